"""Prometheus metrics of the daemon, kept and written by prometheus_client: the text format 0.0.4, or
OpenMetrics 1.0 for a scraper that asks for it (Accept: application/openmetrics-text, as Prometheus does).

Exposed at `GET /metrics`:
    tts_queue_up                       1 when the job queue can be read, 0 while it cannot (no counts then)
    tts_queue_segments{state}          batch segments per state
    tts_jobs{state}                    jobs per state
    tts_engine_active_slots            requests being decoded now
    tts_engine_queued                  requests waiting for a slot
    tts_streams_active                 streaming clients being served
    tts_engine_frames_per_second       codec frames per second (engine)
    tts_ttfa_seconds (histogram)       time to first audio of streaming requests
    tts_realtime_factor (gauge)        audio seconds / wall seconds of the last finished stream
    tts_audio_seconds_total            streamed audio produced
    tts_requests_total{api,outcome}    requests by API and outcome (ok, busy, bad_request, slow_client, error,
                                       cancelled)
    tts_errors_total{kind}             errors by exception class
    tts_disk_free_bytes                free bytes on the spool folder's disk (what /health's `disk` shows)
    tts_disk_ok                        1, or 0 while jobs wait for room there (or less than jobs.min_free_mb is free)

Each daemon keeps its own registry (not the library's global one); the queue, engine and disk gauges are what
the daemon reads at each scrape. Counters and the histogram carry no `_created` series.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

TTFA_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
prometheus_client.disable_created_metrics()  # counters as before: no tts_*_created series beside them


class _Scrape:
    """The gauges read at each scrape (the queue's counts, the engines' state), set by `Metrics.render`."""

    def __init__(self):
        self.engine, self.segments, self.jobs, self.queue_up, self.disk = {}, {}, {}, True, {}

    def collect(self):
        def gauge(name, help_, value=None, label=None, values=None):
            g = GaugeMetricFamily(name, help_, labels=[label] if label else None)
            if values is not None:
                for key, v in sorted(values.items()):
                    g.add_metric([str(key)], float(v))
            else:
                g.add_metric([], float(value or 0))
            return g

        e = self.engine
        yield gauge("tts_queue_up", "Whether the job queue can be read (1) or not (0).", 1 if self.queue_up else 0)
        yield gauge("tts_queue_segments", "Batch segments by state.", label="state", values=self.segments)
        yield gauge("tts_jobs", "Jobs by state.", label="state", values=self.jobs)
        yield gauge("tts_engine_active_slots", "Requests being decoded.", e.get("active_slots", 0))
        yield gauge("tts_engine_queued", "Requests waiting for a slot.", e.get("queued", 0))
        yield gauge("tts_streams_active", "Streaming clients being served.", e.get("streams", 0))
        yield gauge("tts_engine_frames_per_second", "Codec frames per second (engine).", e.get("frames_per_s", 0))
        if "free_bytes" in self.disk:
            yield gauge("tts_disk_free_bytes", "Free bytes on the spool folder's disk.", self.disk["free_bytes"])
        if "ok" in self.disk:
            yield gauge("tts_disk_ok", "Whether jobs find room on the spool folder's disk (1) or wait for it (0).",
                        1 if self.disk["ok"] else 0)


class Metrics:
    """The daemon's metrics: counted as requests and streams end, written by `render` for GET /metrics."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self._scrape = _Scrape()
        self._lock = threading.Lock()  # one render at a time: the scrape gauges are set, then written
        self.registry.register(self._scrape)
        r = self.registry
        self.ttfa = Histogram("tts_ttfa_seconds", "Time to first audio of streaming requests.", buckets=TTFA_BUCKETS,
                              registry=r)
        self.realtime = Gauge("tts_realtime_factor", "Audio seconds per wall second of the last stream (x-realtime).",
                              registry=r)
        self.audio = Counter("tts_audio_seconds", "Streamed audio produced.", registry=r)
        self.requests = Counter("tts_requests", "Requests by API and outcome.", ["api", "outcome"], registry=r)
        self.errors = Counter("tts_errors", "Errors by kind.", ["kind"], registry=r)

    def request(self, api: str, outcome: str) -> None:
        self.requests.labels(api, outcome).inc()

    def error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def observe_stream(self, handle, error=None, started=None) -> None:
        """A finished stream: its time to first audio, its audio, its speed (`started`: time.monotonic() at
        its start), the error it ended with."""
        ttfa = getattr(handle, "ttfa_s", None)
        audio = float(getattr(handle, "audio_seconds", 0.0) or 0.0)
        if ttfa is not None:
            self.ttfa.observe(ttfa)
        self.audio.inc(audio)
        if started and audio:
            self.realtime.set(audio / max(time.monotonic() - started, 1e-6))
        if error:
            self.error(error)

    def ttfa_totals(self) -> tuple[float, float]:
        """(count, sum) of the time-to-first-audio histogram so far (benchmarks.socket_ttfa)."""
        get = self.registry.get_sample_value
        return get("tts_ttfa_seconds_count") or 0.0, get("tts_ttfa_seconds_sum") or 0.0

    def render(self, engine_stats: dict, queue_counts: dict, job_counts: dict, queue_up: bool = True,
               accept: str = "", disk: Optional[dict] = None) -> tuple[bytes, str]:
        """(the exposition, its Content-Type) in the format the scraper's `accept` header asks for, with the
        engines' `engine_stats`, the queue's counts (none while the queue cannot be read: `queue_up` False) and
        the spool folder's `disk` as /health shows it (jobs.disk.disk_state; None: no disk gauges)."""
        encode, content_type = choose_encoder(accept)
        with self._lock:
            s = self._scrape
            s.engine, s.queue_up, s.disk = engine_stats or {}, queue_up, disk or {}
            s.segments, s.jobs = (queue_counts or {}, job_counts or {}) if queue_up else ({}, {})
            return encode(self.registry), content_type
