"""RTF with our own small reader (no converter, no office suite): paragraphs, headings by style, metadata.

What is read: groups and their state; text in the document's code page (\\ansicpg, \\mac, \\pc, \\pca) or a
font's (\\fcharset / \\cpg in the font table, for \\'hh bytes of CJK and other legacy text); \\uN Unicode
escapes (negative N and UTF-16 surrogate pairs included) with their \\ucN fallback characters skipped;
\\binN data skipped unread. Headings: a paragraph whose style (\\sN) the stylesheet names "heading N" or
gives an \\outlinelevel, or that has one itself; the "Title" style or \\info's \\title is the document's title;
without heading styles, chapter headings are found by their words ("Chapter 3") as in plain text, else the
document is one chapter. Destinations holding no body text (font, color and style tables, \\info, pictures,
headers and footers, objects, field instructions, any \\* destination) are not read as text; \\footnote
text becomes footnotes.
"""
from __future__ import annotations

import codecs
import logging
import re
from dataclasses import dataclass, replace
from typing import Optional

from jobs.document import Document
from jobs.errors import IngestError
from jobs.ingest.blocks import Block, build_chapters
from jobs.ingest.docx import HEADING_NAME_RE
from jobs.ingest.text import styled_block

log = logging.getLogger(__name__)

TOKEN = re.compile(rb"\\([a-zA-Z]{1,32})(-?\d{1,10})? ?|\\'([0-9a-fA-F]{2})|\\([^a-zA-Z])|([{}])|[\r\n]+"
                   rb"|([^\\{}\r\n]+)", re.S)
SKIP = {"colortbl", "pict", "header", "headerl", "headerr", "headerf", "footer", "footerl", "footerr", "footerf",
        "object", "objdata", "themedata", "colorschememapping", "latentstyles", "datastore", "listtable",
        "listoverridetable", "rsidtbl", "generator", "xmlnstbl", "fldinst", "filetbl", "revtbl", "pgdsctbl",
        "private", "docvar", "xe", "tc", "tcn", "nonshppict", "shppict", "ftnsep", "ftnsepc", "aftnsep"}
INFO_TEXT = {"title": "title", "author": "author"}
BREAKS = {"par", "sect", "page", "row"}  # end a paragraph
SPACES = {"line", "tab", "cell", "enspace", "emspace", "qmspace", "~"}
CHARS = {"emdash": "\u2014", "endash": "\u2013", "lquote": "\u2018", "rquote": "\u2019", "ldblquote": "\u201c",
         "rdblquote": "\u201d", "bullet": "\u2022", "_": "-", "-": "", "\\": "\\", "{": "{", "}": "}"}
CHARSETS = {77: "mac_roman", 128: "cp932", 129: "cp949", 130: "johab", 134: "gbk", 136: "cp950", 161: "cp1253",
            162: "cp1254", 163: "cp1258", 177: "cp1255", 178: "cp1256", 186: "cp1257", 204: "cp1251",
            222: "cp874", 238: "cp1250", 255: "cp437"}
CHARSET_WORDS = {"mac": "mac_roman", "pc": "cp437", "pca": "cp850", "ansi": "cp1252"}


@dataclass(frozen=True)
class _Group:
    dest: str = "body"  # body | footnote | skip | fonttbl | stylesheet | info | title | author
    uc: int = 1  # fallback characters after \uN
    codec: Optional[str] = None  # the current font's code page (None: the document's)
    hidden: bool = False  # \v text
    mark: int = 0  # where this destination's text starts in the reader's characters


def _codec(name: str) -> Optional[str]:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


