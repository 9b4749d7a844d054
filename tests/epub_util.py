"""Shared by the narrated-EPUB tests: a small valid EPUB 3 whose sentences cross inline markup, reading a
narrated EPUB's overlays and its chapters' WebVTT cues, and epubcheck's verdict."""
from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from urllib.parse import unquote

OPF_NS = "{http://www.idpf.org/2007/opf}"
SMIL = "{http://www.w3.org/ns/SMIL}"

CONTAINER = """<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>
"""
OPF = """<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="uid" xml:lang="en">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:identifier id="uid">urn:uuid:8d3c7f0e-3c1a-4f5e-9d1b-2b6f4a0c9e11</dc:identifier>
    <dc:title>The Station</dc:title>
    <dc:creator>Ann Author</dc:creator>
    <dc:language>en</dc:language>
    <meta property="dcterms:modified">2024-01-02T03:04:05Z</meta>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="css" href="style.css" media-type="text/css"/>
    <item id="ch1" href="text/ch1.xhtml" media-type="application/xhtml+xml"/>
    <item id="ch2" href="text/ch2.xhtml"
          media-type="application/xhtml+xml" />
  </manifest>
  <spine>
    <itemref idref="nav" linear="no"/>
    <itemref idref="ch1"/>
    <itemref idref="ch2"/>
  </spine>
</package>
"""
NAV = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" xml:lang="en" lang="en">
<head><title>Contents</title></head>
<body><nav epub:type="toc" id="toc"><h1>Contents</h1><ol>
<li><a href="text/ch1.xhtml">The Morning</a></li>
<li><a href="text/ch2.xhtml#c2">The Station</a></li>
</ol></nav></body></html>
"""


def xhtml(title: str, body: str) -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" xml:lang="en" lang="en">
<head>
  <meta charset="utf-8"/>
  <title>{title}</title>
  <link rel="stylesheet" type="text/css" href="../style.css"/>
</head>
<body>
{body}
</body>
</html>
"""


# sentences cross inline elements both ways: "Nobody ... spoke" starts inside <em> and ends outside it;
# "Tom &amp; Anna left <i>early</i>." holds one whole; the title is the file's own heading
CH1 = xhtml("The Morning", """<section epub:type="chapter" id="c1">
<h1>The <em>Morning</em></h1>
<p id="p1">The morning was <em>cold and grey. Nobody at the table</em> spoke a word at breakfast.
Tom &amp; Anna left <i>early</i>, long before the others had woken.</p>
<p>She said: \u201c<strong>Wait for me</strong>,\u201d and ran. He waited<a epub:type="noteref"
href="#n1">1</a> by the door.</p>
<aside epub:type="footnote" id="n1"><p>He always waited.</p></aside>
</section>""")
CH2 = xhtml("The Station", """<section epub:type="chapter" id="c2">
<h2>The Station</h2>
<p>The train was late. <span class="x">The platform <b>was</b> empty.</span> Caf\u00e9 lights burned.</p>
<div><p>Then, at last, the train came.</p></div>
</section>""")
CSS = "body { font-family: serif; }\n"


def make_epub(path: Path, files: dict | None = None) -> Path:
    """A valid EPUB 3 (epubcheck: no error, no warning) at `path`; `files` replaces members."""
    content = {"META-INF/container.xml": CONTAINER, "OEBPS/content.opf": OPF, "OEBPS/nav.xhtml": NAV,
               "OEBPS/style.css": CSS, "OEBPS/text/ch1.xhtml": CH1, "OEBPS/text/ch2.xhtml": CH2}
    content.update(files or {})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        for name, data in content.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def _command() -> list[str] | None:
    """How to run epubcheck: Debian's is a jar behind a link (run by java where binfmt_misc does not)."""
    found = shutil.which("epubcheck")
    if found is None:
        return None
    jar = Path(found).resolve()
    if jar.suffix == ".jar":
        return [shutil.which("java") or "java", "-jar", str(jar)]
    return [found]


def epubcheck_missing() -> str | None:
    """Why epubcheck cannot run here, or None."""
    if _command() is None:
        return "epubcheck is not installed (apt-get install epubcheck; .ci/run and ./install.sh --dev do as root)"
    if _command()[0].endswith("java") and not shutil.which("java"):
        return "epubcheck is installed but java is not (apt-get install default-jre-headless)"
    return None


def epubcheck(path: Path) -> tuple[list[str], list[str], str]:
    """Run epubcheck on `path` -> (errors and fatal errors, warnings, its whole output)."""
    run = subprocess.run([*_command(), str(path)], capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    errors = re.findall(r"^(?:ERROR|FATAL)\(.*$", out, re.M)
    warnings = re.findall(r"^WARNING\(.*$", out, re.M)
    if run.returncode != 0 and not errors:
        errors = [f"epubcheck exited {run.returncode}"]
    return errors, warnings, out


def vtt_cues(path: Path) -> list[tuple[str, str, str]]:
    """(start, end, text) of each cue of a .vtt file."""
    blocks = path.read_text(encoding="utf-8").split("\n\n")[1:]
    return [tuple(b.split("\n")[0].split(" --> ")) + (b.split("\n")[1],) for b in blocks if "-->" in b]


def overlays(epub: zipfile.ZipFile):
    """(opf path, opf root, {overlay id: (smil path, narrated xhtml path)})."""
    container = ET.fromstring(epub.read("META-INF/container.xml"))
    opf_path = next(e.get("full-path") for e in container.iter() if e.tag.endswith("rootfile"))
    opf = ET.fromstring(epub.read(opf_path))
    base = posixpath.dirname(opf_path)
    items = {i.get("id"): i for i in opf.iter(OPF_NS + "item")}
    found = {}
    for item in items.values():
        if item.get("media-overlay"):
            smil = items[item.get("media-overlay")]
            assert smil.get("media-type") == "application/smil+xml"
            found[smil.get("id")] = (posixpath.join(base, unquote(smil.get("href"))),
                                     posixpath.join(base, unquote(item.get("href"))))
    return opf_path, opf, found


def metadata(opf) -> dict[tuple[str, str | None], list[str]]:
    """{(property, refines): [values]} of a package document's <meta> elements."""
    out: dict = {}
    for m in opf.iter(OPF_NS + "meta"):
        out.setdefault((m.get("property"), m.get("refines")), []).append(m.text)
    return out


def clock_ms(value: str) -> int:
    """A SMIL clock value (HH:MM:SS.mmm) in milliseconds."""
    h, m, s = value.split(":")
    return round((int(h) * 3600 + int(m) * 60 + float(s)) * 1000)
