"""zstd meta files (:mod:`zstandard`): any zstd file, one frame or many. No torch.

A frame can only be entered at its start, so the checkpoints are frame starts. A file of one frame
(what ``zstd`` writes by default) has a single checkpoint, at 0: every read decompresses from the
start (:func:`one_frame_advice` says what to do). ``pzstd`` and zstd's seekable format write many
frames. The codec itself is :mod:`rank_dataset.files.formats._zstd`, imported on first use: recognising a
file imports no codec (issue 44, item 6).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rank_dataset.files.formats._raw import RawFile
from rank_dataset.files.formats.base import Decoder, Format, Recognised, Stream

if TYPE_CHECKING:
    from rank_dataset.files.formats.checkpoints import Checkpoints

__all__ = ["ADVISED_ABOVE", "MANY_FRAMES", "ZSTD", "ZstdFormat", "many_frames", "one_frame_advice"]

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


def one_frame_advice(path: Path, checkpoints: Checkpoints) -> str | None:
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


class ZstdFormat(Format):
    """zstd: recognised by its magic bytes (or a skippable frame's); checkpoints at frame starts."""

    value = "zstd"
    code = 2
    compressed = True

    def recognise(self, found: Recognised) -> bool:
        head = found.head[:4]
        return head == _MAGIC or _is_skippable(head)

    def stream(self, path: Path, fd: RawFile, spacing: int, block: int) -> Stream:
        from rank_dataset.files.formats import _zstd

        return _zstd.stream(path, fd, spacing, block)

    def reader(self, path: Path, fd: RawFile, checkpoints: Checkpoints) -> Decoder:
        from rank_dataset.files.formats import _zstd

        return _zstd.Reader(path, fd, checkpoints.points)

    def span_cuts(self, checkpoints: Checkpoints, span: int) -> npt.NDArray[np.int64]:
        # A frame may be the whole file: cut it, its decoder going on from span to span. (Not gzip's
        # spans: a read from within one starts at its checkpoint.)
        # (Sorted and made distinct by hand: np.union1d imports numpy.ma on its first call, 10 ms, and
        # the objects it makes set off a full garbage collection, 50-80 ms, inside a fresh process's build.)
        cuts = np.concatenate((checkpoints.points[:, 0], np.arange(0, checkpoints.size, span, dtype=np.int64)))
        cuts.sort()
        return cuts[np.concatenate(([True], cuts[1:] != cuts[:-1]))] if cuts.size else cuts

    def advice(self, path: Path, checkpoints: Checkpoints) -> str | None:
        return one_frame_advice(path, checkpoints)


ZSTD = ZstdFormat()
