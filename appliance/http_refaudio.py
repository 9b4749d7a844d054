"""Reference audio of a request (`ref_audio`: voice cloning on Base checkpoints), in every form the peers'
clients send it, as a file the engine reads:

    base64 of the audio file                 "UklGR..." (what the OpenAI-style clients of this API send)
    a data URL                               "data:audio/wav;base64,UklGR..." (vllm-omni's clients)
    a file on this machine                   "/srv/voices/me.wav", "file:///srv/voices/me.wav", or a name
                                             relative to the voices folder ("me.wav"): only inside the voices
                                             folder (model.voices_dir, else HOME/voices) or jobs.allowed_dirs
    an internet URL (http, https, ...)       refused: the appliance is offline

Anything else is refused with 400 (403 for a file outside those folders) and a message saying what to send.
"""
from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

from appliance.http_common import ApiError

OFFLINE = ("the appliance is offline: send the audio as base64 or a data URL, or put the file in the voices "
           "folder")
PATH_MAX = 4096  # longer strings are never file paths: base64


def allowed_roots(ctx) -> list[Path]:
    """The folders a request may name reference audio in: the voices folder, then jobs.allowed_dirs."""
    roots = [Path(ctx.settings.voices_dir)] + [Path(d) for d in ctx.cfg.jobs.allowed_dirs]
    return [r.expanduser().resolve() for r in roots]


def reference_audio(ctx, raw, tmpdir: Path, name: str = "ref_audio") -> Optional[str]:
    """The path of the audio `raw` (the request's `ref_audio`) names or carries; None when absent. Audio sent
    in the request is written into `tmpdir`."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise ApiError(400, f"'{name}' must be one string: base64 audio, a data URL (data:audio/wav;base64,...) "
                            "or a file in the voices folder")
    text = raw.strip()
    scheme = urlsplit(text[:64]).scheme.lower() if ":" in text[:64] else ""
    if scheme == "data":
        head, comma, body = text.partition(",")
        if not comma or not head.lower().endswith(";base64"):
            raise ApiError(400, f"'{name}': a data URL must carry base64 audio (data:audio/wav;base64,...)")
        return _write(_decode(body, name), tmpdir)
    if scheme == "file":
        return str(_inside(ctx, unquote(urlsplit(text).path), name))
    if len(scheme) > 1 and "//" in text[:len(scheme) + 3]:  # http://, https://, ftp://, s3:// ...
        raise ApiError(400, f"'{name}' is a {scheme} URL; {OFFLINE}")
    if len(text) <= PATH_MAX and _looks_like_path(text):
        return str(_inside(ctx, text, name))
    return _write(_decode(text, name), tmpdir)


def _looks_like_path(text: str) -> bool:
    """A file name rather than base64: it starts with "/" (not "//", how an MP3 frame's base64 begins), "~"
    or ".", or holds a character base64 has not ("." of an extension, "\\", a space)."""
    if text.startswith(("~", ".")) or text.startswith("/") and not text.startswith("//"):
        return True
    return any(c in text for c in ".\\ ")


def _decode(text: str, name: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"'{name}' is neither base64 audio nor a data URL (data:audio/wav;base64,...) nor "
                            "a file in the voices folder") from None


def _write(blob: bytes, tmpdir: Path) -> str:
    path = tmpdir / "ref_audio"
    path.write_bytes(blob)
    return str(path)


def _inside(ctx, raw: str, name: str) -> Path:
    """`raw` (absolute, or relative to the voices folder) resolved, links followed: 403 outside the allowed
    folders, 400 when no such file."""
    roots = allowed_roots(ctx)
    path = Path(raw).expanduser()
    path = (path if path.is_absolute() else roots[0] / path).resolve()
    if not any(path == r or r in path.parents for r in roots):
        raise ApiError(403, f"'{name}' {raw!r} is outside the voices folder ({roots[0]}) and jobs.allowed_dirs: "
                            "put the file there, or send the audio as base64 or a data URL", "forbidden")
    if not path.is_file():
        raise ApiError(400, f"'{name}': no file {raw!r} in the voices folder ({roots[0]}) or jobs.allowed_dirs")
    return path
