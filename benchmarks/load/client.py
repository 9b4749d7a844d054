"""Client side of the open-loop load benchmark (benchmarks/load.py): raw HTTP/1.1 over asyncio, one
connection per request, on the daemon's Unix socket or loopback TCP.

`stream_speech` sends one streaming `POST /v1/audio/speech` (pcm) and times it from the client's
side with `time.perf_counter()`: when the request was written, when the first body byte and the
first non-silent sample arrived, every read's arrival (for the playback-underrun check), when the
response ended. `http_request` is a small non-streaming call for /health, /v1/voices and /v1/jobs.
No third-party HTTP client: nothing between the socket and the clock.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

import numpy as np

from benchmarks.load.stats import BYTES_PER_SAMPLE, playback_deficit

READ_SIZE = 1 << 16
HEAD_LIMIT = 1 << 16


class ProtocolError(Exception):
    """The server's answer is not the HTTP we expect."""


@dataclass(frozen=True)
class Target:
    """Where the daemon listens: a Unix socket path, or host and port (TCP)."""

    socket: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = None

    @staticmethod
    def from_url(url: str) -> "Target":
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"--url must look like http://127.0.0.1:8732, got {url!r}")
        return Target(host=u.hostname, port=u.port or 80)

    def describe(self) -> str:
        return "unix socket" if self.socket else f"tcp {self.host}:{self.port}"

    async def connect(self):
        if self.socket:
            return await asyncio.open_unix_connection(self.socket, limit=HEAD_LIMIT)
        return await asyncio.open_connection(self.host, self.port, limit=HEAD_LIMIT)


def _request_bytes(method: str, path: str, body: bytes, content_type: Optional[str]) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return (head + "\r\n").encode("latin-1") + body


async def _read_head(reader) -> tuple[int, dict]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        raise ConnectionResetError("the server closed the connection before answering") from exc
    except asyncio.LimitOverrunError as exc:
        raise ProtocolError("response headers too long") from exc
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _body_pieces(reader, headers: dict):
    """Yield the response body as it arrives (chunked, Content-Length or until EOF); each piece is
    what one read returned. Raises ConnectionResetError if the body stops short."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise ConnectionResetError("the stream ended inside a chunk header")
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return
            left = size
            while left:
                data = await reader.read(min(left, READ_SIZE))
                if not data:
                    raise ConnectionResetError("the server closed the stream inside a chunk")
                left -= len(data)
                yield data
            if await reader.readexactly(2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            data = await reader.read(min(left, READ_SIZE))
            if not data:
                raise ConnectionResetError("the server closed the connection before the whole body")
            left -= len(data)
            yield data
    else:
        while data := await reader.read(READ_SIZE):
            yield data


async def http_request(target: Target, method: str, path: str, body=None, content_type: Optional[str] = None,
                       timeout: float = 30.0) -> tuple[int, dict, object]:
    """One plain request -> (status, headers, body): JSON bodies decoded, others as bytes."""
    if isinstance(body, (dict, list)):
        body, content_type = json.dumps(body).encode(), "application/json"

    async def go():
        reader, writer = await target.connect()
        try:
            writer.write(_request_bytes(method, path, body or b"", content_type))
            await writer.drain()
            status, headers = await _read_head(reader)
            data = b"".join([piece async for piece in _body_pieces(reader, headers)])
        finally:
            writer.close()
        if headers.get("content-type", "").startswith("application/json"):
            try:
                return status, headers, json.loads(data)
            except ValueError:
                pass
        return status, headers, data

    return await asyncio.wait_for(go(), timeout)


async def engine_stats(target: Target) -> dict:
    """The engine's counters from GET /health (frames, graphs, ...), or {"error": why}."""
    try:
        status, _, h = await http_request(target, "GET", "/health", timeout=10.0)
    except (OSError, asyncio.TimeoutError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return (h.get("engine") or {}) if status == 200 and isinstance(h, dict) else {"error": f"HTTP {status}"}


def multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    """multipart/form-data body: `fields` {name: str}, `files` {name: (filename, bytes, content type)}."""
    boundary = "tts-load-" + uuid.uuid4().hex
    out = bytearray()
    for name, value in fields.items():
        extra = "Content-Type: application/json\r\n" if name == "spec" else ""
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n{extra}\r\n"
                f"{value}\r\n").encode()
    for name, (filename, data, ctype) in files.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                f"Content-Type: {ctype}\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


