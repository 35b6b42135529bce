"""Meta files kept compressed or columnar, read in place: gzip, zstd and Parquet. No torch.

A file's format is recognised by its first bytes (:func:`detect`), not by its name. A gzip or zstd
file is a stream of text like a plain meta file. Its index is made over the decompressed bytes, in one
decompression (:class:`Decompression`) that also records :class:`Checkpoints`: points at least
:data:`SPACING` bytes of output apart from which decompression can start, kept with the index. A
read of decompressed bytes ``[a, b)`` (:class:`DecompressedView`) starts at the last checkpoint at or
before ``a``, so it decompresses less than ``SPACING`` bytes it does not need (at most a frame's, for
zstd).

- gzip (:mod:`indexed_gzip`): any gzip, one member or many (BGZF, ``cat a.gz b.gz``). A checkpoint
  holds the 32 KiB window that decompression needs to start mid-stream, so there is one every
  ``SPACING`` bytes whatever the file.
- zstd (:mod:`zstandard`): a frame can only be entered at its start, so the checkpoints are frame
  starts. A file of one frame (what ``zstd`` writes by default) has a single checkpoint, at 0: every
  read decompresses from the start. ``pzstd`` and zstd's seekable format write many frames.
- Parquet (:mod:`pyarrow`, the ``parquet`` extra): rows, read by row group (:class:`ParquetRows`; see
  :mod:`rank_dataset.files._parquet`).

A corrupt or truncated file is a :class:`~rank_dataset.errors.CorruptMetaFileError` naming the file
and the compressed offset, never a wrong sample.
"""

from __future__ import annotations

import collections
import enum
import functools
import os
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rank_dataset.core.threads import THREADS
from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files import _gzip, _zstd
from rank_dataset.files._parquet import ParquetRows
from rank_dataset.files._points import row_at
from rank_dataset.files._pread import dense

__all__ = [
    "BLOCK",
    "MANY_FRAMES",
    "SPACING",
    "Checkpoints",
    "DecompressedView",
    "Decompression",
    "Format",
    "ParquetRows",
    "SpanSource",
    "decompress",
    "detect",
    "detect_path",
    "one_frame_advice",
]

#: Decompressed bytes between two checkpoints (at least; zstd's are frame starts).
SPACING = 4 << 20
#: Decompressed bytes handed out at a time by a :class:`Decompression`.
BLOCK = 4 << 20
_IntArray = npt.NDArray[np.int64]


class Format(enum.Enum):
    """What a meta file holds, as its first bytes tell."""

    TEXT = "text"
    GZIP = "gzip"
    ZSTD = "zstd"
    PARQUET = "parquet"

    @property
    def compressed(self) -> bool:
        """Whether the file is a compressed stream of text (read through checkpoints)."""
        return self in (Format.GZIP, Format.ZSTD)


_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PARQUET_MAGIC = b"PAR1"


def _is_skippable_zstd(head: bytes) -> bool:
    # A skippable frame (magic 0x184D2A50-0x184D2A5F) may open a zstd file, as in the seekable format.
    return len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50


def detect(fd: int) -> Format:
    """The format of the file open at ``fd``, from its first bytes (and, for Parquet, its last four)."""
    head = os.pread(fd, 4, 0)
    if head[:2] == _GZIP_MAGIC:
        return Format.GZIP
    if head == _ZSTD_MAGIC or _is_skippable_zstd(head):
        return Format.ZSTD
    if head == _PARQUET_MAGIC:
        size = os.fstat(fd).st_size
        if size >= 12 and os.pread(fd, 4, size - 4) == _PARQUET_MAGIC:
            return Format.PARQUET
    return Format.TEXT


