"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand.

Exposed at `GET /metrics`:
    tts_queue_up                       1 when the job queue can be read, 0 while it cannot (no counts then)
    tts_queue_segments{state}          batch segments per state
    tts_jobs{state}                    jobs per state
    tts_engine_active_slots            requests being decoded now
    tts_engine_queued                  requests waiting for a slot
    tts_streams_active                 streaming clients being served
    tts_ttfa_seconds (histogram)       time to first audio of streaming requests
    tts_realtime_factor (gauge)        audio seconds / wall seconds of the last finished stream
    tts_audio_seconds_total            streamed audio produced
    tts_requests_total{api,outcome}    requests by API and outcome (ok, busy, bad_request, error, cancelled)
    tts_errors_total{kind}             errors by exception class
"""
from __future__ import annotations

import threading
import time
from collections import Counter

TTFA_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


def _labels(d: dict) -> str:
    if not d:
        return ""
    esc = {k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in d.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc.items())) + "}"


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()
        self.errors: Counter = Counter()
        self.ttfa_counts = [0] * len(TTFA_BUCKETS)
        self.ttfa_sum = 0.0
        self.ttfa_n = 0
        self.audio_s = 0.0
        self.realtime = 0.0

    def request(self, api: str, outcome: str) -> None:
        with self._lock:
            self.requests[(api, outcome)] += 1

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def observe_stream(self, handle, error=None, started=None) -> None:
        ttfa = getattr(handle, "ttfa_s", None)
        audio = float(getattr(handle, "audio_seconds", 0.0) or 0.0)
        with self._lock:
            if ttfa is not None:
                self.ttfa_sum += ttfa
                self.ttfa_n += 1
                for i, b in enumerate(TTFA_BUCKETS):
                    if ttfa <= b:
                        self.ttfa_counts[i] += 1
            self.audio_s += audio
            if started and audio:
                self.realtime = audio / max(time.monotonic() - started, 1e-6)
            if error:
                self.errors[error] += 1

    def render(self, engine_stats: dict, queue_counts: dict, job_counts: dict, queue_up: bool = True) -> str:
        out = []

        def metric(name, typ, help_, samples):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {typ}")
            for labels, value in samples:
                out.append(f"{name}{_labels(labels)} {float(value):g}")

        with self._lock:
            metric("tts_queue_up", "gauge", "Whether the job queue can be read (1) or not (0).",
                   [({}, 1 if queue_up else 0)])
            metric("tts_queue_segments", "gauge", "Batch segments by state.",
                   [({"state": k}, v) for k, v in sorted(queue_counts.items())])
            metric("tts_jobs", "gauge", "Jobs by state.", [({"state": k}, v) for k, v in sorted(job_counts.items())])
            metric("tts_engine_active_slots", "gauge", "Requests being decoded.",
                   [({}, engine_stats.get("active_slots", 0))])
            metric("tts_engine_queued", "gauge", "Requests waiting for a slot.", [({}, engine_stats.get("queued", 0))])
            metric("tts_streams_active", "gauge", "Streaming clients being served.",
                   [({}, engine_stats.get("streams", 0))])
            metric("tts_engine_frames_per_second", "gauge", "Codec frames per second (engine).",
                   [({}, engine_stats.get("frames_per_s", 0) or 0)])
            out.append("# HELP tts_ttfa_seconds Time to first audio of streaming requests.")
            out.append("# TYPE tts_ttfa_seconds histogram")
            for b, c in zip(TTFA_BUCKETS, self.ttfa_counts):  # cumulative: counted in every bucket >= it
                out.append(f'tts_ttfa_seconds_bucket{{le="{b:g}"}} {c}')
            out.append(f'tts_ttfa_seconds_bucket{{le="+Inf"}} {self.ttfa_n}')
            out.append(f"tts_ttfa_seconds_sum {self.ttfa_sum:g}")
            out.append(f"tts_ttfa_seconds_count {self.ttfa_n}")
            metric("tts_realtime_factor", "gauge", "Audio seconds per wall second of the last stream (x-realtime).",
                   [({}, self.realtime)])
            metric("tts_audio_seconds_total", "counter", "Streamed audio produced.", [({}, self.audio_s)])
            metric("tts_requests_total", "counter", "Requests by API and outcome.",
                   [({"api": a, "outcome": o}, n) for (a, o), n in sorted(self.requests.items())])
            metric("tts_errors_total", "counter", "Errors by kind.",
                   [({"kind": k}, n) for k, n in sorted(self.errors.items())])
        return "\n".join(out) + "\n"
