"""The line scanner: a file's bytes -> the byte spans of its samples, in one vectorised pass.

A sample is a line of the file that holds something other than ASCII whitespace (space, tab, CR,
VT, FF); its text is the line without its ending (``\\n`` or ``\\r\\n``). Its span is ``[start, end)``.
A UTF-8 byte order mark at the start of the file is not part of the first line (editors on Windows
write one; it is not text).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, TypeVar, cast

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, UInt8Array
from rank_dataset.core.native import BLANK, BOM, CR, MARK, NEWLINE
from rank_dataset.core.progress import progress_bar
from rank_dataset.core.threads import THREADS
from rank_dataset.files.io.pread import pread_exact

__all__ = [
    "BLANK",
    "BOM",
    "CHUNK",
    "CR",
    "MARK",
    "NEWLINE",
    "Chunk",
    "PathLike",
    "build_index",
    "scan",
    "scan_blocks",
    "scan_buffer",
    "scan_map",
]

PathLike = str | os.PathLike[str]
#: Bytes per chunk of a scan.
CHUNK = 4 << 20
_T = TypeVar("_T")
_D = TypeVar("_D", bound=np.generic)
_IN_FLIGHT = 6
_PROBE = 4096


@dataclass(frozen=True)
class Chunk:
    """What a scan finds in one chunk of a file (bytes ``[offset, offset + nbytes)``, whole lines).

    ``starts`` and ``lengths``: the samples' spans (absolute offsets). ``newlines``: the newline bytes
    in the chunk. ``marks``: ``(k, 2)`` rows ``(offset, line)``: for each multiple of :data:`MARK` in
    the chunk, where the first line at or after it starts and its number, counted from 0 at the
    chunk's first line (what bounds the reading that finds a sample's line number).
    """

    offset: int
    nbytes: int
    starts: Int64Array
    lengths: Int64Array
    ascii: bool
    newlines: int
    marks: Int64Array


class _Scratch:
    """Arrays that one scanning thread reuses from chunk to chunk (those of at most ``most`` bytes).

    A large array made and freed in a thread can cost a page fault every 4 KiB each time (the
    allocator may hand a thread's freed memory back to the system).
    """

    def __init__(self, most: int = 0) -> None:
        self._most = most
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, size: int, dtype: type[_D]) -> npt.NDArray[_D]:
        """``size`` items of ``dtype``, whatever they hold; valid until the next call for ``name``."""
        kept = self._arrays.get(name)
        if kept is not None and kept.size >= size:
            return kept[:size]
        made = np.empty(size + (size >> 3), dtype)  # room for the next chunk, a little larger
        if made.nbytes <= self._most:
            self._arrays[name] = made
        return made[:size]


def scan_buffer(buf: UInt8Array, offset: int, last: bool) -> Chunk:
    """The samples of the complete lines in ``buf``, which holds bytes ``offset`` onwards of a file and
    starts a line (with ``last``, bytes after its final newline form a line too; at offset 0 a byte
    order mark is skipped): what a scan finds in one chunk, for readers that read a file their own way.
    One kernel call (:func:`rank_dataset.core.native.scan_lines`: C, or its numpy reference).

    Examples:
        >>> c = scan_buffer(np.frombuffer(b"a 1\\n\\nbb 2\\n", np.uint8), 100, False)
        >>> c.starts.tolist(), c.lengths.tolist(), c.newlines
        ([100, 105], [3, 4], 3)
    """
    found = native.scan_lines(buf, offset, last, MARK)
    return Chunk(offset, buf.size, found.starts, found.lengths, found.ascii, found.newlines, found.marks)


def chunk_bounds(f: BinaryIO, size: int, chunk_size: int) -> list[int]:
    """Offsets ``0 = b0 < b1 < ... < bk = size`` near multiples of ``chunk_size``, each just past a
    newline (but where the file turns out shorter than ``size``: reading the missing bytes fails)."""
    bounds, fd = [0], f.fileno()
    for target in range(chunk_size, size, chunk_size):
        pos, step = max(target, bounds[-1]), _PROBE
        while pos < size:
            # Lines are short as a rule: look at a page first, then at more and more.
            piece = os.pread(fd, step, pos)
            if not piece:  # the file shrank
                return [*bounds, size]
            hit = piece.find(b"\n")
            if hit >= 0:
                pos += hit + 1
                break
            pos += len(piece)
            step = min(2 * step, 1 << 20)
        if bounds[-1] < pos < size:
            bounds.append(pos)
    bounds.append(size)
    return bounds


class _PerThread:
    """A :class:`_Scratch` (of arrays of at most ``most`` bytes) for each scanning thread, made at its
    first chunk and reused for the next."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._local = threading.local()

    def get(self) -> _Scratch:
        scratch: _Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _Scratch(self._most)
        return scratch


class _Reader:
    """Reads and scans chunks of one file in the scanning threads, each thread into a buffer and
    temporaries of its own, reused from one chunk to the next."""

    def __init__(self, fd: int, chunk_size: int) -> None:
        self._fd = fd
        # A chunk is chunk_size bytes and a line, as a rule (its buffer is kept; the scan's arrays are the result).
        self._scratches = _PerThread(2 * chunk_size)

    def scan(self, lo: int, hi: int, last: bool) -> Chunk:
        scratch = self._scratches.get()
        buf = scratch.array("buf", hi - lo, np.uint8)
        pread_exact(self._fd, buf, lo)
        return scan_buffer(buf, lo, last)


def scan_map(
    path: PathLike, then: Callable[[Chunk], _T], chunk_size: int = CHUNK, *, fd: int | None = None
) -> Iterator[_T]:
    """Yield ``then(chunk)`` for each :class:`Chunk` of ``path``, in file order.

    Chunks end just past a newline, so each is scanned on its own; two threads (one in a process
    held to one core) scan them and apply ``then`` (numpy releases the GIL in the array passes), and
    results are yielded in order as they come. ``then`` runs in a scanning thread and must not keep
    the chunk's buffer (a :class:`Chunk` holds none). With ``fd``, that open descriptor of ``path``
    is read (the file the caller checked), not the path.

    Raises:
        rank_dataset.files.io.pread.ShortRead: the file shrank while being indexed.
    """
    source: PathLike | int = path if fd is None else fd
    with open(source, "rb", closefd=fd is None) as f, ThreadPoolExecutor(max_workers=THREADS) as pool:
        size = os.fstat(f.fileno()).st_size
        bounds = chunk_bounds(f, size, chunk_size)
        jobs = [(lo, hi, i == len(bounds) - 2) for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]
        pending: deque[Future[tuple[_T, int]]] = deque()

        reader = _Reader(f.fileno(), chunk_size)

        def work(lo: int, hi: int, last: bool) -> tuple[_T, int]:
            return then(reader.scan(lo, hi, last)), hi - lo

        with progress_bar(size, f"indexing {os.fspath(path)}") as bar:
            for n, job in enumerate(jobs):
                pending.append(pool.submit(work, *job))
                # Keep a few chunks in flight: enough to use both cores, few enough to bound memory.
                while pending and (len(pending) > _IN_FLIGHT or n == len(jobs) - 1):
                    result, nbytes = pending.popleft().result()
                    bar.update(nbytes)
                    yield result


def _cut_at_lines(blocks: Iterable[bytes]) -> Iterator[tuple[UInt8Array, int, bool]]:
    """``(bytes, offset, last)`` pieces of the bytes ``blocks`` hold back to back, each ending just
    past a newline (the last: at the end). A line across two blocks is a piece of its own: the
    blocks themselves are not copied."""
    offset, carry = 0, b""
    for block in blocks:
        start = 0
        if carry:
            head = block.find(b"\n") + 1
            if not head:
                carry += block
                continue
            carry += block[:head]
            yield np.frombuffer(carry, np.uint8), offset, False
            offset, carry, start = offset + len(carry), b"", head
        cut = block.rfind(b"\n", start) + 1
        if cut > start:
            yield np.frombuffer(block, np.uint8, cut - start, start), offset, False
            offset += cut - start
        else:
            cut = start
        carry = block[cut:]
    yield np.frombuffer(carry, np.uint8), offset, True


class _Ahead:
    """The items of ``source`` made in a thread of its own, a few ahead of their reader (zstd's and
    zlib's decoders release the GIL, so the bytes are made while the last ones are scanned). The
    first error it raised, raised to the reader in its place."""

    _DONE = object()

    def __init__(self, source: Iterable[bytes], depth: int = 2) -> None:
        self._source = source
        self._queue: queue.Queue[object] = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-dataset-decompress", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        items: Iterator[bytes] | None = None
        try:
            items = iter(self._source)
            for item in items:
                if not self._put(item):
                    break
            else:
                self._put(self._DONE)
        except BaseException as exc:  # handed to the reader, who raises it
            self._put(exc)
        finally:
            close = getattr(items, "close", None) if items is not None else None
            if close is not None:
                close()  # in this thread, the one that ran it (a decoder's own threads stop)

    def __iter__(self) -> Iterator[bytes]:
        try:
            while (item := self._queue.get()) is not self._DONE:
                if isinstance(item, BaseException):
                    raise item
                yield cast(bytes, item)
        finally:
            self._stop.set()
            self._thread.join()


def scan_blocks(blocks: Iterable[bytes], then: Callable[[Chunk], _T]) -> Iterator[_T]:
    """Yield ``then(chunk)`` for each :class:`Chunk` of the bytes ``blocks`` hold back to back (the
    decompressed bytes of a compressed file), as :func:`scan_map` does for a file of those bytes:
    the same samples, offsets and marks. ``blocks`` is iterated in a thread of its own while
    :data:`THREADS` threads scan what it made before (decompressing and scanning cost about the same
    for meta lines)."""

    def work(buf: UInt8Array, offset: int, last: bool) -> _T:
        return then(scan_buffer(buf, offset, last))

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        pending: deque[Future[_T]] = deque()
        try:
            for piece in _cut_at_lines(_Ahead(blocks)):
                pending.append(pool.submit(work, *piece))
                while len(pending) > THREADS:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _spans(chunk: Chunk) -> tuple[Int64Array, bool]:
    return np.column_stack((chunk.starts, chunk.starts + chunk.lengths)), chunk.ascii


def scan(path: PathLike, chunk_size: int = CHUNK) -> tuple[Int64Array, bool]:
    """The ``(n, 2)`` spans of the samples of ``path``, and whether the file is pure ASCII (which spares
    UTF-8 checks later); see :func:`scan_map`."""
    parts, ascii_only = [], True
    for spans, ascii_chunk in scan_map(path, _spans, chunk_size):
        parts.append(spans)
        ascii_only = ascii_only and ascii_chunk
    return (np.concatenate(parts) if parts else np.empty((0, 2), np.int64)), ascii_only


def build_index(path: PathLike, *, chunk_size: int = CHUNK) -> Int64Array:
    """Scan ``path`` once and return the ``(n, 2)`` spans of its samples (no cache involved).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a 1\\n\\n  \\nbb 2\\r\\nc 3")
        >>> build_index(p).tolist()
        [[0, 3], [8, 12], [14, 17]]

    Raises:
        ValueError: ``path`` is a gzip, zstd or Parquet file, whose bytes on disk are not its lines
            (:class:`~rank_dataset.files.read.metafile.MetaFile` reads those).
    """
    from rank_dataset.files.formats.registry import detect_path  # formats import this module
    from rank_dataset.files.formats.text import TEXT

    fmt = detect_path(path)
    if fmt is not TEXT:
        raise ValueError(
            f"build_index({os.fspath(path)!r}): the file is {fmt.value}, and build_index scans a plain text "
            "file's bytes as they are on disk; use MetaFile(path), whose index reads it (len(mf), mf[i], mf.read)"
        )
    return scan(path, chunk_size)[0]
