"""Where an EPUB's text lies: a spine document read with positions (`jobs.document.TextSource` per block),
in the sandboxed reader, so that the narration can later wrap a sentence of the original file by byte offsets."""
from __future__ import annotations

from typing import Optional

from jobs.document import Element, TextRun, TextSource
from jobs.ingest.blocks import Block
from jobs.ingest.html import html_to_blocks
from jobs.ingest.xmlscan import Scan, byte_offsets, decode_utf8, scan

# elements a span may hold (HTML's phrasing content, and the old presentational ones): a span is moved out of
# these only, so it never takes in a block
PHRASING = {"a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins",
            "kbd", "label", "mark", "q", "rb", "rp", "rt", "ruby", "s", "samp", "small", "span", "strike",
            "strong", "sub", "sup", "time", "tt", "u", "var"}


def positioned_blocks(data: bytes, path: str, skip_footnotes: bool) -> Optional[tuple[list[Block], dict, Scan]]:
    """The blocks of spine document `path` (its bytes `data`), each with its source, its metadata (with
    `head_end`: the byte offset of its `</head>`, -1: none) and its scan; None when the document is not plain
    UTF-8 XML (`jobs.ingest.xmlscan`: it is then read without positions)."""
    decoded = decode_utf8(data)
    found = scan(decoded[0]) if decoded else None
    if found is None:
        return None
    text, bom = decoded
    blocks, meta = html_to_blocks(text, skip_footnotes, found)
    chains = {k: chain(found, [found.runs[i][2] for i in b.runs]) for k, b in enumerate(blocks) if b.runs}
    head = next((t.start for t in found.tags if t.end and t.local == "head"), -1)
    used = sorted({i for b in blocks for i in b.runs or ()})
    wanted = [x for i in used for x in found.runs[i][:2]] + [head] + [
        x for c in chains.values() for n in c for x in found.elements[n][1:5]]
    at = {o: b + bom for o, b in byte_offsets(text, [x for x in wanted if x >= 0]).items()}
    at[-1] = -1
    runs = {i: TextRun(at[found.runs[i][0]], at[found.runs[i][1]], found.runs[i][2],
                       text[found.runs[i][0]:found.runs[i][1]]) for i in used}
    for k, b in enumerate(blocks):
        if b.runs:
            elements = tuple(Element(n, found.elements[n][0], *(at[x] for x in found.elements[n][1:5]),
                                     phrasing=found.elements[n][5] in PHRASING) for n in chains[k])
            b.source = TextSource(path, tuple(runs[i] for i in b.runs), elements)
    meta["head_end"] = at[head]
    return blocks, meta, found


def chain(found: Scan, parents: list[int], depth: int = 32) -> list[int]:
    """The elements from each of `parents` up to the nearest one that holds them all (none when that is
    more than `depth` levels up)."""
    paths = []
    for p in dict.fromkeys(parents):
        path = [p]
        while path[-1] in found.elements and len(path) <= depth:
            path.append(found.elements[path[-1]][0])
        paths.append(path)
    common = set(paths[0]).intersection(*paths[1:])
    top = next((n for n in paths[0] if n in common), None)
    if top is None or top not in found.elements:
        return []
    return list(dict.fromkeys(n for path in paths for n in path[:path.index(top) + 1]))
