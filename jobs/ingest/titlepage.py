"""A book's title page: the title and author lines a converter writes before the first chapter (pandoc's title
block in EPUB, HTML, DOCX, RTF and plain text, calibre's title page in EPUB, Kindle books, FB2, RTF and PDF).
They are the book's metadata, not its text: taken out of what is read, and used as the title and author where
the file names none (pandoc's RTF), or names them garbled (calibre's RTF writes "?" for every letter beyond
ASCII in its \\info).
"""
from __future__ import annotations

import re
from typing import Optional

from jobs.document import Document
from jobs.ingest.blocks import _key

TITLE_PAGE_RE = re.compile(r"^\s*(title\s*page|titlepage|titelseite|page de titre)\s*$", re.I)
BY_RE = re.compile(r"^\s*(by|von|par|de|di|door|av|por)\s+(\S.*)$", re.I)
SENTENCE_END = tuple(".!?;。！？；…")
MAX_LINE = 100  # a title page's line is short


def _garbled(meta: Optional[str]) -> bool:
    return bool(meta) and "?" in meta


def _same(meta: Optional[str], line: str) -> bool:
    """`line` says `meta`: the same words, or (metadata garbled with "?") the same with a letter for each "?"."""
    if not meta:
        return False
    if _key(meta) == _key(line):
        return True
    if not _garbled(meta):
        return False
    pattern = "".join("." if ch == "?" else re.escape(ch) for ch in " ".join(meta.split()))
    return re.fullmatch(pattern, " ".join(line.split())) is not None


def _only_metadata(paragraph: str, title: Optional[str], author: Optional[str]) -> bool:
    """`paragraph` holds nothing but the title and the author ("by" and the like included)."""
    if len(paragraph) > 2 * MAX_LINE:
        return False
    if _same(title, paragraph) or _same(author, paragraph):
        return True
    by = BY_RE.match(paragraph)
    if by and _same(author, by.group(2)):
        return True
    rest = f" {_key(paragraph)} "
    for meta in (title, author):
        if meta and _key(meta):
            rest = rest.replace(f" {_key(meta)} ", " ")
    return rest != f" {_key(paragraph)} " and all(BY_RE.match(f"{w} x") for w in rest.split())


def _title_like(line: str) -> bool:
    return 0 < len(line) <= MAX_LINE and not line.rstrip().endswith(SENTENCE_END)


def take_title_page(doc: Document) -> Document:
    """Take the title page out of `doc` (in place): leading lines of the first chapter that say the title or the
    author, or (the title unknown or garbled) a short first line and an author line after it, which then become
    the document's title and author. Returned for chaining."""
    if not doc.chapters:
        return doc
    first = doc.chapters[0]
    if first.title and not (_same(doc.title, first.title) or TITLE_PAGE_RE.match(first.title)):
        return doc
    paras = first.paragraphs
    more = len(doc.chapters) > 1
    if first.title and _garbled(doc.title) and _same(doc.title, first.title):
        doc.title = first.title
    # a page of its own of one to three short lines before the first chapter: the title, then the author
    page = more and 0 < len(paras) <= 3 and all(_title_like(p) for p in paras)
    n = 0
    if page and not first.title and (doc.title is None or _same(doc.title, paras[0])):
        doc.title, n = paras[0], 1
    if page and n < len(paras) and (doc.author is None or _garbled(doc.author)) and (n or first.title):
        by = BY_RE.match(paras[n])
        line = by.group(2) if by else paras[n]
        if (by or n + 1 == len(paras)) and (doc.author is None or _same(doc.author, line)):
            doc.author, n = line, n + 1
    while n < len(paras) and _only_metadata(paras[n], doc.title, doc.author):
        n += 1
    if n and n == len(paras) and more:
        doc.chapters = doc.chapters[1:]
    elif n and n < len(paras):
        first.paragraphs = paras[n:]
        if first.sources is not None:
            first.sources = first.sources[n:]
    return doc
