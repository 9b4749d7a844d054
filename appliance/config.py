"""Settings of every command and the daemon: YAML files + environment + command line, validated
into dataclasses. `resolve()` is the one entry point.

Sources, later ones win (section by section, key by key):

1. the dataclass defaults below (the shipped `configs/default.yaml` repeats them with comments)
2. the main config file: `--config PATH`, else `$TTS_APPLIANCE_CONFIG`, else the user's
   `~/.config/tts-appliance/config.yaml` (`$XDG_CONFIG_HOME`) when it exists, else
   `/etc/tts-appliance/config.yaml`
3. every `config.d/*.yaml` next to that file, in name order (drop-ins)
4. environment variables `TTS_APPLIANCE_<SECTION>__<KEY>=value` (value parsed as YAML, so
   `TTS_APPLIANCE_HTTP__TCP=true` is a bool), plus the older `TTS_APPLIANCE_MODEL` and
   `TTS_APPLIANCE_HOME` as fallbacks for `model.path` and `jobs.home`
5. command-line flags (`--model`, `--device`, `--dtype`, `--home`, the job commands' worker and inbox
   flags) given to `resolve()`

What the result stands for on this machine (every `auto`) is decided by `appliance.settings`.

Unknown sections or keys and wrongly typed values raise `ConfigError` naming the source, the key
and the valid choices (dtype and codec choices come from the engine's own tables).
"""
from __future__ import annotations

import functools
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Optional

import yaml

ENV_PREFIX = "TTS_APPLIANCE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
SYSTEM_CONFIG = Path("/etc/tts-appliance/config.yaml")
SHIPPED_DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


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
    attn_kernel: Optional[bool] = None  # decode attention as one Triton kernel (None: Ampere GPUs on; false: A/B)
    sample_kernel: Optional[bool] = None  # sampling as one Triton kernel per draw, no sort (None: Ampere GPUs on)
    layer_kernel: Optional[bool] = None  # one stream's decoder layers as one persistent kernel each (None: as above)
    kv_cache: str = "auto"            # the talker's key/value cache: auto (= model until fp8 is measured), model, fp8
    linear: str = "auto"              # the decoder layers' weights: auto (engines.runtime.linears.linear_setting), model, fp16, int8
    codec_dtype: str = "auto"         # the codec lanes' dtype: auto (engines.codec.dtype.codec_dtype_setting), model, bfloat16
    engine_process: bool = True       # the daemon runs each engine in a process of its own (false: in its own)


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
LOG_LEVELS = ("debug", "info", "warning", "error")


@functools.lru_cache(maxsize=1)
def choices() -> dict:
    """Keys with a fixed set of values; dtype and codec names come from the engine's tables."""
    from engines.names import AUTO, CODEC_DTYPES, DTYPE_NAMES, KV_CACHES, LINEARS, RUNTIME_CODECS

    return {("model", "dtype"): (AUTO, *DTYPE_NAMES), ("service", "log_level"): LOG_LEVELS,
            ("runtime", "codec"): RUNTIME_CODECS, ("runtime", "kv_cache"): KV_CACHES, ("runtime", "linear"): LINEARS,
            ("runtime", "codec_dtype"): CODEC_DTYPES}


def _section_cls(name: str):
    return {"model": ModelSection, "runtime": RuntimeSection, "jobs": JobsSection, "http": HttpSection,
            "wyoming": WyomingSection, "service": ServiceSection}[name]


def _coerce(value, typ, where: str):
    """Check/convert one value against a field type (Optional[int], float, bool, str, list)."""
    args = typing.get_args(typ)
    if args and type(None) in args:
        if value is None:
            return None
        typ = next(a for a in args if a is not type(None))
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool),
          list: lambda v: isinstance(v, list)}
    base = typ if typ in ok else str
    if not ok[base](value):
        raise ConfigError(f"{where}: expected {base.__name__}, got {value!r}")
    return float(value) if base is float else str(value) if base is str else value


