"""An EPUB's package map (`jobs.document.EpubPackage`), made in the sandboxed reader: where its package
document takes the narration's new manifest items, metadata and media-overlay attributes, as byte offsets,
so that the narrated EPUB is written later by inserting text at those offsets, without reading the book's
XML again outside the sandbox."""
from __future__ import annotations

import hashlib
import html
import posixpath
from typing import Iterable, Optional

from jobs.document import EpubPackage
from jobs.ingest.xmlscan import byte_offsets, decode_utf8, scan

PREFIX = "tts-narration"
ACCESSIBILITY = ("schema:accessMode", "schema:accessModeSufficient", "schema:accessibilityFeature",
                 "schema:accessibilityHazard", "schema:accessibilitySummary")  # what the narration may add to


def package_map(data: bytes, opf_path: str, opf: bytes, docs: dict[str, str], heads: dict[str, int],
                ids: set[str], names: Iterable[str]) -> EpubPackage:
    """The map of an EPUB (`data`: the whole file) whose package document `opf` lies at `opf_path`. `docs`:
    spine document -> its manifest item's id, for the documents read with positions; `heads`: their `</head>`
    byte offsets; `ids`: every id of those documents; `names`: the zip's member names."""
    out = EpubPackage(opf=opf_path, sha256=hashlib.sha256(data).hexdigest())
    decoded = decode_utf8(opf)
    found = scan(decoded[0]) if decoded else None
    if found is None:
        out.problem = "its package document is not plain UTF-8 XML"
        return out
    text, bom = decoded
    tags = found.tags
    package = next((t for t in tags if t.local == "package" and not t.end), None)
    version = (package.attrs.get("version") or "") if package else ""
    if not version.startswith("3"):
        out.problem = f"it is EPUB {version or '(no version)'}; only EPUB 3 carries media overlays"
        return out
    items = [t for t in tags if t.local == "item" and not t.end]
    if any("media-overlay" in t.attrs for t in items):
        out.problem = "it has media overlays (a narration) already"
        return out
    manifest_end = _end_tag(tags, "manifest")
    metadata_end = _end_tag(tags, "metadata")
    if manifest_end is None or metadata_end is None:
        out.problem = "its package document has no manifest or no metadata"
        return out
    by_id = {t.attrs.get("id"): t for t in items}
    item_ends = {path: by_id[item_id].attrs_end for path, item_id in docs.items() if item_id in by_id}
    offsets = byte_offsets(text, [manifest_end, metadata_end, *item_ends.values()])
    out.manifest_end, out.metadata_end = offsets[manifest_end] + bom, offsets[metadata_end] + bom
    out.items = {path: offsets[at] + bom for path, at in item_ends.items()}
    out.heads = dict(heads)
    out.accessibility = _accessibility(text, tags)
    out.images = any((t.attrs.get("media-type") or "").startswith("image/") for t in items)
    taken = ids | {t.attrs.get("id") or "" for t in tags}
    out.prefix = free_prefix(taken, names, posixpath.dirname(opf_path))
    return out


def _accessibility(text: str, tags) -> dict:
    """{property: [values]} of the package's own accessibility metadata (ACCESSIBILITY; EPUB 3's
    `<meta property=...>value</meta>` and the older `<meta name=... content=.../>`; none that refines another)."""
    out: dict[str, list[str]] = {}
    for k, tag in enumerate(tags):
        if tag.end or tag.local != "meta" or "refines" in tag.attrs:
            continue
        prop = tag.attrs.get("property") or tag.attrs.get("name")
        if prop not in ACCESSIBILITY:
            continue
        if "property" in tag.attrs:
            close = None if tag.empty else next((t for t in tags[k + 1:] if t.end and t.local == "meta"), None)
            value = html.unescape(text[tag.stop:close.start]) if close is not None else ""
        else:
            value = tag.attrs.get("content") or ""
        if value.split():
            out.setdefault(prop, []).append(" ".join(value.split()))
    return out


def _end_tag(tags, local: str) -> Optional[int]:
    return next((t.start for t in tags if t.end and t.local == local), None)


def free_prefix(ids: Iterable[str], names: Iterable[str], folder: str) -> str:
    """A name (PREFIX, else PREFIX2, PREFIX3, ...) that no id starts with and no member in `folder` does."""
    ids = [i for i in ids if i]
    inside = [n[len(folder) + 1:] if folder else n for n in names if not folder or n.startswith(folder + "/")]
    n = 1
    while True:
        prefix = PREFIX if n == 1 else f"{PREFIX}{n}"
        if not any(i.startswith(prefix) for i in ids) and not any(m.startswith(prefix) for m in inside):
            return prefix
        n += 1
