"""The narrated EPUB (EPUB 3 with Media Overlays)."""
