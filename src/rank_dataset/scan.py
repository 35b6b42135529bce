"""The line scanner: a file's bytes -> the byte spans of its samples, in one vectorised pass. No torch.

A sample is a line of the file that holds something other than ASCII whitespace (space, tab, CR,
VT, FF); its text is the line without its ending (``\\n`` or ``\\r\\n``). Its span is ``[start, end)``.
A UTF-8 byte order mark at the start of the file is not part of the first line (editors on Windows
write one; it is not text).
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from rank_dataset._pread import pread_exact
from rank_dataset._progress import progress_bar

__all__ = ["BLANK", "BOM", "CHUNK", "CR", "NEWLINE", "PathLike", "build_index", "scan", "scan_chunks"]

PathLike = str | os.PathLike[str]
#: Bytes per chunk of a scan.
CHUNK = 32 << 20
_THREADS = 2
_HIGH_BITS = np.uint64(0x8080808080808080)
NEWLINE, CR = 10, 13
#: The UTF-8 byte order mark, skipped at the start of a file.
BOM = b"\xef\xbb\xbf"
#: Byte -> whether it is ASCII whitespace (space, tab, newline, CR, VT, FF).
BLANK = np.zeros(256, dtype=bool)
BLANK[[9, 10, 11, 12, 13, 32]] = True


def _spans_of_chunk(buf: npt.NDArray[np.uint8], last: bool, first: bool = False) -> tuple[npt.NDArray[np.int64], int]:
    """The sample spans of the complete lines in ``buf`` and the length of the complete part.

    With ``last``, bytes after the final newline form a line too. With ``first`` (``buf`` starts the
    file), a leading byte order mark is skipped.
    """
    if not buf.size:
        return np.empty((0, 2), np.int64), 0
    ends = np.flatnonzero(buf == NEWLINE)
    if last and (not ends.size or ends[-1] + 1 < buf.size):
        ends = np.append(ends, buf.size)
    if not ends.size:
        return np.empty((0, 2), np.int64), 0
    consumed = min(int(ends[-1]) + 1, buf.size)
    starts = np.empty_like(ends)
    starts[0] = len(BOM) if first and buf[: len(BOM)].tobytes() == BOM else 0
    np.add(ends[:-1], 1, out=starts[1:])
    # "\r\n" loses its "\r". For an empty first line this reads buf[-1]: harmless, as a span of
    # length <= 0 is blank either way.
    ends -= buf[ends - 1] == CR
    # An empty line is blank; so is the rest of a line that is only a byte order mark.
    maybe_blank = BLANK[buf[np.minimum(starts, buf.size - 1)]] | (ends <= starts)
    if maybe_blank.any():
        # Only lines that start with whitespace (or are empty) can be blank: check those in full.
        rows = np.flatnonzero(maybe_blank)
        keep = np.ones(ends.size, dtype=bool)
        keep[rows] = False
        sized = rows[ends[rows] > starts[rows]]
        if sized.size:
            content = ~BLANK[buf]
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
    pread_exact(fd, buf, start)
    spans, _ = _spans_of_chunk(buf, last=last, first=start == 0)
    spans += start
    return spans, _is_ascii(buf)


def scan_chunks(
    path: PathLike, chunk_size: int = CHUNK, *, fd: int | None = None
) -> Iterator[tuple[npt.NDArray[np.int64], bool]]:
    """Yield ``(spans, ascii)`` for each chunk of ``path`` in file order: the ``(k, 2)`` spans of its
    samples and whether the chunk is pure ASCII (which spares UTF-8 checks later).

    Chunks end just past a newline, so each is indexed on its own; two threads index them (numpy
    releases the GIL in the array passes), and results are yielded in order as they come. With
    ``fd``, that open descriptor of ``path`` is read (the file the caller checked), not the path.

    Raises:
        rank_dataset._pread.ShortRead: the file shrank while being indexed.
    """
    source: PathLike | int = path if fd is None else fd
    with open(source, "rb", closefd=fd is None) as f, ThreadPoolExecutor(max_workers=_THREADS) as pool:
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
                    bar.update(int(spans[-1, 1] - spans[0, 0]) if spans.size else 0)
                    yield spans, ascii_chunk


def scan(path: PathLike, chunk_size: int = CHUNK) -> tuple[npt.NDArray[np.int64], bool]:
    """The ``(n, 2)`` spans of the samples of ``path``, and whether the file is pure ASCII."""
    parts, ascii_only = [], True
    for spans, ascii_chunk in scan_chunks(path, chunk_size):
        parts.append(spans)
        ascii_only = ascii_only and ascii_chunk
    return (np.concatenate(parts) if parts else np.empty((0, 2), np.int64)), ascii_only


def build_index(path: PathLike, *, chunk_size: int = CHUNK) -> npt.NDArray[np.int64]:
    """Scan ``path`` once and return the ``(n, 2)`` spans of its samples (no cache involved).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a 1\\n\\n  \\nbb 2\\r\\nc 3")
        >>> build_index(p).tolist()
        [[0, 3], [8, 12], [14, 17]]
    """
    return scan(path, chunk_size)[0]
