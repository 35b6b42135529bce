"""Parquet meta files (:mod:`pyarrow`, the ``parquet`` extra): rows, read by row group. No torch.

A row is a sample, its line the chosen columns joined by a tab; the index is the footer's row counts
(:class:`ParquetLayout`), read without the data. The reader itself is
:mod:`rank_dataset.files.formats._parquet`, imported on first use (:class:`ParquetRows` is a lazy name
here): recognising a file, or reading a text one, imports no Parquet reader (issue 44, item 6).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats._layout import ParquetLayout
from rank_dataset.files.formats.base import Format, Recognised

if TYPE_CHECKING:
    from rank_dataset.files.formats._parquet import ParquetRows
    from rank_dataset.files.sources import ObjectFile

__all__ = ["PARQUET", "ParquetFormat", "ParquetLayout", "ParquetRows", "object_rows"]

_MAGIC = b"PAR1"


class ParquetFormat(Format):
    """Parquet: its magic bytes at both ends (a file that has only the first is cut short, and is
    told as text, and refused: :meth:`refuse_cut`)."""

    value = "parquet"
    code = 3
    rows = True

    def recognise(self, found: Recognised) -> bool:
        return found.head[:4] == _MAGIC and found.size >= 12 and found.tail(4) == _MAGIC

    def refuse_cut(self, path: Path, head: bytes, size: int) -> None:
        # Parquet's magic, and named .parquet or holding a NUL byte in its first 64 KiB (text does not).
        if head[:4] == _MAGIC and (path.suffix.lower() == ".parquet" or b"\0" in head):
            raise CorruptMetaFileError(
                path, size, "it starts as a Parquet file (PAR1) but ends without its footer (truncated?)"
            )

    def open_rows(self, path: Path, columns: Sequence[str] | None) -> ParquetRows:
        from rank_dataset.files.formats._parquet import ParquetRows  # on first use: pyarrow's reader

        return ParquetRows(path, columns)


PARQUET = ParquetFormat()


def object_rows(source: ObjectFile, columns: Sequence[str] | None, *, ahead: int = 0) -> ParquetRows:
    """The rows of the Parquet object ``source``, read by pyarrow through ranged GETs pinned to its
    ETag (:class:`~rank_dataset.files.sources.object.ObjectIO`; one client, obstore's): a row group's
    chosen column chunks in one GET where they lie close, with the next row groups' up to ``ahead``
    bytes (for a reader that goes through them in order)."""
    from rank_dataset.files.formats._parquet import ParquetRows
    from rank_dataset.files.sources.object import ObjectFile, ObjectIO  # the format is above its sources

    own = ObjectFile(source.path, source.key)  # a position of its own
    return ParquetRows(cast(Path, source.path), columns, fileobj=ObjectIO(own), ahead=ahead)


def __getattr__(name: str) -> Any:
    """``ParquetRows``, imported on first use (see the module's docstring)."""
    if name == "ParquetRows":
        from rank_dataset.files.formats._parquet import ParquetRows

        return ParquetRows
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
