"""Checkpoints of a compressed meta file, and the decompression that makes them and the reads that
start from them, for any compressed format (:class:`~rank_dataset.files.formats.base.Format` with
``compressed``).

A compressed file's index is made over its decompressed bytes, in one decompression
(:class:`Decompression`) that also records :class:`Checkpoints`, points at least
:data:`~rank_dataset.files.formats.SPACING` bytes of output apart from which decompression can start. A
read of ``[a, b)`` (:class:`DecompressedView`) starts at the last checkpoint at or before ``a``. A corrupt
or truncated file is a :class:`~rank_dataset.errors.CorruptMetaFileError` naming the file and the
compressed offset, never a wrong sample.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rank_dataset.core.arrays import Int64Array
from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats import base
from rank_dataset.files.formats._raw import RawFile
from rank_dataset.files.formats.base import BLOCK, Decoder, Format, row_at
from rank_dataset.files.formats.registry import by_name

__all__ = ["Checkpoints", "DecompressedView", "Decompression", "decompress"]

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
    points: Int64Array
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
            fmt = by_name(name.rstrip(b"\0").decode())
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


class Decompression:
    """One pass over the decompressed bytes of the compressed file open at ``fd`` (``path`` names it
    in errors), in blocks of about :data:`BLOCK` bytes, recording its checkpoints.

    Iterate it once; :attr:`checkpoints` is set when the iteration has ended.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt or truncated.
    """

    def __init__(self, path: Path, fd: RawFile, fmt: Format, *, spacing: int | None = None, block: int = BLOCK) -> None:
        spacing = base.SPACING if spacing is None else spacing
        if not fmt.compressed:
            raise ValueError(f"a Decompression reads gzip or zstd files, not {fmt.value} ({path})")
        if spacing <= 0 or block <= 0:
            raise ValueError(f"spacing and block must be positive, not {spacing} and {block}")
        self.path, self.format = path, fmt
        self._fd, self._spacing, self._block = fd, spacing, block
        self._checkpoints: Checkpoints | None = None

    def __iter__(self) -> Iterator[bytes]:
        size, points, state = yield from self.format.stream(self.path, self._fd, self._spacing, self._block)
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


def decompress(path: Path, fd: RawFile, fmt: Format, *, block: int = BLOCK) -> Iterator[bytes]:
    """The decompressed bytes of the compressed file open at ``fd`` (``path`` names it in errors),
    front to back in blocks of about ``block`` bytes: the checked pass of a :class:`Decompression`
    (for gzip, each member against its trailer) without recording checkpoints, for a reader of the
    whole file (grouping), which needs one decompression and no random access.

    Raises (while iterated):
        CorruptMetaFileError: the file is corrupt or truncated.
    """
    if not fmt.compressed:
        raise ValueError(f"decompress reads gzip or zstd files, not {fmt.value} ({path})")
    yield from fmt.members(path, fd, block)


class DecompressedView:
    """Random reads of the decompressed bytes of the compressed file open at ``fd`` (the file the
    ``checkpoints`` were made from: the caller checks that), each from the nearest checkpoint.

    Not thread-safe; :meth:`close` (or ``with``) frees the decoder (``fd`` stays the caller's).
    """

    def __init__(self, path: Path, fd: RawFile, checkpoints: Checkpoints) -> None:
        self.path, self.checkpoints = path, checkpoints
        self.decompressed = 0  # output bytes decompressed by reads so far, those skipped included
        if not checkpoints.format.compressed:
            raise ValueError(f"a DecompressedView reads gzip or zstd files, not {checkpoints.format.value} ({path})")
        self._reader: Decoder = checkpoints.format.reader(path, fd, checkpoints)

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
