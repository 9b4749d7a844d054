"""The narration's changes to a book's own files, made by inserting text at byte offsets that the sandboxed
reader found (`jobs.document.EpubPackage`, `TextSource`): nothing of the book is parsed here, and nothing
is removed or rewritten, so taking the inserted tags out again gives the original bytes.

An XHTML file gets a `<span id="...">`/`</span>` pair around each piece of each segment (pieces that nest:
`jobs.narrated.align`) and a stylesheet link before `</head>` (the highlight's colour). The package document
gets the new manifest items, a `media-overlay` attribute on each narrated file's item, the overlay
metadata (`media:duration` per overlay and in all, `media:active-class`) and the accessibility metadata.
"""
from __future__ import annotations

import html
import logging
from typing import Sequence

log = logging.getLogger(__name__)

ACTIVE_CLASS = "-epub-media-overlay-active"  # the class a reading system puts on the text being read
CSS = f""".{ACTIVE_CLASS} {{
  background-color: #fff2a8;
  color: #000000;
}}
"""


def insert(data: bytes, inserts: Sequence[tuple[int, int, str]]) -> bytes:
    """`data` with each (offset, order, text) inserted at its offset; at one offset, lower `order` first."""
    out, at = [], 0
    for offset, _, text in sorted(inserts, key=lambda x: (x[0], x[1])):
        out += [data[at:offset], text.encode("utf-8")]
        at = offset
    out.append(data[at:])
    return b"".join(out)


def span_inserts(size: int, spans: Sequence[tuple[str, Sequence[Sequence[int]]]]
                 ) -> tuple[list[tuple[int, int, str]], set[str]]:
    """The tags that wrap each segment's pieces -> (inserts, the ids wrapped): `spans` is [(id, [[start, end],
    ...]), ...]; the first piece gets the id, the next ones `id-2`, `id-3` ... A segment whose pieces overlap
    another's (or lie outside the file's `size` bytes) is left unwrapped, with a warning."""
    out: list[tuple[int, int, str]] = []
    wrapped: set[str] = set()
    done = 0
    for span_id, pieces in sorted(spans, key=lambda s: s[1][0][0] if s[1] else -1):
        flat = [x for piece in pieces for x in piece]
        if not pieces or flat != sorted(flat) or flat[0] < done or flat[-1] > size or any(a >= b for a, b in pieces):
            log.warning("narration: the text of %s is not where it was found; it is spoken, not highlighted", span_id)
            continue
        for k, (start, end) in enumerate(pieces, 1):
            piece_id = span_id if k == 1 else f"{span_id}-{k}"
            out += [(start, 1, f'<span id="{html.escape(piece_id)}">'), (end, 0, "</span>")]
        done = flat[-1]
        wrapped.add(span_id)
    return out, wrapped


def opf_inserts(package, items: Sequence[tuple[str, str, str]], overlays: dict[str, str],
                durations: Sequence[tuple[str, str]], total: str, narrator: str = "",
                accessibility: Sequence[tuple[str, str]] = ()) -> list[tuple[int, int, str]]:
    """The package document's new text: manifest `items` (id, href, media type), `overlays` (narrated file ->
    its overlay's id) as media-overlay attributes, `durations` ((overlay id, clock value)), the `total` and
    the `accessibility` metadata ((property, value), `jobs.narrated.accessibility`)."""
    manifest = "".join(f'    <item id="{i}" href="{html.escape(h)}" media-type="{t}"/>\n' for i, h, t in items)
    metadata = "".join(f'    <meta property="media:duration" refines="#{i}">{d}</meta>\n' for i, d in durations)
    metadata += f'    <meta property="media:duration">{total}</meta>\n'
    metadata += f'    <meta property="media:active-class">{ACTIVE_CLASS}</meta>\n'
    if narrator:
        metadata += f'    <meta property="media:narrator">{html.escape(narrator)}</meta>\n'
    metadata += "".join(f'    <meta property="{p}">{html.escape(v, quote=False)}</meta>\n' for p, v in accessibility)
    out = [(package.manifest_end, 0, manifest), (package.metadata_end, 0, metadata)]
    out += [(package.items[doc], 0, f' media-overlay="{overlay}"') for doc, overlay in overlays.items()]
    return out
