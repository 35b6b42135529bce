""":mod:`indexed_gzip` reads gzip meta files (see :mod:`rank_dataset.files.formats`). No torch.

:mod:`indexed_gzip` (zlib's ``zran`` made a library) records a seek point past every ``spacing`` bytes
of output while it decompresses (at the next deflate block's end; and one at each member's start,
which needs no window), each with the 32 KiB window that decompression needs to start there, and
exports them as bytes: the checkpoints' state. It reads one member or many (BGZF, concatenated
files). It does not notice a file that ends inside a member, so :func:`stream` checks the file's
last 8 bytes (the last member's CRC and size) itself; and 1.10.3 checks the CRC of the last member
only (a corrupt earlier member of a multi-member file can go unnoticed).
"""

from __future__ import annotations

import collections
import io
import os
import struct
import zlib
from collections.abc import Generator
from pathlib import Path

import indexed_gzip
import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError

__all__ = ["Reader", "stream"]

_IntArray = npt.NDArray[np.int64]
_TAIL = 8 << 20  # output bytes kept at the end of a stream to check the last member's CRC
# indexed_gzip's exported index: "GZIDX", version, flags, compressed size, uncompressed size,
# spacing, window size, points; then per point: compressed offset, uncompressed offset, bits, has data.
_IDX_HEAD = struct.Struct("<5sBBQQIII")
_IDX_POINT = struct.Struct("<QQBB")


def _open(fd: int, **kwargs: object) -> tuple[io.FileIO, indexed_gzip.IndexedGzipFile]:
    raw = io.FileIO(fd, "rb", closefd=False)
    try:
        return raw, indexed_gzip.IndexedGzipFile(fileobj=raw, drop_handles=False, **kwargs)
    except BaseException:
        raw.close()
        raise


def _points(state: bytes) -> _IntArray:
    """The seek points ``(output, input)`` of an exported index."""
    magic, version, _, _, _, _, _, count = _IDX_HEAD.unpack_from(state)
    if magic != b"GZIDX" or version < 1:
        raise ValueError(f"not an indexed_gzip index of version 1 ({magic!r}, {version})")
    rows = [_IDX_POINT.unpack_from(state, _IDX_HEAD.size + i * _IDX_POINT.size)[:2] for i in range(count)]
    points = np.array([(0, 0)] + [(out, cin) for cin, out in rows if out > 0], np.int64).reshape(-1, 2)
    # One point per output offset (an empty member, as BGZF's last, starts where the one before ended).
    keep = np.ones(len(points), bool)
    keep[1:] = np.diff(points[:, 0]) > 0
    return points[keep]


def _corrupt(path: Path, gz: indexed_gzip.IndexedGzipFile, exc: BaseException) -> CorruptMetaFileError:
    try:
        last = max((cin for _, cin in gz.raw.seek_points()), default=0)
    except Exception:  # the index itself may be what failed
        last = 0
    return CorruptMetaFileError(path, int(last), f"corrupt gzip data at or after this byte ({exc})")


def stream(path: Path, fd: int, spacing: int, block: int) -> Generator[bytes, None, tuple[int, _IntArray, bytes]]:
    """Yield the decompressed bytes of the gzip file open at ``fd`` in blocks of ``block`` bytes;
    return ``(decompressed size, checkpoints (output, input), indexed_gzip's index)``.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt (a member's CRC or size is wrong, or its data), ends
            inside a member, or has bytes after its last member.
    """
    raw, gz = _open(fd, spacing=spacing)
    tail: collections.deque[bytes] = collections.deque()
    kept = out = 0
    try:
        buf = bytearray(block)
        while True:
            try:
                got = gz.raw.readinto(buf)
            except (OSError, ValueError) as exc:
                raise _corrupt(path, gz, exc) from None
            if not got:
                break
            piece = bytes(memoryview(buf)[:got])
            out += got
            tail.append(piece)
            kept += got
            while kept - len(tail[0]) >= _TAIL:
                kept -= len(tail.popleft())
            yield piece
        state = io.BytesIO()
        try:
            # Marks the index whole (decompressing again from the last point on, less than ``spacing``
            # bytes): an index not marked so does not serve reads past its last point.
            gz.raw.build_full_index()
            gz.raw.export_index(fileobj=state)
        except (OSError, ValueError) as exc:
            raise _corrupt(path, gz, exc) from None
    finally:
        gz.close()
        raw.close()
    index = state.getvalue()
    _check_end(path, fd, out, b"".join(tail), index)
    return out, _points(index), index


def _check_end(path: Path, fd: int, out: int, tail: bytes, index: bytes) -> None:
    """Check that the file ends with a whole member: its last 8 bytes are the CRC and size (mod 2**32)
    of the last member's output, the last ``isize`` of the ``out`` bytes, of which ``tail`` holds the
    last ones (the rest is decompressed again, from the checkpoints, if the last member is longer).

    Raises:
        CorruptMetaFileError: it does not.
    """
    size = os.fstat(fd).st_size
    trailer = os.pread(fd, 8, size - 8) if size >= 8 else b""
    bad = CorruptMetaFileError(
        path,
        size,
        "the file ends inside a gzip member, or has bytes after its last member: its last 8 bytes are not the "
        "CRC and size of its last member (truncated?)",
    )
    if len(trailer) != 8:
        raise bad
    crc, isize = struct.unpack("<II", trailer)
    if isize == out % (1 << 32) and out < (1 << 32):
        return  # one member (or the last one's size is all of it): zlib checked its CRC at its end
    start = out - isize
    if start < 0:
        raise bad
    if out - start <= len(tail):
        last = tail[len(tail) - (out - start) :]
    else:
        reader = Reader(path, fd, _points(index), index)
        try:
            last = reader.read(start, out)[0]
        finally:
            reader.close()
    if zlib.crc32(last) != crc:
        raise bad


class Reader:
    """Decompressed bytes ``[a, b)`` of a gzip file, from the last checkpoint at or before ``a``."""

    def __init__(self, path: Path, fd: int, points: _IntArray, state: bytes) -> None:
        self._path, self._points = path, points
        self._raw, self._gz = _open(fd, auto_build=False)
        try:
            self._gz.raw.import_index(fileobj=io.BytesIO(state))
        except BaseException as exc:
            self.close()
            raise CorruptMetaFileError(path, 0, f"its gzip checkpoints cannot be loaded ({exc})") from None

    def read(self, a: int, b: int) -> tuple[bytes, int]:
        """``(bytes [a, b) (short if the file ends first), output bytes decompressed)``."""
        row = max(int(np.searchsorted(self._points[:, 0], a, side="right")) - 1, 0)
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
