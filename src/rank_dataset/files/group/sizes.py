"""Each sample's width and height, read from its line once and cached beside the index as a grouping is.

:func:`sizes_of` reads two numbers per sample: whitespace fields of a text line by position (parsed in numpy a
block of lines at a time, the lines numpy cannot judge left to ``str.split`` and ``int``), fields of a JSON line
or columns of a Parquet file by name, or functions of the line. The result is cached beside the file's index,
keyed like it (a changed file is read again), built by one process of a node while the others wait
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
import numpy.typing as npt

from rank_dataset.core.checks import meta_path, with_storage
from rank_dataset.core.parsers import quote
from rank_dataset.files.group._cache import columns_candidates, open_columns, write_columns
from rank_dataset.files.group._lines import ParquetLines, TextLines, open_checked
from rank_dataset.files.group.grouping import each_line
from rank_dataset.files.index.cachelock import load_or_build
from rank_dataset.files.index.load import Index, load_index
from rank_dataset.files.index.scan import PathLike

__all__ = ["Sizes", "sizes_of"]

_MAX = (1 << 32) - 1
_WORD = 8  # digits decoded in numpy: every size below 10**8
_KEEP = np.array(
    [0] + [(0xFFFF_FFFF_FFFF_FFFF << (8 * (8 - k))) & 0xFFFF_FFFF_FFFF_FFFF for k in range(1, 9)], np.uint64
)
_HIGH_NIBBLES, _ZEROS, _SIXES = (
    np.uint64(0xF0F0_F0F0_F0F0_F0F0),
    np.uint64(0x3030_3030_3030_3030),
    np.uint64(0x0606_0606_0606_0606),
)
_U8, _U16, _U32 = np.uint64(8), np.uint64(16), np.uint64(32)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Control characters that str.split() does not take as whitespace (0-8, 14-27), and lead bytes of what it takes beyond
# ASCII: the Unicode spaces (U+0085, U+00A0, U+1680, U+2000-U+205F, U+3000), and of a byte order mark. A line
# holding one is split in Python.
_UNSURE = np.zeros(256, bool)
_UNSURE[[0xC2, 0xE1, 0xE2, 0xE3, 0xEF, *range(9), *range(14, 28)]] = True

Field = int | str | Callable[[str], Any]


class Sizes(NamedTuple):
    """Each sample's width and height: read-only uint32 arrays of ``N``."""

    width: npt.NDArray[np.uint32]
    height: npt.NDArray[np.uint32]


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
            whitespace-separated fields (field 0 is usually the path: ``"a.jpg 640 480 3"`` takes ``1, 2``), parsed
            in numpy; both strs, the names of a JSON line's fields or of a Parquet file's columns; or both functions
            of the line's text (a Parquet row's line is its columns joined by tabs), called in Python.
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


def _load_or_read(path: Path, index: Index, width: Field, height: Field, name: str | None) -> npt.NDArray[np.uint32]:
    def fill(out: npt.NDArray[np.uint32]) -> None:
        _read(path, index, width, height, out)

    if name is not None:
        candidates = columns_candidates(path, index, name)
        for cache in candidates:
            found = open_columns(cache, index, 2)
            if found is not None:
                return found
        for cache in candidates:

            def load(cache: Path = cache) -> npt.NDArray[np.uint32] | None:
                return open_columns(cache, index, 2)

            def build(_held: object, cache: Path = cache) -> npt.NDArray[np.uint32] | None:
                return write_columns(cache, index, 2, fill)

            built = load_or_build(cache, load, build)
            if built is not None:
                return built
    out = np.empty((2, index.count), np.uint32)  # not cached: no name, or no writable place
    fill(out)
    return out


def _read(path: Path, index: Index, width: Field, height: Field, out: npt.NDArray[np.uint32]) -> None:
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
            _text_fields(lines, width, height, out)
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


def _by_functions(
    path: Path, width: Callable[[str], Any], height: Callable[[str], Any], out: npt.NDArray[np.uint32]
) -> None:
    for i, (text, where) in enumerate(each_line(path, "sizes of")):
        out[0, i] = _checked(width(text), where, "width(line)")
        out[1, i] = _checked(height(text), where, "height(line)")


