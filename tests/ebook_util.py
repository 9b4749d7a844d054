"""Sample e-books built in the tests (ODT, FB2, RTF; MOBI/AZW3 in mobi_util.py): each covers chapters from
the format's own structure, its metadata, footnotes and non-ASCII text ("Zoë", "Straße", CJK)."""
from __future__ import annotations

import zipfile
from pathlib import Path

ODF = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
       'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
       'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
       'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
       'xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:meta="urn:oasis:names:tc:opendocument:xmlns:meta:1.0" '
       'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"')

# A heading of each kind (text:h with outline levels 1 and 2, a paragraph whose automatic style's parent is
# "Heading 1"), the Title style, a table of contents, spaces/tabs, a footnote, a list, a table, deleted text
# kept in tracked changes, and a title/author in meta.xml.
ODT_BODY = """<text:tracked-changes><text:changed-region><text:deletion><text:p>Deleted words.</text:p>
</text:deletion></text:changed-region></text:tracked-changes>
<text:p text:style-name="P1">Zoë's Title Paragraph</text:p>
<text:table-of-content><text:index-body><text:p>Chapter Eins 1</text:p><text:p>第二章 2</text:p></text:index-body>
</text:table-of-content>
<text:h text:outline-level="1">Chapter Eins</text:h>
<text:p>Die <text:span>Straße</text:span>,<text:s text:c="3"/>ein<text:tab/>Weg.<text:note text:note-class="footnote">
<text:note-citation>1</text:note-citation><text:note-body><text:p>A footnote.</text:p></text:note-body></text:note></text:p>
<text:h text:outline-level="2">A section</text:h><text:p>Section text.</text:p>
<text:list><text:list-item><text:p>Item one</text:p></text:list-item><text:list-item><text:p>Item two</text:p>
</text:list-item></text:list>
<text:p text:style-name="P2">第二章</text:p>
<table:table><table:table-row><table:table-cell><text:p>中文单元格</text:p></table:table-cell></table:table-row>
</table:table>"""


def make_odt(path: Path, body: str = ODT_BODY, content: str | None = None, mimetype: str = "text",
             manifest: str = "", extra: dict | None = None) -> Path:
    styles = (f'<office:document-styles {ODF}><office:styles><style:style style:name="Heading_20_1" '
              'style:display-name="Heading 1" style:family="paragraph" style:default-outline-level="1"/>'
              '<style:style style:name="Title" style:family="paragraph"/></office:styles></office:document-styles>')
    auto = ('<office:automatic-styles><style:style style:name="P1" style:family="paragraph" '
            'style:parent-style-name="Title"/><style:style style:name="P2" style:family="paragraph" '
            'style:parent-style-name="Heading_20_1"/></office:automatic-styles>')
    content = content or (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ODF}>{auto}'
                          f"<office:body><office:text>{body}</office:text></office:body></office:document-content>")
    meta = (f'<office:document-meta {ODF}><office:meta><dc:title>The ODT Book</dc:title>'
            "<meta:initial-creator>Zoë Writer</meta:initial-creator><dc:language>de</dc:language>"
            "</office:meta></office:document-meta>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", f"application/vnd.oasis.opendocument.{mimetype}", compress_type=zipfile.ZIP_STORED)
        z.writestr("content.xml", content)
        z.writestr("styles.xml", styles)
        z.writestr("meta.xml", meta)
        z.writestr("META-INF/manifest.xml", f"<manifest:manifest {ODF}>{manifest}</manifest:manifest>")
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return path


# Nested sections (a part holding chapters, a chapter with a two-line title), a body title, a poem, an
# epigraph, a note link and a notes body, a cover <binary>, metadata with two authors.
FB2 = """<?xml version="1.0" encoding="{encoding}"?>
<FictionBook xmlns="http://www.gribuser.ru/xml/fictionbook/2.0" xmlns:l="http://www.w3.org/1999/xlink">
<description><title-info><author><first-name>Zoë</first-name><last-name>Straße</last-name></author>
<author><nickname>Ghost</nickname></author><book-title>Das FB2 Buch</book-title><lang>de</lang>
<coverpage><image l:href="#cover.jpg"/></coverpage></title-info></description>
<body><title><p>Das FB2 Buch</p></title>
<section><title><p>Teil Eins</p></title>
<section><title><p>Kapitel 1</p><p>Der Anfang</p></title><epigraph><p>Ein Motto.</p></epigraph>
<p>Zoë ging <emphasis>über</emphasis> die Straße.<a l:href="#n1" type="note">[1]</a></p><empty-line/>
<poem><stanza><v>Erste Zeile</v><v>Zweite Zeile</v></stanza></poem></section>
<section><title><p>Kapitel 2</p></title><p>{cjk}</p></section></section></body>
<body name="notes"><section id="n1"><title><p>1</p></title><p>Die Fußnote.</p></section></body>
<binary id="cover.jpg" content-type="image/jpeg">/9j/4AAQSkZJRgABAQ==</binary>
</FictionBook>"""


def fb2_bytes(encoding: str = "utf-8", cjk: str = "第二章的文字。") -> bytes:
    return FB2.format(encoding=encoding, cjk=cjk).encode(encoding, "xmlcharrefreplace")


# Font table (charsets 0, 128 Shift-JIS, 204 Cyrillic), a stylesheet (heading by outline level, by name, the
# Title style, a \* character style), \info, a picture, a field, \uN with ?-fallbacks and a surrogate
# pair, \ucN, a footnote, hidden text, \bin data.
RTF = r"""{\rtf1\ansi\ansicpg1252\deff0{\fonttbl{\f0\fswiss\fcharset0 Arial;}{\f1\fnil\fcharset128 MS Mincho;}
{\f2\froman\fcharset204 Times;}}{\colortbl;\red0\green0\blue0;}
{\stylesheet{\s0 Normal;}{\s1\outlinelevel0 heading 1;}{\s2 \'dcberschrift 2;}{\s15 Title;}
{\*\cs10 \additive Default Paragraph Font;}}
{\info{\title The RTF Book}{\author Zo\'eb Writer}{\creatim\yr2024}}
\pard\s15 Title Paragraph\par
\pard\s1 Chapter Zo\'eb\par
\pard\s0 Die Stra\'dfe, \u8220?quoted\u8221? and \u-10179?\u-8704?.{\footnote \chftn A footnote.} End.\par
\pard {\f1 \'93\'fa\'96\'7b\'8c\'ea} und {\f2 \'cf\'f0\'e8\'e2\'e5\'f2}\par
{\pict\wmetafile8\picw10 0123456789abcdef}{\*\bkmkstart x}{\v hidden words}
{\field{\*\fldinst HYPERLINK "https://example.org"}{\fldrslt link text}}\par
\pard\s2 Second Heading\par
\pard\uc2 Two \u26085\'93\'fa fallbacks,\tab tab\line line. {\*\blipuid \bin4 }}}}} bin\par
}"""
