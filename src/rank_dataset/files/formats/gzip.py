"""gzip meta files: any gzip, one member or many (BGZF, ``cat a.gz b.gz``), read through
:mod:`indexed_gzip` (imported on first use) and checked by zlib.

:mod:`indexed_gzip` (zlib's ``zran``) records a seek point past every ``spacing`` bytes of output (and one
at each member's start), each with the 32 KiB window decompression needs to start there, and exports
them: the checkpoints' state. It misses a file that ends inside a member, and on a corrupt member before
the last it can give wrong bytes without an error. So the cold pass (:func:`stream`) takes its bytes
from zlib, member by member, each checked against its trailer (CRC32 and size), and runs indexed_gzip
beside it only for its checkpoints, never further than zlib has gone. A later read from a checkpoint is
of a file found whole then and unchanged since (its key).
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rank_dataset.core.arrays import Int64Array
from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats._raw import RawFile, file_object, pread, size_of
from rank_dataset.files.formats.base import Decoder, Format, Points, Recognised, Stream, row_at

if TYPE_CHECKING:
    import indexed_gzip


__all__ = ["GZIP", "GzipFormat", "Reader", "members", "stream"]

_MAGIC = b"\x1f\x8b"


_PIECE = 1 << 20  # compressed bytes handed to zlib at a time
# Compressed bytes indexed_gzip reads at a time from a checkpoint (its default, 1 MiB, is what a read
# of a few lines past a slice's end would cost the collective reader: 2x a gzip file at W = 4).
_READBUF = 64 << 10
# Compressed bytes a read in order reads on past its end, at least (see :meth:`Reader.read`).
_AHEAD = 16 * _READBUF
# indexed_gzip's exported index: "GZIDX", version, flags, compressed size, uncompressed size,
# spacing, window size, points; then per point: compressed offset, uncompressed offset, bits, has data.
_IDX_HEAD = struct.Struct("<5sBBQQIII")
_IDX_POINT = struct.Struct("<QQBB")


def _open(fd: RawFile, **kwargs: object) -> tuple[io.RawIOBase, indexed_gzip.IndexedGzipFile]:
    import indexed_gzip  # on first use: most processes read no gzip file

    raw = file_object(fd)
    try:
        return raw, indexed_gzip.IndexedGzipFile(fileobj=raw, drop_handles=False, **kwargs)
    except BaseException:
        raw.close()
        raise


def _points(state: bytes) -> Int64Array:
    """The seek points ``(output, input)`` of an exported index."""
    magic, version, _, _, _, _, _, count = _IDX_HEAD.unpack_from(state)
    if magic != b"GZIDX" or version < 1:
        raise ValueError(f"not an indexed_gzip index of version 1 ({magic!r}, {version})")
    rows = [_IDX_POINT.unpack_from(state, _IDX_HEAD.size + i * _IDX_POINT.size)[:2] for i in range(count)]
    points = np.array([(0, 0)] + [(out, cin) for cin, out in rows if out > 0], np.int64).reshape(-1, 2)
    # One point per output offset (an empty member, as BGZF's last, starts where the one before ended).
    keep = np.ones(len(points), bool)
    keep[1:] = np.diff(points[:, 0]) > 0
    kept: Int64Array = points[keep]
    return kept


def members(path: Path, fd: RawFile, block: int) -> Iterator[bytes]:
    """The decompressed bytes of the gzip file open at ``fd``, member by member through zlib, which
    checks each member's CRC32 and size (its trailer) as it ends: at most ``block`` bytes at a time.

    Raises:
        CorruptMetaFileError: corrupt data, a member's CRC or size wrong, bytes after the last member
            that are not a member, or a file that ends inside a member; named by the compressed offset
            of the member they are in.
    """
    size = size_of(fd)
    pos = 0  # compressed bytes read so far
    tail = b""  # read, not yet given to a decoder
    while pos < size or tail:
        member = pos - len(tail)  # where this member starts
        d = zlib.decompressobj(wbits=31)
        data = tail
        tail = b""
        while not d.eof:
            if not data:
                if pos >= size:
                    what = f"the file ends at byte {size:,}, inside the gzip member starting at byte {member:,}"
                    raise CorruptMetaFileError(path, member, what + " (truncated?)")
                data = pread(fd, min(_PIECE, size - pos), pos)
                if not data:
                    raise CorruptMetaFileError(path, pos, "the file ends here, before its size said (it changed?)")
                pos += len(data)
            before = d.copy()  # (a few KiB: to tell, on an error, where decoding failed)
            try:
                out = d.decompress(data, block)
            except zlib.error as exc:
                # The fault is at or after the member's start (a wrong CRC may be anywhere in it).
                lo, hi = _failed_at(before, data, pos - len(data), block)
                raise CorruptMetaFileError(
                    path,
                    member,
                    f"corrupt gzip data (or a wrong CRC or size in its trailer) in the member starting at byte "
                    f"{member:,}: decoding failed between compressed bytes {lo:,} and {hi:,} ({exc}); "
                    "bytes after the last member count as one",
                ) from None
            data = d.unconsumed_tail
            if out:
                yield out
        # At a member's end zlib puts the input it did not use in unused_data, and, when it stopped at
        # max_length, in unconsumed_tail too (``data``): unused_data alone holds what follows.
        tail = d.unused_data


_FAILED_STEP = 512  # compressed bytes fed at a time to find where decoding failed


def _failed_at(decoder: Any, data: bytes, start: int, block: int) -> tuple[int, int]:
    """``(lo, hi)``: the compressed bytes within which ``decoder`` (a copy of the one that failed on
    ``data``, which starts at compressed byte ``start``) fails, found by feeding it a few at a time."""
    for at in range(0, len(data), _FAILED_STEP):
        piece = data[at : at + _FAILED_STEP]
        try:
            while piece and not decoder.eof:
                decoder.decompress(piece, block)
                piece = decoder.unconsumed_tail
        except zlib.error:
            return start + at, start + min(at + _FAILED_STEP, len(data))
    return start, start + len(data)


class _Checkpointer:
    """indexed_gzip's pass over the same file, in a thread of its own, to record its checkpoints; kept
    from decompressing more output than the checked pass (:func:`members`) has made, so that on a
    corrupt file (where indexed_gzip 1.10.3 can go on giving bytes without end) it stops with it."""

    def __init__(self, path: Path, fd: RawFile, spacing: int, block: int) -> None:
        self._path, self._fd, self._spacing, self._block = path, fd, spacing, block
        self._cond = threading.Condition()
        self._allowed, self._final, self._stop = 0, False, False
        self._done = 0
        self._state: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rank-dataset-gzip-checkpoints", daemon=True)
        self._thread.start()

    def allow(self, out: int, *, final: bool = False) -> None:
        """Let it decompress up to ``out`` output bytes (``final``: all there is)."""
        with self._cond:
            self._allowed, self._final = out, final
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            raw, gz = _open(self._fd, spacing=self._spacing)
        except BaseException as exc:  # pragma: no cover - opening reads only the first bytes
            self._error = exc
            return
        try:
            # Seeks, not reads: a seek inflates once, recording checkpoints as it goes (a read inflates
            # twice: to the checkpoint it starts from, then what it returns).
            while True:
                with self._cond:
                    while not self._stop and not self._final and self._allowed <= self._done:
                        self._cond.wait()
                    if self._stop:
                        return
                    room = self._allowed - self._done
                    final = self._final
                if room <= 0 and final:
                    if gz.raw.read(1):  # the end: there must be nothing more
                        raise ValueError("indexed_gzip gives more bytes than zlib")
                    break
                target = self._done + min(room, self._block)
                gz.raw.seek(target)
                if gz.raw.tell() != target:
                    raise ValueError(f"indexed_gzip ends at {gz.raw.tell():,} bytes, before zlib did")
                self._done = target
            # The seeks to the end made every point: build_full_index would inflate the whole file
            # again for the same index (a second decompression). Only a file with no output has no
            # point yet.
            if next(gz.raw.seek_points(), None) is None:
                gz.raw.build_full_index()
            state = io.BytesIO()
            gz.raw.export_index(fileobj=state)
            self._state = state.getvalue()
        except BaseException as exc:
            self._error = exc
        finally:
            gz.close()
            raw.close()

    def result(self) -> bytes:
        """indexed_gzip's exported index, once it has read the whole file.

        Raises:
            CorruptMetaFileError: it failed, or disagreed with zlib on the decompressed size.
        """
        self._thread.join()
        if self._state is None:
            raise CorruptMetaFileError(self._path, 0, f"indexed_gzip could not index it ({self._error})")
        return self._state

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


def stream(path: Path, fd: RawFile, spacing: int, block: int) -> Generator[bytes, None, tuple[int, Int64Array, bytes]]:
    """Yield the decompressed bytes of the gzip file open at ``fd`` in blocks of at most ``block``
    bytes; return ``(decompressed size, checkpoints (output, input), indexed_gzip's index)``.

    The bytes come from zlib, member by member, each checked against its trailer (indexed_gzip 1.10.3
    checks only some: a corrupt member before the last can give wrong bytes without an error); the
    checkpoints from indexed_gzip, decompressing the same file at the same time in a second thread.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt (a member's CRC or size is wrong, or its data), ends
            inside a member, or has bytes after its last member.
    """
    checkpointer = _Checkpointer(path, fd, spacing, block)
    out = 0
    try:
        for piece in members(path, fd, block):
            out += len(piece)
            checkpointer.allow(out)
            yield piece
        checkpointer.allow(out, final=True)
        index = checkpointer.result()
    finally:
        checkpointer.stop()
    return out, _points(index), index


class Reader:
    """Decompressed bytes ``[a, b)`` of a gzip file, from the last checkpoint at or before ``a``.

    indexed_gzip starts every read from the checkpoint before it (zran keeps no decoder between
    reads), so reads in order of ``[a, b)`` pieces would each decompress again the span before ``a``.
    A read may instead go on to a later checkpoint (no further than ``until``) and keep the bytes
    past ``b`` for the read that starts there: then every span is decompressed once.
    """

    def __init__(self, path: Path, fd: RawFile, points: Int64Array, state: bytes) -> None:
        self._path, self._points = path, points
        self._ahead, self._ahead_at = b"", -1  # bytes read past the last read's end, and where they start
        self._raw, self._gz = _open(fd, auto_build=False, readbuf_size=_READBUF)
        try:
            self._gz.raw.import_index(fileobj=io.BytesIO(state))
        except BaseException as exc:
            self.close()
            raise CorruptMetaFileError(path, 0, f"its gzip checkpoints cannot be loaded ({exc})") from None

    def read(self, a: int, b: int, until: int | None = None) -> tuple[bytes, int]:
        """``(bytes [a, b) (short if the file ends first), output bytes decompressed)``; with ``until``,
        read on to a checkpoint after ``b`` (or to ``until``, if nearer) and keep the bytes past ``b``."""
        head = b""
        if self._ahead_at == a and self._ahead:
            head, a = self._ahead[: b - a], a + min(len(self._ahead), b - a)
            self._ahead = self._ahead[len(head) :]
            self._ahead_at = a
        if a >= b:
            return head, 0
        stop = b
        if until is not None and until > b:
            # On to a checkpoint at least _AHEAD compressed bytes on (a call also reads up to
            # _READBUF past where it stops: fewer, longer calls waste less).
            row = row_at(self._points, b)
            nxt = int(np.searchsorted(self._points[:, 1], int(self._points[row, 1]) + _AHEAD, side="left"))
            nxt = max(nxt, int(np.searchsorted(self._points[:, 0], b, side="left")))
            stop = min(until, int(self._points[nxt, 0])) if nxt < len(self._points) else until
        data, done = self._inflate(a, stop)
        self._ahead, self._ahead_at = data[b - a :], b
        return head + data[: b - a], done

    def _inflate(self, a: int, b: int) -> tuple[bytes, int]:
        row = row_at(self._points, a)
        try:
            self._gz.raw.seek(a)
            data = bytearray()
            while len(data) < b - a:
                piece = self._gz.raw.read(b - a - len(data))
                if not piece:
                    break
                data += piece
        except (OSError, ValueError) as exc:
            raise CorruptMetaFileError(
                self._path, int(self._points[row, 1]), f"corrupt gzip data at or after this byte ({exc})"
            ) from None
        return bytes(data), b - int(self._points[row, 0])

    def close(self) -> None:
        self._gz.close()
        self._raw.close()


class GzipFormat(Format):
    """gzip: recognised by its magic bytes, checkpoints from indexed_gzip, checked by zlib."""

    value = "gzip"
    code = 1
    compressed = True

    def recognise(self, found: Recognised) -> bool:
        return found.head[:2] == _MAGIC

    def stream(self, path: Path, fd: RawFile, spacing: int, block: int) -> Stream:
        return stream(path, fd, spacing, block)

    def members(self, path: Path, fd: RawFile, block: int) -> Iterator[bytes]:
        return members(path, fd, block)

    def reader(self, path: Path, fd: RawFile, checkpoints: Points) -> Decoder:
        return Reader(path, fd, checkpoints.points, checkpoints.state)


GZIP = GzipFormat()
