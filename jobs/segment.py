"""Document -> synthesis units (:class:`jobs.document.SegmentText`), one list per chapter.

Paragraphs are split into sentences, sentences are grouped up to ``max_chars``
(measured on the *normalized* text, i.e. what the engine receives). Sentences
longer than the budget are split at clause punctuation, then between words; a
word is cut only when it alone exceeds the budget. Segments never cross a
paragraph. Pauses: ``sentence_pause_ms`` after a segment ending a sentence
inside a paragraph, ``clause_pause_ms`` after a split at a comma/dash (0 after
a bare word split), ``paragraph_pause_ms`` at a paragraph end, and
``chapter_pause_ms`` after the chapter's last segment. ``pack_sentences`` False keeps every sentence a
segment of its own (a narrated EPUB highlights what one segment says: a sentence).
Each segment's metadata says where it came from: ``chapter_index`` and ``paragraph_index`` in the
document (None for a title) and ``kind``. Inline tags (`text.tags`) are taken out:
``[voice=NAME]`` runs become segments of their own with ``metadata["voice"]``, and a ``[pause=S]``
ends a segment with that pause (``metadata["pause_tag"]``). With
``speak_chapter_titles`` the title is its own segment (``metadata["kind"] ==
"title"``) followed by a paragraph pause. A chapter with nothing to say yields
an empty list, so the result always has one list per chapter.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from engines.model.text import is_cjk_text
from text.normalize import CJK, Lexicon, cleanup, language_code, normalize
from text.split import hard_split, split_clauses, split_sentences, split_words
from text.tags import TagState, split_tags, strip_tags
from jobs.document import Document, SegmentText

log = logging.getLogger(__name__)


@dataclass
class SegmentOptions:
    """Segmentation budget and pauses. ``max_chars``/``min_chars`` None = language default
    (300/30 characters; 120/12 for Chinese, Japanese, Korean, where characters are counted)."""

    max_chars: Optional[int] = None
    min_chars: Optional[int] = None
    sentence_pause_ms: int = 250
    clause_pause_ms: int = 120
    paragraph_pause_ms: int = 600
    chapter_pause_ms: int = 1500
    speak_chapter_titles: bool = True
    pack_sentences: bool = True

    def budget(self, lang: str) -> tuple[int, int]:
        max_chars = self.max_chars or (120 if lang in CJK else 300)
        min_chars = self.min_chars if self.min_chars is not None else max_chars // 10
        return max(10, max_chars), max(0, min(min_chars, max_chars // 2))


@dataclass
class _Unit:
    original: str
    text: str
    end: str  # "sentence", "clause" or "word"


class _Segmenter:
    def __init__(self, lang: str, max_chars: int, min_chars: int, lexicon: Optional[Lexicon], pack: bool = True):
        self.lang, self.max, self.min, self.lexicon, self.pack = lang, max_chars, min_chars, lexicon, pack
        self.joiner = "" if lang in ("zh", "ja") else " "

    def norm(self, text: str) -> str:
        return normalize(text, self.lang, self.lexicon)

    def fit(self, text: str, end: str) -> list[_Unit]:
        """Units of at most ``max`` normalized characters for one sentence (or piece of one)."""
        spoken = self.norm(text)
        if not spoken or not any(c.isalnum() for c in spoken):
            return []
        if len(spoken) <= self.max:
            return [_Unit(text, spoken, end)]
        clauses = split_clauses(text)
        if len(clauses) > 1:
            out: list[_Unit] = []
            for i, clause in enumerate(clauses):
                out.extend(self.fit(clause, end if i == len(clauses) - 1 else "clause"))
            return out
        return self._fit_words(text, end)

    def _fit_words(self, text: str, end: str) -> list[_Unit]:
        words = split_words(text)
        join = "" if self.joiner == "" or any(w.endswith(" ") for w in words) else " "
        if len(words) <= 1:
            size = max(1, self.max * len(text) // max(1, len(self.norm(text))))
            pieces = hard_split(text, size)
            units: list[_Unit] = []
            for i, p in enumerate(pieces):
                units.extend(self._fit_words(p, end if i == len(pieces) - 1 else "word") if len(self.norm(p)) > self.max
                             else [_Unit(p, self.norm(p), end if i == len(pieces) - 1 else "word")])
            return units
        units, cur = [], []
        for w in words:
            if cur and len(self.norm(join.join(cur + [w]).strip())) > self.max:
                units.extend(self._fit_words(join.join(cur).strip(), "word") if len(cur) == 1 else
                             [_Unit(join.join(cur).strip(), self.norm(join.join(cur).strip()), "word")])
                cur = []
            cur.append(w)
        last = join.join(cur).strip()
        if len(cur) == 1 and len(self.norm(last)) > self.max:
            units.extend(self._fit_words(last, end))
        elif last:
            units.append(_Unit(last, self.norm(last), end))
        return [u for u in units if u.text]

    def _pack(self, units: list[_Unit], cap: int) -> list[list[_Unit]]:
        groups: list[list[_Unit]] = []
        size = 0
        for u in units:
            extra = len(u.text) + (len(self.joiner) if groups and groups[-1] else 0)
            if groups and groups[-1] and size + extra <= cap:
                groups[-1].append(u)
                size += extra
            else:
                groups.append([u])
                size = len(u.text)
        return groups

    def paragraph(self, text: str) -> list[list[_Unit]]:
        """Group one paragraph's units into segments; a last one under ``min`` borrows from its neighbour."""
        if not self.pack:  # a sentence a segment (one too long for the budget: its pieces, packed)
            return [g for s in split_sentences(text, self.lang) for g in self._pack(self.fit(s, "sentence"), self.max)]
        units = [u for s in split_sentences(text, self.lang) for u in self.fit(s, "sentence")]
        groups = self._pack(units, self.max)
        while len(groups) >= 2 and self._len(groups[-1]) < self.min and len(groups[-2]) > 1:
            candidate = [groups[-2][-1]] + groups[-1]  # borrow the previous segment's last sentence
            if self._len(candidate) > self.max:
                break
            groups[-2].pop()
            groups[-1] = candidate
        return groups

    def _len(self, group: list[_Unit]) -> int:
        return len(self.joiner.join(u.text for u in group))


