"""HTML/XHTML -> blocks with the stdlib parser; tolerant of broken markup."""
from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from typing import Optional

from jobs.errors import IngestError
from jobs.ingest.blocks import Block
from jobs.ingest.decode import decode_bytes
from jobs.ingest.xmlscan import Scan

log = logging.getLogger(__name__)

SKIP_TAGS = {"script", "style", "head", "template", "svg", "math", "noscript", "iframe", "object", "select", "button"}
VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "wbr", "col", "area", "base", "source", "embed", "param", "track"}
HEADINGS = {f"h{i}": i for i in range(1, 7)}
BLOCK_TAGS = {
    "p", "div", "li", "ul", "ol", "dl", "dt", "dd", "blockquote", "section", "article", "header", "footer",
    "main", "figure", "figcaption", "table", "tr", "td", "th", "pre", "aside", "nav", "address", "body",
    "html", "center", "caption", "hgroup", "details", "summary", "title",
} | set(HEADINGS)
NOTE_TYPES = {"footnote", "footnotes", "endnote", "endnotes", "rearnote", "rearnotes", "note", "doc-footnote",
              "doc-endnote", "doc-endnotes", "doc-footnotes"}
NOTE_CLASSES = {"footnotes", "footnote", "endnotes", "endnote", "footnote-body"}  # pandoc's EPUB 2 and HTML 4 notes
SKIP_TYPES = {"landmarks", "page-list", "loi", "lot", "doc-backlink", "doc-pagelist"}  # navigation, not text
BACKLINK_CLASSES = {"footnote-back", "footnote-backref", "fn-back", "backlink"}
MARKER_CHUNKS = 16  # a footnote marker is a few text pieces at most; longer link texts are kept as they are
MARKER_RE = re.compile(r"^\s*(\[?\(?\d{1,3}\)?\]?|[*†‡§]+)\s*$")
CHARSET_RE = re.compile(rb"""(?:<meta[^>]+charset\s*=\s*["']?|<\?xml[^>]+encoding\s*=\s*["'])([A-Za-z0-9_.:-]+)""", re.I)


