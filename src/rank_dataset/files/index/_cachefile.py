"""The index cache file's format, and the index it holds (:class:`Index`).

The cache: a 128-byte header (:class:`Header`: magic, the file's size and key digest, samples, flags, the hash of the
file's ends, the tables' sizes, the bytes indexed, the format's code), then one 8-byte entry a sample
(see :mod:`rank_dataset.files.index.load`), the long lines and the marks (pairs of int64), and a
compressed file's checkpoints. Changing any of it changes ``_MAGIC``: an older cache is rebuilt.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt64Array
from rank_dataset.files.formats import TEXT, Format, by_code
from rank_dataset.files.index.cache import SEAL
from rank_dataset.files.io import SourceKey
from rank_dataset.files.io.pread import ShortRead, pread_exact

if TYPE_CHECKING:
    from rank_dataset.files.formats import ParquetLayout

_MAGIC = b"RDIDX\x00\x00\x06"
# magic, file size, the key's digest (SourceKey.digest), device (a local file's), samples, flags, hash of the
# file's ends, long lines, marks, bytes indexed (the decompressed size of a compressed file), the size the
# entries' bits are set by, format
HEADER = struct.Struct("<8sq24sQqq16sqqqqq")
SEAL_AT = HEADER.size
_FLAG_ASCII = 1
DATA_OFFSET = 128
ENTRY = 8  # one sample: a little-endian uint64, start << bits | length
_PAIR = 16  # a long line (sample, length) or a mark (offset, line number): two little-endian int64
_CHECK_ROWS = 1 << 12  # entries checked at each end of a cache when it is loaded


def length_bits(size: int) -> int:
    """The low bits of an entry that hold a sample's length in a file of ``size`` bytes; the high
    ``bit_length(size)`` bits hold its start."""
    return 64 - max(1, size.bit_length())


@dataclass(frozen=True)
class Table:
    """An index held in memory: the entries (uint64), the long lines ``(k, 2)`` (sample, length) and
    the marks ``(k, 2)`` (offset, line number), as in a cache file."""

    entries: UInt64Array
    longs: Int64Array
    marks: Int64Array
    extra: bytes = b""


@dataclass(frozen=True)
class Index:
    """Where the spans of a file's samples are, and what they describe.

    ``key`` is the file as this process indexed it, ``ends_hash`` the hash of its first and last
    64 KiB. For a compressed file, the spans are of its decompressed bytes (``extent`` of them, laid
    out as for a file of ``bound`` bytes), and its checkpoints follow the marks in the cache.
    The entries live in ``cache``, or in ``memory`` where no cache location was writable (not
    pickled: a process that receives the index rescans the file if it ever reads it). A Parquet
    file's index is its ``parquet`` layout (``count`` rows), held in the Index itself.
    ``cache_inode`` tells this write of ``cache`` from those beside it in time (each is a new file
    renamed into place, made while the one it replaces is there), -1 without a cache. A later write
    may reuse a freed inode: taken for the old one, it is rebuilt needlessly, never trusted wrongly.
    """

    key: SourceKey
    ends_hash: bytes
    count: int
    ascii: bool
    cache: Path | None
    memory: Table | None = field(default=None, compare=False, repr=False)
    format: Format = TEXT
    extent: int = -1
    bound: int = -1
    parquet: ParquetLayout | None = None
    cache_inode: int = field(default=-1, compare=False)

    @property
    def size(self) -> int:
        """The bytes the spans index: the file's, or its decompressed bytes'."""
        return self.key.size if self.extent < 0 else self.extent

    @property
    def bits_size(self) -> int:
        """The size that sets the entries' bits (see :func:`length_bits`)."""
        return self.key.size if self.bound < 0 else self.bound

    @functools.cached_property
    def header_fields(self) -> tuple[bytes, bytes]:
        """What a cache's header holds for this index, but for the device and the table sizes: its
        bytes ``[0, 40)`` (magic, size, mtime, ctime, inode) and ``[48, 80)`` (samples, flags, hash)."""
        head = Header.of(
            self.key, self.ends_hash, self.count, self.ascii, 0, 0, self.size, self.bits_size, self.format
        ).pack()
        return head[:40], head[48:80]

    def __getstate__(self) -> tuple[object, ...]:
        # The values alone, in field order: a dataset's pickle (what each DataLoader worker receives)
        # stays a small handle, without the field names.
        return tuple(None if f.name == "memory" else getattr(self, f.name) for f in fields(self))

    def __setstate__(self, state: tuple[object, ...]) -> None:
        self.__dict__.update(zip((f.name for f in fields(self)), state))


@dataclass(frozen=True)
class Header:
    size: int
    digest: bytes
    device: int
    ends_hash: bytes
    count: int
    ascii: bool
    longs: int
    marks: int
    extent: int
    bound: int
    format: Format

    @classmethod
    def of(cls, key: SourceKey, *rest: Any) -> Header:
        """The header of an index of the source ``key`` describes (``rest``: the fields after the key)."""
        return cls(key.size, key.digest(), getattr(key, "device", 0), *rest)

    def pack(self) -> bytes:
        flags = _FLAG_ASCII if self.ascii else 0
        return HEADER.pack(
            _MAGIC, self.size, self.digest, self.device, self.count, flags, self.ends_hash, self.longs,
            self.marks, self.extent, self.bound, self.format.code,
        )  # fmt: skip

    def describes(self, key: SourceKey, ends_hash: bytes) -> bool:
        """Whether this is the header of an index of the source ``key`` and ``ends_hash`` identify."""
        return (self.size, self.digest, self.ends_hash) == (key.size, key.digest(), ends_hash)

    @property
    def longs_at(self) -> int:
        return DATA_OFFSET + ENTRY * self.count

    @property
    def marks_at(self) -> int:
        return self.longs_at + _PAIR * self.longs

    @property
    def extra_at(self) -> int:
        """Where a compressed file's checkpoints start (after the marks, to the cache's end)."""
        return self.marks_at + _PAIR * self.marks