class FirstLoud:
    """Finds the first sample whose magnitude exceeds `threshold` (int16 units) across reads that may
    split a sample in two."""

    def __init__(self, threshold: int):
        self.threshold, self.tail, self.found = threshold, b"", False

    def feed(self, data: bytes) -> bool:
        if self.found:
            return True
        buf = self.tail + data
        usable = len(buf) - len(buf) % BYTES_PER_SAMPLE
        self.tail = buf[usable:]
        if usable:
            x = np.frombuffer(buf[:usable], dtype="<i2")
            self.found = bool(np.any(np.abs(x.astype(np.int32)) > self.threshold))
        return self.found


async def stream_speech(target: Target, payload: dict, timeout: float, threshold: int, rec: Optional[dict] = None,
                        first_byte: Optional[asyncio.Event] = None) -> dict:
    """One streaming speech request, measured, into the record `rec` (a new dict if None; filled in
    place, so a caller that cancels the task still holds it) which it returns:

    t_send (perf_counter when the request bytes were handed to the socket), status, error (None,
    'http_<status>', 'timeout', 'connect', 'truncated', 'protocol', 'incomplete' when cancelled),
    completed (200 and the whole body), ttfb_s / ttfa_s / e2e_s from t_send to the first body byte /
    first non-silent sample / end of the response, bytes, samples, sample_rate, underrun and
    deficit_s (benchmarks.load.stats.playback_deficit over the reads' arrival times).
    """
    rec = {} if rec is None else rec
    rec.update({"t_send": None, "status": None, "error": None, "completed": False, "ttfb_s": None, "ttfa_s": None,
                "e2e_s": None, "bytes": 0, "samples": 0, "sample_rate": None, "underrun": None, "deficit_s": None})
    body = json.dumps(payload).encode()
    events: list[tuple[float, int]] = []
    writer = None

    async def go():
        nonlocal writer
        try:
            reader, writer = await target.connect()
        except (ConnectionError, FileNotFoundError, OSError) as exc:
            rec["error"], rec["detail"] = "connect", f"{type(exc).__name__}: {exc}"
            return
        writer.write(_request_bytes("POST", "/v1/audio/speech", body, "application/json"))
        await writer.drain()
        t0 = rec["t_send"] = time.perf_counter()
        status, headers = await _read_head(reader)
        rec["status"] = status
        if status != 200:
            data = b"".join([p async for p in _body_pieces(reader, headers)])
            rec["error"] = f"http_{status}"
            rec["detail"] = data[:300].decode("utf-8", "replace")
            return
        sr = int(headers.get("x-sample-rate", "24000"))
        rec["sample_rate"] = sr
        loud, total = FirstLoud(threshold), 0
        async for data in _body_pieces(reader, headers):
            now = time.perf_counter()
            if rec["ttfb_s"] is None:
                rec["ttfb_s"] = now - t0
                if first_byte is not None:
                    first_byte.set()
            total += len(data)
            events.append((now, total))
            if rec["ttfa_s"] is None and loud.feed(data):
                rec["ttfa_s"] = now - t0
        end = time.perf_counter()
        if events:
            events.append((end, total))
        rec.update(completed=True, e2e_s=end - t0, bytes=total, samples=total // BYTES_PER_SAMPLE)
        if events:
            rec["deficit_s"] = playback_deficit(events, sr * BYTES_PER_SAMPLE)
            rec["underrun"] = rec["deficit_s"] > 0.0
        if total % BYTES_PER_SAMPLE:
            rec["detail"] = f"odd body length {total}"

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        rec["error"] = "timeout"
    except asyncio.CancelledError:
        rec["error"] = "incomplete"
        raise
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        rec["error"], rec["detail"] = "truncated", f"{type(exc).__name__}: {exc}"
    except ProtocolError as exc:
        rec["error"], rec["detail"] = "protocol", str(exc)
    except OSError as exc:
        rec["error"], rec["detail"] = "connect" if rec["t_send"] is None else "truncated", f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
        if first_byte is not None:
            first_byte.set()  # waiters go on whatever happened
    if not rec["completed"] and rec["error"] is None:
        rec["error"] = "protocol"
    return rec
