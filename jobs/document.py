"""What ingestion produces and segmentation consumes: a document of chapters of paragraphs."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Chapter:
    title: str
    paragraphs: list[str]  # plain text, already cleaned of markup


@dataclass
class Document:
    chapters: list[Chapter]
    title: Optional[str] = None
    author: Optional[str] = None
    language: Optional[str] = None  # hint from the file (EPUB/HTML lang), e.g. "en"
    cover: Optional[bytes] = None  # image bytes (EPUB cover) when present
    cover_mime: Optional[str] = None
    source_format: str = "txt"

    def to_dict(self) -> dict:
        """Plain JSON-able data (the cover as base64): how a document leaves the ingest process."""
        return {"chapters": [{"title": c.title, "paragraphs": list(c.paragraphs)} for c in self.chapters],
                "title": self.title, "author": self.author, "language": self.language,
                "cover": base64.b64encode(self.cover).decode("ascii") if self.cover else None,
                "cover_mime": self.cover_mime, "source_format": self.source_format}

    @classmethod
    def from_dict(cls, data: dict) -> "Document":
        """The inverse of :meth:`to_dict`; only plain strings are accepted."""
        def text(value) -> Optional[str]:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"a document field holds {type(value).__name__}, expected text")
            return value

        chapters = [Chapter(text(c["title"]) or "", [text(p) for p in c["paragraphs"]]) for c in data["chapters"]]
        cover = base64.b64decode(data["cover"]) if data.get("cover") else None
        return cls(chapters, title=text(data.get("title")), author=text(data.get("author")),
                   language=text(data.get("language")), cover=cover, cover_mime=text(data.get("cover_mime")),
                   source_format=text(data.get("source_format")) or "txt")


@dataclass
class SegmentText:
    """One unit of synthesis: a few sentences within the model's budget."""

    text: str  # normalized text sent to the engine
    original: str  # the text as it was in the document (for the manifest)
    pause_after_ms: int = 0  # silence after this segment (sentence/paragraph/chapter pause)
    metadata: dict = field(default_factory=dict)
