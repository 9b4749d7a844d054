"""What the configuration holds: its sections and keys with their defaults (`Config`), and the paths derived
from them (sockets, runtime folder, spool folder).

`appliance.config` reads the sources (files, drop-ins, environment, flags) into a `Config`, each value checked by
`appliance.config_check`; `appliance.settings` decides what the result stands for on this machine. The shipped
`configs/default.yaml` repeats these defaults with comments.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

ENV_PREFIX = "TTS_APPLIANCE_"  # TTS_APPLIANCE_<SECTION>__<KEY> variables; TTS_APPLIANCE_MODEL, _HOME, _CONFIG
SYSTEM_CONFIG = Path("/etc/tts-appliance/config.yaml")  # the service's file (and every user's without one)


class ConfigError(ValueError):
    """A configuration file or variable is wrong; the message says where and what is allowed."""


@dataclass
class ModelSection:
    """The checkpoint and how to run it."""

    path: Optional[str] = None        # checkpoint folder (else $TTS_APPLIANCE_MODEL)
    device: str = "auto"              # auto, cpu, cuda, cuda:N, npu:N; all or cuda:0,cuda:1: one engine each
    dtype: str = "auto"               # auto (bfloat16 on a GPU/NPU, float32 on the CPU), float32, bfloat16, float16
    voices_dir: Optional[str] = None  # saved cloned voices (default HOME/voices)
    threads: Optional[str] = "auto"   # torch CPU threads: auto (appliance.settings.torch_threads; null too) or a number
    warmup: bool = True               # synthesize one short sentence before READY=1
    max_frames: Optional[int] = None  # cap on frames per streaming request (None: the model's)


@dataclass
class RuntimeSection:
    """The engine runner (continuous batching)."""

    max_slots: str = "auto"           # requests decoded together: auto (what fits in free memory) or a number
    max_context: int = 2048           # cache positions per request (prompt + frames; 12.5 frames per second)
    max_queue: int = 16               # admission queue; beyond it requests get "busy" (HTTP 503)
    retry_after_s: int = 2            # Retry-After sent with 503
    codec: str = "auto"               # codec backend: auto (what build-engines built, else torch), torch, ...
    prefill_graphs: bool = True       # GPU: prompts prefilled by captured graphs (false: eager, for A/B runs)
    codec_fast: Optional[bool] = None  # torch codec: channels-last fused upsampling (None: NVIDIA GPUs from Ampere on; false for A/B)
    codec_windows: Optional[bool] = None  # book codec calls over windows of the rows (None: on a GPU or NPU; false: A/B)
    attn_kernel: Optional[bool] = None  # decode attention as one Triton kernel (None: Ampere GPUs on; false: A/B)
    sample_kernel: Optional[bool] = None  # sampling as one Triton kernel per draw, no sort (None: Ampere GPUs on)
    layer_kernel: Optional[bool] = None  # one stream's decoder layers as one persistent kernel each (None: as above)
    kv_cache: str = "auto"            # the talker's key/value cache: auto (= model until fp8 is measured), model, fp8
    attn_split: Optional[bool] = None  # the talker's attention split over programs per row (None: off until measured)
    linear: str = "auto"              # the decoder layers' weights: auto (engines.runtime.linears.linear_setting), model, fp16, int8
    codec_dtype: str = "auto"         # the codec lanes' dtype: auto (engines.codec.dtype.codec_dtype_setting), model, bfloat16
    engine_process: bool = True       # the daemon runs each engine in a process of its own (false: in its own)
    engine_cache: Optional[str] = None  # where build-engines puts the codec engines, a folder per checkpoint
                                        # (None: $TTS_APPLIANCE_ENGINE_CACHE, else ~/.cache/tts-appliance/engines)


@dataclass
class JobsSection:
    """Batch (audiobook) jobs and the watched folder."""

    home: Optional[str] = None        # spool folder (else $TTS_APPLIANCE_HOME, else ~/.local/share/tts-appliance)
    queue: Optional[str] = None       # job queue: HOME/queue.db (SQLite), or postgresql://user@host/db (several hosts)
    queue_file: Optional[str] = None  # a file holding jobs.queue (keeps a password out of the config)
    enabled: bool = True              # run a queue worker inside the daemon
    batch_size: int = 0               # segments a worker keeps in flight (0: the engine's slot count)
    workers: int = 1                  # worker threads (each tops up its segments as they finish)
    lease_s: float = 120.0
    guard: bool = True                # runaway/silence guard
    watch: bool = True                # watch HOME/inbox
    watch_quiet_s: float = 5.0
    watch_poll: bool = False          # poll instead of inotify (network mounts)
    allowed_dirs: list = field(default_factory=list)  # server-side paths the API may submit from
    voice: Optional[str] = None       # voice of jobs that name none (None: a CustomVoice model's first speaker)
    language: str = "auto"            # language of jobs that name none
    instruct: Optional[str] = None    # voice description of jobs that give none (VoiceDesign checkpoints)
    synth_rate: Optional[float] = None  # audio s synthesized per s, for `preview` (None: measured from past jobs)
    ingest_cpu_s: float = 120.0       # limits for parsing one file (in a child process); over them it fails
    ingest_memory_mb: int = 2048
    ingest_wall_s: float = 300.0
    ingest_parallel: int = 2          # inbox files parsed at once (one child process each)
    max_file_mb: int = 50             # largest document a job reads (submit, upload, path, inbox), in MiB
    lexicon: Optional[str] = None     # pronunciation lexicon, a YAML file (word: say this), for jobs and streams
    keep_work_days: Optional[float] = 7.0  # a finished job's working files (segment audio, upload): days; None: kept
    min_free_mb: int = 200            # kept free in the spool folder: segments are leased, books begun, only beyond it


@dataclass
class HttpSection:
    """Local HTTP API."""

    socket: Optional[str] = None      # Unix socket (default RUNTIME_DIR/api.sock); "" disables it
    group: Optional[str] = None       # group owning the sockets (mode below)
    mode: str = "0660"
    tcp: bool = False                 # also listen on TCP (loopback only unless tcp_host says otherwise)
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 8732
    api_key: Optional[str] = None     # TCP requests need `Authorization: Bearer KEY` (the Unix socket: its mode)
    max_body_bytes: int = 64 * 1024 * 1024
    max_text_chars: int = 20000       # longest `input` for /v1/audio/speech
    response_format: str = "mp3"      # what a speech request without response_format gets (OpenAI's default)
    read_timeout_s: float = 30.0      # a client must send its request within this
    write_timeout_s: float = 60.0     # a stream whose client stops reading this long is dropped


@dataclass
class WyomingSection:
    """Wyoming protocol server (Home Assistant)."""

    enabled: bool = True
    socket: Optional[str] = None      # default RUNTIME_DIR/wyoming.sock; "" disables it
    tcp_port: Optional[int] = None    # e.g. 10200 on 127.0.0.1 (None: off)
    tcp_host: str = "127.0.0.1"
    default_voice: Optional[str] = None
    default_language: str = "auto"
    idle_timeout_s: float = 60.0      # a connection that sends no event this long while nothing is spoken is closed
    write_timeout_s: float = 60.0     # a connection whose client reads none of its audio this long is closed


@dataclass
class ServiceSection:
    """Process behaviour under systemd or by hand."""

    log_level: str = "info"
    status_interval_s: float = 5.0    # STATUS= updates
    stop_timeout_s: float = 60.0      # finish in-flight segments within this on SIGTERM
    runtime_dir: Optional[str] = None  # sockets (default $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR/tts-appliance, HOME/run)


@dataclass
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    jobs: JobsSection = field(default_factory=JobsSection)
    http: HttpSection = field(default_factory=HttpSection)
    wyoming: WyomingSection = field(default_factory=WyomingSection)
    service: ServiceSection = field(default_factory=ServiceSection)
    sources: list = field(default_factory=list)  # files that were read (for logs)

    def require_model(self) -> str:
        """model.path; ConfigError saying how to set it when there is none."""
        if not self.model.path:
            raise ConfigError(f"no model: pass --model PATH, or set model.path in the config "
                              f"({', '.join(self.sources) or f'none read; default {SYSTEM_CONFIG}'}) "
                              f"or ${ENV_PREFIX}MODEL")
        return self.model.path

    # -- derived paths -----------------------------------------------------------------------
    def home(self):
        from jobs.settings import resolve_home

        return resolve_home(self.jobs.home, queue=self.jobs.queue, queue_file=self.jobs.queue_file)

    def runtime_dir(self) -> Path:
        raw = (self.service.runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
               or (os.environ.get("XDG_RUNTIME_DIR") and os.path.join(os.environ["XDG_RUNTIME_DIR"], "tts-appliance")))
        return Path(raw).expanduser() if raw else self.home().home / "run"

    def http_socket(self) -> Optional[Path]:
        s = self.http.socket
        return None if s == "" else Path(s).expanduser() if s else self.runtime_dir() / "api.sock"

    def wyoming_socket(self) -> Optional[Path]:
        s = self.wyoming.socket
        if not self.wyoming.enabled or s == "":
            return None
        return Path(s).expanduser() if s else self.runtime_dir() / "wyoming.sock"


SECTIONS = {f.name: f.type for f in fields(Config) if f.name != "sources"}


def section_class(name: str):
    """The dataclass of section `name`."""
    return {"model": ModelSection, "runtime": RuntimeSection, "jobs": JobsSection, "http": HttpSection,
            "wyoming": WyomingSection, "service": ServiceSection}[name]
