"""Every value of the configuration checked: its type (`coerce`), its allowed choices (`choices`: dtype and codec
names come from the engine's own tables) and the checks beyond types (`check`), after each source, so that an
error names the file, variable or flag that caused it, the key and what is allowed.

    merge(cfg, {"model": {"threads": 2}}, "config.d/10-cpu.yaml")   # validated, or ConfigError

`appliance.config` calls `merge` once per source, in order.
"""
from __future__ import annotations

import functools
import typing
from dataclasses import fields, replace
from pathlib import Path

from appliance.config_keys import SECTIONS, Config, ConfigError, JobsSection, section_class

LOG_LEVELS = ("debug", "info", "warning", "error")


@functools.lru_cache(maxsize=1)
def choices() -> dict:
    """Keys with a fixed set of values; dtype and codec names come from the engine's tables."""
    from engines.names import AUTO, CODEC_DTYPES, DTYPE_NAMES, KV_CACHES, LINEARS, RUNTIME_CODECS

    return {("model", "dtype"): (AUTO, *DTYPE_NAMES), ("service", "log_level"): LOG_LEVELS,
            ("runtime", "codec"): RUNTIME_CODECS, ("runtime", "kv_cache"): KV_CACHES, ("runtime", "linear"): LINEARS,
            ("runtime", "codec_dtype"): CODEC_DTYPES}


def coerce(value, typ, where: str):
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
        cls = section_class(sec)
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
            updates[key] = coerce(value, hints[key], f"{origin}: {sec}.{key}")
            allowed = choices().get((sec, key))
            if allowed and updates[key] not in allowed:
                raise ConfigError(f"{origin}: {sec}.{key} = {value!r}; choose one of {', '.join(allowed)}")
        setattr(cfg, sec, replace(getattr(cfg, sec), **updates))
    return check(cfg, origin)


def check(cfg: Config, origin: str = "config") -> Config:
    """Value checks beyond types (after each source, so errors name the file that caused them)."""
    for sec, key in (("runtime", "max_queue"), ("runtime", "max_context"), ("jobs", "workers"),
                     ("jobs", "ingest_cpu_s"), ("jobs", "ingest_memory_mb"), ("jobs", "ingest_wall_s"),
                     ("jobs", "ingest_parallel"), ("jobs", "max_file_mb"),
                     ("http", "max_body_bytes"), ("http", "max_text_chars"), ("wyoming", "idle_timeout_s"),
                     ("wyoming", "write_timeout_s")):
        if getattr(getattr(cfg, sec), key) < 1:
            raise ConfigError(f"{origin}: {sec}.{key} must be at least 1")
    if cfg.jobs.batch_size < 0:
        raise ConfigError(f"{origin}: jobs.batch_size must be 0 (the engine's slot count) or more")
    if cfg.jobs.min_free_mb < 0 or (cfg.jobs.keep_work_days is not None and cfg.jobs.keep_work_days < 0):
        raise ConfigError(f"{origin}: jobs.min_free_mb and jobs.keep_work_days must be 0 or more "
                          "(keep_work_days null: working files are kept)")
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
    cache = cfg.runtime.engine_cache
    if cache and not Path(cache).expanduser().is_absolute():
        raise ConfigError(f"{origin}: runtime.engine_cache = {cache!r}: give an absolute path")
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
