"""A narrated EPUB's job, as it is queued: the book the narration goes into, kept in the spool folder, and
where each segment's text lies in it.

An EPUB 3 input is its own book: a copy of the very file the sandboxed reader read (checked by its sha256)
goes to `HOME/narration/`. Any other input (or an EPUB that cannot carry overlays: EPUB 2, overlays already,
a package document that is not plain UTF-8 XML, no text found in its files) gets a simple EPUB of its text
(`jobs.narrated.generate`).
Each segment then learns its place (`jobs.narrated.align`): its metadata's `source` is `{"doc": zip member,
"ranges": [[start, end], ...]}` (byte ranges that nest), which the queue keeps with the segment row; a segment
that is not found keeps none and is spoken but not highlighted. The job's meta keeps `narration`:
`{"package": file, "map": EpubPackage, "generated": bool}`.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Optional, Sequence

from jobs.assemble import write_bytes_atomic
from jobs.document import Document, TextSource
from jobs.errors import IngestError
from jobs.narrated.align import Locator
from jobs.narrated.generate import generate_epub
from text.language import spoken_language

log = logging.getLogger(__name__)


def prepare_narration(home: Path, doc: Document, chapters: Sequence[tuple[str, list]], source: Optional[Path],
                      language: str, title: str, author: Optional[str]) -> dict:
    """Store the book the narration goes into and give each segment of `chapters` its source; returns the
    job meta's `narration` entry. `source`: the input file (an EPUB 3 input is narrated in place); `language`:
    the job's (its own, else the document's; "" for auto: the text's language is then guessed, `book_language`)."""
    package, generated, total = doc.package, False, sum(len(segs) for _, segs in chapters)
    problem = package.problem if package is not None else None
    if package is not None and problem is None and (source is None or not Path(source).is_file()):
        problem = "the input file is not at hand"
    if package is not None and problem is None:
        data = Path(source).read_bytes()
        if hashlib.sha256(data).hexdigest() != package.sha256:
            raise IngestError(f"{Path(source).name} changed while it was read; submit it again")

        def source_of(ci: int, pi: Optional[int]) -> Optional[TextSource]:
            chapter = doc.chapters[ci]
            if pi is None:
                return chapter.title_source
            return chapter.sources[pi] if chapter.sources else None

        missing = bind(chapters, source_of)
        if missing == total:
            problem = "none of its text could be found in its files (not plain UTF-8 XML?)"
    if package is None or problem is not None:
        if package is not None:
            log.info("the narrated EPUB is a new EPUB of the book's text: %s", problem)
        data, package, made = generate_epub(doc, chapters, book_language(language, chapters), title, author)
        generated = True
        missing = bind(chapters, lambda ci, pi: made.get((ci, pi)))
    if missing:
        log.warning("%d of %d segments were not found in the book's text: they are spoken, not highlighted",
                    missing, total)
    path = home / "narration" / f"{package.sha256[:32]}.epub"
    if not path.is_file():
        write_bytes_atomic(path, data)
    return {"package": str(path), "map": package.to_dict(), "generated": generated}


def book_language(language: str, chapters: Sequence[tuple[str, list]]) -> str:
    """The BCP-47 tag a simple EPUB of the text declares: the job's language where it names one (`language`:
    "english", "de"), else the language of what was spoken, guessed from the segments' text; `und` where neither
    tells (`text.language.spoken_language`)."""
    return spoken_language(language, (s.original for _, segs in chapters for s in segs))


def bind(chapters: Sequence[tuple[str, list]], source_of) -> int:
    """Give every segment its `source` (see the module docstring) from `source_of(chapter_index,
    paragraph_index or None)`; returns how many were not found."""
    missing = 0
    for _, segs in chapters:
        finders: dict[tuple, Optional[Locator]] = {}
        for seg in segs:
            ci, pi = seg.metadata.get("chapter_index"), seg.metadata.get("paragraph_index")
            where = (ci, pi)
            if where not in finders:
                found = source_of(ci, pi) if ci is not None else None
                finders[where] = Locator(found) if found is not None and found.runs else None
            finder = finders[where]
            ranges = finder.find(seg.original) if finder is not None else None
            seg.metadata.pop("source", None)
            if ranges:
                seg.metadata["source"] = {"doc": finder.source.doc, "ranges": [list(r) for r in ranges]}
            else:
                missing += 1
    return missing
