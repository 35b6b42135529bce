"""Meta file formats: text, and files kept compressed or columnar, read in place (gzip, zstd,
Parquet).

A file's format is recognised by its content (:func:`detect_source`), not by its name. Each format is one
module (:mod:`~.text`, :mod:`~.gzip`, :mod:`~.zstd`, :mod:`~.parquet`) holding a
:class:`~.base.Format`, the protocol the readers above go through, and its codec, whose library is
imported on first use; :mod:`~.registry` owns the table of formats. A compressed file is read through
its :class:`Checkpoints` (:mod:`~.checkpoints`), and a gather reads it through the threaded span cache
(:class:`SpanSource`, :mod:`~.spans`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rank_dataset.files.formats.base import BLOCK, SPACING, Decoder, Format
from rank_dataset.files.formats.registry import (
    TEXT,
    by_code,
    by_name,
    detect_path,
    detect_source,
    formats,
    refuse_cut_source,
    register,
    unregister,
)

if TYPE_CHECKING:
    from rank_dataset.files.formats.checkpoints import Checkpoints, DecompressedView, Decompression, decompress
    from rank_dataset.files.formats.parquet import ParquetLayout, ParquetRows, source_rows
    from rank_dataset.files.formats.registry import GZIP, PARQUET, ZSTD
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
    "detect_path",
    "detect_source",
    "formats",
    "many_frames",
    "one_frame_advice",
    "refuse_cut_source",
    "register",
    "source_rows",
    "unregister",
]

# The names of the compressed and columnar formats, their modules imported on first use: a job over text
# files imports none of them (see the registry).
_LAZY = {
    **dict.fromkeys(("Checkpoints", "DecompressedView", "Decompression", "decompress"), "checkpoints"),
    **dict.fromkeys(("ParquetLayout", "ParquetRows", "source_rows"), "parquet"),
    **dict.fromkeys(("GZIP", "PARQUET", "ZSTD"), "registry"),
    **dict.fromkeys(("SPAN", "SpanSource"), "spans"),
    **dict.fromkeys(("ADVISED_ABOVE", "MANY_FRAMES", "many_frames", "one_frame_advice"), "zstd"),
}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return value
