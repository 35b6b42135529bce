"""zstd meta files (:mod:`zstandard`): any zstd file, one frame or many.

A frame can only be entered at its start, so the checkpoints are frame starts, at least ``spacing``
output bytes apart. A file of one frame (``zstd``'s default) has a single checkpoint, at 0: every read
decompresses from the start (:func:`one_frame_advice` says what to do); ``pzstd`` and zstd's seekable
format write many frames. Skippable frames are passed over. :mod:`zstandard` is imported on first use.

The cold index's pass (:func:`stream`) decodes frame by frame into reused blocks of output, finding each
frame's end from its block headers; the reads of a build (:class:`Reader`) go through one ``stream_reader``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Generator
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

import numpy as np

from rank_dataset.core.arrays import Int64Array
from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats._raw import RawFile, pread, size_of
from rank_dataset.files.formats.base import Decoder, Format, Points, Recognised, Stream, row_at

if TYPE_CHECKING:
    import zstandard


__all__ = ["ADVISED_ABOVE", "MANY_FRAMES", "ZSTD", "Reader", "ZstdFormat", "many_frames", "one_frame_advice", "stream"]

_MAGIC = b"\x28\xb5\x2f\xfd"
#: The frames ``pzstd`` writes at level 3 (``1 << (windowLog + 2)``, windowLog 21), the advice's first
#: fix: a file of one frame is advised about only above it, so that a file ``pzstd`` rewrote (frames
#: of this size) is never advised about again.
ADVISED_ABOVE = 8 << 20


def _is_skippable(head: bytes) -> bool:
    # A skippable frame (magic 0x184D2A50-0x184D2A5F) may open a zstd file, as in the seekable format.
    return len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50


def many_frames(path: Path) -> str:
    """How to rewrite the one-frame zstd file ``path`` as many frames, with the tools zstd 1.5 installs
    (its ``-B`` sets the size of a thread's job, not of a frame: ``zstd -T0 -B4MiB`` still writes one)."""
    name = path.name[: -len(".zst")] if path.name.endswith(".zst") else path.name
    src, out = shlex.quote(str(path)), shlex.quote(str(path.with_name(f"{name}.frames.zst")))
    return (
        f"zstd -dc {src} | pzstd -3 -p 2 -c > {out} (frames of 8 MiB of text at level 3), or "
        f"zstd -dc {src} | split -b 4M --filter='zstd -q -3 -c' > {out} (a frame per 4 MiB, with zstd alone)"
    )


#: :func:`many_frames` of a file named ``meta.txt.zst``.
MANY_FRAMES = many_frames(Path("meta.txt.zst"))


def one_frame_advice(path: Path, checkpoints: Points) -> str | None:
    """What to do about a zstd file read from a single checkpoint (one frame, or frames less than
    one per :data:`~rank_dataset.files.formats.base.SPACING` bytes) of more than :data:`ADVISED_ABOVE`
    bytes: no decoder can enter a frame mid-way, so every read of it (each rank's build,
    ``MetaFile[i]``, a server pass) decompresses from its start. None for any other file."""
    if checkpoints.format is not ZSTD or len(checkpoints.points) > 1 or checkpoints.size <= ADVISED_ABOVE:
        return None
    return (
        f"{path} is a single zstd frame ({checkpoints.size:,} bytes decompressed): no decoder can start inside "
        "a frame, so every read of it decompresses it from the start. Write it as many frames: " + many_frames(path)
    )


# Compressed bytes read at a time (meta lines compress well: 80x for the demo's at level 3, so a
# read of 128 KiB gives about 10 MB of output).
_PIECE = 128 << 10
# Reader's first read from a checkpoint: a read that crosses a checkpoint only to finish a line needs
# the next frame's first block (a few KiB), and a slice owner of the collective reader does so once per
# build: 128 KiB there was 8% of a 5 MB file at W = 8. Reads double from it up to _PIECE.
_FIRST = 8 << 10
_HEADER_MOST = 18  # bytes of a frame header, at most (magic 4, descriptor 1, window 1, dictionary 4, size 8)
_SKIPPABLE = b"\x50\x2a\x4d\x18"  # 0x184D2A50-0x184D2A5F, little-endian
_SKIP = 4 << 20  # output bytes a read decodes at a time to reach where it starts (and lets go of)
_TAIL = 1 << 20  # the last bytes of a read kept for a read that starts a little before its end


class _Frames:
    """The compressed bytes of a zstd file as a decoder's source (``read(n)``), one frame at a time:
    a read gives bytes of the current frame only, and ``b""`` at its end, so that a decoder of one
    frame stops there. The frame's end is found without decoding: the block headers are walked in
    the bytes read (3 bytes before each block give its size; the last block's say it is the last),
    each byte read from the file once, the reads in order.
    """

    def __init__(self, path: Path, fd: RawFile) -> None:
        self._path, self._fd = path, fd
        self.size = size_of(fd)
        self._held, self._held_at = b"", 0  # compressed bytes read, and the offset of their first
        self.pos = 0  # the next byte a read gives
        self.frame = 0  # where the current frame starts
        self._next = 0  # where its next block header is; once ended, where the frame ends
        self._ended = True  # the frame's last block header is walked
        self._checksum = 0  # bytes after its last block (its content checksum)

    def _more(self, keep: int) -> None:
        """Read the next piece of the file; of the bytes held, keep those from offset ``keep`` on (a
        header cut by the piece's end). Reads go on where the last ended, as an object's GETs want."""
        end = self._held_at + len(self._held)
        if keep >= end:  # (a skippable frame passed over: the next read starts past the bytes held)
            self._held, self._held_at = pread(self._fd, _PIECE, keep), keep
        else:
            self._held, self._held_at = self._held[keep - self._held_at :] + pread(self._fd, _PIECE, end), keep

    def _walk(self) -> None:
        """Walk the block headers that lie in the bytes held."""
        held, base = self._held, self._held_at
        end = base + len(held)
        while not self._ended and self._next + 3 <= end:
            i = self._next - base
            head = held[i] | held[i + 1] << 8 | held[i + 2] << 16
            self._next += 3 + (1 if (head >> 1) & 3 == 1 else head >> 3)  # an RLE block holds one byte
            if head & 1:
                self._next += self._checksum
                self._ended = True

    def _truncated(self, at: int) -> CorruptMetaFileError:
        what = f"the file ends at byte {self.size:,}, inside the zstd frame starting at byte {at:,} (truncated?)"
        return CorruptMetaFileError(self._path, at, what)

    def next_frame(self) -> bool | None:
        """Go to the frame after the current one (which the decoder has read to its end): True for a
        zstd frame, False for a skippable one (passed over), None at the file's end.

        Raises:
            CorruptMetaFileError: no frame starts there, or the file ends inside a skippable frame.
        """
        self.frame = at = self.pos
        if at >= self.size:
            return None
        while (end := self._held_at + len(self._held)) < min(at + _HEADER_MOST, self.size):
            self._more(at)
            if self._held_at + len(self._held) == end:  # the file shrank
                break
        head = self._held[at - self._held_at : at - self._held_at + _HEADER_MOST]
        if head[:4] == _MAGIC and len(head) > 4:
            descriptor = head[4]
            single = descriptor >> 5 & 1
            size = 6 - single + (0, 1, 2, 4)[descriptor & 3] + (single, 2, 4, 8)[descriptor >> 6]
            self._checksum = 4 * (descriptor >> 2 & 1)
            self._next, self._ended = at + size, False
            self._walk()
            return True
        skippable = head[1:4] == _SKIPPABLE[1 : len(head[1:4]) + 1] and (head[0] & 0xF0 == 0x50)
        if skippable and len(head) >= 8:
            end = at + 8 + int.from_bytes(head[4:8], "little")
            if end > self.size:
                raise self._truncated(at)
            self.pos = self._next = end
            return False
        if skippable or _MAGIC.startswith(head[:4]):  # the file ends inside the frame's header
            raise self._truncated(at)
        what = f"corrupt zstd data: no zstd frame starts at byte {at:,} (its first bytes are {bytes(head[:4]).hex()})"
        raise CorruptMetaFileError(self._path, at, what)

    def read(self, n: int = -1) -> bytes:
        if self._ended and self.pos >= self._next:
            return b""  # the frame's end
        if self.pos >= self._held_at + len(self._held):
            self._more(self.pos if self._ended else min(self.pos, self._next))
            self._walk()
        hi = min(self._held_at + len(self._held), self.pos + (n if n >= 0 else _PIECE))
        if self._ended:
            hi = min(hi, self._next)
        data = self._held[self.pos - self._held_at : hi - self._held_at]
        self.pos += len(data)
        return data

    def end_frame(self) -> None:
        """Check that the decoder, which gave its last bytes of the current frame, read all of it.

        Raises:
            CorruptMetaFileError: the file ends inside the frame, or the decoder ended it early.
        """
        if self._ended and self.pos == self._next:
            return
        if self.pos >= self.size:
            raise self._truncated(self.frame)
        what = (
            f"corrupt zstd data in the frame starting at byte {self.frame:,}: it ended at compressed byte {self.pos:,}"
        )
        what += " before its blocks did"
        raise CorruptMetaFileError(self._path, self.frame, what)


class _Blocks:
    """Output blocks of ``size`` bytes, each used again once nothing but this holds it (its reader
    let go of it: a scan took its lines): new memory for each would be faulted in page by page,
    and a decoder writing into a block is spared the copy of bytes objects joined into one."""

    def __init__(self, size: int, most: int = 8) -> None:
        self._size, self._most = size, most
        self._kept: list[bytearray] = []
        # A block made and let go of at once: glibc then serves blocks of this size from its heap
        # rather than each from a map of its own (its mmap threshold rises to the size of a map freed),
        # and so the scan's arrays of each block too. Without it (the blocks kept, none freed), the
        # scanning threads fault their arrays in page by page.
        bytearray(size)

    def take(self) -> bytearray:
        for k in range(len(self._kept)):
            # Referred to by the list and by getrefcount's argument alone: no one else holds it.
            if sys.getrefcount(self._kept[k]) <= 2:
                return self._kept[k]
        block = bytearray(self._size)
        if len(self._kept) < self._most:
            self._kept.append(block)
        return block


def _as_bytes(block: bytearray) -> bytes:
    # A block is read as bytes are (find, slices, the buffer protocol) and never written while a
    # reader holds it (_Blocks): bytes to its readers.
    return cast(bytes, block)


def stream(path: Path, fd: RawFile, spacing: int, block: int) -> Generator[bytes, None, tuple[int, Int64Array, bytes]]:
    """Yield the decompressed bytes of the zstd file open at ``fd`` in blocks of ``block`` bytes (the
    last shorter; a block is written again once its reader lets go of it); return ``(decompressed
    size, checkpoints (output, input), b"")``: the frame starts at least ``spacing`` output bytes apart.

    Frame by frame, each decoded straight into the blocks by a decoder that stops at its end (found
    by walking its block headers, :class:`_Frames`).

    Raises (while iterated):
        CorruptMetaFileError: corrupt data, or the file ends inside a frame.
    """
    import zstandard  # on first use: most processes read no zstd file

    source, blocks = _Frames(path, fd), _Blocks(block)
    dctx = zstandard.ZstdDecompressor()
    points = [(0, 0)]
    out = filled = 0
    buf = blocks.take()
    view = memoryview(buf)
    while (kind := source.next_frame()) is not None:
        if out - points[-1][0] >= spacing:
            points.append((out, source.frame))
        if not kind:
            continue
        reader = dctx.stream_reader(cast(IO[bytes], source), read_size=_PIECE, read_across_frames=False, closefd=False)
        while True:
            try:
                made = reader.readinto(view[filled:])
            except zstandard.ZstdError as exc:
                raise CorruptMetaFileError(
                    path,
                    source.frame,
                    f"corrupt zstd data in the frame starting at byte {source.frame:,}: decoding failed at or "
                    f"before compressed byte {source.pos:,} ({exc})",
                ) from None
            filled += made
            out += made
            if filled == len(buf):
                view.release()
                yield _as_bytes(buf)
                buf = blocks.take()
                view, filled = memoryview(buf), 0
            elif not made:
                break
        del reader
        source.end_frame()
    view.release()
    if filled:
        yield _as_bytes(buf[:filled])
    return out, np.array(points, np.int64).reshape(-1, 2), b""


class _Compressed:
    """The compressed bytes of the file open at ``fd`` from byte ``pos`` on, as a decoder's source
    reads them (``read(n)``): no read crosses a checkpoint (``stops``, increasing), and the reads
    from one start at :data:`_FIRST` bytes, doubling up to :data:`_PIECE`."""

    def __init__(self, fd: RawFile, pos: int, stops: Int64Array) -> None:
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

    def __init__(self, path: Path, fd: RawFile, points: Int64Array) -> None:
        self._path, self._fd, self._points = path, fd, points
        self._source: _Compressed | None = None
        self._stream: zstandard.ZstdDecompressionReader | None = None
        self._at = 0  # the output offset the decoder is at
        self._tail: tuple[int, bytes] = (0, b"")  # the last read's last bytes (output offset, bytes)

    def read(self, a: int, b: int, until: int | None = None) -> tuple[bytes, int]:
        """``(bytes [a, b) (short if the file ends first), output bytes decompressed)``. (``until`` is
        :class:`~rank_dataset.files.formats.gzip.Reader`'s: this decoder goes on from where it stopped.)"""
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


class ZstdFormat(Format):
    """zstd: recognised by its magic bytes (or a skippable frame's); checkpoints at frame starts."""

    value = "zstd"
    code = 2
    compressed = True

    def recognise(self, found: Recognised) -> bool:
        head = found.head[:4]
        return head == _MAGIC or _is_skippable(head)

    def stream(self, path: Path, fd: RawFile, spacing: int, block: int) -> Stream:
        return stream(path, fd, spacing, block)

    def reader(self, path: Path, fd: RawFile, checkpoints: Points) -> Decoder:
        return Reader(path, fd, checkpoints.points)

    def span_cuts(self, checkpoints: Points, span: int) -> Int64Array:
        # A frame may be the whole file: cut it, its decoder going on from span to span. (Not gzip's
        # spans: a read from within one starts at its checkpoint.)
        # (Sorted and made distinct by hand: np.union1d imports numpy.ma on its first call, and the
        # objects it makes set off a full garbage collection inside a fresh process's build.)
        cuts = np.concatenate((checkpoints.points[:, 0], np.arange(0, checkpoints.size, span, dtype=np.int64)))
        cuts.sort()
        return cuts[np.concatenate(([True], cuts[1:] != cuts[:-1]))] if cuts.size else cuts

    def advice(self, path: Path, checkpoints: Points) -> str | None:
        return one_frame_advice(path, checkpoints)


ZSTD = ZstdFormat()