def _title_text(spoken: str, lang: str) -> str:
    if spoken and spoken[-1] not in ".!?。！？…:;":
        spoken += "。" if lang in ("zh", "ja") else "."
    return spoken


def _pause_after(out: list[SegmentText], ms: int) -> None:
    """A [pause=...] tag: its silence replaces the usual pause after the last segment (tags in a row add up)."""
    if not out:
        log.info("a [pause=...] tag before the first words of a chapter is ignored")
        return
    last = out[-1]
    last.pause_after_ms = last.pause_after_ms + ms if last.metadata.get("pause_tag") else ms
    last.metadata["pause_tag"] = True


def resolve_language(language: Optional[str], doc: Document) -> str:
    """Short language code from the caller, else the document's hint, else a CJK guess, else ""."""
    lang = language_code(language) or language_code(doc.language)
    if not lang:
        sample = " ".join(p for ch in doc.chapters[:3] for p in ch.paragraphs[:20])
        lang = "zh" if is_cjk_text(sample) else ""
    return lang


def segment_document(
    doc: Document, language: str, options: Optional[SegmentOptions] = None, lexicon: Optional[Lexicon] = None
) -> list[list[SegmentText]]:
    """Split ``doc`` into synthesis units: one list of SegmentText per chapter (see module docstring)."""
    options = options or SegmentOptions()
    lang = resolve_language(language, doc)
    max_chars, min_chars = options.budget(lang)
    seg = _Segmenter(lang, max_chars, min_chars, lexicon, options.pack_sentences)
    pauses = {"sentence": options.sentence_pause_ms, "clause": options.clause_pause_ms, "word": 0}
    result: list[list[SegmentText]] = []
    tags = TagState()  # voice tags stay open across paragraphs and chapters
    for ci, chapter in enumerate(doc.chapters):
        out: list[SegmentText] = []
        title = cleanup(strip_tags(chapter.title or ""))
        if options.speak_chapter_titles and title:
            for u in seg.fit(title, "sentence"):
                text = u.text if len(u.text) >= max_chars else _title_text(u.text, lang)
                out.append(SegmentText(text, u.original, options.paragraph_pause_ms,
                                       {"chapter_index": ci, "paragraph_index": None, "kind": "title"}))
        for pi, para in enumerate(chapter.paragraphs):
            pieces = split_tags(para, tags)
            for k, piece in enumerate(pieces):  # runs of one voice, or ending at a [pause=...]
                groups = seg.paragraph(cleanup(piece.text)) if piece.text.strip() else []
                end_pause = options.paragraph_pause_ms if k == len(pieces) - 1 else options.sentence_pause_ms
                for gi, group in enumerate(groups):
                    meta = {"chapter_index": ci, "paragraph_index": pi, "kind": "text"}
                    if piece.voice:
                        meta["voice"] = piece.voice
                    out.append(SegmentText(
                        text=seg.joiner.join(u.text for u in group),
                        original=seg.joiner.join(u.original for u in group),
                        pause_after_ms=end_pause if gi == len(groups) - 1 else pauses[group[-1].end],
                        metadata=meta,
                    ))
                if piece.pause_ms is not None:
                    _pause_after(out, piece.pause_ms)
        if out:
            tagged = out[-1].metadata.get("pause_tag")
            out[-1].pause_after_ms = max(out[-1].pause_after_ms, options.chapter_pause_ms) if tagged \
                else options.chapter_pause_ms
        for si, s in enumerate(out):
            s.metadata["segment_index"] = si
        result.append(out)
    log.info("segmented %d chapters into %d segments (lang=%s, max_chars=%d)",
             len(result), sum(len(r) for r in result), lang or "?", max_chars)
    return result
