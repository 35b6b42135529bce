"""MetaFile: the samples of one or more meta files, read through their line-offset index. No torch.

This is the one module that touches a meta file's bytes: :class:`_FileBytes` opens and maps a file,
and :meth:`MetaFile.read` copies a set of samples into a :class:`~rank_dataset.shard.Shard`. Another
kind of file (compressed, remote) is another ``_FileBytes``.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset._checks import check_index
from rank_dataset._residency import drop_pages, return_freed_memory
from rank_dataset.index import Index, load_index
from rank_dataset.scan import PathLike
from rank_dataset.shard import Shard, new_buffer, offset_dtype

__all__ = ["MetaFile"]

# Lines are copied in batches of about this many bytes, after each of which the file pages they
# came from are dropped from this process's resident set.
_WINDOW = 16 << 20
_MAX_WIDTH = 4096
_INDEX_STEP = 1 << 18  # index entries gathered at a time, their pages dropped after


class _FileBytes:
    """The bytes of one file, mapped read-only once per process (a map survives fork, so forked
    DataLoader workers share it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._map: mmap.mmap | None = None

    def map(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map

    def __getitem__(self, span: slice) -> bytes:
        return self.map()[span]

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident set (the page cache keeps them)."""
        if self._map is not None:
            drop_pages(self._map, 0, len(self._map))


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    index: Index
    bytes: _FileBytes

    def release_pages(self) -> None:
        self.bytes.release_pages()
        self.index.release_pages()


class MetaFile:
    """The samples of one meta file, or of several taken as one in the order given.

    Args:
        path_or_paths: a path, or a sequence of paths.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: the files hold no sample.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("img_0.JPEG 3\\nimg_1.JPEG 5\\n")
        >>> mf = MetaFile(p)
        >>> len(mf), mf[1]
        (2, 'img_1.JPEG 5')
    """

    def __init__(self, path_or_paths: PathLike | Sequence[PathLike]) -> None:
        if isinstance(path_or_paths, (str, os.PathLike)):
            raw: list[PathLike] = [path_or_paths]
        elif isinstance(path_or_paths, Sequence) and all(isinstance(p, (str, os.PathLike)) for p in path_or_paths):
            raw = list(path_or_paths)
        else:
            raise TypeError(f"path_or_paths must be a path or a sequence of paths, got {path_or_paths!r}")
        if not raw:
            raise ValueError("path_or_paths is empty: give at least one meta file")
        files = []
        for p in raw:
            path = Path(p).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"meta file not found: {os.fspath(p)!r}")
            files.append(_File(path, path.stat().st_size, load_index(path), _FileBytes(path)))
        self._files = tuple(files)
        self._bounds = np.cumsum([0] + [len(f.index.spans) for f in files], dtype=np.int64)
        if self._bounds[-1] == 0:
            names = ", ".join(str(f.path) for f in files)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")

    @property
    def paths(self) -> tuple[Path, ...]:
        """The resolved paths of the files, in order."""
        return tuple(f.path for f in self._files)

    def __len__(self) -> int:
        return int(self._bounds[-1])

    def __repr__(self) -> str:
        return f"MetaFile({[str(p) for p in self.paths]!r}, samples={len(self)})"

    def __getstate__(self) -> dict[str, object]:
        return {"paths": [str(p) for p in self.paths]}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["paths"])  # type: ignore[misc]

    @property
    def fingerprint(self) -> str:
        """A short hash of the files' sample counts, sizes, and first and last 64 KiB.

        Equal for the same files on any machine (paths and mtimes do not enter it), and computed
        without reading the whole files: what a resume state is checked against.
        """
        return _fingerprint(self._files)

    @property
    def file_fingerprints(self) -> tuple[str, ...]:
        """The fingerprint of each file alone (``MetaFile(path).fingerprint`` of each path)."""
        return tuple(_fingerprint([f]) for f in self._files)

    def select(self, files: Sequence[int]) -> MetaFile:
        """The files numbered ``files`` (in that order, repeats allowed) as one MetaFile, sharing this
        one's indexes and maps: no file is opened or indexed again.

        Example:
            >>> import tempfile, os
            >>> d = tempfile.mkdtemp()
            >>> paths = [os.path.join(d, n) for n in ("a.txt", "b.txt")]
            >>> for p, text in zip(paths, ["a0\\na1\\n", "b0\\n"]):
            ...     _ = open(p, "w").write(text)
            >>> mf = MetaFile(paths).select([1, 0])
            >>> len(mf), mf[0], mf[1]
            (3, 'b0', 'a0')
        """
        chosen = [self._files[check_index(f, len(self._files), label="file number", of="the files")] for f in files]
        if not chosen:
            raise ValueError("select at least one file")
        view = object.__new__(MetaFile)
        view._files = tuple(chosen)
        view._bounds = np.cumsum([0] + [len(f.index.spans) for f in chosen], dtype=np.int64)
        return view

    @property
    def file_bounds(self) -> npt.NDArray[np.int64]:
        """Sample numbers at which each file starts, and the total at the end."""
        return self._bounds

    def locate(self, index: int) -> tuple[int, int]:
        """``(file number, sample number within that file)`` of global sample ``index``."""
        n = len(self)
        index = check_index(index, n, label="sample index", of=f"{n} samples")
        file = int(np.searchsorted(self._bounds, index, side="right")) - 1
        return file, index - int(self._bounds[file])

    def where(self, index: int) -> str:
        """``path:line`` of global sample ``index``, for error messages."""
        file, local = self.locate(index)
        f = self._files[file]
        offset = int(f.index.spans[local, 0])
        line = f.bytes[:offset].count(b"\n") + 1 if offset else 1
        return f"{f.path}:{line}"

    def raw(self, index: int) -> bytes:
        """The bytes of sample ``index`` without its line ending."""
        file, local = self.locate(index)
        start, end = self._files[file].index.spans[local]
        return self._files[file].bytes[int(start) : int(end)]

    def __getitem__(self, index: int) -> str:
        raw = self.raw(index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.where(index)}: line is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None

    def read(self, indices: npt.ArrayLike) -> Shard:
        """Read the samples ``indices`` (in that order) into a new Shard.

        Reads the index entries and the lines of these samples only, in file order, and drops the
        pages it read from this process's resident set as it goes.

        Raises:
            ValueError: a line is not valid UTF-8 (the message names its file and line).
        """
        indices = np.asarray(indices, np.int64)
        data, starts, ends, check = _gather(self._files, self._bounds, indices)
        if check:
            _check_utf8(self.where, indices, data, starts, ends)
        return_freed_memory()
        return Shard(data, starts, ends, ids=indices)


def _fingerprint(files: Sequence[_File]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(struct.pack("<qq", len(f.index.spans), f.size))
        digest.update(f.bytes[: 1 << 16] if f.size else b"")
        digest.update(f.bytes[max(0, f.size - (1 << 16)) :] if f.size else b"")
    return digest.hexdigest()[:32]


def _file_of(bounds: npt.NDArray[np.int64], indices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The file number of each sample: comparisons for a few files (several times faster than a
    binary search), a binary search for many."""
    inner = bounds[1:-1]
    if inner.size > 16:
        return np.searchsorted(bounds, indices, side="right") - 1
    out = np.zeros(indices.size, np.int64)
    for bound in inner.tolist():
        out += indices >= bound
    return out


def _gather(
    files: Sequence[_File], bounds: npt.NDArray[np.int64], indices: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.integer[Any]], npt.NDArray[np.integer[Any]], bool]:
    """The bytes of samples ``indices``, the offsets of each in them (``indices``' order kept), and
    whether they still need a UTF-8 check (then each row's tail is zeroed).

    Lines are copied as fixed-width rows (their length rounded up to a multiple of 8, the tail being
    whatever follows the line in the file), one numpy gather per block of rows, so a shard costs at
    most 7 bytes a line more than its text. Rows are visited in file order at the granularity of
    1/4096 of the samples: a cheap radix sort instead of a full one.
    """
    if not indices.size:
        return new_buffer(0), np.empty(0, np.uint32), np.empty(0, np.uint32), False
    n_total = int(bounds[-1])
    shift = max(0, (n_total - 1).bit_length() - 12)
    order = np.argsort((indices >> shift).astype(np.uint16), kind="stable")
    sorted_idx = indices[order]
    first = np.empty(indices.size, np.int64)  # where each row starts in its file, in visiting order
    lengths = np.empty(indices.size, np.int64)
    file_of = _file_of(bounds, sorted_idx) if len(files) > 1 else None
    for f, file in enumerate(files):
        rows = np.flatnonzero(file_of == f) if file_of is not None else np.arange(indices.size)
        # np.take of whole rows is several times faster than fancy indexing the 2-D index.
        spans = np.asarray(file.index.spans)
        for lo in range(0, rows.size, _INDEX_STEP):
            part = rows[lo : lo + _INDEX_STEP]
            local = sorted_idx[part] - bounds[f]
            got = np.take(spans, local, axis=0)
            first[part] = got[:, 0]
            lengths[part] = got[:, 1] - got[:, 0]
            file.index.release_pages(int(local.min()), int(local.max()) + 1)
    del sorted_idx
    code = ((np.maximum(lengths, 1) + 7) >> 3).astype(np.uint16)  # the row width in units of 8 bytes
    code[lengths > _MAX_WIDTH] = 0  # long rows: copied one by one, at their exact length
    # Lay rows out by (file, width), keeping the visiting order within each group, so that every
    # group is one contiguous run of fixed-width records in data.
    key = code if file_of is None else (file_of.astype(np.uint32) << 16) | code
    layout = np.argsort(key, kind="stable")
    laid_width = code[layout].astype(np.int64) << 3
    exact = laid_width == 0
    laid_width[exact] = lengths[layout[exact]]
    total = int(laid_width.sum())
    data = new_buffer(total)
    row_starts = np.empty(indices.size, np.int64)
    row_starts[layout] = np.cumsum(laid_width) - laid_width
    del laid_width, exact
    dtype = offset_dtype(total)
    starts = np.empty(indices.size, dtype)
    starts[order] = row_starts
    ends = starts.copy()
    ends[order] += lengths.astype(dtype)
    del order
    laid_key = key[layout]
    # An ASCII file needs no UTF-8 check; otherwise row tails are zeroed so that whole runs of
    # rows can be decoded at once, a NUL ending every line that is shorter than its row.
    check = not all(file.index.ascii for file in files)
    for group in np.split(layout, np.flatnonzero(laid_key[1:] != laid_key[:-1]) + 1):
        f = int(file_of[group[0]]) if file_of is not None else 0
        w = int(code[group[0]]) << 3
        _copy_rows(files[f].bytes.map(), first, lengths, group, w, data, row_starts, zero_tails=check)
    for file in files:
        file.release_pages()
    return data, starts, ends, check


def _copy_rows(
    mm: mmap.mmap,
    first: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    width: int,
    data: npt.NDArray[np.uint8],
    row_starts: npt.NDArray[np.int64],
    *,
    zero_tails: bool,
) -> None:
    """Copy ``rows`` of one file into ``data`` at ``row_starts``, ``width`` bytes each (0: exact).

    Rows go in batches that each span at most about ``_WINDOW`` bytes of the file (rows are in file
    order up to a little jitter), and each batch's file pages are dropped from the resident set
    after it, so the build never holds much of the file.
    """
    fbytes = np.frombuffer(mm, np.uint8)
    starts_in_file = first[rows]
    # Windows of the file a row could start at: a byte view with a stride of one byte, whose
    # elements are ``width``-byte records, so that one fancy index copies whole rows.
    windows = None
    if 0 < width <= fbytes.size:
        windows = np.ndarray((fbytes.size - width + 1,), dtype=f"V{width}", buffer=mm, strides=(1,))
    region = np.maximum.accumulate(starts_in_file) // _WINDOW
    cuts = np.flatnonzero(region[1:] != region[:-1]) + 1
    max_rows = max(1, _WINDOW // max(width, 1))
    if cuts.size == 0 or np.diff(cuts, prepend=0, append=rows.size).max() > max_rows:
        cuts = np.union1d(cuts, np.arange(max_rows, rows.size, max_rows))
    for batch in np.split(np.arange(rows.size), cuts):
        if not batch.size:
            continue
        b_first, b_rows = starts_in_file[batch], rows[batch]
        dst = row_starts[b_rows]
        fits = windows is not None and int(b_first.max()) <= fbytes.size - width
        if fits and int(dst[-1] - dst[0]) == width * (b_rows.size - 1):
            # Rows of one width land back to back: one copy for the batch.
            out = data[dst[0] : dst[0] + width * b_rows.size]
            out[:] = windows[b_first].view(np.uint8)  # type: ignore[index]
            if zero_tails:
                block = out.reshape(b_rows.size, width)
                block[np.arange(width) >= lengths[b_rows][:, None]] = 0
        else:  # rows with no full window left before the end of the file, or of no fixed width
            for s, n, o in zip(b_first.tolist(), lengths[b_rows].tolist(), dst.tolist()):
                data[o : o + n] = fbytes[s : s + n]
                data[o + n : o + width] = 0
        drop_pages(mm, int(b_first.min()), int(b_first.max()) + max(width, int(lengths[b_rows].max()), 1))


def _check_utf8(
    where: Callable[[int], str],
    indices: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.integer[Any]],
    ends: npt.NDArray[np.integer[Any]],
) -> None:
    """Raise ValueError naming file and line of a sample that is not valid UTF-8.

    ``data`` holds the lines, each followed by zero bytes up to the start of the next one.
    """

    def fail(row: int) -> None:
        try:
            data[starts[row] : ends[row]].tobytes().decode("utf-8")
            reason = "invalid byte sequence"  # pragma: no cover - callers pass an invalid row
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{where(int(indices[row]))}: line is not valid UTF-8 ({reason})")

    nonempty = np.flatnonzero(ends > starts)
    first = data[starts[nonempty]]
    # A line that starts with a continuation byte is invalid on its own; with none such, a
    # sequence cut at a line boundary cannot pass as valid, so whole runs of lines can be decoded.
    bad = nonempty[(first >= 0x80) & (first < 0xC0)]
    if bad.size:
        fail(int(bad[0]))
    layout = np.sort(starts[nonempty])
    cuts = [*layout[:: 1 << 16].tolist(), data.size]
    view = data.data
    for a, b in itertools.pairwise(cuts):
        try:
            str(view[a:b], "utf-8")
        except UnicodeDecodeError as exc:
            pos = a + exc.start
            fail(int(np.flatnonzero((starts <= pos) & (ends > pos))[0]))
