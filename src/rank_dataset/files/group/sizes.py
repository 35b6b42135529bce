"""Each sample's width and height, read from its line once and cached beside the index as a grouping is.

:func:`sizes_of` reads two numbers per sample: whitespace fields of a text line by position (found and decoded
in one pass over a chunk of the file's bytes by the native field kernel, or its numpy reference; the lines it
cannot judge left to ``str.split`` and ``int``), fields of a JSON line or columns of a Parquet file by name,
or functions of the line. The result is cached beside the file's index, keyed like it (a changed file is read
again), built by one process of a node while the others wait
(:func:`~rank_dataset.files.index.cachelock.load_or_build`), and memory-mapped, so the ranks of a node share one
copy in the page cache (:mod:`rank_dataset.files.group._cache`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.arrays import UInt8Array, UInt32Array
from rank_dataset.core.checks import meta_path, with_storage
from rank_dataset.core.parsers import quote
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.group._cache import Put, cache_candidates, open_columns, write_columns
from rank_dataset.files.group._lines import ParquetLines, TextLines, open_checked
from rank_dataset.files.group.grouping import each_line
from rank_dataset.files.index.cachelock import load_or_build
from rank_dataset.files.index.load import Index, SpanReader, load_index
from rank_dataset.files.index.scan import PathLike

__all__ = ["Sizes", "sizes_of"]

_MAX = (1 << 32) - 1
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

Field = int | str | Callable[[str], Any]


class Sizes(NamedTuple):
    """Each sample's width and height: read-only uint32 arrays of ``N``."""

    width: UInt32Array
    height: UInt32Array


