"""Documents that are one text file: plain text, Markdown and HTML (also the one file inside calibre's HTMLZ and
TXTZ zips, `jobs.ingest.htmlz`)."""
from __future__ import annotations

from jobs.document import Document
from jobs.ingest.blocks import build_chapters
from jobs.ingest.decode import decode_bytes


def read_text_file(data: bytes, fmt: str, options) -> Document:
    """A document of `fmt` ("txt", "md" or "html") from its bytes. Its title and author come from the file: an
    HTML head's <title> and author meta, a Markdown file's YAML (or TOML) metadata block, a plain-text file's
    title block (`jobs.ingest.text.take_title_line`)."""
    if fmt == "html":
        from jobs.ingest.html import load_html_bytes

        blocks, meta = load_html_bytes(data, options)
        title, chapters = build_chapters(blocks, options)
        return Document(chapters, title=meta["title"] or title, author=meta["author"], language=meta["language"],
                        source_format="html")
    from jobs.ingest.markdown import front_matter, markdown_to_plain
    from jobs.ingest.text import parse_plain_text, take_title_line
    from text.normalize.cleanup import strip_ansi

    text = strip_ansi(decode_bytes(data, options.encoding))
    if fmt == "md":
        meta, text = front_matter(text)
        text = markdown_to_plain(text, options.skip_footnotes)
    else:
        title_line, author, text = take_title_line(text)
        meta = {"title": title_line, "author": author, "language": None}
    title, chapters = build_chapters(parse_plain_text(text, markdown=fmt == "md"), options)
    return Document(chapters, title=meta["title"] or title, author=meta["author"], language=meta["language"],
                    source_format=fmt)