class _Reader:
    def __init__(self, skip_footnotes: bool):
        self.skip_footnotes = skip_footnotes
        self.ansi = "cp1252"
        self.fonts: dict[int, str] = {}  # font number -> codec of its charset
        self.styles: dict[int, int] = {}  # paragraph style number -> heading level (0: Title)
        self.info: dict[str, str] = {}
        self.blocks: list[Block] = []
        self.title: Optional[str] = None
        self.chars: list[str] = []  # the paragraph (or footnote, table entry, info field) being read
        self.notes: list[str] = []  # footnotes waiting for the end of their paragraph
        self.pending, self.pending_codec = bytearray(), "cp1252"  # bytes not decoded yet, and their codec
        self.entry: dict = {}  # the font or style table entry being read
        self.style, self.outline = 0, None  # paragraph properties (\sN, \outlinelevelN), reset by \pard
        self.skip = 0  # fallback characters still to skip after \uN
        self.deff = 0  # the default font (\deffN)

    # -- text --
    def flush_bytes(self) -> None:
        if self.pending:
            self.chars.append(self.pending.decode(self.pending_codec, errors="replace"))
            self.pending = bytearray()

    def add_bytes(self, data: bytes, g: _Group) -> None:
        if self.skip:
            n = min(self.skip, len(data))
            self.skip -= n
            data = data[n:]
        codec = g.codec or self.fonts.get(self.deff) or self.ansi
        if codec != self.pending_codec:
            self.flush_bytes()
            self.pending_codec = codec
        self.pending += data

    def add_text(self, text: str) -> None:
        self.flush_bytes()
        self.chars.append(text)

    def take(self, mark: int = 0) -> str:
        """The text read since `mark` (an index into the characters), taken out."""
        self.flush_bytes()
        raw = "".join(self.chars[mark:])
        del self.chars[mark:]
        raw = raw.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # \u pairs -> one character
        return " ".join(raw.split())

    def end_paragraph(self) -> None:
        text = self.take()
        level = self.styles.get(self.style)
        if self.outline is not None and self.outline < 9:
            level = self.outline + 1
        block = styled_block(text, level) if text else None
        if block is not None:
            self.blocks.append(block)
        elif text:
            self.title = self.title or text
        self.blocks.extend(Block("footnote", n) for n in self.notes)
        self.notes = []

    # -- tables read for their facts --
    def end_entry(self, g: _Group) -> None:
        """A font table or stylesheet entry is complete (its ';' or its group's end)."""
        dest, name = g.dest, self.take(g.mark).rstrip(";").strip()
        entry, self.entry = self.entry, {}
        if dest == "fonttbl" and "f" in entry:
            codec = _codec(f"cp{entry['cpg']}") if "cpg" in entry else CHARSETS.get(entry.get("fcharset", 0))
            if codec:
                self.fonts[entry["f"]] = codec
        elif dest == "stylesheet" and "s" in entry:
            m = HEADING_NAME_RE.match(name)
            if "outlinelevel" in entry and entry["outlinelevel"] < 9:
                self.styles[entry["s"]] = entry["outlinelevel"] + 1
            elif m:
                self.styles[entry["s"]] = int(m.group(1))
            elif name.lower() == "title":
                self.styles[entry["s"]] = 0


def _dest(r: _Reader, g: _Group, dest: str) -> _Group:
    """`g` turned into destination `dest`, its text starting here."""
    r.flush_bytes()
    return replace(g, dest=dest, mark=len(r.chars))


def _word(r: _Reader, g: _Group, word: str, arg: Optional[int]) -> _Group:
    """Apply control word `word` (with its numeric argument) in group state `g`; returns the new state."""
    if word in SKIP or (word == "footnote" and r.skip_footnotes):
        return replace(g, dest="skip")
    if g.dest == "skip":
        return g
    if word in ("fonttbl", "stylesheet", "info", "footnote"):
        return _dest(r, g, word)
    if g.dest == "info":
        return _dest(r, g, INFO_TEXT[word]) if word in INFO_TEXT else replace(g, dest="skip")
    if g.dest in ("fonttbl", "stylesheet"):
        keys = ("f", "fcharset", "cpg") if g.dest == "fonttbl" else ("s", "outlinelevel")
        if word in keys and arg is not None:
            r.entry[word] = arg
        return g
    if word == "u" and arg is not None:
        r.add_text(chr(arg + 65536 if arg < 0 else arg))
        r.skip = g.uc
    elif word == "uc" and arg is not None:
        return replace(g, uc=max(0, arg))
    elif word == "f" and arg is not None:
        return replace(g, codec=r.fonts.get(arg))
    elif word == "plain":
        return replace(g, codec=None, hidden=False)
    elif word == "deff" and arg is not None:
        r.deff = arg
    elif word == "ansicpg" and arg is not None:
        r.ansi = _codec(f"cp{arg}") or r.ansi
    elif word in CHARSET_WORDS:
        r.ansi = CHARSET_WORDS[word]
    elif word == "v":
        return replace(g, hidden=arg != 0)
    elif g.hidden:
        return g
    elif word in BREAKS and g.dest == "body":
        r.end_paragraph()
    elif word in BREAKS or word in SPACES:
        r.add_text(" ")
    elif word in CHARS:
        r.add_text(CHARS[word])
    elif word == "pard":
        r.style, r.outline = 0, None
    elif word == "s" and arg is not None:
        r.style = arg
    elif word == "outlinelevel" and arg is not None:
        r.outline = arg
    return g


