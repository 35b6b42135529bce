"""gzip meta files (:mod:`indexed_gzip`): any gzip, one member or many (BGZF, ``cat a.gz b.gz``).
No torch.

A checkpoint holds the 32 KiB window that decompression needs to start mid-stream, so there is one
every :data:`~rank_dataset.files.formats.base.SPACING` bytes of output whatever the file. The codec
itself is :mod:`rank_dataset.files.formats._gzip`, imported on first use: recognising a file imports
no codec (issue 44, item 6).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rank_dataset.files.formats._raw import RawFile
from rank_dataset.files.formats.base import Decoder, Format, Recognised, Stream

if TYPE_CHECKING:
    from rank_dataset.files.formats.checkpoints import Checkpoints

__all__ = ["GZIP", "GzipFormat"]

_MAGIC = b"\x1f\x8b"


class GzipFormat(Format):
    """gzip: recognised by its magic bytes, checkpoints from indexed_gzip, checked by zlib."""

    value = "gzip"
    code = 1
    compressed = True

    def recognise(self, found: Recognised) -> bool:
        return found.head[:2] == _MAGIC

    def stream(self, path: Path, fd: RawFile, spacing: int, block: int) -> Stream:
        from rank_dataset.files.formats import _gzip

        return _gzip.stream(path, fd, spacing, block)

    def members(self, path: Path, fd: RawFile, block: int) -> Iterator[bytes]:
        from rank_dataset.files.formats import _gzip

        return _gzip.members(path, fd, block)

    def reader(self, path: Path, fd: RawFile, checkpoints: Checkpoints) -> Decoder:
        from rank_dataset.files.formats import _gzip

        return _gzip.Reader(path, fd, checkpoints.points, checkpoints.state)


GZIP = GzipFormat()
