"""Meta file formats: text, and files kept compressed or columnar, read in place (gzip, zstd,
Parquet). No torch.

A file's format is recognised by its content (:func:`detect`), not by its name. Each format is a
module (:mod:`~.text`, :mod:`~.gzip`, :mod:`~.zstd`, :mod:`~.parquet`) holding a
:class:`~.base.Format`, the protocol the readers above go through; :mod:`~.registry` lists them.
A compressed file is read through its :class:`Checkpoints` (:mod:`~.checkpoints`), and a gather
reads it through the threaded span cache (:class:`SpanSource`, :mod:`~.spans`).

This package keeps the names of the module ``rank_dataset.files.formats`` it replaced. The codecs and the
Parquet reader (:class:`ParquetRows`, a lazy name here) are imported on first use: recognising a file, or
reading a text one, imports none of them (issue 44, item 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rank_dataset.files.formats.base import BLOCK, SPACING, Decoder, Format
from rank_dataset.files.formats.checkpoints import Checkpoints, DecompressedView, Decompression, decompress
from rank_dataset.files.formats.parquet import ParquetLayout, object_rows
from rank_dataset.files.formats.registry import (
    by_code,
    by_name,
    detect,
    detect_path,
    detect_source,
    formats,
    refuse_cut,
    refuse_cut_source,
    register,
    registered,
    unregister,
)
from rank_dataset.files.formats.spans import SPAN, SpanSource
from rank_dataset.files.formats.zstd import ADVISED_ABOVE, MANY_FRAMES, many_frames, one_frame_advice

if TYPE_CHECKING:
    from rank_dataset.files.formats._parquet import ParquetRows

__all__ = [
    "ADVISED_ABOVE",
    "BLOCK",
    "MANY_FRAMES",
    "SPACING",
    "SPAN",
    "Checkpoints",
    "Decoder",
    "DecompressedView",
    "Decompression",
    "Format",
    "ParquetLayout",
    "ParquetRows",
    "SpanSource",
    "by_code",
    "by_name",
    "decompress",
    "detect",
    "detect_path",
    "detect_source",
    "formats",
    "many_frames",
    "object_rows",
    "one_frame_advice",
    "refuse_cut",
    "refuse_cut_source",
    "register",
    "registered",
    "unregister",
]


def __getattr__(name: str) -> Any:
    """``ParquetRows``, imported on first use (see the package's docstring)."""
    if name == "ParquetRows":
        from rank_dataset.files.formats._parquet import ParquetRows

        return ParquetRows
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
