"""The messages between the daemon's front and an engine process, over one socket pair.

Every message is one `Connection.send_bytes` payload whose first byte says its kind:
- `P` + a pickled tuple: control messages, both ways (submit, cancel, feed, clone, stop; ready,
  start_failed, end, stats, cloned). Small, and rare next to audio.
- `C` + chunk records: audio, engine -> front. Each record is `<q I` (request id, samples) followed by
  that many float32 samples; one message carries every chunk the engine had ready.
"""
from __future__ import annotations

import importlib
import pickle
import struct

import numpy as np

CONTROL, CHUNKS = b"P", b"C"
_REC = struct.Struct("<qI")


def pack(*msg) -> bytes:
    return CONTROL + pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def pack_chunks(records: list) -> bytes:
    """[(request id, float32 samples)] -> one CHUNKS message."""
    parts = [CHUNKS]
    for rid, audio in records:
        a = np.ascontiguousarray(audio, dtype=np.float32)
        parts.append(_REC.pack(rid, a.size))
        parts.append(a.tobytes())
    return b"".join(parts)


def unpack(data: bytes):
    """-> ("chunks", [(rid, samples)]) or the control tuple."""
    kind, body = data[:1], memoryview(data)[1:]
    if kind == CONTROL:
        return pickle.loads(body)
    if kind != CHUNKS:
        raise ValueError(f"unknown engine message kind {kind!r}")
    out, i = [], 0
    while i < len(body):
        rid, n = _REC.unpack_from(body, i)
        i += _REC.size
        out.append((rid, np.frombuffer(body[i:i + 4 * n], dtype=np.float32).copy()))
        i += 4 * n
    return ("chunks", out)


def error_info(exc: BaseException) -> tuple[str, str, str]:
    """An exception as plain data (its class by name, its message): errors with their own constructors
    (VoiceNotFound(name, available)) do not survive pickling as objects."""
    return type(exc).__module__, type(exc).__qualname__, str(exc)


def rebuild_error(info: tuple[str, str, str]) -> BaseException:
    """The exception of `error_info`: the same class when it can be imported, else a RuntimeError."""
    module, name, message = info
    try:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, Exception):
            exc = cls.__new__(cls)
            Exception.__init__(exc, message)
            return exc
    except Exception:  # noqa: BLE001 - an unknown class: keep the message
        pass
    return RuntimeError(f"{name}: {message}")
