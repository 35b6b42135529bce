"""MetaFile: the samples of one or more meta files, read through their line-offset index. No torch.

This is the one module that touches a meta file's bytes: :class:`_FileBytes` opens a file only
while reading it and reads it with positional reads (a shared map of a file that shrinks kills the
process with SIGBUS; a positional read comes back short), checking when it opens the file and again
when it is done that it is still the file the index describes. :meth:`MetaFile.read` copies a set of
samples into a :class:`~rank_dataset.shard.Shard` and checks each against the bytes it copied: a
sample starts the file or follows a newline, ends at a line ending or the end of the file, and holds
no newline. So a rewritten file is a :class:`MetaFileChangedError`, never a torn sample, and an
index that disagrees with an unchanged file is rebuilt. Another kind of file (compressed, remote)
is another ``_FileBytes``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from rank_dataset._bounds import Bounds
from rank_dataset._checks import check_index
from rank_dataset._pread import ShortRead, Window, count_newlines, read_ends
from rank_dataset._residency import return_freed_memory
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.index import FileKey, Index, SpanReader, load_index, spans_are_sane
from rank_dataset.scan import BLANK, BOM, CR, NEWLINE, PathLike
from rank_dataset.shard import Shard, ShardWriter, copy_rows

__all__ = ["MetaFile", "MetaFileChangedError"]

# Lines are copied in batches that each span about this many bytes of the file, read into one
# reusable buffer: large enough that a build makes few numpy calls per batch, small enough to bound
# its memory.
_WINDOW = 8 << 20
_INDEX_STEP = 1 << 18  # index entries gathered at a time
_BATCH_ROWS = 1 << 17  # rows copied at a time, bounding the temporaries of a batch
_TRIES = 3  # reads of a file whose index disagrees with it, rebuilding the index in between
_FINGERPRINT_BYTES = 1 << 16
_T = TypeVar("_T")


class _IndexMismatch(Exception):
    """The index of file ``file`` cannot be used as it is: ``corrupt`` (its spans disagree with the
    unchanged file: rebuild it) or gone (the cache was removed or replaced: load it again)."""

    def __init__(self, file: int, *, corrupt: bool) -> None:
        super().__init__(file, corrupt)
        self.file, self.corrupt = file, corrupt


class _FileBytes:
    """The bytes of one meta file: no descriptor is kept between reads (a job with thousands of meta
    files stays far below the descriptor limit, and a DataLoader worker never needs the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def open(self, key: FileKey) -> Iterator[int]:
        """A descriptor of the file, checked against ``key`` on entry and (after a read completes)
        on exit, both the descriptor and the path: the bytes read are those of the file indexed.

        Raises:
            MetaFileChangedError: the file is not (or, by the end, no longer) the one indexed.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MetaFileChangedError(self.path, "it was deleted or moved") from None
        try:
            self.check(fd, key)
            try:
                yield fd
            except ShortRead:
                self.check(fd, key)
                raise MetaFileChangedError(self.path, "it shrank while being read") from None
            self.check(fd, key)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                raise MetaFileChangedError(self.path, "it was deleted or moved") from None
            _raise_if_changed(self.path, key, FileKey.of(now))
        finally:
            os.close(fd)

    def check(self, fd: int, key: FileKey) -> None:
        """Raise MetaFileChangedError if the file open at ``fd`` is not the one ``key`` describes."""
        _raise_if_changed(self.path, key, FileKey.of(os.fstat(fd)))


def _raise_if_changed(path: Path, key: FileKey, now: FileKey) -> None:
    what = key.change(now)
    if what is not None:
        raise MetaFileChangedError(path, what)


@dataclass(frozen=True)
class _File:
    path: Path
    index: Index
    bytes: _FileBytes


class MetaFile:
    """The samples of one meta file, or of several taken as one in the order given.

    Args:
        path_or_paths: a path, or a sequence of paths.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: the files hold no sample.

    Examples:
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
            files.append(_File(path, load_index(path), _FileBytes(path)))
        # The fingerprints of the files as indexed (together, and each alone), computed now: taken
        # later, from a file changed meanwhile, they would fail, and in the ranks' agreement check
        # one rank failing alone would leave the others waiting in the collective.
        self._set(files, *_fingerprints(files))
        if self._layout.total == 0:
            names = ", ".join(str(f.path) for f in files)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")

    def _set(self, files: Sequence[_File], fingerprint: str | None, file_fingerprints: tuple[str, ...]) -> None:
        self._files = tuple(files)
        self._layout = Bounds([f.index.count for f in files])
        self._fingerprint, self._file_fingerprints = fingerprint, file_fingerprints

    @property
    def paths(self) -> tuple[Path, ...]:
        """The resolved paths of the files, in order."""
        return tuple(f.path for f in self._files)

    def __len__(self) -> int:
        return self._layout.total

    def __repr__(self) -> str:
        return f"MetaFile({[str(p) for p in self.paths]!r}, samples={len(self)})"

    def __getstate__(self) -> dict[str, object]:
        # What lengths, error messages and later reads need, and no open file: a spawn worker that
        # receives a dataset whose shard is in shared memory never touches the meta files (they may
        # even be gone), and one that does read checks them against these keys first.
        files = [(str(f.path), f.index) for f in self._files]
        return {"files": files, "fingerprint": self._fingerprint, "file_fingerprints": self._file_fingerprints}

    def __setstate__(self, state: dict[str, Any]) -> None:
        files = [_File(Path(path), index, _FileBytes(Path(path))) for path, index in state["files"]]
        self._set(files, state["fingerprint"], state["file_fingerprints"])

    @property
    def fingerprint(self) -> str:
        """A short hash of the files' sample counts, sizes, and first and last 64 KiB, as indexed.

        Equal for the same files on any machine (paths and mtimes do not enter it), and computed
        without reading the whole files: what a resume state is checked against.
        """
        if self._fingerprint is None:  # a view from select
            self._fingerprint = _fingerprint(self._files)
        return self._fingerprint

    @property
    def file_fingerprints(self) -> tuple[str, ...]:
        """The fingerprint of each file alone (``MetaFile(path).fingerprint`` of each path), as indexed."""
        return self._file_fingerprints

    def select(self, files: Sequence[int]) -> MetaFile:
        """The files numbered ``files`` (in that order, repeats allowed) as one MetaFile, sharing this
        one's indexes: no file is opened or indexed again (its fingerprint is taken if asked for).

        Examples:
            >>> import tempfile, os
            >>> d = tempfile.mkdtemp()
            >>> paths = [os.path.join(d, n) for n in ("a.txt", "b.txt")]
            >>> for p, text in zip(paths, ["a0\\na1\\n", "b0\\n"]):
            ...     _ = open(p, "w").write(text)
            >>> mf = MetaFile(paths).select([1, 0])
            >>> len(mf), mf[0], mf[1]
            (3, 'b0', 'a0')
        """
        numbers = [check_index(f, len(self._files), label="file number", of="the files") for f in files]
        if not numbers:
            raise ValueError("select at least one file")
        view = object.__new__(MetaFile)
        view._set([self._files[f] for f in numbers], None, tuple(self._file_fingerprints[f] for f in numbers))
        return view

    @property
    def file_bounds(self) -> npt.NDArray[np.int64]:
        """Sample numbers at which each file starts, and the total at the end."""
        return self._layout.starts

    def locate(self, index: int) -> tuple[int, int]:
        """``(file number, sample number within that file)`` of global sample ``index``."""
        n = len(self)
        index = check_index(index, n, label="sample index", of=f"{n} samples")
        return self._layout.locate(index)

    def where(self, index: int) -> str:
        """``path:line`` of global sample ``index``, for error messages.

        The line is found by counting newlines 16 MiB at a time. If the file cannot be read (it
        changed or is gone), the sample's number within its file is given instead.
        """
        file, local = self.locate(index)
        path = self._files[file].path
        try:
            start = int(self._retrying(lambda: _span(self._files[file], file, local))[0])
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                return f"{path}:{count_newlines(fd, start) + 1}"
            finally:
                os.close(fd)
        except (OSError, MetaFileChangedError):
            return f"{path}, sample {local} of the file"

    def raw(self, index: int) -> bytes:
        """The bytes of sample ``index`` without its line ending.

        Raises:
            MetaFileChangedError: the file changed since it was indexed.
        """
        file, local = self.locate(index)
        return self._retrying(lambda: _read_one(self._files[file], file, local))

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

        Reads the index entries and the lines of these samples only, in file order, a window of
        the file at a time into one reusable buffer, and checks every sample against the bytes.
        With ``ids=False`` the shard does not keep the sample numbers (a dataset recomputes them
        from its plan).

        Raises:
            IndexError: an index outside ``[0, len(self))``.
            MetaFileChangedError: a file changed since it was indexed (or while it was read).
            ValueError: a line is not valid UTF-8 (the message names its file and line).
        """
        indices = np.asarray(indices, np.int64)
        n, low, high = len(self), int(indices.min(initial=0)), int(indices.max(initial=0))
        if low < 0 or high >= n:
            raise IndexError(f"sample index {low if low < 0 else high} is out of range for {n} samples")
        writer = self._retrying(lambda: _gather(self._files, self._layout, indices, ids=ids))
        if not all(file.index.ascii for file in self._files):
            _check_utf8(self.where, indices, writer.data, writer.bounds)
        return_freed_memory()
        return writer.finish()

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, loading the index of a file again (rebuilding it, if it disagrees with the
        file's bytes) and retrying, a few times at most."""
        for tries in itertools.count(1):
            try:
                return attempt()
            except _IndexMismatch as exc:
                if tries == _TRIES:
                    what = "its lines still disagree with its index after the index was rebuilt"
                    raise MetaFileChangedError(self._files[exc.file].path, what) from None
                self._reindex(exc.file, rebuild=exc.corrupt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _reindex(self, file: int, *, rebuild: bool) -> None:
        old = self._files[file]
        index = load_index(old.path, rebuild=rebuild)
        what = old.index.key.change(index.key)
        if what is None and index.count != old.index.count:
            what = f"it holds {index.count:,} samples now, not {old.index.count:,}"
        if what is not None:
            raise MetaFileChangedError(old.path, what)
        files = list(self._files)
        files[file] = replace(old, index=index)
        self._set(files, self._fingerprint, self._file_fingerprints)


def _fingerprints(files: Sequence[_File]) -> tuple[str, tuple[str, ...]]:
    """The fingerprint of ``files`` taken as one, and of each alone, from one read of each file's ends."""
    whole, each = hashlib.sha256(), []
    for f in files:
        size = f.index.key.size
        part = struct.pack("<qq", f.index.count, size)
        if size:
            with f.bytes.open(f.index.key) as fd:
                part += read_ends(fd, size, _FINGERPRINT_BYTES)
        whole.update(part)
        each.append(hashlib.sha256(part).hexdigest()[:32])
    return whole.hexdigest()[:32], tuple(each)


def _fingerprint(files: Sequence[_File]) -> str:
    return _fingerprints(files)[0]


def _spans(index: Index, file: int, local: npt.NDArray[np.int64], out: npt.NDArray[np.int64]) -> None:
    """Write the spans of samples ``local`` of file number ``file`` into ``out`` (``(k, 2)``), taken
    from the index ``_INDEX_STEP`` at a time, and check that they could be lines of the file (inside
    it, not empty); the bytes they point at are checked when they are copied."""
    try:
        with SpanReader(index) as reader:
            for a in range(0, local.size, _INDEX_STEP):
                reader.take(local[a : a + _INDEX_STEP], out[a : a + _INDEX_STEP])
    except LookupError:
        raise _IndexMismatch(file, corrupt=False) from None
    if not spans_are_sane(out, index.key.size, ordered=False):
        raise _IndexMismatch(file, corrupt=True)


def _span(f: _File, file: int, local: int) -> npt.NDArray[np.int64]:
    out = np.empty((1, 2), np.int64)
    _spans(f.index, file, np.array([local], np.int64), out)
    span: npt.NDArray[np.int64] = out[0]
    return span


def _read_one(f: _File, file: int, local: int) -> bytes:
    start, end = _span(f, file, local).tolist()
    s, e = np.array([start], np.int64), np.array([end], np.int64)
    size = f.index.key.size
    with f.bytes.open(f.index.key) as fd:
        buf, lo = Window().load(fd, _need_lo(s), e + 2, size, pad=2)
        line = buf[start - lo : end - lo]
        if not (_bounds_ok(buf, lo, s, e, size) and _line_ok(line)):
            f.bytes.check(fd, f.index.key)
            raise _IndexMismatch(file, corrupt=True)
        return line.tobytes()


def _batches(positions: npt.NDArray[np.int64], window: int, max_rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive runs of ``positions`` (roughly ascending) that each span about
    ``window`` bytes and hold at most ``max_rows`` entries."""
    if not positions.size:
        return []
    region = np.maximum.accumulate(positions) // window
    cuts = np.flatnonzero(region[1:] != region[:-1]) + 1
    if cuts.size == 0 or np.diff(cuts, prepend=0, append=positions.size).max() > max_rows:
        cuts = np.union1d(cuts, np.arange(max_rows, positions.size, max_rows))
    bounds = [0, *cuts.tolist(), positions.size]
    return list(itertools.pairwise(bounds))


def _gather(files: Sequence[_File], bounds: Bounds, indices: npt.NDArray[np.int64], *, ids: bool) -> ShardWriter:
    """A ShardWriter holding the lines of samples ``indices``, back to back in ``indices``' order.

    Rows are visited in file order at the granularity of 1/4096 of the samples (a cheap radix sort
    instead of a full one), read a window of the file at a time, checked against the file's bytes,
    and each copied at its exact length into its place in item order
    (:func:`~rank_dataset.shard.copy_rows`), so a shard holds nothing but its lines and offsets.

    Raises:
        MetaFileChangedError: a file is not the one indexed.
        _IndexMismatch: an index cannot be used as it is.
    """
    n = indices.size
    if not n:
        writer = ShardWriter(0, 0, ids=ids)
        writer.bounds[0] = 0
        return writer
    n_total = bounds.total
    shift = max(0, (n_total - 1).bit_length() - 12)
    order = np.argsort((indices >> shift).astype(np.uint16), kind="stable")
    sorted_idx = indices[order]
    spans = np.empty((n, 2), np.int64)  # of each row, in visiting order
    if len(files) > 1:
        file_of = bounds.part_of(sorted_idx)
        by_file = np.argsort(file_of, kind="stable")  # visiting order kept within each file
        cuts = np.cumsum(np.bincount(file_of, minlength=len(files)))
        per_file = [(f, by_file[lo:hi]) for f, (lo, hi) in enumerate(itertools.pairwise([0, *cuts.tolist()]))]
        per_file = [(f, rows) for f, rows in per_file if rows.size]
        for f, rows in per_file:
            part = np.empty((rows.size, 2), np.int64)
            _spans(files[f].index, f, sorted_idx[rows] - bounds.starts[f], part)
            spans[rows] = part
        del file_of, by_file
    else:
        per_file = [(0, np.arange(n))]
        _spans(files[0].index, 0, sorted_idx, spans)
    del sorted_idx
    first = np.ascontiguousarray(spans[:, 0])
    lengths = spans[:, 1] - first
    del spans
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
    window = Window()
    for f, rows in per_file:
        file = files[f]
        with file.bytes.open(file.index.key) as fd:
            if not _copy_rows(fd, file.index.key.size, window, first[rows], lengths[rows], dst[rows], writer.data):
                file.bytes.check(fd, file.index.key)  # a file changed meanwhile is that error
                raise _IndexMismatch(f, corrupt=True)
    # Each row starts after a newline and ends at one (checked as it was read): a newline inside a
    # row means its span covers more than one line. One pass over the copied bytes finds it.
    bad = _first_newline(writer.data)
    if bad >= 0:
        row = int(np.searchsorted(writer.bounds, bad, side="right")) - 1
        f = bounds.locate(int(indices[row]))[0]
        with files[f].bytes.open(files[f].index.key) as fd:
            files[f].bytes.check(fd, files[f].index.key)
        raise _IndexMismatch(f, corrupt=True)
    return writer


def _need_lo(s: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where the bytes needed to check samples starting at ``s`` begin: the byte before each (the
    whole byte order mark for a sample that may follow one)."""
    return np.where(s == len(BOM), 0, np.maximum(s - 1, 0))


def _copy_rows(
    fd: int,
    size: int,
    window: Window,
    first: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    dst: npt.NDArray[np.integer[Any]],
    data: npt.NDArray[np.uint8],
) -> bool:
    """Copy rows of one file (``lengths`` bytes at ``first``, in about file order) to ``dst`` in
    ``data``; False, before copying a batch, if one of its rows is not a line of the file.

    Rows go in batches that each span about ``_WINDOW`` bytes of the file (rows are in file order up
    to a little jitter), each read once into ``window``, checked there and copied from it.
    """
    for a, b in _batches(first, _WINDOW, _BATCH_ROWS):
        s, e = first[a:b], first[a:b] + lengths[a:b]
        buf, lo = window.load(fd, _need_lo(s), e + 2, size, pad=8)
        if not (_bounds_ok(buf, lo, s, e, size) and _rows_ok(buf, s - lo, e - lo)):
            return False
        copy_rows(buf, s - lo, lengths[a:b], data, dst[a:b])
    return True


def _bounds_ok(
    buf: npt.NDArray[np.uint8], lo: int, s: npt.NDArray[np.int64], e: npt.NDArray[np.int64], size: int
) -> bool:
    """Whether every span ``[s, e)`` is bounded as a sample is: it starts the file (after a byte
    order mark, if the file has one) or follows a newline, and its end is a line ending (``\\n`` not
    after ``\\r``, ``\\r\\n``, ``\\r`` at the end of the file) or the end of the file.

    ``buf[x - lo]`` is byte ``x`` of the file for ``x`` in ``[s - 1, e + 2)``, and ``buf`` has at
    least 2 bytes more after ``e``.
    """
    # The common case first, in a few passes: after a newline, before a newline not after a CR.
    first = s == 0
    ok = (buf[s - 1 - lo] == NEWLINE) & (buf[e - lo] == NEWLINE) & (buf[e - 1 - lo] != CR) & ~first
    if bool(ok.all()):
        return True
    rows = np.flatnonzero(~ok)  # the first sample, the last, CRLF endings, and wrong spans
    s, e = s[rows], e[rows]
    bom = lo == 0 and size >= len(BOM) and buf[: len(BOM)].tobytes() == BOM
    after_newline = buf[np.maximum(s - 1 - lo, 0)] == NEWLINE
    start_ok = np.where(s == 0, not bom, after_newline | ((s == len(BOM)) & bom))
    last, c1, c2 = buf[e - 1 - lo], buf[e - lo], buf[e + 1 - lo]
    at_eof = e >= size
    plain_end = (at_eof | (c1 == NEWLINE)) & (last != CR)
    cr_end = ~at_eof & (c1 == CR) & ((e + 1 >= size) | (c2 == NEWLINE))
    return bool((start_ok & (plain_end | cr_end)).all())


def _rows_ok(buf: npt.NDArray[np.uint8], s: npt.NDArray[np.int64], e: npt.NDArray[np.int64]) -> bool:
    """Whether each row ``buf[s:e]`` holds something other than whitespace (newlines inside rows are
    looked for once the whole shard is copied: :func:`_first_newline`)."""
    # Only a row that starts with whitespace can be blank: check those in full (they are rare).
    maybe_blank = np.flatnonzero(BLANK[buf[s]])
    return all(_line_ok(buf[x:y]) for x, y in zip(s[maybe_blank].tolist(), e[maybe_blank].tolist()))


def _first_newline(data: npt.NDArray[np.uint8]) -> int:
    """Where the first newline byte of ``data`` is, or -1: a few MiB at a time, so the comparison's
    temporary stays small."""
    step = 4 << 20
    for lo in range(0, data.size, step):
        hits = np.flatnonzero(data[lo : lo + step] == NEWLINE)
        if hits.size:
            return lo + int(hits[0])
    return -1


def _line_ok(line: npt.NDArray[np.uint8]) -> bool:
    """Whether ``line`` holds no newline and something other than whitespace."""
    return not bool((line == NEWLINE).any()) and not bool(BLANK[line].all())


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
