"""An audio file encoded in a process of its own: `ProcessEncoder`, the `audio.encode.SoundFileEncoder` formats
(wav, flac, ogg, opus, mp3) written by a child process that gets the audio through a pipe.

    enc = ProcessEncoder(path, sample_rate, fmt, tags)     # the child starts (EncodeError: a format not written here)
    enc.write(audio); ...                                  # float32 blocks (or `write_raw(bytes)` of float32)
    codec = enc.close(chapters)                            # or enc.abort(): the child stops, the file stays as is

Why: a book's file is the whole book encoded once more after its chapters, on one thread. In the daemon that
thread shares the interpreter with the queue worker, the chapter writers and the engines' readers, and ran at
about half of what the encoder does alone: on a book synthesized at ~1,900 audio-s/s (two GPUs) it finished
9 s after the last segment. In a process of its own the encoder has a core to itself.

The pipe carries messages: one byte of kind, eight of length (little-endian), the payload. b"a": float32
samples; b"c": the chapter marks as JSON, then the child closes the file and prints the codec. A child that
fails says why on its standard error in one line (`EncodeError` here); one whose parent goes away stops.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from audio.encode import EncodeError, soundfile_format

AUDIO, CLOSE = b"a", b"c"
HEAD = 9  # kind (1) + length (8)


def _root() -> str:
    """The folder `audio` is imported from, so the child runs the same code whatever the working folder."""
    return str(Path(__file__).resolve().parent.parent)


class ProcessEncoder:
    """`SoundFileEncoder`'s interface (write, close -> codec, abort) with the encoding in a child process."""

    def __init__(self, path: str | Path, sample_rate: int, fmt: str, tags: dict):
        self.path = Path(path)
        self.codec = soundfile_format(fmt, sample_rate)[1]  # (a format this machine cannot write fails here)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_root(), env.get("PYTHONPATH")) if p)
        args = json.dumps({"path": str(self.path), "sample_rate": int(sample_rate), "fmt": fmt, "tags": tags})
        self.proc = subprocess.Popen([sys.executable, "-m", "audio.encode_process", args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def _send(self, kind: bytes, payload: bytes) -> None:
        try:
            self.proc.stdin.write(kind + len(payload).to_bytes(8, "little"))
            self.proc.stdin.write(payload)
        except (BrokenPipeError, ValueError):  # the child ended: it says why
            raise self._failure() from None

    def _failure(self) -> EncodeError:
        _, err = self._finish()
        line = err.decode("utf-8", "replace").strip().splitlines()
        return EncodeError(f"encoding {self.path.name}: {line[-1] if line else f'the encoder exited ({self.proc.returncode})'}")

    def write(self, audio: np.ndarray) -> None:
        self.write_raw(np.asarray(audio, dtype=np.float32).reshape(-1).tobytes())

    def write_raw(self, data: bytes) -> None:
        """float32 samples as bytes (a spool's, without a copy through numpy)."""
        if data:
            self._send(AUDIO, data)

    def close(self, chapters: Sequence[tuple[str, float, float]] = ()) -> str:
        self._send(CLOSE, json.dumps([list(c) for c in chapters]).encode())
        out, err = self._finish()
        if self.proc.returncode != 0:
            line = err.decode("utf-8", "replace").strip().splitlines()
            raise EncodeError(f"encoding {self.path.name}: {line[-1] if line else f'exit {self.proc.returncode}'}")
        return out.decode().strip()

    def abort(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._finish()

    def _finish(self) -> tuple[bytes, bytes]:
        """Close the pipe (the child ends) and wait -> what it printed (stdout, stderr)."""
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):  # (what was still buffered had nowhere to go)
            pass
        out, err = self.proc.stdout.read(), self.proc.stderr.read()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return out, err


def _read(stream, n: int) -> bytes:
    parts, left = [], n
    while left:
        b = stream.read(left)
        if not b:
            raise EOFError
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def main(argv: list[str]) -> int:
    from audio.encode import SoundFileEncoder

    args = json.loads(argv[1])
    inp = sys.stdin.buffer
    try:
        enc = SoundFileEncoder(args["path"], args["sample_rate"], args["fmt"], args["tags"])
    except Exception as exc:  # noqa: BLE001 - said in one line to the parent
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    try:
        while True:
            head = _read(inp, HEAD)
            payload = _read(inp, int.from_bytes(head[1:], "little"))
            if head[:1] == AUDIO:
                enc.write(np.frombuffer(payload, dtype=np.float32))
            else:
                print(enc.close([tuple(c) for c in json.loads(payload)]))
                return 0
    except EOFError:  # the parent went away (or aborted): nothing more to write
        enc.abort()
        return 1
    except Exception as exc:  # noqa: BLE001 - said in one line to the parent (a full disk: "System error.")
        enc.abort()
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
