"""The narrated EPUB (job format `epub`): EPUB 3 with Media Overlays, the book's text highlighted as it is read.

At submit, `prepare` keeps the book the narration goes into (an EPUB 3 input itself; else `generate`'s
simple EPUB of the text) and finds each segment's text in it (`align`, from the positions the sandboxed
reader noted: `jobs.document.TextSource`). At assembly, `writer` inserts the spans (`splice`), writes one
overlay per narrated file (`smil`, clip times from the subtitles' spans) and packs the chapter audio.
"""