def sizes_of(
    meta_file: PathLike,
    width: Field = 1,
    height: Field = 2,
    *,
    cache_name: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Sizes:
    """Each sample's ``(width, height)`` as read from its line: read once, cached beside the index.

    Args:
        meta_file: a meta file (text, gzip, zstd or Parquet; a local path or an object's URL), samples numbered
            as ``RankDataset(meta_file)`` numbers them.
        width, height: where the two numbers are: both ints, the 0-based positions of a text line's
            whitespace-separated fields (field 0 is usually the path: ``"a.jpg 640 480 3"`` takes ``1, 2``), read
            in one native pass; both strs, the names of a JSON line's fields or of a Parquet file's columns; or
            both functions of the line's text (a Parquet row's line is its columns joined by tabs), called in Python.
        cache_name: with functions, the name their sizes are cached under (letters, digits, ``_``, ``-``); without
            it they are read anew on each call. Keep a name for one pair of functions: a cache is matched on the
            file, not on the functions. Positions and names are cached by themselves.
        storage_options: for a meta file in object storage, obstore's settings (as ``group_by``).

    Returns:
        ``Sizes(width, height)``, two read-only uint32 arrays of ``N`` (views of the memory-mapped cache when cached).

    Raises:
        ValueError: a size that is missing or not an integer in ``[1, 2**32)`` (the message names the file, the
            line or row, and the value), a file of no samples, an invalid ``cache_name``.
        TypeError: ``width`` and ``height`` not two ints, two strs or two functions.

    Sizes are read before any DataLoader starts, so a bad size is an error at once; it takes no
    ``on_error="replace"`` (fix the line, or leave the sample out with ``exclude=`` and a size of your choice).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a.jpg 640 480 3\\nb.jpg 480 640 1\\n")
        >>> w, h = sizes_of(p)
        >>> w.tolist(), h.tolist()
        ([640, 480], [480, 640])
    """
    kinds = {type(width) if not callable(width) else "function", type(height) if not callable(height) else "function"}
    if isinstance(width, bool) or isinstance(height, bool) or len(kinds) != 1 or kinds - {int, str, "function"}:
        raise TypeError(
            "width and height must be two field positions (ints), two field or column names (strs) or two functions "
            f"of the line, got {width!r} and {height!r}"
        )
    if isinstance(width, int) and isinstance(height, int) and (width < 0 or height < 0):
        raise ValueError(f"field positions are 0-based and non-negative, got width={width}, height={height}")
    if cache_name is not None:
        if not callable(width):
            raise ValueError(
                f"cache_name is for functions; positions and names are cached by themselves, got {cache_name!r}"
            )
        if not isinstance(cache_name, str) or not _NAME.fullmatch(cache_name):
            raise ValueError(f"cache_name must be 1-64 letters, digits, '_' or '-', got {cache_name!r}")
    path = meta_path(with_storage(meta_file, storage_options))
    index = load_index(path)
    if index.count == 0:
        raise ValueError(f"no samples in {path}: every line is empty or whitespace")
    columns = _load_or_read(path, index, width, height, _cache_name(width, height, cache_name))
    columns.flags.writeable = False
    return Sizes(columns[0], columns[1])


def _cache_name(width: Field, height: Field, cache_name: str | None) -> str | None:
    if callable(width):
        return None if cache_name is None else f"sizes-fn-{cache_name}"
    if isinstance(width, int):
        return f"sizes-{width}-{height}"
    return "sizes-" + hashlib.blake2b(json.dumps([width, height]).encode(), digest_size=8).hexdigest()


def _load_or_read(path: Path, index: Index, width: Field, height: Field, name: str | None) -> UInt32Array:
    def fill(out: UInt32Array, put: Put) -> None:
        _read(path, index, width, height, out, put)

    if name is not None:
        built = load_or_build(
            cache_candidates(path, index, name, "rdcol"),
            lambda cache: open_columns(cache, index, 2),
            lambda _held, cache: write_columns(cache, index, 2, fill),
        )
        if built is not None:
            return built
    out = np.empty((2, index.count), np.uint32)  # not cached: no name, or no writable place

    def put(row: int, first: int, values: UInt32Array) -> None:
        out[row, first : first + values.size] = values

    fill(out, put)
    return out


def _read(path: Path, index: Index, width: Field, height: Field, out: UInt32Array, put: Put) -> None:
    if callable(width):
        assert callable(height)
        _by_functions(path, width, height, out)
        return
    with open_checked(path, index) as lines:
        if isinstance(lines, ParquetLines):
            if not isinstance(width, str):
                raise TypeError(f"{path} is a Parquet file: name its columns (strs), got positions {width}, {height}")
            _parquet(lines, width, str(height), out)
        elif isinstance(width, int) and isinstance(height, int):
            _text_fields(lines, width, height, put)
        else:
            _json_fields(lines, str(width), str(height), out)


def _bad(where: str, what: str, value: Any) -> ValueError:
    return ValueError(f"{where}: {what} is {value!r}, not an integer in [1, 2**32)")


def _checked(value: Any, where: Callable[[], str], what: str) -> int:
    """``value`` as a size: an int (or an integral float) in ``[1, 2**32)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _bad(where(), what, value)
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise _bad(where(), what, value)
    if not 1 <= value <= _MAX:
        raise _bad(where(), what, value)
    return int(value)


def _by_functions(path: Path, width: Callable[[str], Any], height: Callable[[str], Any], out: UInt32Array) -> None:
    for i, (text, where) in enumerate(each_line(path, "sizes of")):
        out[0, i] = _checked(width(text), where, "width(line)")
        out[1, i] = _checked(height(text), where, "height(line)")


def _json_fields(lines: TextLines, width: str, height: str, out: UInt32Array) -> None:
    i = 0
    for block in lines.text_blocks():
        for text, where in block:
            try:
                record = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"{where()}: not a JSON line ({exc}): {quote(text)}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where()}: not a JSON object, so it has no field {width!r}: {quote(text)}")
            for row, name in ((0, width), (1, height)):
                if name not in record:
                    raise ValueError(f"{where()}: no field {name!r} in {quote(text)}")
                out[row, i] = _checked(record[name], where, f"field {name!r}")
            i += 1


def _parquet(lines: ParquetLines, width: str, height: str, out: UInt32Array) -> None:
    bounds = lines.rows.bounds.tolist()
    for g, (a, b) in enumerate(itertools.pairwise(bounds)):
        for row, name in ((0, width), (1, height)):
            column = lines.rows.column(g, name)
            values = np.asarray(column.to_numpy(zero_copy_only=False))
            bad = np.ones(values.size, bool) if values.dtype.kind not in "iuf" else ~((values >= 1) & (values <= _MAX))
            if values.dtype.kind == "f":
                bad |= np.isnan(values) | (values != np.floor(values))
            if column.null_count:
                bad |= np.asarray(column.is_null().to_numpy(zero_copy_only=False), bool)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise _bad(lines.where(a + k), f"column {name!r}", column[k].as_py())
            out[row, a:b] = values


def _text_fields(lines: TextLines, width: int, height: int, put: Put) -> None:
    """Fields ``width`` and ``height`` of each line, a chunk of whole lines at a time: found and decoded in one pass
    over the chunk's bytes by the field kernel (:func:`rank_dataset.core.native.line_fields`) into two arrays reused
    from chunk to chunk, then ``put`` in the columns; a line it flags (a field missing or not plain digits, a byte
    that may be Unicode whitespace) is split and read by ``str.split`` and ``int``, and named if its size is bad."""
    scratch = np.empty((2, 0), np.uint32)
    for first, n, base, data, reader in lines.chunks():
        if scratch.shape[1] < n:
            scratch = np.empty((2, n), np.uint32)
        widths, heights = scratch[0, :n], scratch[1, :n]
        samples, flagged = native.line_fields(data, width, height, widths, heights)
        if samples != n:
            raise MetaFileChangedError(lines.path, "its lines no longer end where its index says")
        if flagged:
            _judged(lines, width, height, first, base, data, reader, scratch[:, :n])
        put(0, first, widths)
        put(1, first, heights)


def _judged(
    lines: TextLines,
    width: int,
    height: int,
    first: int,
    base: int,
    data: UInt8Array,
    reader: SpanReader,
    values: UInt32Array,
) -> None:
    """The flagged lines of a chunk (their ``values`` both 0: no size is) read by ``str.split`` and ``int``."""
    rows = np.flatnonzero(values[0] == 0)
    starts, lengths = reader.take(rows + first)
    for k, start, length in zip(rows.tolist(), (starts - base).tolist(), lengths.tolist(), strict=True):
        if not 0 <= start <= start + length <= data.size:
            raise MetaFileChangedError(lines.path, "its lines no longer end where its index says")
        text = data[start : start + length].tobytes().decode("utf-8", "replace")
        fields = text.split()
        where = lines.where(base + start)
        for row, field in ((0, width), (1, height)):
            if len(fields) <= field:
                raise ValueError(f"{where}: no field {field} (the line has {len(fields)}): {quote(text)}")
            try:
                value = int(fields[field])
            except ValueError:
                raise _bad(where, f"field {field}", fields[field]) from None
            values[row, k] = _checked(value, functools.partial(str, where), f"field {field}")
