"""What ingestion produces and segmentation consumes: a document of chapters of paragraphs."""
from __future__ import annotations

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


@dataclass
class SegmentText:
    """One unit of synthesis: a few sentences within the model's budget."""

    text: str  # normalized text sent to the engine
    original: str  # the text as it was in the document (for the manifest)
    pause_after_ms: int = 0  # silence after this segment (sentence/paragraph/chapter pause)
    metadata: dict = field(default_factory=dict)
