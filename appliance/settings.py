"""The composition root's settings: what the configuration comes to on this machine, every `auto`
decided once.

    s = settings(resolve(path))     # frozen; the daemon and every command run with it, `info` prints it
    s.devices, s.engines[0].codec, s.threads, s.worker.batch_for(slots), s.inbox.quiet_s, s.job_defaults

`appliance.config.resolve` merges files, drop-ins, environment and command-line flags and checks them;
this module decides what they stand for, and `appliance.compose` builds the engines, queue workers and
inbox watcher from the result, for the daemon and the job commands alike. What only an engine's device
can tell (auto dtype and slot count) is decided by `engines.load.settings(spec)` from the `EngineSpec`
made here, for the loader and `info` alike. docs/ARCHITECTURE.md has the table "Where each setting is
decided".
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from appliance.config import Config, ConfigError
from jobs.ingest.isolate import IngestLimits
from jobs.settings import Paths

if TYPE_CHECKING:
    from engines.api import EngineSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    """The queue workers: the daemon's (`jobs.enabled`, `jobs.workers` threads) and the one of `work`,
    `watch` and `submit --wait` in this process."""

    enabled: bool = True
    threads: int = 1
    batch_size: int = 0       # segments a worker keeps in flight; 0: the slots of its engines (batch_for)
    lease_s: float = 120.0
    guard: bool = True        # runaway/silence guard (off for a test model: jobs.guard.guard_for)
    model: Optional[str] = None  # the checkpoint they run: they claim unpinned jobs and those pinned to it
    min_free_mb: int = 200    # kept free in the spool folder: nothing leased, no book begun beyond it (jobs.disk)

    def batch_for(self, slots: int) -> int:
        """Segments a worker keeps in flight on engines with `slots` slots in all."""
        return self.batch_size or slots


@dataclass(frozen=True)
class InboxSettings:
    """The watched folder HOME/inbox (the daemon's when `jobs.watch`; `watch` always)."""

    enabled: bool = True
    quiet_s: float = 5.0      # a file must be unchanged this long
    polling: bool = False     # poll instead of inotify (network mounts)


@dataclass(frozen=True)
class Settings:
    """What the daemon and every command run with (see the module docstring)."""

    config: Config            # the merged configuration (sockets, HTTP, service ... read from here as they are)
    paths: Paths              # the spool folder and where its queue lives
    model: Optional[str]      # the checkpoint folder, absolute (None: none configured)
    devices: tuple            # one engine per device ("cpu", "cuda", "cuda:1", ...)
    threads: int              # torch CPU threads of every engine
    voices_dir: Path          # saved cloned voices
    catalog: Optional[object]  # what the checkpoint offers, engines.catalog.Catalog (None: none, or unreadable)
    engines: tuple            # an engines.api.EngineSpec per device (empty without a model)
    worker: WorkerSettings
    inbox: InboxSettings
    ingest: IngestLimits      # reading one document (submit, upload, path, inbox)
    job_defaults: dict        # spec values of jobs that name none, fitted to the checkpoint (read only)

    def require_model(self) -> str:
        """The checkpoint; ConfigError saying how to set it when there is none."""
        return self.model or self.config.require_model()


def torch_threads(threads: Optional[str]) -> int:
    """model.threads decided: a number as given; auto (or null): the loop's share of the physical cores this
    process may use (`cpu_split`). torch's intra-op threads wait for each other at every op, so one that
    loses its core (to the daemon's other threads, to other programs) stalls them all: docs/PERFORMANCE.md
    ("CPU threads") has the measurement."""
    return cpu_split(threads)[0]


def codec_threads(threads: Optional[str]) -> int:
    """A CPU engine's codec threads (0: the codec runs in the loop's thread): `cpu_split`."""
    return cpu_split(threads)[1]


def idle_threads(threads: Optional[str]) -> int:
    """A CPU engine loop's torch threads while its codec has no call running: `cpu_split`."""
    return cpu_split(threads)[2]


def cpu_split(threads: Optional[str], cores: Optional[int] = None) -> tuple[int, int, int]:
    """(the engine loop's torch threads, its codec's threads, the loop's threads while the codec has no call
    running) on `cores` physical cores (those this process may use: engines.device.detect.cpu_cores). A CPU
    engine runs its codec beside the decode steps, off the loop's thread (engines.runtime.host_worker.HostWorker),
    a call's rows split over the codec's threads of one torch thread each
    (engines.codec.streaming.StreamingCodecDecoder). From 3 cores one core is left to
    the daemon's other threads; the loop takes the larger half of the rest (model.threads as a number sets
    it). The codec's threads take the cores neither the loop's threads nor the spare one hold, at least 1;
    a loop of one thread has no other intra-op thread to stall, so it shares its core with them: on 2 cores
    the loop has 1 thread and the codec 2, and when the decode waits the codec has both cores
    (docs/PERFORMANCE.md, "Books on the CPU"). While no codec call runs (a book's first prompts, streams
    between chunks) the loop takes every usable core, unless model.threads gives its number. On one core
    the codec runs in the loop's thread."""
    if cores is None:
        from engines.device.detect import cpu_cores

        cores = cpu_cores()
    given = threads not in (None, "auto")
    if cores < 2:
        loop = int(threads) if given else 1
        return loop, 0, loop
    spare = int(cores > 2)
    usable = cores - spare
    loop = int(threads) if given else usable - usable // 2
    return loop, max(1, cores - spare - (loop if loop > 1 else 0)), loop if given else usable


def devices(device: str, instance: Optional[str] = None) -> tuple:
    """model.device decided: the device of each engine (engines.device.detect.resolve_devices). `instance`
    (the daemon of tts-appliance@INSTANCE.service): with a list (or `all`), its INSTANCE-th device; with
    one device kind (auto, cuda, npu), that kind's device number INSTANCE."""
    from engines.device.detect import resolve_device, resolve_devices
    from engines.names import is_multi

    if instance is None:
        return tuple(resolve_devices(device))
    if is_multi(device):
        listed = resolve_devices(device)
        if not (instance.isdigit() and int(instance) < len(listed)):
            raise ConfigError(f"instance {instance!r} has no device in model.device = {device!r} "
                              f"({', '.join(listed)}); use 0..{len(listed) - 1}")
        return (listed[int(instance)],)
    dev = resolve_device(device)
    return (dev if dev == "cpu" or ":" in dev else f"{dev}:{instance}",)


def checkpoint(cfg: Config) -> Optional[str]:
    """model.path as an absolute folder (None when none is configured)."""
    return str(Path(cfg.model.path).expanduser().resolve()) if cfg.model.path else None


def catalog(model: Optional[str], voices: Path):
    """What the checkpoint at `model` offers (engines.catalog.Catalog: its config files, no weights) with
    the saved voices in `voices`; None without a model, or when its files cannot be read (logged: what
    depends on it keeps the configured values; the engines' start reports the error itself)."""
    if not model:
        return None
    from engines.catalog import Catalog
    from engines.model.errors import CheckpointError

    try:
        return Catalog.from_dir(model, voices)
    except (CheckpointError, OSError, ValueError) as exc:
        log.warning("cannot read the checkpoint at %s (%s): jobs.voice and jobs.guard are used as configured",
                    model, exc)
        return None


def voices_dir(cfg: Config) -> Path:
    """Where saved cloned voices live: model.voices_dir, else HOME/voices."""
    return Path(cfg.model.voices_dir or cfg.home().home / "voices").expanduser()


def engine_spec(cfg: Config, device: str, warmup=None, *, max_slots: Optional[int] = None,
                max_queue: Optional[int] = None) -> EngineSpec:
    """What the settings `cfg` make of one engine on `device` (one of model.device's): the checkpoint,
    dtype, voices folder, CPU threads (`torch_threads`), the codec (runtime.codec, auto
    decided by engines.codec.build.codec_choice) and its engine cache folder (runtime.engine_cache) and the rest of the runtime section; `max_slots` /
    `max_queue` override runtime.max_slots / runtime.max_queue; `warmup`: a request spoken once it is ready."""
    from engines.api import EngineSpec
    from engines.codec.build import codec_choice
    from engines.codec.manifest import default_cache_dir

    m, r = cfg.model, cfg.runtime
    model = checkpoint(cfg) or cfg.require_model()  # (raises when none is configured)
    cache = default_cache_dir(model, r.engine_cache)  # where build-engines put this checkpoint's codec engines
    return EngineSpec(model=model, device=device, dtype=m.dtype, voices_dir=str(voices_dir(cfg)),
                      threads=torch_threads(m.threads), codec_threads=codec_threads(m.threads) if device == "cpu" else 0,
                      idle_threads=idle_threads(m.threads) if device == "cpu" else 0,
                      max_slots=max_slots or r.max_slots,
                      max_queue=max_queue or r.max_queue, max_context=r.max_context,
                      codec=codec_choice(r.codec, cache), engine_cache=str(cache), codec_fast=r.codec_fast,
                      codec_windows=r.codec_windows,
                      attn_kernel=r.attn_kernel, sample_kernel=r.sample_kernel, layer_kernel=r.layer_kernel,
                      kv_cache=r.kv_cache, attn_split=r.attn_split, linear=r.linear, codec_dtype=r.codec_dtype,
                      prefill_graphs=r.prefill_graphs,
                      warmup=warmup)


def worker_settings(cfg: Config, checkpoint_catalog=None) -> WorkerSettings:
    """The queue workers of `cfg` on the checkpoint of `checkpoint_catalog` (its test-model label turns
    the guard off: jobs.guard.guard_for, logged)."""
    from jobs.guard import guard_for

    j = cfg.jobs
    return WorkerSettings(enabled=j.enabled, threads=max(1, j.workers), batch_size=j.batch_size, lease_s=j.lease_s,
                          guard=guard_for(j.guard, checkpoint_catalog).enabled, model=checkpoint(cfg),
                          min_free_mb=j.min_free_mb)


def inbox_settings(cfg: Config) -> InboxSettings:
    j = cfg.jobs
    return InboxSettings(enabled=j.watch, quiet_s=j.watch_quiet_s, polling=j.watch_poll)


def job_defaults(cfg: Config, checkpoint_catalog=None) -> dict:
    """The spec values of jobs that name none (jobs.voice, jobs.language, jobs.instruct, jobs.lexicon's
    entries) fitted to the checkpoint of `checkpoint_catalog` (jobs.submit.job_defaults; logged there)."""
    from jobs.submit import job_defaults as fitted

    j, c = cfg.jobs, checkpoint_catalog
    kind = c.model_type if c is not None else None
    return fitted(j.voice, j.language, j.instruct, kind, c.voices if kind == "custom_voice" else (), j.lexicon)


def settings(cfg: Config, instance: Optional[str] = None) -> Settings:
    """The settings of `cfg` with every `auto` decided (see the module docstring); `instance`: the daemon
    instance of tts-appliance@.service (`devices`). ConfigError for an instance without a device."""
    devs, model, voices = devices(cfg.model.device, instance), checkpoint(cfg), voices_dir(cfg)
    cat = catalog(model, voices)
    return Settings(config=cfg, paths=cfg.home(), model=model, devices=devs, threads=torch_threads(cfg.model.threads),
                    voices_dir=voices, catalog=cat, engines=tuple(engine_spec(cfg, d) for d in devs) if model else (),
                    worker=worker_settings(cfg, cat), inbox=inbox_settings(cfg),
                    ingest=IngestLimits.from_config(cfg.jobs), job_defaults=job_defaults(cfg, cat))


def reloaded(old: Settings, cfg: Config) -> Settings:
    """The daemon's settings after a reload to `cfg` (restart-only keys already held at their old values):
    what may change live (workers, inbox, ingest limits) from `cfg`; engines, devices and job defaults kept."""
    return replace(old, config=cfg, worker=worker_settings(cfg, old.catalog), inbox=inbox_settings(cfg),
                   ingest=IngestLimits.from_config(cfg.jobs))
