"""Where a segment's text lies in its source: the byte ranges of the original file that a span may wrap.

Segmentation works on text that ingestion cleaned (whitespace folded, footnote markers dropped, ligatures
expanded, dashes and ellipses tidied), so a segment is found in its paragraph's runs (`jobs.document.TextRun`)
by matching what both say, not by offsets carried through every step: the letters and digits must match in
order (compared NFKC-folded, case-insensitive); punctuation matches where it can and is skipped where the
cleanup changed it; a few letters of the source the segment lacks (a footnote marker) are passed over. A
segment that is not found gets no range (the narration leaves it out and says so), it never gets a wrong one.

A sentence may cross inline markup (`<p>... <em>end of one. Start of two</em> goes on.</p>`): a span from
its first to its last character would not nest. The range is then cut where it must be, into the fewest
pieces that each nest (runs of one parent element, the elements between them whole): "Start of two" and
" goes on." above. Each piece becomes a span of its own (`jobs.narrated.splice`); the narration's `par`
points at the first.
"""
from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

from jobs.document import TextSource

_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
WINDOW = 4000  # how far past the last segment found the next one may begin (one not found is passed over)
MAX_INNER_SKIP = 12  # letters of the source a segment may lack between two that match (footnote markers)


@lru_cache(maxsize=4096)
def _key(ch: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKC", ch).casefold() if not c.isspace())


@dataclass(frozen=True)
class _Atom:
    """One character of the source as written (an entity is one atom): its run and bytes [start, stop),
    and its text folded for comparison (`key`; "" for a space)."""

    run: int
    start: int
    stop: int
    key: str
    space: bool

    @property
    def mark(self) -> bool:
        """Punctuation: neither letter, digit nor space."""
        return not self.space and not self.key.isalnum()


def _atoms(source: TextSource) -> list[_Atom]:
    """The characters of a source's runs, entities resolved, with their byte offsets."""
    out: list[_Atom] = []
    for k, run in enumerate(source.runs):
        pos, at = run.start, 0
        for m in [*_ENTITY.finditer(run.raw), None]:
            pieces = list(run.raw[at:m.start() if m else len(run.raw)])
            if m is not None:
                pieces.append(m.group())
            for piece in pieces:
                size = len(piece.encode("utf-8"))
                text = html.unescape(piece) if len(piece) > 1 else piece
                out.append(_Atom(k, pos, pos + size, "".join(_key(c) for c in text), text.isspace()))
                pos += size
            if m is None:
                break
            at = m.end()
    return out


class Locator:
    """Finds segments of one source in order (each after the one before)."""

    def __init__(self, source: TextSource):
        self.source = source
        self.atoms = _atoms(source)
        self.keys = [(c, i) for i, atom in enumerate(self.atoms) for c in atom.key]  # (folded char, atom)
        self.cursor = 0  # into keys
        self.done_atom = -1  # the last atom a found segment took

    def find(self, text: str) -> Optional[list[tuple[int, int]]]:
        """The byte ranges (pieces that each nest) of the next occurrence of `text`, or None."""
        target = [c for ch in text for c in _key(ch)]
        first_alnum = next((i for i, c in enumerate(target) if c.isalnum()), None)
        if first_alnum is None:
            return None
        best = None  # (letters passed over, first key, last key): the first exact match, else the closest
        for j0 in range(self.cursor, min(len(self.keys), self.cursor + WINDOW + len(target))):
            if self.keys[j0][0] != target[first_alnum]:
                continue
            found = self._match(target, first_alnum, j0)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], j0, found[1])
                if not found[0]:
                    break
        if best is None:
            return None
        start, end = self._widen(self.keys[best[1]][1], self.keys[best[2]][1])
        self.done_atom = end
        self.cursor = next((j for j in range(best[2] + 1, len(self.keys)) if self.keys[j][1] > end), len(self.keys))
        return self._pieces(start, end)

    def _match(self, target: list[str], i: int, j: int) -> Optional[tuple[int, int]]:
        """(letters passed over, the key index of the last match) when `target[i:]` matches from key `j` on."""
        last, skipped = None, 0
        while i < len(target):
            if j >= len(self.keys):
                return None
            raw, want = self.keys[j][0], target[i]
            if raw == want:
                last, i, j = j, i + 1, j + 1
            elif not want.isalnum():
                i += 1  # punctuation the cleanup made (or changed)
            elif not raw.isalnum():
                j += 1  # punctuation of the source the segment does not have
            else:
                skipped, j = skipped + 1, j + 1  # a letter the segment lacks: a marker dropped
                if skipped > MAX_INNER_SKIP:
                    return None
        return skipped, last

    def _widen(self, start: int, end: int) -> tuple[int, int]:
        """Take the punctuation that clings to the found text (quotes, the final stop) into it."""
        atoms = self.atoms
        while start - 1 > self.done_atom and atoms[start - 1].mark:
            start -= 1
        while end + 1 < len(atoms) and atoms[end + 1].mark:
            end += 1
        return start, end

    def _pieces(self, start: int, end: int) -> list[tuple[int, int]]:
        """Atoms [start, end] as byte ranges that nest: one span where the elements it starts or ends in hold
        no other text (it then takes their tags in), else runs of one parent grouped, whitespace trimmed."""
        whole = self._lifted(start, end)
        if whole is not None:
            return [whole]
        runs = self.source.runs
        pieces: list[tuple[int, int]] = []
        k = self.atoms[start].run
        while k <= self.atoms[end].run:
            m = max(x for x in range(k, self.atoms[end].run + 1) if runs[x].parent == runs[k].parent)
            inside = [a for a in self.atoms[start:end + 1] if k <= a.run <= m and not a.space]
            if inside:
                pieces.append((inside[0].start, inside[-1].stop))
            k = m + 1
        return pieces


    def _lifted(self, start: int, end: int) -> Optional[tuple[int, int]]:
        """Atoms [start, end] as one range that nests, or None: the start moves out of the elements whose
        text begins with it (before their start tags), the end out of those whose text ends with it, up to the
        element that holds both; where both get there, a span from one to the other nests."""
        elements = {e.number: e for e in self.source.elements}
        a, b = self.atoms[start], self.atoms[end]
        pa, pb = self.source.runs[a.run].parent, self.source.runs[b.run].parent
        above = set()
        node = pb
        while node in elements:
            above.add(node)
            node = elements[node].parent
        top = pa
        while top in elements and top not in above:
            top = elements[top].parent
        if top not in above:
            return None
        x, node = a.start, pa
        while node != top and elements[node].first == a.start and elements[node].phrasing:
            x, node = elements[node].open, elements[node].parent
        y, node_b = b.stop, pb
        while node_b != top and elements[node_b].last == b.stop and elements[node_b].phrasing:
            y, node_b = elements[node_b].close, elements[node_b].parent
        return (x, y) if node == top and node_b == top else None


def locate(texts: Sequence[str], source: Optional[TextSource]) -> list[Optional[list[tuple[int, int]]]]:
    """The byte ranges of each of `texts` (in order) in `source`; None for one not found (or no source)."""
    if source is None or not source.runs:
        return [None] * len(texts)
    finder = Locator(source)
    return [finder.find(t) for t in texts]
