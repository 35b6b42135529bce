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
from rank_dataset.shard import Shard, ShardWriter, copy_rows

__all__ = ["MetaFile"]

# Lines are copied in batches of about this many bytes, after each of which the file pages they
# came from are dropped from this process's resident set.
_WINDOW = 16 << 20
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

    def read(self, indices: npt.ArrayLike, *, ids: bool = True) -> Shard:
        """Read the samples ``indices`` (in that order) into a new Shard, in shareable memory.

        Reads the index entries and the lines of these samples only, in file order, and drops the
        pages it read from this process's resident set as it goes. With ``ids=False`` the shard
        does not keep the sample numbers (a dataset recomputes them from its plan).

        Raises:
            ValueError: a line is not valid UTF-8 (the message names its file and line).
        """
        indices = np.asarray(indices, np.int64)
        writer = _gather(self._files, self._bounds, indices, ids=ids)
        if not all(file.index.ascii for file in self._files):
            _check_utf8(self.where, indices, writer.data, writer.bounds)
        return_freed_memory()
        return writer.finish()


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
    files: Sequence[_File], bounds: npt.NDArray[np.int64], indices: npt.NDArray[np.int64], *, ids: bool
) -> ShardWriter:
    """A ShardWriter holding the lines of samples ``indices``, back to back in ``indices``' order.

    Rows are visited in file order at the granularity of 1/4096 of the samples (a cheap radix sort
    instead of a full one), and each is copied at its exact length into its place in item order
    (:func:`~rank_dataset.shard.copy_rows`), so a shard holds nothing but its lines and offsets.
    """
    n = indices.size
    if not n:
        writer = ShardWriter(0, 0, ids=ids)
        writer.bounds[0] = 0
        return writer
    n_total = int(bounds[-1])
    shift = max(0, (n_total - 1).bit_length() - 12)
    order = np.argsort((indices >> shift).astype(np.uint16), kind="stable")
    sorted_idx = indices[order]
    first = np.empty(n, np.int64)  # where each row starts in its file, in visiting order
    lengths = np.empty(n, np.int64)
    file_of = _file_of(bounds, sorted_idx) if len(files) > 1 else None
    for f, file in enumerate(files):
        rows = np.flatnonzero(file_of == f) if file_of is not None else np.arange(n)
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
    writer = ShardWriter(n, int(lengths.sum()), ids=ids)
    if writer.ids is not None:
        writer.ids[:] = indices
    # Offsets in item order; each visited row's place among them.
    item_lengths = np.empty(n, np.int64)
    item_lengths[order] = lengths
    writer.bounds[0] = 0
    np.cumsum(item_lengths, dtype=writer.bounds.dtype, out=writer.bounds[1:])
    del item_lengths
    dst = writer.bounds[:-1][order]
    del order
    for f, file in enumerate(files):
        rows = np.flatnonzero(file_of == f) if file_of is not None else np.arange(n)
        if not rows.size:
            continue
        _copy_rows(file.bytes.map(), first[rows], lengths[rows], dst[rows], writer.data)
    for file in files:
        file.release_pages()
    return writer


def _copy_rows(
    mm: mmap.mmap,
    first: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    dst: npt.NDArray[np.integer[Any]],
    data: npt.NDArray[np.uint8],
) -> None:
    """Copy rows of one file (``lengths`` bytes at ``first``, in about file order) to ``dst`` in ``data``.

    Rows go in batches that each span at most about ``_WINDOW`` bytes of the file (rows are in file
    order up to a little jitter) and of the shard, and each batch's file pages are dropped from the
    resident set after it, so the build never holds much of the file.
    """
    if not first.size:
        return
    fbytes = np.frombuffer(mm, np.uint8)
    region = np.maximum.accumulate(first) // _WINDOW
    region += np.cumsum(lengths) // _WINDOW  # also a new batch every _WINDOW bytes copied
    cuts = np.flatnonzero(region[1:] != region[:-1]) + 1
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), first.size]):
        b_first, b_lengths = first[lo:hi], lengths[lo:hi]
        copy_rows(fbytes, b_first, b_lengths, data, dst[lo:hi])
        drop_pages(mm, int(b_first.min()), int((b_first + b_lengths).max()))


def _check_utf8(
    where: Callable[[int], str],
    indices: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    bounds: npt.NDArray[np.integer[Any]],
) -> None:
    """Raise ValueError naming file and line of a sample that is not valid UTF-8.

    ``data`` holds the lines back to back, line ``i`` at ``bounds[i]:bounds[i + 1]``.
    """

    def fail(row: int) -> None:
        try:
            data[bounds[row] : bounds[row + 1]].tobytes().decode("utf-8")
            reason = "invalid byte sequence"  # pragma: no cover - callers pass an invalid row
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{where(int(indices[row]))}: line is not valid UTF-8 ({reason})")

    starts, ends = bounds[:-1], bounds[1:]
    nonempty = np.flatnonzero(ends > starts)
    first = data[starts[nonempty]]
    # A line that starts with a continuation byte is invalid on its own; with none such, a
    # sequence cut at a line boundary cannot pass as valid, so whole runs of lines can be decoded.
    bad = nonempty[(first >= 0x80) & (first < 0xC0)]
    if bad.size:
        fail(int(bad[0]))
    cuts = [*bounds[: -1 : 1 << 16].tolist(), int(bounds[-1])]
    view = data.data
    for a, b in itertools.pairwise(cuts):
        try:
            str(view[a:b], "utf-8")
        except UnicodeDecodeError as exc:
            fail(int(np.searchsorted(bounds, a + exc.start, side="right")) - 1)
