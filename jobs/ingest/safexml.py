"""XML of untrusted books (FB2, ODT) parsed with the stdlib, never expanding a declared entity.

Entities can only be declared in a DOCTYPE's internal subset, which comes before the root element; a first
pass over that prolog refuses any declaration (an entity bomb such as "billion laughs", or an external
entity naming a file or URL), and stops at the root element's start tag. Only then is the whole document
parsed into a tree; nothing is fetched from anywhere.
"""
from __future__ import annotations

import codecs
import re
import xml.etree.ElementTree as ET
from typing import Callable, Optional, Union
from xml.parsers import expat

from jobs.errors import IngestError


DECLARED = re.compile(rb"""^\s*<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._:-]+)["']""")
EXPAT_CODECS = {"utf-8", "utf-16", "utf-16-le", "utf-16-be", "ascii", "latin-1", "iso8859-1"}


class _RootReached(Exception):
    """The prolog is over: no entity was declared before the root element."""


class _EntityDeclared(Exception):
    pass


def _refuse(*_args) -> None:
    raise _EntityDeclared()


def _root(*_args) -> None:
    raise _RootReached()


def check_prolog(data: Union[bytes, str], what: str) -> None:
    """Raise IngestError when `data` declares an XML entity (or an unparsed entity) before its root element."""
    parser = expat.ParserCreate()
    parser.EntityDeclHandler = _refuse
    parser.UnparsedEntityDeclHandler = _refuse
    parser.StartElementHandler = _root
    try:
        parser.Parse(data, True)
    except _RootReached:
        return
    except _EntityDeclared:
        raise IngestError(f"The {what} declares XML entities (<!ENTITY>), which are never expanded here "
                          "(a possible entity bomb); save the book again without a DTD.") from None
    except (expat.ExpatError, ValueError, LookupError) as exc:
        raise IngestError(f"The {what} is not valid XML ({exc}).") from None


def parse(data: Union[bytes, str], what: str) -> ET.Element:
    """The root element of `data` (bytes as written, or decoded text); IngestError for an entity declaration
    or a document that is not well-formed XML, naming `what` ("FB2 file", "ODT file's content.xml")."""
    data = _decoded(data, what)
    check_prolog(data, what)
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise IngestError(f"The {what} is not valid XML ({exc}); it is damaged or truncated.") from None


def _decoded(data: Union[bytes, str], what: str) -> Union[bytes, str]:
    """Bytes in a multi-byte legacy encoding expat cannot read (GBK, Shift_JIS, Big5 ...), decoded here;
    anything else as it was (expat reads UTF-8/16 and single-byte code pages such as windows-1251)."""
    m = DECLARED.match(data[:512]) if isinstance(data, bytes) else None
    if m is None:
        return data
    try:
        info = codecs.lookup(m.group(1).decode("ascii"))
    except LookupError:
        raise IngestError(f"The {what} declares an unknown text encoding {m.group(1).decode('ascii')!r}; "
                          "save it as UTF-8.") from None
    if info.name in EXPAT_CODECS or len("\u4e2d\uac00".encode(info.name, "ignore")) <= 1:
        return data  # a single-byte code page: expat maps it itself
    return data.decode(info.name, errors="replace")


def local(tag) -> str:
    """An element's name without its namespace."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def inline_text(el: ET.Element, instead: Callable[[ET.Element], Optional[str]]) -> str:
    """The text of `el` and all inside it in document order, white space collapsed, read without recursion
    (however deep the nesting); `instead(child)` gives the text to put in place of a child (its tail is still
    read), or None to read the child itself."""
    parts: list[str] = [el.text or ""]
    stack = [(iter(el), "")]  # (children still to read, the tail that follows them)
    while stack:
        child = next(stack[-1][0], None)
        if child is None:
            parts.append(stack.pop()[1])
            continue
        text = instead(child)
        if text is None:
            parts.append(child.text or "")
            stack.append((iter(child), child.tail or ""))
        else:
            parts += (text, child.tail or "")
    return " ".join("".join(parts).split())
