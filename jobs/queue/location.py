"""Where a queue lives (`jobs.queue`, `jobs.queue_file`): the one parser of the value, and the one mask
that keeps the database password out of every log line, error, report and status text (`redact`).

A PostgreSQL URL is `postgresql://[user[:password]@]host[:port][,host[:port]...][/database][?key=value&...]`
(or `postgres://`, scheme in any case). What it accepts beyond the strict form, and what it refuses:

- the user part runs up to the URL's *last* `@` (the usual rule), so a password may hold `@`, `/`,
  `?`, `#`, `:` or spaces as they are; an `@` inside a query parameter must then be written `%40`;
- `%` followed by two hex digits is a percent-encoded character anywhere; any other `%` is an error
  (write it `%25`): it is what the database library would choke on, quoting the password;
- a port is a number (a missing `@` turns `user:password/db` into host `user`, port `password`).

The URL handed on (`parse_location`'s result) has its user name and password percent-encoded, so the
database library reads exactly the characters written. Every password seen while parsing is also
remembered by this process (its raw, decoded and encoded forms), so `redact` hides it in any text,
whatever shape a message gives it.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path
from urllib.parse import quote, unquote

POSTGRES_SCHEMES = ("postgresql", "postgres")
HOW = ("write it as postgresql://user:password@host[:port]/database with reserved characters percent-encoded "
       "('%' as %25, '@' as %40, '/' as %2F), or leave the password out of the URL and put it in the service "
       "user's ~/.pgpass (docs/SCALE.md)")
MASK = "***"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_HOST = re.compile(r"(\[[^\]]*\]|[^:\[\]\s]*)(:\d*)?")  # host or [IPv6 address], then a numeric port
_SAFE = "!$&'()*+,;="  # RFC 3986 sub-delims: kept as they are in a user name or password
_MIN_LITERAL = 4  # shorter remembered passwords are hidden by their place in a URL only (not in any text)
_secrets: set[str] = set()
_lock = threading.Lock()


def is_url(location) -> bool:
    """Whether `location` (as `parse_location` returns it) names a PostgreSQL database."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def _remember(*secrets: str) -> None:
    """Hide these (and their percent-decoded and -encoded forms) in every later `redact`."""
    forms = set()
    for s in secrets:
        forms.update((s, unquote(s), quote(unquote(s), safe=_SAFE)))
    with _lock:
        _secrets.update(f for f in forms if len(f) >= _MIN_LITERAL)


def _hide_userinfo(token: str) -> str:
    """`token` (one URL, or one word of a message) with what lies between the first `:` of its user part
    and its last `@` masked; a port that is no number masked too (a password where the host should be)."""
    head, at, tail = token.rpartition("@")
    start = (head if at else token).find("://")
    start = start + 3 if start >= 0 else 0
    if at:
        colon = head.find(":", start)
        return token if colon < 0 else f"{head[:colon + 1]}{MASK}{at}{tail}"
    if not start:
        return token
    hosts, rest = re.match(r"([^/?]*)(.*)", token[start:], re.S).groups()
    shown = ",".join(h if _HOST.fullmatch(h) else f"{h.split(':')[0]}:{MASK}" for h in hosts.split(","))
    return token[:start] + shown + rest


def redact(text: str) -> str:
    """`text` (a database URL, or a message quoting one) fit for logs, errors and reports: every password
    this process has parsed, in any form; in every word with an `@` what lies between the first `:` of
    its user part and its last `@` (`postgresql://tts:***@db/tts`, a mistyped URL too); a URL's port
    that is no number (a password where the host belongs); and `password=` parameters become `***`."""
    text = str(text)
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for s in known:
        text = text.replace(s, MASK)
    text = re.sub(r"[^\s'\"]*[:@][^\s'\"]*", lambda m: _hide_userinfo(m.group(0)), text)
    return re.sub(r"(?i)(\bpassword=)[^\s&'\"]*", r"\1" + MASK, text)