def merge(cfg: Config, data, origin: str) -> Config:
    """Apply one mapping `{section: {key: value}}` onto `cfg` (validated)."""
    if data is None:
        return cfg
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: must be a YAML mapping of sections ({', '.join(SECTIONS)})")
    for sec, values in data.items():
        if sec not in SECTIONS:
            raise ConfigError(f"{origin}: unknown section {sec!r}; valid sections: {', '.join(SECTIONS)}")
        if values is None:
            continue
        cls = _section_cls(sec)
        valid = {f.name: f for f in fields(cls)}
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: section {sec!r} must be a mapping of keys ({', '.join(valid)})")
        updates = {}
        for key, value in values.items():
            if key not in valid:
                raise ConfigError(f"{origin}: unknown key {sec}.{key}; valid keys in {sec}: {', '.join(valid)}")
            hints = typing.get_type_hints(cls)
            if (sec, key) == ("http", "mode") and isinstance(value, int) and not isinstance(value, bool):
                value = format(value, "04o")  # YAML 1.1 reads 0660 as the octal number 432
            updates[key] = _coerce(value, hints[key], f"{origin}: {sec}.{key}")
            allowed = choices().get((sec, key))
            if allowed and updates[key] not in allowed:
                raise ConfigError(f"{origin}: {sec}.{key} = {value!r}; choose one of {', '.join(allowed)}")
        setattr(cfg, sec, replace(getattr(cfg, sec), **updates))
    return check(cfg, origin)


