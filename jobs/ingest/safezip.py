"""Reading zip containers (EPUB, DOCX, ODT, .fb2.zip) without trusting them: zip-bomb and size checks."""
from __future__ import annotations

import io
import logging
import zipfile

from jobs.errors import IngestError

log = logging.getLogger(__name__)


class SafeZip:
    """A zip archive whose declared sizes were checked before anything is extracted.

    Every member read is also capped at its declared size, so an archive that lies
    about its sizes cannot expand beyond the limits.
    """

    def __init__(self, data: bytes, kind: str, max_total: int, max_ratio: float, max_entries: int = 10_000):
        self.kind = kind
        try:
            self.zf = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, OSError, ValueError):
            raise IngestError(f"The {kind} file is not a valid zip archive (is it really {kind}?).") from None
        infos = self.zf.infolist()
        if len(infos) > max_entries:
            raise IngestError(f"The {kind} file has too many entries ({len(infos)}); refusing to open it.")
        total = sum(i.file_size for i in infos)
        packed = sum(i.compress_size for i in infos)
        if total > max_total:
            raise IngestError(
                f"The {kind} file would expand to {total // (1024 * 1024)} MB, over the limit of "
                f"{max_total // (1024 * 1024)} MB (possible zip bomb); refusing to open it."
            )
        for i in infos:
            ratio = i.file_size / max(i.compress_size, 1)
            if ratio > max_ratio and i.file_size > 1024 * 1024:
                raise IngestError(
                    f"The {kind} file has a suspicious compression ratio ({ratio:.0f}:1 for {i.filename}); "
                    "refusing to open it (possible zip bomb)."
                )
        if packed and total / packed > max_ratio and total > 1024 * 1024:
            raise IngestError(f"The {kind} file has a suspicious overall compression ratio; refusing to open it.")
        self.names = {i.filename for i in infos}
        self._infos = {i.filename: i for i in infos}

    def has(self, name: str) -> bool:
        return name in self.names

    def read(self, name: str) -> bytes:
        """Read one member, never more than its declared size."""
        info = self._infos.get(name)
        if info is None:
            raise IngestError(f"The {self.kind} file is missing {name!r}.")
        try:
            with self.zf.open(info) as fh:
                data = fh.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, EOFError) as exc:
            raise IngestError(f"The {self.kind} file is damaged: cannot read {name!r} ({exc}).") from None
        if len(data) > info.file_size:
            raise IngestError(f"The {self.kind} file lies about the size of {name!r}; refusing to read it.")
        return data

    def close(self) -> None:
        self.zf.close()