class _Parser(HTMLParser):
    """Blocks from HTML in one pass; every tag costs O(1) whatever the nesting depth (a file of
    200,000 nested <div>s must not stall ingestion): open tags and flags are counted, not searched."""

    def __init__(self, skip_footnotes: bool, positions: Optional[Scan] = None, text: str = ""):
        super().__init__(convert_charrefs=True)
        self.skip_footnotes = skip_footnotes
        self.positions = positions  # the file's runs (jobs.ingest.xmlscan): each block notes the runs it read
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)] if positions else []
        self.buf_runs: list[Optional[int]] = []  # beside buf: the run each piece of text came from
        self.stack: list[tuple[str, frozenset, int]] = []  # (tag, flags, absolute buffer index at start)
        self.open: dict[str, list[int]] = {}  # tag -> stack positions where it is open, innermost last
        self.flag_count: dict[str, int] = {"skip": 0, "note": 0, "toc": 0, "ref": 0}
        self.headings_open = 0
        self.buf: list[str] = []
        self.base = 0  # absolute index of buf[0] (the buffer is emptied at every flush)
        self.blocks: list[Block] = []
        self.title = ""
        self.lang: Optional[str] = None
        self.author: Optional[str] = None
        self._in_title = False

    # -- helpers --
    def _push(self, tag: str, flags: frozenset) -> None:
        self.open.setdefault(tag, []).append(len(self.stack))
        self.headings_open += tag in HEADINGS
        self.stack.append((tag, flags, self.base + len(self.buf)))
        for f in flags:
            self.flag_count[f] += 1

    def _pop(self) -> tuple[str, frozenset, int]:
        tag, flags, start = self.stack.pop()
        self.open[tag].pop()
        self.headings_open -= tag in HEADINGS
        for f in flags:
            self.flag_count[f] -= 1
        return tag, flags, start

    def _heading_level(self) -> Optional[int]:
        if not self.headings_open:
            return None
        return min((level for tag, level in HEADINGS.items() if self.open.get(tag)), default=None)

    def _flush(self) -> None:
        if not self.buf:
            return
        text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
        runs = list(dict.fromkeys(r for r in self.buf_runs if r is not None)) if self.positions else None
        self.base += len(self.buf)
        self.buf, self.buf_runs = [], []
        if not text or self.flag_count["skip"]:
            return
        if self.flag_count["note"]:
            self.blocks.append(Block("footnote", text, runs=runs))
        elif self.flag_count["toc"]:
            self.blocks.append(Block("toc", text, runs=runs))
        else:
            level = self._heading_level()
            if level is not None:
                self.blocks.append(Block("heading", text, level=level, runs=runs))
            else:
                self.blocks.append(Block("para", text, runs=runs))

    def _close_to(self, index: int) -> None:
        """Pop stack entries down to ``index`` (inclusive), finishing each element."""
        while len(self.stack) > index:
            tag, flags, start = self.stack[-1]
            if "ref" in flags and self.skip_footnotes:
                start = max(start - self.base, 0)  # text before the last flush is gone already
                if len(self.buf) - start <= MARKER_CHUNKS and MARKER_RE.match("".join(self.buf[start:])):
                    del self.buf[start:]
                    del self.buf_runs[start:]
            if tag in BLOCK_TAGS:
                self._flush()
            self._pop()

    # -- parser callbacks --
    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "html":
            self.lang = a.get("lang") or a.get("xml:lang") or self.lang
        if tag == "meta" and a.get("name", "").lower() in ("author", "dc.creator"):
            self.author = a.get("content") or self.author
        if tag in VOID_TAGS:
            if tag == "br":
                self.buf.append(" ")
                self.buf_runs.append(None)
            elif tag == "hr":
                self._flush()
            return
        if tag in BLOCK_TAGS:
            # a block inside a heading (or a p/heading inside a p) closes the outermost such element
            closers = [self.open[h][0] for h in HEADINGS if self.open.get(h)] if self.headings_open else []
            if (tag == "p" or tag in HEADINGS) and self.open.get("p"):
                closers.append(self.open["p"][0])
            if closers:
                self._close_to(min(closers))
            self._flush()
        # KF8 (azw3) keeps an EPUB's epub:type as a plain `type`
        types = set(" ".join((a.get("epub:type", ""), a.get("role", ""), a.get("type", ""))).lower().split())
        classes = {c.rstrip("0123456789") for c in a.get("class", "").lower().split()}  # calibre: footnote1
        flags: set = set()
        if tag in SKIP_TAGS or "hidden" in a or types & SKIP_TYPES or classes & BACKLINK_CLASSES:
            flags.add("skip")
        if tag == "title":
            self._in_title = True
        if types & NOTE_TYPES or classes & NOTE_CLASSES or (tag == "aside" and classes & {"note"}):
            flags.add("note")
        if tag == "nav" and types & {"toc", "doc-toc"}:
            flags.add("toc")
        href = a.get("href", "")
        if tag in ("a", "sup") and ("noteref" in types or "doc-noteref" in types or "#" in href
                                    or href.startswith("kindle:pos:") or "filepos" in a):
            flags.add("ref")  # old MOBI links by `filepos`, KF8 by kindle:pos
        self._push(tag, frozenset(flags))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if self.open.get(tag):
            self._close_to(self.open[tag][-1])
            return
        if tag in BLOCK_TAGS:
            self._flush()

    def handle_data(self, data):
        if self._in_title:
            self.title += data
            return
        if not self.flag_count["skip"]:
            self.buf.append(data)
            self.buf_runs.append(self._run())

    def _run(self) -> Optional[int]:
        """The run (of `positions`) the data being handled starts in."""
        if not self.positions:
            return None
        line, column = self.getpos()
        return self.positions.run_at(self.line_starts[line - 1] + column)

    def finish(self) -> None:
        self.close()
        self._close_to(0)
        self._flush()


def html_to_blocks(text: str, skip_footnotes: bool = True,
                   positions: Optional[Scan] = None) -> tuple[list[Block], dict]:
    """Parse HTML text into blocks; returns (blocks, metadata with title/lang/author). With `positions` (the
    `jobs.ingest.xmlscan.scan` of `text`) every block's `runs` lists the indexes of the runs its text came from."""
    p = _Parser(skip_footnotes, positions, text)
    try:
        p.feed(text)
        p.finish()
    except Exception as exc:  # html.parser is lenient; keep whatever was parsed
        log.warning("HTML parser stopped early: %s", exc)
        p._flush()
    meta = {"title": re.sub(r"\s+", " ", p.title).strip() or None, "language": p.lang, "author": p.author}
    return p.blocks, meta


def decode_html(data: bytes) -> str:
    """Decode HTML bytes using the declared charset when it works, else detection."""
    m = CHARSET_RE.search(data[:4096])
    if m and not data.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode(m.group(1).decode("ascii"))
            if text.strip():
                return text
        except (LookupError, UnicodeDecodeError):
            pass
    return decode_bytes(data)


def load_html_bytes(data: bytes, options) -> tuple[list[Block], dict]:
    """Decode and parse a standalone HTML file."""
    blocks, meta = html_to_blocks(decode_html(data), options.skip_footnotes)
    if not blocks:
        raise IngestError("The HTML file contains no readable text.")
    return blocks, meta
