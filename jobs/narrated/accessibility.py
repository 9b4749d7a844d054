"""The accessibility metadata of a narrated EPUB (schema.org properties in its package document, as EPUB
Accessibility asks and Ace by DAISY checks): what the narration makes true, and nothing the book already says.

The narration adds synchronized audio to the text, so the book gets `accessibilityFeature
synchronizedAudioText` and `accessMode auditory` wherever it does not say so already. A property the book
does not declare at all is filled in with what is known of it: a simple EPUB made of the text
(`jobs.narrated.generate`) is text with headings and a table of contents, no hazard; an input EPUB's own
content is not ours to vouch for: textual (and visual where its manifest lists images), hazards unknown. What
the book declares is kept as it is (the narration only inserts, `jobs.narrated.splice`).
"""
from __future__ import annotations

from jobs.document import EpubPackage

SUMMARY_GENERATED = ("The text of this book with a text-to-speech narration: each sentence is read aloud and "
                     "highlighted as it is read (EPUB Media Overlays). Chapters have headings and are listed in "
                     "the table of contents.")
SUMMARY_INPUT = ("This edition adds a text-to-speech narration: each sentence found in the text is read aloud "
                 "and highlighted as it is read (EPUB Media Overlays).")


def accessibility_metadata(package: EpubPackage, generated: bool) -> list[tuple[str, str]]:
    """(property, value) of each `<meta>` the narrated book's package document gets."""
    declared = package.accessibility
    if declared is None:  # a map made before the package's metadata was read: only what the narration adds
        return [("schema:accessibilityFeature", "synchronizedAudioText")]
    out: list[tuple[str, str]] = []

    def add(prop: str, *values: str) -> None:
        out.extend((prop, v) for v in values if v not in declared.get(prop, ()))

    visual = ("visual",) if package.images else ()
    if "schema:accessMode" in declared:
        add("schema:accessMode", "auditory")
    else:
        add("schema:accessMode", "textual", *visual, "auditory")
    if generated and "schema:accessibilityFeature" not in declared:
        add("schema:accessibilityFeature", "tableOfContents", "readingOrder")
    add("schema:accessibilityFeature", "synchronizedAudioText")
    if "schema:accessModeSufficient" not in declared:
        add("schema:accessModeSufficient", ",".join(("textual", *visual)))
    if "schema:accessibilityHazard" not in declared:
        add("schema:accessibilityHazard", "none" if generated else "unknown")
    if "schema:accessibilitySummary" not in declared:
        add("schema:accessibilitySummary", SUMMARY_GENERATED if generated else SUMMARY_INPUT)
    return out
