"""MetaFile: random access to the samples of one or more meta files, through a line-offset index.

A sample is a line of the file that holds something other than ASCII whitespace (space, tab, CR,
VT, FF); its text is the line without its ending (``\\n`` or ``\\r\\n``). The index of a file is an
``(n, 2)`` int64 array of the byte spans ``[start, end)`` of its samples, computed in one vectorised
pass over large chunks and cached on disk, keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import struct
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
from platformdirs import user_cache_dir

from rank_dataset._checks import check_index
from rank_dataset._progress import progress_bar

__all__ = ["CACHE_DIR_ENV", "MetaFile", "build_index"]

#: Environment variable naming a directory for index caches, used instead of the meta file's own.
CACHE_DIR_ENV = "RANK_DATASET_CACHE_DIR"

_MAGIC = b"RDIDX\x00\x00\x01"
_HEADER = struct.Struct("<8sqqqq")  # magic, file size, file mtime_ns, number of samples, flags
_FLAG_ASCII = 1
_HIGH_BITS = np.uint64(0x8080808080808080)
_DATA_OFFSET = 64
_CHUNK = 32 << 20
_THREADS = 2
_NEWLINE, _CR = 10, 13
_BLANK = np.zeros(256, dtype=bool)
_BLANK[[9, 10, 11, 12, 13, 32]] = True

PathLike = str | os.PathLike[str]


def _spans_of_chunk(buf: npt.NDArray[np.uint8], last: bool) -> tuple[npt.NDArray[np.int64], int]:
    """The sample spans of the complete lines in ``buf`` and the length of the complete part.

    With ``last``, bytes after the final newline form a line too.
    """
    if not buf.size:
        return np.empty((0, 2), np.int64), 0
    ends = np.flatnonzero(buf == _NEWLINE)
    if last and (not ends.size or ends[-1] + 1 < buf.size):
        ends = np.append(ends, buf.size)
    if not ends.size:
        return np.empty((0, 2), np.int64), 0
    consumed = min(int(ends[-1]) + 1, buf.size)
    starts = np.empty_like(ends)
    starts[0] = 0
    np.add(ends[:-1], 1, out=starts[1:])
    # "\r\n" loses its "\r". For an empty first line this reads buf[-1]: harmless, as a span of
    # length <= 0 is blank either way.
    ends -= buf[ends - 1] == _CR
    maybe_blank = _BLANK[buf[np.minimum(starts, buf.size - 1)]]
    if maybe_blank.any():
        # Only lines that start with whitespace (or are empty) can be blank: check those in full.
        rows = np.flatnonzero(maybe_blank)
        keep = np.ones(ends.size, dtype=bool)
        keep[rows] = False
        sized = rows[ends[rows] > starts[rows]]
        if sized.size:
            content = ~_BLANK[buf]
            bounds = np.column_stack((starts[sized], ends[sized])).reshape(-1)
            if bounds[-1] == buf.size:
                bounds = bounds[:-1]
            keep[sized] = np.logical_or.reduceat(content, bounds)[::2]
        starts, ends = starts[keep], ends[keep]
    return np.column_stack((starts, ends)), consumed


def _is_ascii(buf: npt.NDArray[np.uint8]) -> bool:
    whole = buf.size - buf.size % 8
    return not (np.bitwise_or.reduce(buf[:whole].view(np.uint64)) & _HIGH_BITS) and not (buf[whole:] >= 0x80).any()


def _chunk_bounds(f: BinaryIO, size: int, chunk_size: int) -> list[int]:
    """Offsets ``0 = b0 < b1 < ... < bk = size`` near multiples of ``chunk_size``, each just past a newline."""
    bounds = [0]
    for target in range(chunk_size, size, chunk_size):
        pos = max(target, bounds[-1])
        while pos < size:
            f.seek(pos)
            piece = f.read(1 << 16)
            hit = piece.find(b"\n")
            if hit >= 0:
                pos += hit + 1
                break
            pos += len(piece)
        if bounds[-1] < pos < size:
            bounds.append(pos)
    bounds.append(size)
    return bounds


def _index_chunk(fd: int, start: int, stop: int, last: bool) -> tuple[npt.NDArray[np.int64], bool]:
    buf = np.empty(stop - start, np.uint8)
    got = os.preadv(fd, [buf.data], start) if buf.size else 0
    if got != buf.size:
        raise OSError(f"short read at byte {start} of a meta file that is changing while being indexed")
    spans, _ = _spans_of_chunk(buf, last=last)
    spans += start
    return spans, _is_ascii(buf)


def _scan(
    path: PathLike, chunk_size: int = _CHUNK, facts: dict[str, bool] | None = None
) -> Iterator[npt.NDArray[np.int64]]:
    """Yield the ``(k, 2)`` spans of the samples of ``path``, chunk by chunk, in file order.

    Chunks end just past a newline, so each is indexed on its own; two threads index them (numpy
    releases the GIL in the array passes), and results are yielded in order as they come.
    ``facts["ascii"]`` is set to whether the file is pure ASCII (which spares UTF-8 checks later).
    """
    ascii_only = True
    with open(path, "rb") as f, ThreadPoolExecutor(max_workers=_THREADS) as pool:
        size = os.fstat(f.fileno()).st_size
        bounds = _chunk_bounds(f, size, chunk_size)
        jobs = [(lo, hi, i == len(bounds) - 2) for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]
        pending: deque[Future[tuple[npt.NDArray[np.int64], bool]]] = deque()
        with progress_bar(size, f"indexing {os.fspath(path)}") as bar:
            for n, job in enumerate(jobs):
                pending.append(pool.submit(_index_chunk, f.fileno(), *job))
                # Keep a few chunks in flight: enough to use both cores, few enough to bound memory.
                while pending and (len(pending) > _THREADS or n == len(jobs) - 1):
                    spans, ascii_chunk = pending.popleft().result()
                    ascii_only = ascii_only and ascii_chunk
                    bar.update(int(spans[-1, 1] - spans[0, 0]) if spans.size else 0)
                    if spans.size:
                        yield spans
    if facts is not None:
        facts["ascii"] = ascii_only


def build_index(path: PathLike, *, chunk_size: int = _CHUNK) -> npt.NDArray[np.int64]:
    """Scan ``path`` once and return the ``(n, 2)`` spans of its samples (no cache involved).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a 1\\n\\n  \\nbb 2\\r\\nc 3")
        >>> build_index(p).tolist()
        [[0, 3], [8, 12], [14, 17]]
    """
    parts = list(_scan(path, chunk_size))
    return np.concatenate(parts) if parts else np.empty((0, 2), np.int64)


def _cache_paths(path: Path) -> list[Path]:
    """Where the index of ``path`` may live, in order of preference."""
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    name = f"{path.name}.{digest}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return [Path(override) / name]
    return [path.with_name(f".{path.name}.rdidx"), Path(user_cache_dir("rank-dataset")) / name]


@dataclass(frozen=True)
class _Index:
    spans: npt.NDArray[np.int64]
    ascii: bool
    map: mmap.mmap | None = None  # the cache file's map, when the spans live there


def _read_cache(cache: Path, size: int, mtime_ns: int) -> _Index | None:
    try:
        with open(cache, "rb") as f:
            magic, c_size, c_mtime, n, flags = _HEADER.unpack(f.read(_HEADER.size))
    except (OSError, struct.error):
        return None
    if magic != _MAGIC or c_size != size or c_mtime != mtime_ns:
        return None
    if cache.stat().st_size != _DATA_OFFSET + 16 * n:
        return None
    ascii_only = bool(flags & _FLAG_ASCII)
    if n == 0:
        return _Index(np.empty((0, 2), np.int64), ascii_only)
    with open(cache, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    spans = np.frombuffer(mm, dtype="<i8", count=2 * n, offset=_DATA_OFFSET).reshape(n, 2)
    return _Index(spans, ascii_only, mm)


def _write_cache(cache: Path, path: Path, size: int, mtime_ns: int) -> bool:
    """Index ``path`` straight into ``cache``.

    The index is written to a temporary file that is then renamed into place, so that concurrent
    builders all succeed and a reader never sees half a file.
    """
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.seek(_DATA_OFFSET)
            n = 0
            facts: dict[str, bool] = {}
            for spans in _scan(path, facts=facts):
                f.write(spans.astype("<i8", copy=False).data)
                n += len(spans)
            f.seek(0)
            f.write(_HEADER.pack(_MAGIC, size, mtime_ns, n, _FLAG_ASCII if facts["ascii"] else 0))
        os.replace(tmp, cache)
        return True
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False


def _load_index(path: Path) -> _Index:
    st = path.stat()
    candidates = _cache_paths(path)
    for cache in candidates:
        spans = _read_cache(cache, st.st_size, st.st_mtime_ns)
        if spans is not None:
            return spans
    for cache in candidates:
        if _write_cache(cache, path, st.st_size, st.st_mtime_ns):
            spans = _read_cache(cache, st.st_size, st.st_mtime_ns)
            if spans is not None:
                return spans
    # No writable cache location (or the file changed while being indexed): index in memory.
    facts: dict[str, bool] = {}
    parts = list(_scan(path, facts=facts))
    return _Index(np.concatenate(parts) if parts else np.empty((0, 2), np.int64), facts["ascii"])


def drop_pages(mm: mmap.mmap, start: int, stop: int) -> None:
    """Drop ``[start, stop)`` of a read-only file map from the resident set (the page cache keeps it)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:  # not on this platform: the pages stay mapped, which is only a cost
        return
    start -= start % mmap.PAGESIZE
    stop = min(stop, len(mm))
    if stop > start:
        mm.madvise(advice, start, stop - start)


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    index: _Index


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
            files.append(_File(path, path.stat().st_size, _load_index(path)))
        self._files = tuple(files)
        self._bounds = np.cumsum([0] + [len(f.index.spans) for f in files], dtype=np.int64)
        if self._bounds[-1] == 0:
            names = ", ".join(str(f.path) for f in files)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")
        self._maps: dict[int, mmap.mmap] = {}

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
        digest = hashlib.sha256()
        for i, f in enumerate(self._files):
            digest.update(struct.pack("<qq", len(f.index.spans), f.size))
            data = self.file_map(i) if f.size else b""
            digest.update(data[: 1 << 16])
            digest.update(data[max(0, f.size - (1 << 16)) :])
        return digest.hexdigest()[:32]

    @property
    def file_bounds(self) -> npt.NDArray[np.int64]:
        """Sample numbers at which each file starts, and the total at the end."""
        return self._bounds

    def file_spans(self, file: int) -> npt.NDArray[np.int64]:
        """The ``(n, 2)`` byte spans of the samples of file number ``file`` (a memory map)."""
        return self._files[file].index.spans

    def file_is_ascii(self, file: int) -> bool:
        """Whether file number ``file`` is pure ASCII (so its lines need no UTF-8 check)."""
        return self._files[file].index.ascii

    def file_map(self, file: int) -> mmap.mmap:
        """A read-only memory map of file number ``file``, opened once per process."""
        # A map survives fork, so forked DataLoader workers share this one.
        if file not in self._maps:
            with open(self._files[file].path, "rb") as f:
                self._maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[file]

    def release_pages(self, file: int) -> None:
        """Drop the pages of file number ``file`` and of its index from this process's resident set.

        They stay in the page cache, so reading them again costs a page fault, not a disk read.
        """
        for mm in (self._maps.get(file), self._files[file].index.map):
            if mm is not None:
                drop_pages(mm, 0, len(mm))

    def release_index_pages(self, file: int, start: int, stop: int) -> None:
        """Drop the index pages of samples ``[start, stop)`` of file ``file`` from the resident set."""
        mm = self._files[file].index.map
        if mm is not None:
            drop_pages(mm, _DATA_OFFSET + 16 * start, _DATA_OFFSET + 16 * stop)

    def locate(self, index: int) -> tuple[int, int]:
        """``(file number, sample number within that file)`` of global sample ``index``."""
        n = len(self)
        index = check_index(index, n, label="sample index", of=f"{n} samples")
        file = int(np.searchsorted(self._bounds, index, side="right")) - 1
        return file, index - int(self._bounds[file])

    def line_number(self, file: int, offset: int) -> int:
        """The 1-based line number of the byte at ``offset`` of file number ``file`` (for messages)."""
        data = self.file_map(file)
        return data[:offset].count(b"\n") + 1 if offset else 1

    def where(self, index: int) -> str:
        """``path:line`` of global sample ``index``, for error messages."""
        file, local = self.locate(index)
        return f"{self._files[file].path}:{self.line_number(file, int(self._files[file].index.spans[local, 0]))}"

    def raw(self, index: int) -> bytes:
        """The bytes of sample ``index`` without its line ending."""
        file, local = self.locate(index)
        start, end = self._files[file].index.spans[local]
        return self.file_map(file)[int(start) : int(end)]

    def __getitem__(self, index: int) -> str:
        raw = self.raw(index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.where(index)}: line is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
