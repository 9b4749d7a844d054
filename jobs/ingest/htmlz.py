"""calibre's HTMLZ and TXTZ: a zip of one book file (`index.html`; `index.txt`, `.md` or `.textile`), its images
and style, and a `metadata.opf` with the title, author and language.

The zip is opened through `SafeZip` (no zip bomb is expanded), the OPF through `jobs.ingest.safexml` (no entity
is expanded); the book file is read as the HTML, Markdown or plain text it is (`jobs.ingest.textfile`), and the
OPF's metadata win over what that file says.
"""
from __future__ import annotations

import logging
import posixpath
import re
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest import safexml
from jobs.ingest.safexml import local
from jobs.ingest.safezip import SafeZip
from jobs.ingest.textfile import read_text_file

log = logging.getLogger(__name__)

BOOK_FILES = {"htmlz": ((".html", ".htm", ".xhtml"), "html"),
              "txtz": ((".txt", ".text"), "txt"), "txtz-md": ((".md", ".markdown", ".textile"), "md")}
LANGUAGE_RE = re.compile(r"^[A-Za-z]{2}(?:[-_][A-Za-z0-9]{2,8})*$")  # "en", "pt-BR"; calibre's "eng" is no hint


def _book_file(z: SafeZip, fmt: str) -> tuple[str, str]:
    """The zip member holding the book, and the format it is read as."""
    kinds = [BOOK_FILES["htmlz"]] if fmt == "htmlz" else [BOOK_FILES["txtz"], BOOK_FILES["txtz-md"]]
    top = sorted(n for n in z.names if "/" not in n.strip("/"))
    for endings, read_as in kinds:
        found = [n for n in top if n.lower().endswith(endings)]
        index = [n for n in found if posixpath.splitext(n)[0].lower() == "index"]
        if index or found:
            return (index or found)[0], read_as
    what = "an HTML file (index.html)" if fmt == "htmlz" else "a text file (index.txt)"
    raise IngestError(f"The {fmt.upper()} file holds no book: {what} is missing at the top of the zip.")


def _metadata(z: SafeZip) -> dict:
    """Title, author and language from the zip's metadata.opf (None where it has none)."""
    meta: dict[str, Optional[str]] = {"title": None, "author": None, "language": None}
    name = next((n for n in sorted(z.names) if n.lower().endswith(".opf")), None)
    if name is None:
        return meta
    try:
        root = safexml.parse(z.read(name), f"{name} of the zip")
    except IngestError as exc:
        log.info("%s", exc)
        return meta
    for el in root.iter():
        tag, text = local(el.tag).lower(), " ".join("".join(el.itertext()).split())
        role = next((v for k, v in el.attrib.items() if local(k) == "role"), "aut")
        if text and tag == "title" and not meta["title"]:
            meta["title"] = text
        elif text and tag == "creator" and role == "aut" and not meta["author"]:
            meta["author"] = text
        elif text and tag == "language" and not meta["language"] and LANGUAGE_RE.match(text):
            meta["language"] = text
    return meta


def load_htmlz(data: bytes, options, fmt: str = "htmlz") -> Document:
    """Read calibre's HTMLZ (`fmt` "htmlz") or TXTZ ("txtz") held in memory into a Document."""
    z = SafeZip(data, fmt.upper(), options.max_uncompressed_bytes, options.max_compression_ratio)
    try:
        name, read_as = _book_file(z, fmt)
        doc = read_text_file(z.read(name), read_as, options)
        meta = _metadata(z)
    finally:
        z.close()
    doc.title = meta["title"] or doc.title
    doc.author = meta["author"] or doc.author
    doc.language = meta["language"] or doc.language
    doc.source_format = fmt
    return doc


def load_txtz(data: bytes, options) -> Document:
    """Read calibre's TXTZ held in memory into a Document."""
    return load_htmlz(data, options, "txtz")