def read_header(fd: int) -> Header | None:
    """The header of the cache open at ``fd``; None if it is not a valid one (or not a file)."""
    raw = np.empty(HEADER.size, np.uint8)
    try:
        pread_exact(fd, raw, 0)
        length = os.fstat(fd).st_size
    except OSError:  # ShortRead; IsADirectoryError where the cache's path is a directory
        return None
    fields = HEADER.unpack(raw.tobytes())
    magic, size, digest, device, count, flags, ends_hash, longs, marks, extent, bound, code = fields
    fmt = by_code(code)
    if magic != _MAGIC or fmt is None or fmt.rows or min(count, longs, marks, extent, bound) < 0:
        return None
    header = Header(size, digest, device, ends_hash, count, bool(flags & _FLAG_ASCII), longs, marks, extent, bound, fmt)
    if length < header.extra_at or (not fmt.compressed and length != header.extra_at):
        return None
    return header


def read_pairs(fd: int, offset: int, count: int) -> Int64Array:
    raw = np.empty(_PAIR * count, np.uint8)
    pread_exact(fd, raw, offset)
    return raw.view("<i8").astype(np.int64).reshape(-1, 2)


def decode(entries: UInt64Array, local: Int64Array, size: int, longs: Int64Array) -> tuple[Int64Array, Int64Array]:
    """``(starts, lengths)`` of samples ``local`` of a file of ``size`` bytes from their ``entries``
    and the file's long lines. A length the entry marks as long but the table does not hold is 0 (no
    sample has it: the index is damaged)."""
    bits = length_bits(size)
    mask = (1 << bits) - 1
    starts: Int64Array = np.right_shift(entries, np.uint64(bits)).view(np.int64)
    lengths: Int64Array = np.bitwise_and(entries, np.uint64(mask)).view(np.int64)
    rows = np.flatnonzero(lengths == mask) if longs.size or bits < 32 else np.empty(0, np.int64)
    if rows.size:
        at = np.minimum(np.searchsorted(longs[:, 0], local[rows]), max(len(longs) - 1, 0))
        found = longs[at, 0] == local[rows] if longs.size else np.zeros(rows.size, bool)
        lengths[rows] = np.where(found, longs[at, 1] if longs.size else 0, 0)
    return starts, lengths


def spans_are_sane(starts: Int64Array, lengths: Int64Array, size: int, *, ordered: bool = True) -> bool:
    """Whether these spans could be samples of a file of ``size`` bytes: non-empty, inside the file
    and (``ordered``: consecutive samples) increasing without overlap, as a newline separates them."""
    if not starts.size:
        return True
    if not (int(starts.min()) >= 0 and int(lengths.min()) > 0 and int((starts + lengths).max()) <= size):
        return False
    return not ordered or bool((starts[1:] > starts[:-1] + lengths[:-1]).all())


def _cache_is_sane(fd: int, header: Header) -> bool:
    """Check the entries at each end of a cache (all of a small one): a cache that a crash or a bad
    disk left zeroed or torn is rebuilt instead of trusted. Spans are also checked, against the
    bytes they point at, whenever a shard is built from them."""
    count, size = header.count, header.extent
    blocks = [(0, min(count, _CHECK_ROWS))]
    if count > _CHECK_ROWS:
        blocks.append((max(_CHECK_ROWS, count - _CHECK_ROWS), count))
    try:
        longs = read_pairs(fd, header.longs_at, header.longs)
        for lo, hi in blocks:
            raw = np.empty(ENTRY * (hi - lo), np.uint8)
            pread_exact(fd, raw, DATA_OFFSET + ENTRY * lo)
            starts, lengths = decode(raw.view("<u8"), np.arange(lo, hi), header.bound, longs)
            if not spans_are_sane(starts, lengths, size):
                return False
    except ShortRead:
        return False
    return bool(longs.size == 0 or (np.diff(longs[:, 0]) > 0).all())


def open_cache(cache: Path, key: SourceKey, ends_hash: bytes, distrust: Index | None = None) -> Index | None:
    """The index in ``cache`` if it describes the file ``key`` and ``ends_hash`` identify, is sealed
    (whole on disk), is sane, and is not the write of it ``distrust`` was read from."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        inode = os.fstat(fd).st_ino
        if distrust is not None and (distrust.cache, distrust.cache_inode) == (cache, inode):
            return None
        header = read_header(fd)
        if header is None or not header.describes(key, ends_hash) or os.pread(fd, len(SEAL), SEAL_AT) != SEAL:
            return None
        if not _cache_is_sane(fd, header):
            return None
        return Index(key, ends_hash, header.count, header.ascii, cache, None, *_layout(header), cache_inode=inode)
    finally:
        os.close(fd)


def _layout(header: Header) -> tuple[Format, int, int]:
    """``(format, extent, bound)`` of an :class:`Index` from its cache's header (-1: the file's size)."""
    if not header.format.compressed:
        return TEXT, -1, -1
    return header.format, header.extent, header.bound