def detect_path(path: str | os.PathLike[str]) -> Format:
    """The format of the file at ``path`` (see :func:`detect`)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return detect(fd)
    finally:
        os.close(fd)


_CKPT_MAGIC = b"RDCKPT\x00\x01"
_CKPT_HEADER = struct.Struct("<8s8sqqq")  # magic, format, decompressed size, points, state bytes


@dataclass(frozen=True, eq=False)
class Checkpoints:
    """Where decompression of a compressed file can start.

    ``size``: the file's decompressed bytes. ``points``: ``(k, 2)`` rows ``(output offset, input
    offset)``, increasing, the first ``(0, 0)``. ``state``: what the decoder needs besides (for gzip,
    :mod:`indexed_gzip`'s index, with each point's 32 KiB window; empty for zstd).
    """

    format: Format
    size: int
    points: _IntArray
    state: bytes = b""

    def to_bytes(self) -> bytes:
        """These checkpoints as bytes (what the index cache keeps; :meth:`from_bytes` reads them)."""
        head = _CKPT_HEADER.pack(
            _CKPT_MAGIC, self.format.value.encode().ljust(8, b"\0"), self.size, len(self.points), len(self.state)
        )
        return head + self.points.astype("<i8").tobytes() + self.state

    @classmethod
    def from_bytes(cls, raw: bytes) -> Checkpoints:
        """Checkpoints written by :meth:`to_bytes`.

        Raises:
            ValueError: ``raw`` is not that (damaged or another version's).
        """
        if len(raw) < _CKPT_HEADER.size:
            raise ValueError(f"checkpoints of {len(raw)} bytes are too short to hold their header")
        magic, name, size, count, nstate = _CKPT_HEADER.unpack_from(raw)
        points_at = _CKPT_HEADER.size
        if magic != _CKPT_MAGIC or count < 1 or nstate < 0 or len(raw) != points_at + 16 * count + nstate:
            raise ValueError("checkpoints damaged or written by another version")
        try:
            fmt = Format(name.rstrip(b"\0").decode())
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"checkpoints of an unknown format {name!r}") from None
        points = np.frombuffer(raw, "<i8", 2 * count, points_at).astype(np.int64).reshape(-1, 2)
        if not (points[0] == 0).all() or (np.diff(points, axis=0) < 0).any() or points[-1, 0] > size:
            raise ValueError("checkpoints damaged: not increasing from (0, 0) within the file")
        return cls(fmt, int(size), points, raw[points_at + 16 * count :])

    def at(self, offset: int) -> tuple[int, int]:
        """``(output offset, input offset)`` of the last checkpoint at or before output ``offset``."""
        row = row_at(self.points, offset)
        return int(self.points[row, 0]), int(self.points[row, 1])

    def compressed_span(self, a: int, b: int, file_size: int) -> tuple[int, int]:
        """The compressed bytes ``[lo, hi)`` that a read of output ``[a, b)`` decompresses: from the
        checkpoint at or before ``a`` to the one after ``b`` (or the file's end)."""
        lo = self.at(a)[1]
        row = int(np.searchsorted(self.points[:, 0], b, side="left"))
        hi = int(self.points[row, 1]) if row < len(self.points) else file_size
        return lo, max(lo, hi)


#: How to write a zstd meta file as many frames, with the tools zstd 1.5 installs (its ``-B``
#: sets the size of a thread's job, not of a frame: ``zstd -T0 -B4MiB`` still writes one frame).
MANY_FRAMES = (
    "pzstd -3 -p 2 meta.txt (frames of 8 MiB at level 3), or split -b 4M --filter='zstd -q -3 -c' meta.txt "
    "> meta.txt.zst; from a .zst: zstd -dc meta.txt.zst | pzstd -3 -c > meta.frames.zst"
)


def one_frame_advice(path: Path, checkpoints: Checkpoints) -> str | None:
    """What to do about a zstd file read from a single checkpoint (one frame, or frames less than
    one per :data:`SPACING` bytes): no decoder can enter a frame mid-way, so every read of it (each
    rank's build, ``MetaFile[i]``, a server pass) decompresses from its start. None for any other."""
    if checkpoints.format is not Format.ZSTD or len(checkpoints.points) > 1 or checkpoints.size <= SPACING:
        return None
    return (
        f"{path} is a single zstd frame ({checkpoints.size:,} bytes decompressed): no decoder can start inside "
        "a frame, so every read of it decompresses it from the start. Write it as many frames: " + MANY_FRAMES
    )


class Decompression:
    """One pass over the decompressed bytes of the compressed file open at ``fd`` (``path`` names it
    in errors), in blocks of about :data:`BLOCK` bytes, recording its checkpoints.

    Iterate it once; :attr:`checkpoints` is set when the iteration has ended.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt or truncated.
    """

    def __init__(self, path: Path, fd: int, fmt: Format, *, spacing: int | None = None, block: int = BLOCK) -> None:
        spacing = SPACING if spacing is None else spacing
        if not fmt.compressed:
            raise ValueError(f"a Decompression reads gzip or zstd files, not {fmt.value} ({path})")
        if spacing <= 0 or block <= 0:
            raise ValueError(f"spacing and block must be positive, not {spacing} and {block}")
        self.path, self.format = path, fmt
        self._fd, self._spacing, self._block = fd, spacing, block
        self._checkpoints: Checkpoints | None = None

    def __iter__(self) -> Iterator[bytes]:
        stream = _gzip.stream if self.format is Format.GZIP else _zstd.stream
        size, points, state = yield from stream(self.path, self._fd, self._spacing, self._block)
        self._checkpoints = Checkpoints(self.format, size, points, state)

    @property
    def checkpoints(self) -> Checkpoints:
        """The checkpoints recorded.

        Raises:
            ValueError: the decompression has not run to its end.
        """
        if self._checkpoints is None:
            raise ValueError(f"the decompression of {self.path} has not run to its end")
        return self._checkpoints


def decompress(path: Path, fd: int, fmt: Format, *, block: int = BLOCK) -> Iterator[bytes]:
    """The decompressed bytes of the compressed file open at ``fd`` (``path`` names it in errors),
    front to back in blocks of about ``block`` bytes: the checked pass of a :class:`Decompression`
    (for gzip, each member against its trailer) without recording checkpoints, for a reader of the
    whole file (grouping), which needs one decompression and no random access.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt or truncated.
    """
    if fmt is Format.GZIP:
        yield from _gzip.members(path, fd, block)
    elif fmt is Format.ZSTD:
        yield from _zstd.stream(path, fd, SPACING, block)
    else:
        raise ValueError(f"decompress reads gzip or zstd files, not {fmt.value} ({path})")


class DecompressedView:
    """Random reads of the decompressed bytes of the compressed file open at ``fd`` (the file the
    ``checkpoints`` were made from: the caller checks that), each from the nearest checkpoint.

    Not thread-safe; :meth:`close` (or ``with``) frees the decoder (``fd`` stays the caller's).
    """

    def __init__(self, path: Path, fd: int, checkpoints: Checkpoints) -> None:
        self.path, self.checkpoints = path, checkpoints
        self.decompressed = 0  # output bytes decompressed by reads so far, those skipped included
        if checkpoints.format is Format.GZIP:
            self._reader: _gzip.Reader | _zstd.Reader = _gzip.Reader(path, fd, checkpoints.points, checkpoints.state)
        elif checkpoints.format is Format.ZSTD:
            self._reader = _zstd.Reader(path, fd, checkpoints.points)
        else:
            raise ValueError(f"a DecompressedView reads gzip or zstd files, not {checkpoints.format.value} ({path})")

    def read(self, a: int, b: int, until: int | None = None) -> bytes:
        """Decompressed bytes ``[a, b)``; ``until``: the next read starts at ``b``, and none will
        ask for bytes past ``until`` (so a gzip read may go on and keep the bytes up to the next
        checkpoint, not decompressing again the span before ``b`` then).

        Raises:
            ValueError: ``[a, b)`` is not within the decompressed file.
            CorruptMetaFileError: the file is corrupt, or ends before ``b`` (it changed).
        """
        if not 0 <= a <= b <= self.checkpoints.size:
            raise ValueError(f"bytes [{a}, {b}) are not within the {self.checkpoints.size:,} decompressed bytes")
        if a == b:
            return b""
        data, done = self._reader.read(a, b, until)
        self.decompressed += done
        if len(data) != b - a:
            start = self.checkpoints.at(a)[1]
            raise CorruptMetaFileError(
                self.path, start, f"it ends {b - a - len(data):,} decompressed bytes short of byte {b:,} (truncated?)"
            )
        return data

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> DecompressedView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Decompressed bytes a :class:`SpanSource` decodes and keeps at a time (at most; less between checkpoints).
SPAN = 4 << 20
_KEPT_SPANS = 6
#: Spans a serial :class:`SpanSource` decodes ahead of the last one a load asked for.
_AHEAD = 1


class SpanSource:
    """The decompressed bytes of a compressed file as a gather reads them (``Window.load``'s
    protocol): spans between checkpoints (zstd's cut at most :data:`SPAN` long), each decompressed once
    from its checkpoint and kept while a few others are (a batch's rows share them); a thread that
    asks for a span another is decoding waits for it. Each thread reads through a decoder and a
    descriptor of its own (``open_fd`` makes one, checked by the caller), but for a file of fewer
    checkpoints than two a thread (one zstd frame): one decoder thread decodes its spans in order,
    :data:`_AHEAD` ahead of the loads (a decoder of its own would decompress from the file's start).

    Raises (from reads):
        CorruptMetaFileError: the file is corrupt, or ends early.
    """

    def __init__(self, path: Path, fd: int, checkpoints: Checkpoints, open_fd: Callable[[], int]) -> None:
        self.path, self.fd, self.checkpoints = path, fd, checkpoints
        size = checkpoints.size
        cuts = checkpoints.points[:, 0]
        if checkpoints.format is Format.ZSTD:
            # A frame may be the whole file: cut it, its decoder going on from span to span. Not gzip's
            # spans (SPACING and a deflate block long): a read from within one starts at its checkpoint.
            cuts = np.union1d(cuts, np.arange(0, size, SPAN, dtype=np.int64))
        self._bounds: _IntArray = np.append(cuts[cuts < size], size).astype(np.int64) if size else np.zeros(1, np.int64)
        self._open_fd = open_fd
        self._kept: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._pending: dict[int, Future[bytes]] = {}
        self._lock = threading.RLock()  # (a decoding's end may be told in the thread that holds it)
        self._local = threading.local()
        self._views: list[tuple[DecompressedView, int]] = []
        self._serial: ThreadPoolExecutor | None = None
        if len(checkpoints.points) < 2 * THREADS and len(self._bounds) > 2:
            self._serial = ThreadPoolExecutor(1, thread_name_prefix="rank-dataset-spans")
        self._next = 0  # the span the serial decoder reaches next without starting over
        self._pins: dict[int, int] = {}  # span -> the batches that still need it (see pin)
        self.decompressed = 0  # output bytes decoded, those skipped to reach a span included

    @property
    def serial(self) -> bool:
        """Whether one decoder thread makes the spans, in order (a file of few checkpoints)."""
        return self._serial is not None

    def _view(self) -> DecompressedView:
        view: DecompressedView | None = getattr(self._local, "view", None)
        if view is None:
            fd = self._open_fd()
            try:
                view = DecompressedView(self.path, fd, self.checkpoints)
            except BaseException:  # (damaged checkpoints) the descriptor is not left open
                os.close(fd)
                raise
            self._local.view = view
            with self._lock:
                self._views.append((view, fd))
        return view

    def _decode(self, k: int) -> bytes:
        if self._serial is not None:  # (the decoder thread) in order: the spans passed on the way are kept
            with self._lock:
                if k in self._kept:
                    return self._kept[k]
            for j in range(self._next, k):
                data = self._read(j)
                with self._lock:
                    self._keep(j, data)
            self._next = max(self._next, k + 1)
        return self._read(k)

    def _keep(self, k: int, data: bytes) -> None:
        """Keep span ``k``; let go of the least recently used beyond :data:`_KEPT_SPANS`, but of no pinned one."""
        self._kept[k] = data
        self._kept.move_to_end(k)
        pinned = sum(1 for j in self._kept if self._pins.get(j))
        for old in [j for j in self._kept if not self._pins.get(j)][: max(0, len(self._kept) - pinned - _KEPT_SPANS)]:
            del self._kept[old]

    def pin(self, first: int, last: int) -> tuple[int, int]:
        """Keep the spans that lines starting from byte ``first`` to byte ``last`` need (from the one
        that holds the byte before ``first`` to the one after ``last``'s), once decoded, until
        :meth:`unpin`: a gather's thread pins its batch's spans as it takes the batch, so that a
        thread that lags finds them still kept (not decoded again from the frame's start). Returns
        the spans ``[k0, k1)``."""
        spans = len(self._bounds) - 1
        k0 = max(int(np.searchsorted(self._bounds, first - 1, side="right")) - 1, 0)
        k1 = min(max(int(np.searchsorted(self._bounds, last, side="right")) + 1, k0 + 1), spans)
        with self._lock:
            for k in range(k0, k1):
                self._pins[k] = self._pins.get(k, 0) + 1
        return k0, k1

    def unpin(self, k0: int, k1: int) -> None:
        """Undo :meth:`pin` of the spans ``[k0, k1)``."""
        with self._lock:
            for k in range(k0, k1):
                self._pins[k] -= 1
                if not self._pins[k]:
                    del self._pins[k]

    def _read(self, k: int) -> bytes:
        view = self._view()
        before = view.decompressed
        data = view.read(int(self._bounds[k]), int(self._bounds[k + 1]))
        with self._lock:
            self.decompressed += view.decompressed - before
        return data

    def _done(self, k: int, future: Future[bytes]) -> None:
        with self._lock:
            if self._pending.get(k) is future:
                del self._pending[k]
                if not future.cancelled() and future.exception() is None:
                    self._keep(k, future.result())

    def _start(self, k: int) -> tuple[Future[bytes] | None, bool]:
        """(Holding the lock.) ``(future, new)``: the decoding of span ``k``, None if it is kept; a new
        one is the decoder thread's (serial), or else the caller's to run."""
        if k in self._kept:
            self._kept.move_to_end(k)
            return None, False
        future = self._pending.get(k)
        if future is not None:
            return future, False
        future = self._serial.submit(self._decode, k) if self._serial is not None else Future()
        self._pending[k] = future
        future.add_done_callback(functools.partial(self._done, k))
        return future, True

    def span(self, k: int, ahead: bool = False) -> bytes:
        """Decompressed span ``k``: bytes ``[bounds[k], bounds[k + 1])``; ``ahead``: a serial source
        decodes the next spans meanwhile (the reads go on in order)."""
        with self._lock:
            future, new = self._start(k)
            data = self._kept[k] if future is None else None
            if ahead and self._serial is not None:
                for j in range(k + 1, min(k + 1 + _AHEAD, len(self._bounds) - 1)):
                    self._start(j)
        if data is not None:
            return data
        assert future is not None
        if new and self._serial is None and future.set_running_or_notify_cancel():
            try:  # decoded here, with this thread's decoder; others that want it wait
                future.set_result(self._decode(k))
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def _spans_of(self, a: int, b: int) -> tuple[int, int]:
        """The spans ``[k0, k1)`` that hold bytes ``[a, b)``."""
        k0 = int(np.searchsorted(self._bounds, a, side="right")) - 1
        k1 = int(np.searchsorted(self._bounds, b, side="left"))
        return max(k0, 0), max(k1, k0 + 1)

    def read(self, a: int, b: int) -> bytes:
        """Decompressed bytes ``[a, b)`` (cut at the end)."""
        b = min(b, self.checkpoints.size)
        if b <= a:
            return b""
        k0, k1 = self._spans_of(a, b)
        lo = int(self._bounds[k0])
        return b"".join(self.span(k) for k in range(k0, k1))[a - lo : b - lo]

    def load(
        self,
        starts: _IntArray,
        stops: _IntArray,
        end: int,
        pad: int = 0,
        buffer: Callable[[int], npt.NDArray[np.uint8]] | None = None,
    ) -> tuple[npt.NDArray[np.uint8], int | _IntArray]:
        """As :meth:`rank_dataset.files._pread.Window.load`: ranges ``[starts[i], stops[i])`` (cut at
        ``end``), back to back in the buffer with the bytes between them where they share a span, one
        copy of what the spans decoded: byte ``x`` of range ``i`` is ``buf[x - shift[i]]``. The
        buffer is ``buffer(size)`` (a :class:`~rank_dataset.files._pread.Window`'s, reused), or new, or
        a read-only view of a decoded span where dense ranges lie in one (:meth:`_load_dense`)."""
        bounds, spans = self._bounds, len(self._bounds) - 1
        hi_all = np.minimum(stops, min(end, int(bounds[-1])))
        lo_all = np.minimum(starts, hi_all)
        if not spans or not starts.size:
            return np.zeros(pad, np.uint8), 0
        lo, hi = int(lo_all.min()), int(hi_all.max())
        if dense(starts.size, lo, hi):
            return self._load_dense(lo, hi, pad, buffer)
        k0 = np.clip(np.searchsorted(bounds, lo_all, side="right") - 1, 0, spans - 1)
        k1 = np.maximum(np.searchsorted(bounds, hi_all, side="left"), k0 + 1)
        # Each wanted span's part: from the lowest byte a range needs in it (its start, where a range
        # runs into it from the span before) to the highest. A range across spans then runs from the
        # end of one part to the start of the next: back to back.
        through = np.zeros(spans + 1, np.int64)  # ranges that run into span k from the one before
        np.add.at(through, k0 + 1, 1)
        np.add.at(through, k1, -1)
        first = np.full(spans, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, k0, lo_all)
        first = np.where(np.cumsum(through)[:spans] > 0, bounds[:-1], first)
        onto = np.zeros(spans + 1, np.int64)  # ranges that run on from span k into the one after
        np.add.at(onto, k0, 1)
        np.add.at(onto, k1 - 1, -1)
        last = np.full(spans, -1, np.int64)
        np.maximum.at(last, k1 - 1, hi_all)
        last = np.where(np.cumsum(onto)[:spans] > 0, bounds[1:], last)
        wanted = np.flatnonzero(last >= first)
        sizes = last[wanted] - first[wanted]
        place = np.zeros(spans, np.int64)  # where a wanted span's part starts in the buffer
        place[wanted] = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        size = int(sizes.sum()) + pad
        buf = np.empty(size, np.uint8) if buffer is None else buffer(size)
        buf[buf.size - pad :] = 0
        for k, at, part in zip(wanted.tolist(), place[wanted].tolist(), sizes.tolist()):
            data = self.span(k, ahead=True)
            buf[at : at + part] = np.frombuffer(data, np.uint8, part, int(first[k] - bounds[k]))
        # A range's spans are consecutive and all wanted, their parts back to back: one shift serves it.
        shift = first[k0] - place[k0]
        return buf, shift

    def _load_dense(
        self, lo: int, hi: int, pad: int, buffer: Callable[[int], npt.NDArray[np.uint8]] | None
    ) -> tuple[npt.NDArray[np.uint8], int]:
        """:meth:`load` of ranges that fill ``[lo, hi)`` densely (two a page on average, as a shard's
        build at a few ranks asks for), as ``Window.load`` reads them from a file: the bytes from the
        first to the last, with one shift and no work per range. Within one span (and its ``pad``),
        a view of the span, not a copy."""
        bounds = self._bounds
        k0 = int(np.searchsorted(bounds, lo, side="right")) - 1
        if hi <= lo:
            return np.zeros(pad, np.uint8), lo
        if hi + pad <= bounds[k0 + 1]:
            at = int(bounds[k0])
            return np.frombuffer(self.span(k0, ahead=True), np.uint8, hi + pad - lo, lo - at), lo
        k1 = int(np.searchsorted(bounds, hi, side="left"))
        buf = np.empty(hi - lo + pad, np.uint8) if buffer is None else buffer(hi - lo + pad)
        buf[hi - lo :] = 0
        for k in range(k0, k1):
            a, b = max(int(bounds[k]), lo), min(int(bounds[k + 1]), hi)
            buf[a - lo : b - lo] = np.frombuffer(self.span(k, ahead=True), np.uint8, b - a, a - int(bounds[k]))
        return buf, lo

    def close(self) -> None:
        if self._serial is not None:
            self._serial.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            views, self._views = self._views, []
            self._kept.clear()
            self._pending.clear()
        for view, fd in views:
            view.close()
            os.close(fd)
