"""What ingestion produces and segmentation consumes: a document of chapters of paragraphs.

An EPUB's paragraphs also say where their text lies in the file (`TextSource`: the spine document and its
runs of character data, by byte offset), and the document says where its package document can take new
entries (`EpubPackage`): the narrated EPUB (`jobs.narrated`) binds each spoken sentence to the original
text with them, without parsing the book again outside the sandboxed reader.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class TextRun:
    """Character data between two tags of a file: bytes [start, end) hold `raw` (UTF-8, entities as written);
    `parent` numbers the element holding it (runs with the same number are siblings: a span from one to the
    other nests)."""

    start: int
    end: int
    parent: int
    raw: str


@dataclass(frozen=True)
class Element:
    """An element that holds a source's runs (up to the one that holds them all), by byte offsets: where its
    start tag begins (`open`) and its end tag ends (`close`), where its first character that is not a space
    begins (`first`) and its last ends (`last`); `parent` numbers its parent; `phrasing`: an inline element
    (a span may take it in)."""

    number: int
    parent: int
    open: int
    close: int
    first: int
    last: int
    phrasing: bool = False


@dataclass(frozen=True)
class TextSource:
    """Where a paragraph (or a title) came from: the runs of zip member `doc` that hold its text, in order,
    and the elements around them."""

    doc: str
    runs: tuple[TextRun, ...]
    elements: tuple[Element, ...] = ()

    def to_list(self) -> list:
        return [self.doc, [[r.start, r.end, r.parent, r.raw] for r in self.runs],
                [[e.number, e.parent, e.open, e.close, e.first, e.last, int(e.phrasing)] for e in self.elements]]

    @classmethod
    def from_list(cls, data) -> "TextSource":
        doc, runs, elements = data
        return cls(_text(doc), tuple(TextRun(*(_int(x) for x in r[:3]), _text(r[3])) for r in runs),
                   tuple(Element(*(_int(x) for x in e[:6]), phrasing=bool(_int(e[6]))) for e in elements))


@dataclass
class EpubPackage:
    """Where an EPUB's package document (`opf`, a zip member) takes new entries, as byte offsets in it:
    `manifest_end` (new items), `metadata_end` (new metadata); `items`: spine document -> the offset where its
    manifest item's start tag ends (an attribute goes there); `heads`: spine document -> the offset of its
    `</head>`; `prefix`: a name that no id and no member under the OPF's folder starts with; `sha256`: of the
    EPUB file; `problem`: why the book cannot carry overlays itself (EPUB 2, overlays already, ...), or None;
    `accessibility`: the schema.org accessibility metadata its package declares ({property: [values]}; None:
    not read, a map made before it was); `images`: whether its manifest lists images."""

    opf: str = ""
    manifest_end: int = -1
    metadata_end: int = -1
    items: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)
    prefix: str = "tts-narration"
    sha256: str = ""
    problem: Optional[str] = None
    accessibility: Optional[dict] = None
    images: bool = False

    def to_dict(self) -> dict:
        return {"opf": self.opf, "manifest_end": self.manifest_end, "metadata_end": self.metadata_end,
                "items": dict(self.items), "heads": dict(self.heads), "prefix": self.prefix, "sha256": self.sha256,
                "problem": self.problem, "images": self.images,
                "accessibility": None if self.accessibility is None else
                {k: list(v) for k, v in self.accessibility.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "EpubPackage":
        return cls(opf=_text(data["opf"]), manifest_end=_int(data["manifest_end"]),
                   metadata_end=_int(data["metadata_end"]),
                   items={_text(k): _int(v) for k, v in data["items"].items()},
                   heads={_text(k): _int(v) for k, v in data["heads"].items()}, prefix=_text(data["prefix"]),
                   sha256=_text(data["sha256"]), problem=_text(data.get("problem")),
                   accessibility=_accessibility(data.get("accessibility")), images=data.get("images") is True)


def _accessibility(data) -> Optional[dict]:
    """A package map's accessibility metadata, checked as it comes from the sandboxed reader."""
    if data is None:
        return None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ValueError("a package map's accessibility metadata is no {property: [values]}")
    return {_text(k): [_text(v) for v in values] for k, values in data.items()}


@dataclass
class Chapter:
    title: str
    paragraphs: list[str]  # plain text, already cleaned of markup
    sources: Optional[list[Optional[TextSource]]] = None  # per paragraph, where known (EPUB)
    title_source: Optional[TextSource] = None


@dataclass
class Document:
    chapters: list[Chapter]
    title: Optional[str] = None
    author: Optional[str] = None
    language: Optional[str] = None  # hint from the file (EPUB/HTML lang), e.g. "en"
    cover: Optional[bytes] = None  # image bytes (EPUB cover) when present
    cover_mime: Optional[str] = None
    source_format: str = "txt"
    package: Optional[EpubPackage] = None  # an EPUB's package map (see EpubPackage)

    def to_dict(self) -> dict:
        """Plain JSON-able data (the cover as base64): how a document leaves the ingest process."""
        def chapter(c: Chapter) -> dict:
            out = {"title": c.title, "paragraphs": list(c.paragraphs)}
            if c.sources is not None:
                out["sources"] = [s.to_list() if s else None for s in c.sources]
            if c.title_source is not None:
                out["title_source"] = c.title_source.to_list()
            return out

        return {"chapters": [chapter(c) for c in self.chapters],
                "title": self.title, "author": self.author, "language": self.language,
                "cover": base64.b64encode(self.cover).decode("ascii") if self.cover else None,
                "cover_mime": self.cover_mime, "source_format": self.source_format,
                "package": self.package.to_dict() if self.package else None}

    @classmethod
    def from_dict(cls, data: dict) -> "Document":
        """The inverse of :meth:`to_dict`; only plain strings (and numbers where offsets go) are accepted."""
        def chapter(c: dict) -> Chapter:
            paragraphs = [_text(p) for p in c["paragraphs"]]
            sources = c.get("sources")
            if sources is not None:
                sources = [TextSource.from_list(s) if s else None for s in sources]
                if len(sources) != len(paragraphs):
                    raise ValueError("a chapter's paragraph sources do not match its paragraphs")
            title_source = TextSource.from_list(c["title_source"]) if c.get("title_source") else None
            return Chapter(_text(c["title"]) or "", paragraphs, sources, title_source)

        cover = base64.b64decode(data["cover"]) if data.get("cover") else None
        package = EpubPackage.from_dict(data["package"]) if data.get("package") else None
        return cls([chapter(c) for c in data["chapters"]], title=_text(data.get("title")),
                   author=_text(data.get("author")), language=_text(data.get("language")), cover=cover,
                   cover_mime=_text(data.get("cover_mime")), source_format=_text(data.get("source_format")) or "txt",
                   package=package)


def _text(value) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"a document field holds {type(value).__name__}, expected text")
    return value


def _int(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"a document offset holds {type(value).__name__}, expected a whole number")
    return value


@dataclass
class SegmentText:
    """One unit of synthesis: a few sentences within the model's budget."""

    text: str  # normalized text sent to the engine
    original: str  # the text as it was in the document (for the manifest)
    pause_after_ms: int = 0  # silence after this segment (sentence/paragraph/chapter pause)
    metadata: dict = field(default_factory=dict)
