"""Names of the temp files our writers use, and whether the process that wrote one still runs.

A file is written under a hidden temp name beside its final name and renamed into place when complete
(jobs.assemble.atomic_path, StreamedFile): `.{stem}.{random}.{writer}.tmp{suffix}`. `writer` is
`{host}-{pid}-{start}`: a digest of the host (jobs.queue.holders.host_key), the writer's process id and
a digest of its start (boot id and start time), the identity that leases record. A process killed while
writing leaves its temp file; `writer_state` tells from the name alone whether its writer is a live
process of this host, a dead one, or unknown (another host's, or a name from before writers were named:
`.{stem}.{random}.tmp{suffix}`). jobs.leftovers removes what is left behind.
"""
from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Optional

from jobs.queue import holders

TEMP_NAME = re.compile(r"^\..*\.[0-9a-f]{8}(?:\.(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-(?P<start>[0-9a-f]{6}))?"
                       r"\.tmp(?:\.[^./]+)?$")
_tags: dict[int, str] = {}  # pid -> its writer tag (a forked child has another pid: its own tag)


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:6]


def writer_tag() -> str:
    """`{host}-{pid}-{start}` of this process."""
    pid = os.getpid()
    tag = _tags.get(pid)
    if tag is None:
        tag = _tags[pid] = f"{_digest(holders.host_key())}-{pid}-{_digest(holders.start_token(pid) or '')}"
    return tag


def temp_path(final: Path) -> Path:
    """A hidden temp name beside `final`, keeping its suffix and naming this process as its writer."""
    return final.parent / f".{final.stem}.{uuid.uuid4().hex[:8]}.{writer_tag()}.tmp{final.suffix}"


def is_temp(name: str) -> bool:
    """Whether `name` is one of our temp names (of this version or an older one)."""
    return TEMP_NAME.match(name) is not None


def writer_state(name: str) -> Optional[str]:
    """"live" or "dead" for a temp file written by a process of this host, "unknown" for another host's
    or an unnamed writer's, None for a name that is not one of our temp names."""
    m = TEMP_NAME.match(name)
    if m is None:
        return None
    if m["host"] is None or m["host"] != _digest(holders.host_key()):
        return "unknown"
    pid = int(m["pid"])
    token = holders.start_token(pid)
    if token is None:  # no such process, or /proc hides it (holders.alive asks the kernel)
        return "live" if holders.alive(pid, None) else "dead"
    return "live" if _digest(token) == m["start"] and holders.alive(pid, token) else "dead"
