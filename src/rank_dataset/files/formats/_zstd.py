"""zstd meta files through :mod:`zstandard` (see :mod:`rank_dataset.files.formats`). No torch.

A zstd frame can only be decompressed from its start, so a file's checkpoints are frame starts, at
least ``spacing`` output bytes apart. Skippable frames (zstd's seekable format ends with one) are
passed over. The cold index's pass (:func:`stream`) decodes frame by frame, in pieces, to find the
frame starts; the reads of a build (:class:`Reader`) go across frames through one ``stream_reader``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats._points import row_at
from rank_dataset.files.formats._raw import RawFile, pread, size_of

if TYPE_CHECKING:
    import zstandard  # imported on first use (a process that reads no zstd file does without it)

__all__ = ["Reader", "stream"]

# Compressed bytes handed to the decoder at a time, at most (stream: it gives all their output at once, and
# meta lines compress well (80x for the demo's at level 3: 1 MiB came out as 80 MiB, slowing the
# index's scan 2x; Reader: what its stream_reader asks its source for).
_PIECE = 128 << 10
# Output bytes a piece should give, about: the piece shrinks to the compression ratio seen so far
# (at least _LEAST bytes). Output of a few MB at a time is new memory each time, faulted in page by
# page: 128 KiB pieces of the demo's lines (9 MB out each) took 0.6 s to decompress 10M lines in
# spans, 8 KiB ones 0.3 s.
_OUTPUT = 1 << 20
_LEAST = 4 << 10
# Reader's first read from a checkpoint: a read that crosses a checkpoint only to finish a line needs
# the next frame's first block (a few KiB), and a slice owner of the collective reader does so once per
# build: 128 KiB there was 8% of a 5 MB file at W = 8. Reads double from it up to _PIECE.
_FIRST = 8 << 10
_WRITE = 1 << 20  # output buffer of stream's decoder
_SKIP = 4 << 20  # output bytes a read decodes at a time to reach where it starts (and lets go of)
_TAIL = 1 << 20  # the last bytes of a read kept for a read that starts a little before its end
_IntArray = npt.NDArray[np.int64]


def _frames(path: Path, fd: RawFile) -> Iterator[tuple[int, int, bytes]]:
    """Decompress the file from its start to its end: ``(frame start, output offset, data)``, with
    ``b""`` data once as each frame begins.

    Raises:
        CorruptMetaFileError: corrupt data, or the file ends inside a frame.
    """
    import zstandard  # on first use: most processes read no zstd file

    size = size_of(fd)
    dctx = zstandard.ZstdDecompressor()
    pos = out = 0  # compressed bytes read up to here, output bytes made
    pending = b""  # read but not yet given to a decoder
    frame = 0
    fed_in, made = 1, 0  # the last piece's compressed and output bytes (none yet: a full piece)
    while pos < size or pending:
        frame = pos - len(pending)
        yield frame, out, b""
        obj = dctx.decompressobj(write_size=_WRITE)
        fed = False
        while not obj.eof:
            if not pending:
                if pos >= size:
                    if not fed:  # no bytes left: the file ended between frames
                        return
                    what = (
                        f"the file ends at byte {size:,}, inside the zstd frame starting at byte {frame:,} (truncated?)"
                    )
                    raise CorruptMetaFileError(path, frame, what)
                want = min(_PIECE, size - pos, max(_LEAST, _OUTPUT * fed_in // max(made, 1)))
                pending = pread(fd, want, pos)
                if not pending:  # the file shrank while being read
                    raise CorruptMetaFileError(path, pos, "the file ends here, before its size said (it changed?)")
                pos += len(pending)
            piece, pending, fed = pending, b"", True
            try:
                data = obj.decompress(piece)
            except zstandard.ZstdError as exc:
                raise CorruptMetaFileError(
                    path,
                    frame,
                    f"corrupt zstd data in the frame starting at byte {frame:,}: decoding failed between "
                    f"compressed bytes {pos - len(piece):,} and {pos:,} ({exc})",
                ) from None
            fed_in, made = len(piece), len(data)
            if data:
                yield frame, out, data
                out += len(data)
            if obj.eof:
                pending = obj.unused_data


def stream(path: Path, fd: RawFile, spacing: int, block: int) -> Generator[bytes, None, tuple[int, _IntArray, bytes]]:
    """Yield the decompressed bytes of the zstd file open at ``fd`` in blocks of about ``block``
    bytes; return ``(decompressed size, checkpoints (output, input), b"")``: the frame starts at
    least ``spacing`` output bytes apart."""
    points = [(0, 0)]
    parts: list[bytes] = []
    held = out_end = 0
    for frame, out, data in _frames(path, fd):
        if not data:
            if out - points[-1][0] >= spacing:
                points.append((out, frame))
            continue
        parts.append(data)
        held += len(data)
        out_end = out + len(data)
        if held >= block:
            yield b"".join(parts)
            parts, held = [], 0
    if parts:
        yield b"".join(parts)
    return out_end, np.array(points, np.int64).reshape(-1, 2), b""


class _Compressed:
    """The compressed bytes of the file open at ``fd`` from byte ``pos`` on, as a decoder's source
    reads them (``read(n)``): no read crosses a checkpoint (``stops``, increasing), and the reads
    from one start at :data:`_FIRST` bytes, doubling up to :data:`_PIECE`."""

    def __init__(self, fd: RawFile, pos: int, stops: _IntArray) -> None:
        self._fd, self.pos, self._stops = fd, pos, stops
        self._size = size_of(fd)
        self._step = _FIRST

    def read(self, n: int = -1) -> bytes:
        nxt = int(np.searchsorted(self._stops, self.pos, side="right"))
        self._step = _FIRST if nxt and int(self._stops[nxt - 1]) == self.pos else min(2 * self._step, _PIECE)
        want = min(self._step, self._size - self.pos, n if n >= 0 else _PIECE)
        if nxt < len(self._stops):
            want = min(want, int(self._stops[nxt]) - self.pos)
        data = pread(self._fd, max(want, 0), self.pos)
        self.pos += len(data)
        return data


class Reader:
    """Decompressed bytes ``[a, b)`` of a zstd file, from the last checkpoint at or before ``a``, or
    on from where the previous read stopped when that is nearer: reads in ascending order (a build's
    spans) decompress each frame once, even in a file of one frame. One decoder goes on across
    frames (zstandard's ``stream_reader``), writing each read's bytes in one piece: a decoder fed
    pieces whose outputs are joined took twice as long."""

    def __init__(self, path: Path, fd: RawFile, points: _IntArray) -> None:
        self._path, self._fd, self._points = path, fd, points
        self._source: _Compressed | None = None
        self._stream: zstandard.ZstdDecompressionReader | None = None
        self._at = 0  # the output offset the decoder is at
        self._tail: tuple[int, bytes] = (0, b"")  # the last read's last bytes (output offset, bytes)

    def read(self, a: int, b: int, until: int | None = None) -> tuple[bytes, int]:
        """``(bytes [a, b) (short if the file ends first), output bytes decompressed)``. (``until`` is
        :class:`~rank_dataset.files.formats._gzip.Reader`'s: this decoder goes on from where it stopped.)"""
        import zstandard  # on first use (a cached module: a dict lookup a read)

        # A read that starts a little before where the last one stopped (a line's end, looked for
        # past a cut) takes those bytes from the last read's end, not from the checkpoint again.
        tail_at, tail = self._tail
        head = tail[a - tail_at : b - tail_at] if tail_at <= a < self._at else b""
        a += len(head)
        if a >= b:
            return head, 0
        row = row_at(self._points, a)
        out0, in0 = int(self._points[row, 0]), int(self._points[row, 1])
        if self._stream is None or a < self._at or out0 > self._at:
            self.close()
            self._source = _Compressed(self._fd, in0, self._points[:, 1])
            self._stream = zstandard.ZstdDecompressor().stream_reader(
                cast(IO[bytes], self._source), read_size=_PIECE, read_across_frames=True, closefd=False
            )
            self._at = out0
        assert self._source is not None
        done = 0
        try:
            while self._at < a:  # to a, from the checkpoint or from where the last read stopped
                skipped = len(self._stream.read(min(a - self._at, _SKIP)))
                if not skipped:
                    return head, done  # the file ends first
                self._at += skipped
                done += skipped
            data = self._stream.read(b - a)
        except zstandard.ZstdError as exc:
            pos = self._source.pos
            self.close()
            raise CorruptMetaFileError(
                self._path,
                pos,
                f"corrupt zstd data at or before compressed byte {pos:,}, in a frame that starts at or after "
                f"compressed byte {in0:,} ({exc})",
            ) from None
        except BaseException:  # (a read of the file failed) the decoder went on: where it is, is not known
            self.close()
            raise
        self._at += len(data)
        done += len(data)
        data = head + data if head else data
        self._tail = (self._at - min(len(data), _TAIL), data[-_TAIL:] if len(data) > _TAIL else data)
        return data, done

    def close(self) -> None:
        self._stream = self._source = None
        self._at, self._tail = 0, (0, b"")