def _shown(value: str) -> str:
    """One configured value as an error quotes it: masked as a whole (a password may hold spaces)."""
    value = re.sub(r"(?i)(\bpassword=)[^&]*", r"\1" + MASK, value)
    return redact(_hide_userinfo(value))


def _postgres(name: str, body: str) -> str:
    """`name://body` checked and with its user part percent-encoded (see the module docstring)."""
    userinfo, at, hostpart = body.rpartition("@")
    user, colon, password = userinfo.partition(":")
    query = re.findall(r"(?i)(?:^|[?&])password=([^&]*)", hostpart)
    _remember(*([password] if colon else []), *query)
    hosts, tail = re.match(r"([^/?]*)(.*)", hostpart, re.S).groups()
    shown = _shown(f"{name}://{body}")
    for part, text in (("user name", user), ("password", password), ("database name or parameters", tail)):
        if _BAD_ESCAPE.search(text):
            raise ValueError(f"jobs.queue = {shown!r}: the {part} holds a '%' not followed by two hex digits; {HOW}")
    if not all(_HOST.fullmatch(h) for h in hosts.split(",")):
        raise ValueError(f"jobs.queue = {shown!r}: the host part is no list of host[:port] (a port is a number; "
                         f"a password goes between 'user:' and the '@'); {HOW}")
    tail = re.sub(r"\s", lambda m: quote(m.group(0)), tail)  # the library refuses spaces as they are
    if not at:
        return f"{name}://{hosts}{tail}"
    userinfo = quote(unquote(user), safe=_SAFE) + (":" + quote(unquote(password), safe=_SAFE) if colon else "")
    return f"{name}://{userinfo}@{hosts}{tail}"


def parse_location(value: str | Path) -> str | Path:
    """The queue `jobs.queue` names, strictly: a `postgresql://` or `postgres://` URL (scheme in any
    case; returned in lower case, its user part percent-encoded) or the absolute path of a SQLite file
    (`~` expanded). Anything else (`postgresql:/db`, `postgresql+psycopg://...`, `mysql://...`, a
    relative path, a malformed URL) raises ValueError in one line naming the key, the password masked:
    a typo must not become a private SQLite file named after the URL. A `Path` is taken as given (code,
    not an admin, chose it)."""
    if isinstance(value, Path):
        return value
    text = str(value).strip()
    scheme = _SCHEME.match(text)
    if scheme:
        name, rest = scheme.group(1).lower(), text[scheme.end():]
        if name in POSTGRES_SCHEMES and rest.startswith("//"):
            return _postgres(name, rest[2:])
        form = "postgresql://user@host[:port]/database"
        if name in POSTGRES_SCHEMES:
            raise ValueError(f"jobs.queue = {_shown(text)!r}: a PostgreSQL queue is a URL of the form {form}")
        raise ValueError(f"jobs.queue = {_shown(text)!r}: unknown scheme {scheme.group(1)!r}; give {form} "
                         "(PostgreSQL), the absolute path of a SQLite file, or nothing (HOME/queue.db)")
    path = Path(text).expanduser()
    if not text or not path.is_absolute():
        raise ValueError(f"jobs.queue = {_shown(text)!r}: a SQLite queue is an absolute file path (leave jobs.queue "
                         "unset for HOME/queue.db); a PostgreSQL queue is a postgresql://user@host/database URL")
    return path


def read_location_file(path: str | Path) -> str | Path:
    """The queue named by the first line of `path` (jobs.queue_file: a file only the service reads,
    e.g. a systemd credential), parsed as `parse_location` does."""
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as f:
            line = f.readline().strip()
    except OSError as exc:
        raise ValueError(f"jobs.queue_file = {str(path)!r}: cannot read it ({exc.strerror}); it holds the queue "
                         "URL and must be readable by the service (e.g. mode 0640, group tts-appliance)") from None
    try:
        return parse_location(line)
    except ValueError as exc:
        raise ValueError(f"jobs.queue_file = {str(path)!r}: {exc}") from None
