"""Meta file formats: text, and files kept compressed or columnar, read in place (gzip, zstd,
Parquet).

A file's format is recognised by its content (:func:`detect`), not by its name. Each format is one
module (:mod:`~.text`, :mod:`~.gzip`, :mod:`~.zstd`, :mod:`~.parquet`) holding a
:class:`~.base.Format`, the protocol the readers above go through, and its codec, whose library is
imported on first use; :mod:`~.registry` owns the table of formats. A compressed file is read through
its :class:`Checkpoints` (:mod:`~.checkpoints`), and a gather reads it through the threaded span cache
(:class:`SpanSource`, :mod:`~.spans`).
"""

from __future__ import annotations

from rank_dataset.files.formats.base import BLOCK, SPACING, Decoder, Format
from rank_dataset.files.formats.checkpoints import Checkpoints, DecompressedView, Decompression, decompress
from rank_dataset.files.formats.parquet import ParquetLayout, ParquetRows, object_rows
from rank_dataset.files.formats.registry import (
    GZIP,
    PARQUET,
    TEXT,
    ZSTD,
    by_code,
    by_name,
    detect,
    detect_path,
    detect_source,
    formats,
    refuse_cut,
    refuse_cut_source,
    register,
    unregister,
)
from rank_dataset.files.formats.spans import SPAN, SpanSource
from rank_dataset.files.formats.zstd import ADVISED_ABOVE, MANY_FRAMES, many_frames, one_frame_advice

__all__ = [
    "ADVISED_ABOVE",
    "BLOCK",
    "GZIP",
    "MANY_FRAMES",
    "PARQUET",
    "SPACING",
    "SPAN",
    "TEXT",
    "ZSTD",
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
    "unregister",
]
