"""Parquet meta files through :mod:`pyarrow` (the ``parquet`` extra, imported on first use): rows,
read by row group.

A row is a sample; its text is the line of its chosen columns (``columns``, in that order; by default
all) joined by a tab, a null as an empty field, a number or a date as Arrow casts it to a string.
The row groups are the checkpoints: a read decodes the row groups that hold the rows asked for, and
only the chosen columns. The index (rows per row group) comes from the footer, without reading data.
Nested and binary columns are refused, naming the column; :attr:`ParquetRows.schema_hash` tells a
schema that changed since the index was made. Row ``i`` is sample ``i`` whatever its line holds (all
fields empty, a tab or a newline in a value), so the index is the footer's row counts alone.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, UInt8Array, prefix_sums
from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats.base import Format, Recognised

if TYPE_CHECKING:
    from rank_dataset.files.io import ByteSource

__all__ = ["PARQUET", "ParquetFormat", "ParquetLayout", "ParquetRows", "source_rows"]


@dataclass(frozen=True)
class ParquetLayout:
    """What the index of a Parquet file holds: the chosen ``columns``, the hash of their names and
    types (``schema_hash``), and ``bounds``: row ``bounds[g]`` is the first of row group ``g``,
    ``bounds[-1]`` the number of rows. All from the footer."""

    columns: tuple[str, ...]
    schema_hash: bytes
    bounds: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.bounds[-1]


def _pyarrow() -> tuple[Any, Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet meta files needs pyarrow: pip install 'rank-dataset[parquet]'") from None
    return pa, pc, pq


def _refusal(name: str, typ: Any) -> str | None:
    """Why a column of Arrow type ``typ`` cannot be a field of a line; None if it can."""
    pa, _, _ = _pyarrow()
    t = pa.types
    if t.is_dictionary(typ):
        return _refusal(name, typ.value_type)
    if t.is_nested(typ):
        return f"column {name!r} is nested ({typ}): choose flat columns with columns=[...]"
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_fixed_size_binary(typ) or str(typ) == "binary_view":
        return f"column {name!r} is binary ({typ}), not text: choose text or number columns with columns=[...]"
    return None


class ParquetRows:
    """The rows of a Parquet file as lines (see the module's docstring).

    Args:
        path: the file (``fileobj``, if given, is read instead: the file the caller opened and checked).
        columns: the columns, in order, whose values make a line; None for all.

    Raises:
        ImportError: pyarrow is not installed.
        ValueError: a column is missing, nested or binary.
        CorruptMetaFileError: the footer cannot be read.
    """

    def __init__(
        self,
        path: Path,
        columns: Sequence[str] | None = None,
        *,
        fileobj: io.RawIOBase | None = None,
        ahead: int = 0,
    ) -> None:
        pa, _, pq = _pyarrow()
        self.path = path
        # A file object that can hold ranges (an object's ObjectIO): each row group's chosen column
        # chunks are fetched at once, with the next row groups' up to ``ahead`` bytes (a reader going
        # through them in order), rather than a GET a column chunk.
        self._hold = getattr(fileobj, "hold", None)
        self._ahead = ahead
        self._held: tuple[tuple[str, ...], int, int] | None = None  # (columns, first, end) row groups held
        try:
            # Pages written with a checksum are checked (pyarrow writes none by default).
            self._file = pq.ParquetFile(fileobj if fileobj is not None else path, page_checksum_verification=True)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptMetaFileError(path, 0, f"its Parquet footer cannot be read ({exc})") from None
        schema = self._file.schema_arrow
        names = list(schema.names)
        chosen = names if columns is None else list(columns)
        if isinstance(columns, str) or not chosen:
            raise ValueError(f"columns must be a non-empty sequence of column names, not {columns!r}")
        missing = [c for c in chosen if c not in names]
        if missing:
            raise ValueError(f"{path} has no column {missing[0]!r}; its columns are {names}")
        for name in chosen:
            why = _refusal(name, schema.field(name).type)
            if why is not None:
                raise ValueError(f"{path}: {why}")
        self.columns = tuple(chosen)
        meta = self._file.metadata
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        #: Row ``bounds[g]`` is the first of row group ``g``; ``bounds[-1]`` the number of rows.
        self.bounds: Int64Array = prefix_sums(rows)
        self.schema_hash = self.hash_schema(schema, self.columns)
        self._cached: tuple[int, bytes, Int64Array] | None = None
        # A ParquetFile is not safe to read from two threads at once (its read cache mixes up their
        # ranges: wrong-range errors, or a hang), and group_by decodes row groups in a pool.
        self._reading = threading.Lock()

    @property
    def layout(self) -> ParquetLayout:
        """This file's index: its chosen columns, their schema's hash, its row groups' bounds."""
        return ParquetLayout(self.columns, self.schema_hash, tuple(self.bounds.tolist()))

    @staticmethod
    def hash_schema(schema: Any, columns: Sequence[str]) -> bytes:
        """What identifies the chosen columns and their types."""
        text = "\n".join(f"{c}\t{schema.field(c).type}" for c in columns)
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def group_bytes(self) -> tuple[Int64Array, Int64Array]:
        """``(compressed, uncompressed)``: the bytes of the chosen columns in each row group, as the
        footer gives them (what reading and decoding each row group takes), without reading data."""
        meta = self._file.metadata
        names = set(self.columns)
        sizes = np.zeros((2, meta.num_row_groups), np.int64)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema in names:
                    sizes[:, g] += (column.total_compressed_size, column.total_uncompressed_size)
        return sizes[0], sizes[1]

    def group(self, g: int) -> tuple[bytes, Int64Array]:
        """Row group ``g`` as lines: ``(data, offsets)``, row ``bounds[g] + i`` being
        ``data[offsets[i]:offsets[i + 1]]``. The last group read is kept."""
        if self._cached is not None and self._cached[0] == g:
            return self._cached[1], self._cached[2]
        _, data_buf, offsets = self._decode(g)
        data = data_buf.to_pybytes() if data_buf is not None else b""
        self._cached = (g, data, offsets)
        return data, offsets

    def group_array(self, g: int, rows: Int64Array | None = None) -> tuple[UInt8Array, Int64Array]:
        """Row group ``g`` as :meth:`group` gives it, its data a numpy view of Arrow's buffer (no copy,
        nothing kept). With ``rows`` (numbers within the group, in range), only those rows, in that
        order: line ``i`` is row ``rows[i]``. A rank of many needs a few rows of each group, and
        rendering them (casting, joining the columns) costs as much as decoding the whole group."""
        _, data_buf, offsets = self._decode(g, rows)
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        return data, offsets

    def group_text(self, g: int, pad: int = 0) -> tuple[UInt8Array, Int64Array, Int64Array]:
        """Row group ``g`` as text: ``pad`` newlines, then each row's line followed by a newline; and where
        each line starts in it, and its length."""
        data, offsets = self.group_array(g)
        lengths = np.diff(offsets)
        starts = pad + offsets[:-1] - offsets[0] + np.arange(lengths.size, dtype=np.int64)
        text = np.full(pad + int(lengths.sum()) + lengths.size, ord("\n"), np.uint8)
        native.copy_rows(data, offsets[:-1], lengths, text, starts)
        return text, starts, lengths

    def last_integers(self, g: int) -> Int64Array | None:
        """Row group ``g``'s values of the last chosen column, when they are every row's label: the
        integer after the line's last run of whitespace (the ``"label"`` parser's). That is so where
        there are two columns or more and the last holds integers (within int64), none null; else None.
        Only that column is read."""
        pa, _, _ = _pyarrow()
        if len(self.columns) < 2:
            return None
        name = self.columns[-1]
        typ = self._file.schema_arrow.field(name).type
        if not pa.types.is_integer(typ):
            return None
        col = self._read(g, [name]).column(name)
        if col.null_count or len(col) != self.bounds[g + 1] - self.bounds[g]:
            return None
        values: np.ndarray = np.asarray(col.to_numpy())
        if values.dtype == np.uint64 and values.size and int(values.max()) >= 1 << 63:
            return None
        labels: Int64Array = values.astype(np.int64, copy=False)
        return labels

    def column(self, g: int, name: str) -> Any:
        """Row group ``g``'s values of the column ``name`` (any column of the file, chosen or not), an Arrow
        array; only that column is read.

        Raises:
            ValueError: the file has no column ``name`` (naming its columns).
        """
        names = list(self._file.schema_arrow.names)
        if name not in names:
            raise ValueError(f"{self.path} has no column {name!r}; its columns are {names}")
        return self._read(g, [name]).column(name)

    def _read(self, g: int, columns: list[str]) -> Any:
        pa, _, _ = _pyarrow()
        try:
            # One thread a row group: the callers spread row groups over threads of their own (a
            # build's, group_by's pool), and pyarrow's column threads on top of them oversubscribe
            # the cores.
            with self._reading:
                if self._hold is not None:
                    self._hold_groups(g, columns)
                return self._file.read_row_group(g, columns=columns, use_threads=False)
        except (pa.ArrowInvalid, OSError) as exc:
            offset = self._file.metadata.row_group(g).column(0).data_page_offset
            raise CorruptMetaFileError(self.path, int(offset), f"its row group {g} cannot be read ({exc})") from None

    def _hold_groups(self, g: int, columns: list[str]) -> None:
        """Have the file object hold row group ``g``'s chunks of ``columns`` (and the next groups' up to
        ``ahead`` bytes), unless it holds them already."""
        held = self._held
        if held is not None and held[0] == tuple(columns) and held[1] <= g < held[2]:
            return
        meta, names = self._file.metadata, set(columns)
        starts: list[int] = []
        stops: list[int] = []
        end, total = g, 0
        while end < meta.num_row_groups and (end == g or total < self._ahead):
            group = meta.row_group(end)
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema in names:
                    first = column.dictionary_page_offset if column.has_dictionary_page else None
                    start = int(first if first else column.data_page_offset)
                    starts.append(start)
                    stops.append(start + int(column.total_compressed_size))
                    total += int(column.total_compressed_size)
            end += 1
        self._held = None
        self._hold(starts, stops)  # type: ignore[misc]
        self._held = (tuple(columns), g, end)

    def _decode(self, g: int, rows: Int64Array | None = None) -> tuple[Any, Any, Int64Array]:
        """Row group ``g``'s lines (or those of its ``rows``) as an Arrow large string array, its data
        buffer and its offsets."""
        pa, pc, _ = _pyarrow()
        table = self._read(g, list(self.columns))
        expected = self.bounds[g + 1] - self.bounds[g]
        if table.num_rows != expected:
            offset = self._file.metadata.row_group(g).column(0).data_page_offset
            raise CorruptMetaFileError(
                self.path,
                int(offset),
                f"its row group {g} holds {table.num_rows:,} rows, not the {expected:,} of its footer",
            )
        if rows is not None:
            table = table.take(pa.array(rows, pa.int64()))
        fields = []
        for name in self.columns:
            col = table.column(name)
            if not pa.types.is_string(col.type):
                col = pc.cast(col, pa.string())
            fields.append(col)
        if len(fields) == 1:
            joined = pc.if_else(pc.is_null(fields[0]), "", fields[0])
        else:
            joined = pc.binary_join_element_wise(*fields, "\t", null_handling="replace", null_replacement="")
        arr = joined.combine_chunks() if hasattr(joined, "combine_chunks") else joined
        arr = pc.cast(arr, pa.large_string())  # 64-bit offsets
        n = len(arr)
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, np.int64, n + 1, arr.offset * 8).astype(np.int64)
        return arr, data_buf, offsets

    def lines(self, rows: Int64Array) -> list[bytes]:
        """The lines of ``rows`` (in range), in the order given."""
        out: list[bytes] = [b""] * len(rows)
        groups = np.searchsorted(self.bounds, rows, side="right") - 1
        for g in np.unique(groups):
            data, offsets = self.group(int(g))
            for i in np.flatnonzero(groups == g):
                k = int(rows[i] - self.bounds[g])
                out[i] = data[offsets[k] : offsets[k + 1]]
        return out


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
        return ParquetRows(path, columns)


PARQUET = ParquetFormat()


def source_rows(source: ByteSource, columns: Sequence[str] | None, *, ahead: int = 0) -> ParquetRows:
    """The rows of the Parquet file ``source``: a local file's read by pyarrow from its path; an
    object's through ranged GETs pinned to its ETag (:class:`~rank_dataset.files.io.object.ObjectIO`;
    one client, obstore's), a row group's chosen column chunks in one GET where they lie close, with
    the next row groups' up to ``ahead`` bytes (for a reader that goes through them in order)."""
    if source.local:
        return ParquetRows(source.path, columns)
    from rank_dataset.files.io import open_source
    from rank_dataset.files.io.object import ObjectIO  # the format is above its sources

    own = open_source(source.path, key=source.key, checked=False)  # a position of its own
    return ParquetRows(source.path, columns, fileobj=ObjectIO(own), ahead=ahead)