def _json_fields(lines: TextLines, width: str, height: str, out: npt.NDArray[np.uint32]) -> None:
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


def _parquet(lines: ParquetLines, width: str, height: str, out: npt.NDArray[np.uint32]) -> None:
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


def _text_fields(lines: TextLines, width: int, height: int, out: npt.NDArray[np.uint32]) -> None:
    """Fields ``width`` and ``height`` of each line, a block of lines at a time: the fields found where runs of
    whitespace end, the digits decoded in numpy; a line numpy cannot judge (bytes that may be Unicode
    whitespace, a field that is not plain digits) is split and read by ``str.split`` and ``int``."""
    for first, base, buf, spans in lines.blocks():
        # Every byte up to 32 is taken as whitespace here; the few that str.split() does not take (other control
        # characters) and those that may start Unicode whitespace send their line to Python.
        edge = np.diff((buf <= 32).view(np.int8))
        token_starts = np.flatnonzero(edge == -1) + 1
        token_ends = np.flatnonzero(edge == 1) + 1
        line_first = np.searchsorted(token_starts, spans[:, 0])
        tokens = np.searchsorted(token_starts, spans[:, 1]) - line_first
        n = spans.shape[0]
        ok = np.ones(n, bool)
        rare = np.flatnonzero(buf - np.uint8(28) >= 0xC2 - 28)  # bytes up to 27, or from 0xC2 on (one pass)
        unsure = rare[_UNSURE[buf[rare]]]
        if unsure.size:  # the lines holding such a byte
            held = np.searchsorted(spans[:, 1], unsure)
            ok[held[held < n]] = False
        if not token_starts.size:  # lines of control characters only: str.split() judges them
            ok[:] = False
        for row, field in ((0, width), (1, height)):
            ok &= tokens > field
            if not ok.any():
                break
            at = line_first + field
            at[~ok] = 0
            values, decoded = _digits(buf, token_starts[at], token_ends[at])
            ok &= decoded
            out[row, first : first + n][ok] = values[ok]
        for k in np.flatnonzero(~ok).tolist():
            start, stop = int(spans[k, 0]), int(spans[k, 1])
            text = buf[start:stop].tobytes().decode("utf-8", "replace")
            fields = text.split()
            for row, field in ((0, width), (1, height)):
                where = lines.where(base + start)
                if len(fields) <= field:
                    raise ValueError(f"{where}: no field {field} (the line has {len(fields)}): {quote(text)}")
                try:
                    value = int(fields[field])
                except ValueError:
                    raise _bad(where, f"field {field}", fields[field]) from None
                out[row, first + k] = _checked(value, functools.partial(str, where), f"field {field}")


def _digits(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]]:
    """The number each ``buf[starts[i]:ends[i]]`` spells in 1-8 decimal digits, and whether it does and lies in
    ``[1, 2**32)`` (longer numbers are left to Python). One 8-byte load a field: the word that ends at its last
    byte, the bytes before the field cleared, its digits combined in pairs, fours and eights. ``buf`` must hold
    8 bytes before the first field (the blocks' pad)."""
    length = ends - starts
    decoded = (length >= 1) & (length <= _WORD)
    words: npt.NDArray[np.uint64] = np.ndarray((buf.size - (_WORD - 1),), "<u8", buffer=buf, strides=(1,))
    value = words[ends - _WORD]
    keep = _KEEP[np.clip(length, 0, _WORD)]  # the field's bytes: the high ones of the word
    value &= keep
    # Each kept byte a digit: its high nibble 3, and adding 6 leaves it below ':'.
    decoded &= (value & _HIGH_NIBBLES) == (_ZEROS & keep)
    decoded &= ((value + _SIXES) & _HIGH_NIBBLES) == (_ZEROS & keep)
    value -= _ZEROS & keep
    value = (value * np.uint64(10) + (value >> _U8)) & np.uint64(0x00FF_00FF_00FF_00FF)
    value = (value * np.uint64(100) + (value >> _U16)) & np.uint64(0x0000_FFFF_0000_FFFF)
    value = (value * np.uint64(10000) + (value >> _U32)) & np.uint64(0xFFFF_FFFF)
    decoded &= value >= 1
    return value.astype(np.uint32), decoded