def _read(data: bytes, r: _Reader) -> bool:
    """Read the document's group (its opening brace already passed); False when it never closes."""
    stack: list[_Group] = []
    g = _Group()
    pos, end = 0, len(data)
    while pos < end:
        m = TOKEN.match(data, pos)
        if m is None:  # a lone backslash at the very end
            break
        pos = m.end()
        word, arg, hexa, symbol, brace, text = m.groups()
        if brace is not None:
            r.skip = 0
            if brace == b"{":
                stack.append(g)
                continue
            if not stack:
                return True  # the document's group is closed: what follows is not part of it
            _end_group(r, g, stack[-1])
            g = stack.pop()
        elif word is not None:
            number = int(arg) if arg else None
            if word == b"bin":
                pos += number or 0  # binary data: skipped, never read as text
            elif r.skip and word != b"u":
                r.skip -= 1  # a control word standing in for the \uN character before it
            else:
                g = _word(r, g, word.decode("ascii"), number)
        elif symbol == b"*":
            g = replace(g, dest="skip")  # an optional destination: nothing of it is read
        elif g.dest == "skip" or g.hidden and g.dest == "body":
            continue
        elif hexa is not None:
            r.add_bytes(bytes([int(hexa, 16)]), g)
        elif symbol is not None:
            _symbol(r, g, symbol.decode("latin-1"))
        elif text is not None:
            _text(r, g, text)
    return False


def _symbol(r: _Reader, g: _Group, symbol: str) -> None:
    if r.skip:
        r.skip -= 1
    elif symbol in ("\n", "\r") and g.dest == "body":
        r.end_paragraph()
    elif symbol in CHARS:
        r.add_text(CHARS[symbol])
    elif symbol == "~":
        r.add_text(" ")


def _text(r: _Reader, g: _Group, text: bytes) -> None:
    if g.dest not in ("fonttbl", "stylesheet"):
        r.add_bytes(text, g)
        return
    for piece in re.split(rb"(;)", text):  # a table's entries end with ';'
        if piece == b";":
            r.end_entry(g)
        elif piece:
            r.add_bytes(piece, g)


def _end_group(r: _Reader, g: _Group, outer: _Group) -> None:
    """Group `g` ends inside `outer`: a destination's text is taken where it belongs."""
    if g.dest in ("fonttbl", "stylesheet"):
        if r.entry:
            r.end_entry(g)
        elif outer.dest != g.dest:
            r.take(g.mark)
    elif g.dest == outer.dest and g.mark == outer.mark:
        return  # a plain group (formatting) inside the same destination
    elif g.dest in ("title", "author"):
        r.info.setdefault(g.dest, r.take(g.mark))
    elif g.dest == "footnote":
        note = r.take(g.mark)
        if note:
            r.notes.append(note)


def load_rtf(data: bytes, options) -> Document:
    """Read an RTF document held in memory into a Document."""
    start = len(data) - len(data.lstrip(b"\xef\xbb\xbf \t\r\n"))
    if not data[start:].startswith(b"{\\rtf"):
        raise IngestError("The file is not RTF (it does not begin with {\\rtf); it is damaged or another format: "
                          "submit it with the ending of its real format.")
    r = _Reader(options.skip_footnotes)
    if not _read(data[start + 1:], r):  # the document's own group is the outermost
        raise IngestError("The RTF file is truncated or damaged (its document group never closes); open it in "
                          "its program and save it again.")
    r.end_paragraph()
    promoted, chapters = build_chapters(r.blocks, options, promote_title=r.title is None)
    if not chapters:
        raise IngestError("The RTF file contains no readable text.")
    return Document(chapters, title=r.info.get("title") or r.title or promoted, author=r.info.get("author"),
                    source_format="rtf")
