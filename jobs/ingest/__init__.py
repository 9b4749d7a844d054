"""Reading user files into a :class:`jobs.document.Document` (chapters of paragraphs).

Entry point: :func:`load_document`. Supported inputs: plain text (any common
encoding), Markdown, HTML, EPUB, DOCX, PDF (text layer, via ``pypdf``), MOBI/AZW3
(Kindle, without DRM), ODT, RTF, FB2 (also .fb2.zip) and calibre's HTMLZ and TXTZ.
Anything else is sniffed: text is read as plain text, binaries are refused.
The user's file is only ever opened for reading.

Every problem with the input raises :class:`jobs.errors.IngestError` with a
message that can be shown to the user as-is.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest.decode import sniff_binary
from jobs.ingest.textfile import read_text_file
from jobs.ingest.titlepage import take_title_page

log = logging.getLogger(__name__)

TEXT_EXT = {".txt", ".text", ".asc", ".rst", ".log", ""}
MD_EXT = {".md", ".markdown", ".mdown", ".mkd", ".mkdn"}
HTML_EXT = {".html", ".htm", ".xhtml", ".xht"}
MOBI_EXT = {".mobi", ".azw", ".azw3", ".prc"}  # Kindle / Mobipocket (PalmDB); KF8 inside for AZW3
FB2_EXT = {".fb2", ".fb2.zip"}
ZIPPED_EXT = {".htmlz": "htmlz", ".txtz": "txtz"}  # calibre's zip of one HTML or text file and its metadata.opf
FORMATS = ("txt", "md", "html", "epub", "docx", "pdf", "mobi", "odt", "rtf", "fb2", "htmlz", "txtz")
READ_SUFFIXES = (TEXT_EXT - {""}) | MD_EXT | HTML_EXT | MOBI_EXT | FB2_EXT | set(ZIPPED_EXT) | {
    ".epub", ".docx", ".pdf", ".odt", ".rtf"}  # names read by their ending
MAX_FILE_MB = 50  # default of the config's jobs.max_file_mb


@dataclass
class IngestOptions:
    """How to read a document.

    max_bytes: refuse files larger than this (checked before reading; jobs.max_file_mb).
    skip_toc: drop a table of contents.  skip_front_matter: drop copyright page,
    dedication etc. before the first chapter.  skip_footnotes: drop footnote
    markers and footnote blocks.  allowed_roots: if set, the (symlink-resolved)
    path must lie under one of these directories.  The zip limits guard EPUB, DOCX,
    ODT and .fb2.zip against zip bombs (max_uncompressed_bytes also caps a MOBI's
    decompressed text).  format: force one of FORMATS ("txt", "md", "html", "epub",
    "docx", "pdf", "mobi" (also AZW3), "odt", "rtf", "fb2", "htmlz", "txtz") instead of guessing.
    encoding: force a text encoding.
    """

    max_bytes: int = MAX_FILE_MB << 20
    skip_toc: bool = True
    skip_front_matter: bool = False
    skip_footnotes: bool = True
    allowed_roots: Optional[list[Path]] = None
    max_uncompressed_bytes: int = 300 * 1024 * 1024
    max_compression_ratio: float = 100.0
    format: Optional[str] = None
    encoding: Optional[str] = None


def _check_path(path: Union[str, Path], options: IngestOptions) -> Path:
    raw = Path(path).expanduser()
    try:
        resolved = raw.resolve(strict=True)
    except FileNotFoundError:
        raise IngestError(f"File not found: {raw}") from None
    except (OSError, RuntimeError) as exc:
        raise IngestError(f"Cannot access {raw}: {exc}") from None
    if options.allowed_roots is not None:
        roots = [Path(r).expanduser().resolve() for r in options.allowed_roots]
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise IngestError(f"{raw} is outside the allowed input folders; refusing to read it.")
    if resolved.is_dir():
        raise IngestError(f"{raw} is a folder, not a file.")
    if not resolved.is_file():
        raise IngestError(f"{raw} is not a regular file.")
    return resolved


def too_large(size: int, max_bytes: int) -> str:
    """The message for a document over the size limit, naming the setting to raise."""
    return (f"The file is too large ({size / 2**20:.1f} MiB); documents are read up to {max_bytes / 2**20:g} MiB: "
            "raise jobs.max_file_mb in the config, or split the file.")


def _read(path: Path, options: IngestOptions) -> bytes:
    size = path.stat().st_size
    if size > options.max_bytes:
        raise IngestError(too_large(size, options.max_bytes))
    try:
        with open(path, "rb") as fh:
            data = fh.read(options.max_bytes + 1)
    except PermissionError:
        raise IngestError(f"Permission denied reading {path}.") from None
    except OSError as exc:
        raise IngestError(f"Cannot read {path}: {exc}") from None
    if len(data) > options.max_bytes:  # grew while we looked
        raise IngestError(too_large(len(data), options.max_bytes))
    if not data:
        raise IngestError("The file is empty.")
    return data


def guess_format(path: Path, data: bytes) -> str:
    """The document format of `path` (one of FORMATS) from its extension, else from `data` (its bytes, or
    its head and tail); an unsupported kind raises IngestError."""
    ext = path.suffix.lower()
    by_ending = {".epub": "epub", ".docx": "docx", ".pdf": "pdf", ".odt": "odt", ".rtf": "rtf", ".fb2": "fb2",
                 **ZIPPED_EXT}
    if ext in by_ending:
        return by_ending[ext]
    if path.name.lower().endswith(".fb2.zip"):
        return "fb2"
    if ext in MOBI_EXT:
        return "mobi"
    if ext in MD_EXT:
        return "md"
    if ext in HTML_EXT:
        return "html"
    if ext in (".doc", ".pages", ".kfx"):
        raise IngestError(f"{ext} files are not supported; convert the document to EPUB, DOCX or plain text.")
    if ext in TEXT_EXT:
        return "txt"
    return _sniff(data)


def _sniff(data: bytes) -> str:
    """The format of a file whose name says nothing, from its bytes."""
    if data.startswith(b"PK\x03\x04"):
        head = data[:200]
        if b"mimetypeapplication/epub+zip" in head:
            return "epub"
        if b"mimetypeapplication/vnd.oasis.opendocument.text" in head:
            return "odt"
        if b"word/" in data[-65536:] or b"[Content_Types].xml" in head:
            return "docx"
        name_len = int.from_bytes(data[26:28], "little")
        if data[30:30 + name_len].lower().endswith(b".fb2"):
            return "fb2"
        if b"metadata.opf" in data[-65536:]:  # calibre's HTMLZ / TXTZ (the central directory names the members)
            return "htmlz" if b"index.html" in data[-65536:] else "txtz"
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data[60:68] in (b"BOOKMOBI", b"TEXtREAd"):
        return "mobi"
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{\\rtf"):
        return "rtf"
    what = sniff_binary(data)
    if what:
        raise IngestError(f"The file looks like a binary file ({what}), not a document this appliance can read.")
    head = data[:2048].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith(b"<?xml") and b"<fictionbook" in head:
        return "fb2"
    if head.startswith((b"<!doctype html", b"<html", b"<?xml")) and b"<html" in data[:4096].lower():
        return "html"
    return "txt"


BINARY_READERS = ("epub", "docx", "pdf", "mobi", "odt", "rtf", "fb2", "htmlz", "txtz")  # read by a module of their own


def _binary_reader(fmt: str):
    """The reader function of `fmt` (one of BINARY_READERS), imported when a file of it comes."""
    if fmt == "epub":
        from jobs.ingest.epub import load_epub as reader
    elif fmt == "docx":
        from jobs.ingest.docx import load_docx as reader
    elif fmt == "pdf":
        from jobs.ingest.pdf import load_pdf as reader
    elif fmt == "mobi":
        from jobs.ingest.mobi import load_mobi as reader
    elif fmt == "odt":
        from jobs.ingest.odt import load_odt as reader
    elif fmt == "rtf":
        from jobs.ingest.rtf import load_rtf as reader
    elif fmt == "htmlz":
        from jobs.ingest.htmlz import load_htmlz as reader
    elif fmt == "txtz":
        from jobs.ingest.htmlz import load_txtz as reader
    else:
        from jobs.ingest.fb2 import load_fb2 as reader
    return reader


def load_document(path: Union[str, Path], options: Optional[IngestOptions] = None) -> Document:
    """Read ``path`` into a Document; raises IngestError with a user-facing message on bad input."""
    options = options or IngestOptions()
    resolved = _check_path(path, options)
    data = _read(resolved, options)
    fmt = options.format or guess_format(resolved, data)
    if fmt not in FORMATS:
        raise IngestError(f"Unknown input format {fmt!r}; use one of {', '.join(FORMATS)}.")
    log.info("reading %s as %s (%d bytes)", resolved.name, fmt, len(data))
    if fmt in BINARY_READERS:
        doc = _binary_reader(fmt)(data, options)
    else:
        doc = read_text_file(data, fmt, options)
    if not doc.chapters or not any(c.paragraphs for c in doc.chapters):
        raise IngestError("The document contains no readable text.")
    take_title_page(doc)
    if doc.title is None and fmt in ("txt", "md"):
        doc.title = resolved.stem
    return doc


__all__ = ["IngestOptions", "load_document", "IngestError", "guess_format"]
