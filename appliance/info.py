"""`tts-appliance info`: one report of this installation for a bug report.

    report = collect(settings(cfg))   # plain data (the --json output)
    print(render(report))             # the text a user pastes

Sections: the program and config files read, the machine's compute (engines.device.detect.
device_inventory), the settings as decided (appliance.settings: devices, threads, the queue workers and
the inbox: what the daemon and the job commands run with), the model (kind, modes, speakers, languages,
from its config.json: no weights loaded), the engines (device, dtype, slots and why:
engines.load.settings of each EngineSpec of the settings, what the engine itself decides), the codec
engines `build-engines` made and what would be used or why not, paths (sockets, queue, inbox), the spool
folder's disk (free space, what each folder holds, the retention) and, when a daemon answers on its socket,
its /health. Every part is guarded: a broken part is reported as an
`error` entry, never raised, so the report is always complete.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Optional

from appliance.config import CONFIG_ENV, ENV_PREFIX, SHIPPED_DEFAULTS, Config, config_file
from appliance.settings import Settings

log = logging.getLogger(__name__)

MODES = {"custom_voice": "built-in speakers (voice=NAME); style instructions on 1.7B",
         "base": "voice cloning (ref_audio + ref_text, or a saved .voice)",
         "voice_design": "voices described in words (instruct=...)"}


def _guard(fn: Callable, *args) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a report shows what failed instead of failing
        from jobs.queue.location import redact

        log.debug("info: %s failed", getattr(fn, "__name__", fn), exc_info=True)
        return {"error": redact(f"{type(exc).__name__}: {exc}")}


def program_info(cfg: Config, config_path: Optional[str]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("tts-appliance")
    except PackageNotFoundError:
        ver = "not installed (running from the source tree)"
    main, named = config_file(config_path)
    env = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k != CONFIG_ENV)
    return {"version": ver, "config_file": str(main), "config_named": named, "config_exists": main.is_file(),
            "config_read": [str(SHIPPED_DEFAULTS), *cfg.sources], "environment": env}


def settings_info(s: Settings) -> dict:
    """What the configuration comes to on this machine (appliance.settings): the devices, CPU threads,
    the queue workers and the inbox the daemon and the job commands run with."""
    w, i = s.worker, s.inbox
    return {"devices": list(s.devices), "threads": s.threads,
            "worker": {"enabled": w.enabled, "threads": w.threads, "batch_size": w.batch_size, "lease_s": w.lease_s,
                       "guard": w.guard, "model": w.model},
            "inbox": {"enabled": i.enabled, "quiet_s": i.quiet_s, "polling": i.polling},
            "job_defaults": dict(s.job_defaults)}


def model_info(s: Settings) -> dict:
    from engines.model.config import ModelConfig

    path = s.require_model()
    mc = ModelConfig.from_dir(path)
    saved = sorted(p.stem for p in s.voices_dir.glob("*.voice")) if s.voices_dir.is_dir() else []
    return {"path": path, "kind": mc.tts_model_type, "size": mc.tts_model_size,
            "modes": MODES.get(mc.tts_model_type, "?"), "speakers": sorted(mc.talker.spk_id),
            "languages": mc.talker.languages, "voices_dir": str(s.voices_dir), "saved_voices": saved}


def engines_info(s: Settings) -> list:
    """The engines of the settings: one per device, each with what engines.load.settings decides for it
    (dtype, slots and why), its codec and CPU threads."""
    from engines.load import code_error, settings as decided

    s.require_model()
    broken = code_error()
    if broken:
        return {"error": broken}
    return [_guard(lambda spec: {**decided(spec), "codec": spec.codec, "threads": spec.threads,
                                   "codec_threads": spec.codec_threads, "idle_threads": spec.idle_threads}, spec)
            for spec in s.engines]


def codec_info(s: Settings) -> dict:
    """What build-engines made for this model, whether it still fits this machine, what would be used."""
    from engines.codec.manifest import MANIFEST, model_identity, read_manifest, stale_reasons, unusable_reason
    from engines.device.detect import detect_platform

    model, cfg = s.require_model(), s.config
    choice = s.engines[0].codec  # runtime.codec with auto decided (engines.codec.build.codec_choice)
    cache = Path(s.engines[0].engine_cache)  # this checkpoint's folder in runtime.engine_cache
    out = {"runtime_codec": cfg.runtime.codec, "cache": str(cache), "built": [], "skipped": {}}
    manifest = read_manifest(cache)
    if manifest is None:
        out["uses"] = "torch" if choice in ("built", "torch") else choice
        out["why"] = f"no {MANIFEST} in the cache: `tts-appliance build-engines` makes the codec engines"
        return out
    plat = detect_platform(s.devices[0])
    stale = stale_reasons(manifest, plat, model_identity(model))
    out.update(ranking=manifest.get("ranking", []), skipped=manifest.get("skipped", {}), stale=stale,
               built_for=manifest.get("platform", {}).get("device_name"))
    for e in manifest.get("engines", []):
        why = unusable_reason(e, plat, Path(cache))
        out["built"].append({"backend": e["backend"], "precision": e.get("precision"),
                             "audio_s_per_s": (e.get("gpu_speed") or e.get("cpu_speed") or {}).get("audio_s_per_s"),
                             "usable": why is None and not stale, "why_not": "; ".join(stale) if stale else why})
    if choice in ("torch", "torch-compiled"):
        out["uses"], out["why"] = choice, "runtime.codec names it"
    else:
        usable = {e["backend"] for e in out["built"] if e["usable"]}
        first = next((n for n in out["ranking"] if n in usable or n == "torch"), "torch")
        out["uses"] = first
        out["why"] = "first usable in the build's ranking" if not stale else "the build no longer fits: " + "; ".join(stale)
    return out


def paths_info(cfg: Config) -> dict:
    from jobs.queue import Queue, QueueError, QueueUnavailable
    from jobs.queue.daemons import host_name
    from jobs.queue.location import redact

    paths = cfg.home()
    try:
        db = paths.db
    except QueueError as exc:  # jobs.queue_file unreadable here: say so, report the rest
        db = exc
    out = {"home": str(paths.home), "queue": redact(str(db)), "inbox": str(paths.home / "inbox"),
           "output": str(paths.output), "runtime_dir": str(cfg.runtime_dir()),
           "http_socket": str(cfg.http_socket()) if cfg.http_socket() else None,
           "http_tcp": f"{cfg.http.tcp_host}:{cfg.http.tcp_port}" if cfg.http.tcp else None,
           "wyoming_socket": str(cfg.wyoming_socket()) if cfg.wyoming_socket() else None}
    if not isinstance(db, QueueError):
        try:
            with Queue.reading(db) as queue:  # read only: the report never creates or migrates the queue
                if queue is not None:
                    out["jobs"] = queue.job_counts()
                    out["daemons"] = [{"host": host_name(d["host"]), "pid": d["pid"], "home": d["home"],
                                       "instance": d["instance"], "seen_s_ago": round(time.time() - d["seen_at"], 1)}
                                      for d in queue.daemons()]  # those sharing the queue, and their spool folders
        except (QueueError, QueueUnavailable) as exc:
            out["jobs"] = {"error": str(exc)}
    return out


def disk_info(cfg: Config) -> dict:
    """The spool folder's disk: free and total bytes, what each of its folders holds (jobs.disk.usage), the
    reserve (jobs.min_free_mb) and the retention (jobs.keep_work_days)."""
    from jobs.disk import usage

    return {**usage(cfg.home().home, cfg.jobs.min_free_mb << 20), "keep_work_days": cfg.jobs.keep_work_days}


def _disk_lines(k: dict) -> list[str]:
    from jobs.disk import mb

    if k.get("free_bytes") is None:
        return [f"  {k['path']}: not made yet"]
    lines = [f"  {k['path']}: {mb(k['free_bytes'])} free of {mb(k['total_bytes'])} "
             f"(jobs.min_free_mb keeps {mb(k['min_free_bytes'])} free)" + (f"; {k['error']}" if k.get("error") else "")]
    lines += [f"  {name}: {mb(f['bytes'])} in {f['files']} file(s)" for name, f in k["folders"].items() if f["files"]]
    days = k["keep_work_days"]
    lines.append(f"  working files of finished jobs (segment audio, uploads) removed {days:g} days after they end "
                 "(jobs.keep_work_days)" if days is not None else "  working files are kept (jobs.keep_work_days: null)")
    return lines


def daemon_info(cfg: Config, timeout: float = 3.0) -> dict:
    """/health of the daemon serving this config's spool folder, if one answers."""
    from appliance.client import SOCKET_ENV, DaemonClient

    home = cfg.home().home
    tried = [os.environ[SOCKET_ENV]] if os.environ.get(SOCKET_ENV) else []
    for f in sorted(home.glob("daemon*.json")) if home.is_dir() else []:
        try:
            tried.append(json.loads(f.read_text(encoding="utf-8"))["socket"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if cfg.http_socket():
        tried.append(str(cfg.http_socket()))
    errors = []
    for path in dict.fromkeys(p for p in tried if p):
        try:
            return {"reachable": True, "socket": path,
                    "health": DaemonClient(path).read_health(timeout)}
        except TimeoutError:
            errors.append(f"{path}: took the connection, no answer within {timeout:.0f} s (starting: socket "
                          "activation and loading the model take a while; try again)")
        except Exception as exc:  # noqa: BLE001 - no daemon there: try the next place
            errors.append(f"{path}: {exc}")
    return {"reachable": False, "tried": errors or ["no socket configured"]}


def collect(s: Settings, config_path: Optional[str] = None, daemon: bool = True) -> dict:
    """The whole report of the settings `s` as plain data (see the module docstring)."""
    from engines.device.detect import device_inventory

    cfg = s.config
    return {"program": _guard(program_info, cfg, config_path), "device": _guard(device_inventory),
            "configured": {"device": cfg.model.device, "dtype": cfg.model.dtype,
                           "max_slots": cfg.runtime.max_slots, "codec": cfg.runtime.codec,
                           "threads": cfg.model.threads, "torch_threads": s.threads},
            "settings": _guard(settings_info, s),
            "model": _guard(model_info, s), "engines": _guard(engines_info, s),
            "codec_engines": _guard(codec_info, s), "paths": _guard(paths_info, cfg), "disk": _guard(disk_info, cfg),
            "daemon": _guard(daemon_info, cfg) if daemon else {"reachable": False, "tried": ["not asked"]}}


# -- text -----------------------------------------------------------------------------------------
def _join(items, limit: int = 12) -> str:
    items = list(items)
    more = f" ... (+{len(items) - limit})" if len(items) > limit else ""
    return (", ".join(str(x) for x in items[:limit]) or "-") + more


def _linear_words(e: dict) -> str:
    """An engine's decoder-layer weight format, where it is not the model's dtype (runtime.linear)."""
    fmt = e.get("linear")
    if fmt in (None, "model"):
        return ""
    return f"{fmt} decoder-layer weights ({'lossy; ' if fmt == 'int8' else ''}{e.get('linear_reason', '')}), "


def _device_lines(d: dict) -> list[str]:
    if "error" in d:
        return [f"  error: {d['error']}"]
    lines = [f"  torch {d['torch']}, CUDA {d['cuda'] or '-'}, cuDNN {d['cudnn'] or '-'}, driver {d['driver'] or '-'}, "
             f"Python {d['python']}"]
    for g in d.get("gpus", []):
        lines.append(f"  {g['device']}: {g['name']} (sm {g['capability']}), {g['memory_gib']} GiB, "
                     f"{g['free_gib'] if g['free_gib'] is not None else '?'} GiB free")
    if d.get("gpus_error"):
        lines.append(f"  GPUs: error: {d['gpus_error']}")
    if d.get("npu"):
        lines.append(f"  NPU: {d['npu'].get('device_name')} x{d['npu'].get('device_count')} "
                     f"(torch_npu {d['npu'].get('torch_npu')})")
    lines.append(f"  CPU: {d['cpu']}, {d['cpu_cores']} cores ({d['cpu_cores_usable']} usable), "
                 f"torch threads {d['torch_threads']}, {d['machine']}")
    return lines


def _jobs_lines(j: dict, engines) -> list[str]:
    """The queue workers and the inbox as `render` shows them (the batch size with 0 decided)."""
    w, i = j["worker"], j["inbox"]
    slots = sum(e.get("max_slots", 0) for e in engines) if isinstance(engines, list) else 0
    batch = w["batch_size"] or (f"{slots} (the engines' slots)" if slots else "the engines' slots")
    workers = f"{w['threads']} worker(s) in the daemon" if w["enabled"] else "no worker in the daemon (jobs.enabled)"
    inbox = (f"quiet {i['quiet_s']} s, {'polling' if i['polling'] else 'inotify'}"
             + ("" if i["enabled"] else "; the daemon does not watch it (jobs.watch)"))
    defaults = ", ".join(f"{k} {v}" for k, v in j["job_defaults"].items() if v is not None)
    return [f"  {workers}: {batch} segments in flight each, lease {w['lease_s']} s, "
            f"guard {'on' if w['guard'] else 'off'}", f"  inbox: {inbox}", f"  jobs that name none: {defaults}"]


def _paths_lines(q: dict) -> list[str]:
    """The paths, then the daemons sharing the queue (each with its spool folder)."""
    lines = [f"  {k}: {v}" for k, v in q.items() if v is not None and k != "daemons"]
    homes = {d["home"] for d in q.get("daemons", ())}
    for d in q.get("daemons", ()):
        at = f"@{d['instance']}" if d.get("instance") else ""
        lines.append(f"  daemon{at} pid {d['pid']} on {d['host']}: spool folder {d['home']}, seen {d['seen_s_ago']} s ago")
    if len(homes) > 1:
        lines.append("  the daemons sharing this queue have different spool folders (jobs.home): see docs/SCALE.md")
    return lines


def render(r: dict) -> str:
    """The report as text (what `tts-appliance info` prints)."""
    out = []

    def section(title: str, data, lines: Callable[[dict], list]):
        out.append(title)
        out.extend([f"  error: {data['error']}"] if isinstance(data, dict) and "error" in data else lines(data))

    p = r["program"]
    section("tts-appliance", p, lambda p: [f"  version {p['version']}", f"  config file: {p['config_file']}"
                                           f"{' (named)' if p['config_named'] else ''}{'' if p['config_exists'] else ' (absent)'}",
                                           f"  read: {_join(p['config_read'])}",
                                           f"  environment: {_join(p['environment'])}"])
    section("device", r["device"], _device_lines)
    c = r["configured"]
    out.append(f"configured: device {c['device']}, dtype {c['dtype']}, slots {c['max_slots']}, codec {c['codec']}, "
               f"CPU threads {c['torch_threads']} (model.threads {c['threads']})")
    section("model", r["model"], lambda m: [f"  {m['path']}", f"  kind {m['kind']} {m['size']}: {m['modes']}",
                                            f"  speakers: {_join(m['speakers'])}",
                                            f"  languages: {_join(m['languages'])}",
                                            f"  saved voices ({m['voices_dir']}): {_join(m['saved_voices'])}"])
    section("engines", r["engines"], lambda es: [
        f"  {e['error']}" if "error" in e else
        f"  {e['device']}: {e['dtype']}{', fp8 key/value cache' if e.get('kv_cache') == 'fp8' else ''}, "
        f"{_linear_words(e)}"
        f"{e['max_slots']} slots of {e['max_context']} positions ({e['slots_reason']}), "
        f"codec {e['codec']}{' in bf16' if e.get('codec_dtype') == 'bfloat16' else ''}, {e['threads']} CPU threads"
        f"{' (' + str(e['idle_threads']) + ' while the codec idles)' if e.get('idle_threads', 0) > e['threads'] else ''}"
        f"{' + ' + str(e['codec_threads']) + ' for the codec' if e.get('codec_threads') else ''}" for e in es])
    section("jobs", r["settings"], lambda j: _jobs_lines(j, r["engines"]))
    section("codec engines", r["codec_engines"], lambda k: [f"  cache {k['cache']}", *[
        f"  {b['backend']}: {'usable' if b['usable'] else 'not usable: ' + str(b['why_not'])}"
        + (f", {b['audio_s_per_s']} audio-s/s" if b.get("audio_s_per_s") else "") for b in k["built"]],
        *[f"  {name}: skipped at build: {why}" for name, why in k["skipped"].items()],
        f"  uses {k['uses']} (runtime.codec {k['runtime_codec']}): {k['why']}"])
    section("paths", r["paths"], _paths_lines)
    section("disk", r["disk"], _disk_lines)
    d = r["daemon"]
    if d.get("reachable"):
        h = d["health"]
        eng = h.get("engine", {}) if isinstance(h, dict) else {}
        queue = h.get("queue") if isinstance(h, dict) else None
        q = "" if not isinstance(queue, dict) else (", queue ok" if queue.get("ok") else
                                                    f", queue unreachable: {queue.get('error')}")
        out += ["daemon", f"  {d['socket']}: {h.get('status')}, pid {h.get('pid')}, "
                          f"slots {eng.get('active_slots')}/{eng.get('max_slots')}, streams {eng.get('streams')}{q}",
                *[f"  engine {e.get('device')}: {e.get('dtype')}, {e.get('max_slots')} slots, {e.get('frames')} frames"
                  for e in eng.get("engines", [])],
                *[f"  {name} down: {why}" for name, why in (h.get("down") or {}).items()]]
    else:
        out += ["daemon", f"  not reachable ({_join(d.get('tried', []), 3)})"]
    return "\n".join(out)
