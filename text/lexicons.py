"""Where pronunciation lexicons come from (the matching rules: `text.normalize.lexicon`).

    file_lexicon("words.yaml")           the file of jobs.lexicon, read again only when it changes
    lexicon_entries(value, "spec")       a job's or request's own entries, checked: {"word": "say it"}
    merged(file, entries)                the file's entries with the job's or request's on top

Jobs store their entries (the file's and their own) in their spec, so a job is spoken the same way
whenever it runs; streamed requests (speech API, live route, Wyoming) read the file as it is now.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

from text.normalize.lexicon import Lexicon, LexiconError

_cache: dict = {}  # resolved path -> ((mtime_ns, size), Lexicon)
_lock = threading.Lock()


def file_lexicon(path: Optional[str]) -> Lexicon:
    """The lexicon of the YAML file at `path` (None: an empty one); LexiconError when it cannot be read."""
    if not path:
        return Lexicon()
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise LexiconError(f"jobs.lexicon: cannot read {p}: {exc.strerror}") from None
    key, version = str(p.resolve()), (st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _cache.get(key)
        if hit and hit[0] == version:
            return hit[1]
    lex = Lexicon.load(p)
    with _lock:
        _cache[key] = (version, lex)
    return lex


def lexicon_entries(value, what: str) -> dict:
    """`value` as lexicon entries: a mapping of word or phrase -> replacement, both text (None: none);
    LexiconError naming `what` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise LexiconError(f"{what}: 'lexicon' must map words to what to say instead, e.g. "
                           '{"Qwen": "chwen", "nginx": "engine x"}')
    return value


def merged(file: Lexicon, entries: Optional[dict]) -> Lexicon:
    """`file`'s entries with `entries` on top (they win on the same word)."""
    return file.merge(Lexicon(entries)) if entries else file
