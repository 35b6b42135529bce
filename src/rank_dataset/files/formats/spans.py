"""The threaded span cache over a compressed file's decompressed bytes (:class:`SpanSource`): what a
gather reads lines from.

The decompressed bytes are cut into spans (between checkpoints; a format may cut them finer, see
:meth:`~rank_dataset.files.formats.base.Format.span_cuts`), each decompressed once from its checkpoint
and kept while a few others are; threads share them.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt8Array, prefix_sums
from rank_dataset.core.threads import THREADS
from rank_dataset.files.formats._raw import RawFile
from rank_dataset.files.formats.checkpoints import Checkpoints, DecompressedView
from rank_dataset.files.io.pread import dense

__all__ = ["SPAN", "SpanSource"]


#: Decompressed bytes a :class:`SpanSource` decodes and keeps at a time (at most; less between checkpoints).
SPAN = 4 << 20
_KEPT_SPANS = 6
#: Spans a serial :class:`SpanSource` decodes ahead of the last one a load asked for.
_AHEAD = 1
#: Spans :meth:`SpanSource.read_ahead` decodes at most before a load asks for them (64 MiB).
READ_AHEAD = 16


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

    def __init__(self, path: Path, fd: RawFile, checkpoints: Checkpoints, open_fd: Callable[[], RawFile]) -> None:
        self.path, self.fd, self.checkpoints = path, fd, checkpoints
        size = checkpoints.size
        cuts = checkpoints.format.span_cuts(checkpoints, SPAN)
        self._bounds: Int64Array = (
            np.append(cuts[cuts < size], size).astype(np.int64) if size else np.zeros(1, np.int64)
        )
        self._open_fd = open_fd
        self._kept: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._pending: dict[int, Future[bytes]] = {}
        self._lock = threading.RLock()  # (a decoding's end may be told in the thread that holds it)
        self._local = threading.local()
        self._views: list[tuple[DecompressedView, RawFile]] = []
        self._serial: ThreadPoolExecutor | None = None
        if len(checkpoints.points) < 2 * THREADS and len(self._bounds) > 2:
            self._serial = ThreadPoolExecutor(1, thread_name_prefix="rank-dataset-spans")
        self._next = 0  # the span the serial decoder reaches next without starting over
        self._pins: dict[int, int] = {}  # span -> the batches that still need it (see pin)
        self._ahead: set[int] = set()  # spans read ahead, kept until a batch pins them (see read_ahead)
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
                if isinstance(fd, int):
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
        held = [j for j in self._kept if self._pins.get(j) or j in self._ahead]
        free = [j for j in self._kept if not (self._pins.get(j) or j in self._ahead)]
        for old in free[: max(0, len(self._kept) - len(held) - _KEPT_SPANS)]:
            del self._kept[old]

    def read_ahead(self, count: int | None = None) -> int:
        """Start decoding the first ``count`` spans (at most; None: :data:`READ_AHEAD`) in the decoder
        thread of a serial source of one checkpoint (one zstd frame: a read of any span decodes those
        before it), and keep each until a batch pins it or one after it (:meth:`pin`): a build calls
        this before its first pass, which then runs beside the decoding (its second pass cannot start
        before the first ends). The spans started (0 for any other source)."""
        if self._serial is None or len(self.checkpoints.points) > 1:
            return 0
        count = min(READ_AHEAD if count is None else count, len(self._bounds) - 1)
        with self._lock:
            self._ahead.update(range(count))
            for k in range(count):
                self._start(k)
        return count

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
            if self._ahead:  # read ahead: now held by this pin, or passed by the batches (in order)
                self._ahead = {k for k in self._ahead if k >= k1}
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
        starts: Int64Array,
        stops: Int64Array,
        end: int,
        pad: int = 0,
        buffer: Callable[[int], UInt8Array] | None = None,
    ) -> tuple[UInt8Array, int | Int64Array]:
        """As :meth:`rank_dataset.files.io.pread.Window.load`: ranges ``[starts[i], stops[i])`` (cut at
        ``end``), back to back in the buffer with the bytes between them where they share a span, one
        copy of what the spans decoded: byte ``x`` of range ``i`` is ``buf[x - shift[i]]``. The
        buffer is ``buffer(size)`` (a :class:`~rank_dataset.files.io.pread.Window`'s, reused), or new, or
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
        place[wanted] = prefix_sums(sizes)[:-1]
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
        self, lo: int, hi: int, pad: int, buffer: Callable[[int], UInt8Array] | None
    ) -> tuple[UInt8Array, int]:
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
            self._ahead.clear()
        for view, fd in views:
            view.close()
            if isinstance(fd, int):
                os.close(fd)
