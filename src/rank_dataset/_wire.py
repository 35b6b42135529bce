"""The binary framing of many samples between the meta server and its clients. No torch.

A frame is a 24-byte header (magic ``RDS1``, the offsets' item size, the sample count, the number
of data bytes) followed by four arrays, little-endian: the sample numbers (int64), the line starts
and ends (uint32 or int64), and the data bytes they point into. It is a Shard as it lies in memory,
so neither side converts anything: the client maps the arrays straight out of the body.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

from rank_dataset.shard import Shard

_HEADER = struct.Struct("<4sIQQ")
_MAGIC = b"RDS1"
CONTENT_TYPE = "application/x-rank-dataset-shard"
_CHUNK = 4 << 20


class FrameError(ValueError):
    """A body that is not a whole, well-formed frame."""


def frame_size(shard: Shard) -> int:
    """The number of bytes :func:`encode` yields for ``shard``."""
    n = len(shard)
    return _HEADER.size + 8 * n + 2 * shard.starts.dtype.itemsize * n + shard.data.nbytes


def encode(shard: Shard) -> Iterator[bytes]:
    """The frame of ``shard`` (which must carry ids), in chunks of at most a few MiB."""
    if shard.ids is None:
        raise ValueError("a shard sent over the wire must carry its sample numbers")
    size = shard.starts.dtype.itemsize
    yield _HEADER.pack(_MAGIC, size, len(shard), shard.data.nbytes)
    for array in (
        shard.ids.astype("<i8"),
        shard.starts.astype(f"<u{size}" if size == 4 else "<i8"),
        shard.ends.astype(f"<u{size}" if size == 4 else "<i8"),
        shard.data,
    ):
        raw = np.ascontiguousarray(array).data.cast("B")
        for lo in range(0, len(raw), _CHUNK):
            yield bytes(raw[lo : lo + _CHUNK])


def decode(body: bytes, *, source: str) -> Shard:
    """The Shard in a whole frame; FrameError if the body is short, long or malformed."""
    if len(body) < _HEADER.size:
        raise FrameError(f"a frame of {len(body)} bytes is shorter than its header")
    magic, size, count, nbytes = _HEADER.unpack_from(body)
    if magic != _MAGIC or size not in (4, 8):
        raise FrameError(f"not a rank-dataset frame (magic {magic!r}, offset size {size})")
    expect = _HEADER.size + 8 * count + 2 * size * count + nbytes
    if len(body) != expect:
        raise FrameError(f"incomplete frame: got {len(body)} bytes of {expect} ({count} samples)")
    offset = _HEADER.size
    ids = np.frombuffer(body, "<i8", count, offset)
    offset += 8 * count
    dtype = np.dtype("<u4" if size == 4 else "<i8")
    starts = np.frombuffer(body, dtype, count, offset)
    offset += size * count
    ends = np.frombuffer(body, dtype, count, offset)
    offset += size * count
    data = np.frombuffer(body, np.uint8, nbytes, offset)
    try:
        return Shard(data, starts, ends, ids=ids, source=source)
    except ValueError as exc:
        raise FrameError(f"malformed frame: {exc}") from None