def _read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except PermissionError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}{_group_hint(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def _group_hint(path: Path) -> str:
    """What to do about a config file this user may not read: the service's file is for its group."""
    import grp
    import stat

    try:
        st = path.stat()
        group = grp.getgrgid(st.st_gid).gr_name
    except (OSError, KeyError):
        return ""
    if not st.st_mode & stat.S_IRGRP or group == "root":
        return f" (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: ask its administrator)"
    return (f". It is readable by group {group!r} (the service's users): sudo usermod -aG {group} $USER, "
            "then log in again")


def env_overrides(environ) -> dict:
    """`TTS_APPLIANCE_<SECTION>__<KEY>` variables as a nested mapping (values parsed as YAML)."""
    out: dict = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        sec, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.setdefault(sec, {})[key] = value
    return out


def check(cfg: Config, origin: str = "config") -> Config:
    """Value checks beyond types (after each source, so errors name the file that caused them)."""
    for sec, key in (("runtime", "max_queue"), ("runtime", "max_context"), ("jobs", "workers"),
                     ("jobs", "ingest_cpu_s"), ("jobs", "ingest_memory_mb"), ("jobs", "ingest_wall_s"),
                     ("jobs", "ingest_parallel"), ("jobs", "max_file_mb"),
                     ("http", "max_body_bytes"), ("http", "max_text_chars")):
        if getattr(getattr(cfg, sec), key) < 1:
            raise ConfigError(f"{origin}: {sec}.{key} must be at least 1")
    if cfg.jobs.batch_size < 0:
        raise ConfigError(f"{origin}: jobs.batch_size must be 0 (the engine's slot count) or more")
    from engines.names import check_device_spec

    why = check_device_spec(cfg.model.device)
    if why:
        raise ConfigError(f"{origin}: model.device = {why}")
    threads = cfg.model.threads
    if threads is not None and threads != "auto" and not (threads.isdigit() and int(threads) >= 1):
        raise ConfigError(f"{origin}: model.threads = {threads!r}: give auto or a number of at least 1")
    slots = str(cfg.runtime.max_slots)
    if slots != "auto" and not (slots.isdigit() and int(slots) >= 1):
        raise ConfigError(f"{origin}: runtime.max_slots = {slots!r}: give auto or a number of at least 1")
    for sec, key in (("http", "tcp_port"), ("wyoming", "tcp_port")):
        port = getattr(getattr(cfg, sec), key)
        if port is not None and not 0 <= port <= 65535:
            raise ConfigError(f"{origin}: {sec}.{key} = {port}: a TCP port is 0..65535")
    try:
        mode = int(cfg.http.mode, 8)
    except ValueError:
        raise ConfigError(f"{origin}: http.mode = {cfg.http.mode!r}: give an octal file mode such as 0660") from None
    if mode & ~0o777:
        raise ConfigError(f"{origin}: http.mode = {cfg.http.mode!r}: only permission bits (e.g. 0660)")
    from audio.encode_stream import CONTENT_TYPES

    if cfg.http.response_format not in CONTENT_TYPES:
        raise ConfigError(f"{origin}: http.response_format = {cfg.http.response_format!r}: choose one of "
                          f"{', '.join(CONTENT_TYPES)}")
    check_queue(cfg.jobs, origin)
    if cfg.jobs.lexicon:
        from text.normalize.lexicon import LexiconError
        from text.lexicons import file_lexicon

        try:
            file_lexicon(cfg.jobs.lexicon)
        except LexiconError as exc:
            raise ConfigError(f"{origin}: jobs.lexicon: {exc}") from None
    return cfg


def check_queue(jobs: JobsSection, origin: str) -> None:
    """jobs.queue parsed strictly (a typo must not become a SQLite file); jobs.queue_file an absolute path."""
    from jobs.queue.location import parse_location

    if jobs.queue and jobs.queue_file:
        raise ConfigError(f"{origin}: set jobs.queue or jobs.queue_file, not both")
    if jobs.queue_file and not Path(jobs.queue_file).expanduser().is_absolute():
        raise ConfigError(f"{origin}: jobs.queue_file = {jobs.queue_file!r}: give an absolute path")
    if jobs.queue:
        try:
            parse_location(jobs.queue)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {exc}") from None


def user_config(environ=None) -> Path:
    """The user's config file: $XDG_CONFIG_HOME/tts-appliance/config.yaml (default ~/.config/...)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tts-appliance" / "config.yaml"


def config_file(path: Optional[str | os.PathLike] = None, environ=None) -> tuple[Path, bool]:
    """The main config file and whether it was named (`path` or $TTS_APPLIANCE_CONFIG): a named file
    must exist; else the user's file when it exists, else /etc/tts-appliance/config.yaml (optional)."""
    environ = os.environ if environ is None else environ
    named = path or environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser(), True
    user = user_config(environ)
    return (user if user.is_file() else SYSTEM_CONFIG), False


def load_config(path: Optional[str | os.PathLike] = None, environ=None) -> Config:
    """Read and validate files and environment (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    cfg = Config()
    if SHIPPED_DEFAULTS.is_file():
        merge(cfg, _read_yaml(SHIPPED_DEFAULTS), str(SHIPPED_DEFAULTS))
    main, named = config_file(path, environ)
    if named and not main.is_file():
        raise ConfigError(f"{main}: no such config file")
    files = ([main] if main.is_file() else []) + sorted((main.parent / "config.d").glob("*.yaml"))
    for f in files:
        merge(cfg, _read_yaml(f), str(f))
        cfg.sources.append(str(f))
    if not cfg.model.path and environ.get(ENV_PREFIX + "MODEL"):
        cfg.model.path = environ[ENV_PREFIX + "MODEL"]
    if not cfg.jobs.home and environ.get(ENV_PREFIX + "HOME"):
        cfg.jobs.home = environ[ENV_PREFIX + "HOME"]
    return merge(cfg, env_overrides(environ), "environment")


def resolve(config_path: Optional[str | os.PathLike] = None, *, model=None, device: Optional[str] = None,
            dtype: Optional[str] = None, home=None, flags: Optional[dict] = None, environ=None) -> Config:
    """The configuration every command and the daemon run with: `load_config` (files, drop-ins,
    environment), then the command line's flags on top (None: not given), validated the same way:
    `model`, `device`, `dtype`, `home`, and `flags` {section: {key: value}} for the other keys a
    command takes a flag for."""
    cfg = load_config(config_path, environ)
    given = {"model": {"path": model, "device": device, "dtype": dtype}, "jobs": {"home": home}}
    for sec, keys in (flags or {}).items():
        given.setdefault(sec, {}).update(keys)
    given = {sec: {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in keys.items() if v is not None}
             for sec, keys in given.items()}
    return merge(cfg, {sec: keys for sec, keys in given.items() if keys}, "command line")


def as_dict(cfg: Config) -> dict:
    """The effective configuration as plain data (for `daemon --print-config`)."""
    from jobs.queue.location import parse_location, redact

    out = {name: {f.name: getattr(getattr(cfg, name), f.name) for f in fields(getattr(cfg, name))}
           for name in SECTIONS if is_dataclass(getattr(cfg, name))}
    if cfg.jobs.queue:
        out["jobs"]["queue"] = redact(str(parse_location(cfg.jobs.queue)))  # the database password is not shown
    if cfg.http.api_key:
        out["http"]["api_key"] = "(set)"  # nor the API key
    return out
