"""The line-offset index of a meta file and its cache on disk. No torch.

The index of a file holds the byte span of each of its samples (see :mod:`rank_dataset.files.scan`) in
8 bytes: one little-endian uint64 ``start << bits | length``, where ``bits = 64 - bit_length(size)``
(a line too long for its field, which only a file over 4 GiB can hold, has an all-ones length and
its true length in a table of long lines). After the entries come that table and the file's marks:
where the first line after every 4 MiB starts and its line number, so that a sample's line number is
found by reading less than 4 MiB. It is cached beside the file (or in the user cache directory),
built by one process while others that want it wait (:mod:`rank_dataset.files._cachelock`). A cache is
keyed by what identifies the file's content without reading all of it: size, mtime, ctime and inode
(ctime cannot be set by ``utime``, so ``touch -r`` and ``cp -p`` over the file do not pass for it),
and a hash of its first and last 64 KiB. No descriptor is kept open, and no cache is mapped: a build
reads the entries it needs with positional reads (:class:`SpanReader`).

A Parquet file has no entries and no cache: its index (:class:`~rank_dataset.files._parquet.ParquetLayout`,
the rows of each row group and the chosen columns' schema) is read from its footer each time it is
loaded, in milliseconds, without its data; it keeps the file's key and ends' hash as a cache would.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files._cache import (
    CACHE_DIR_ENV,
    SEAL,
    Seal,
    Syncer,
    cache_paths,
    discard,
    temp_beside,
    wait_for_seal,
)
from rank_dataset.files._cachelock import one_builder
from rank_dataset.files._parquet import ParquetLayout, ParquetRows
from rank_dataset.files._pread import ShortRead, Window, pread_exact, read_ends
from rank_dataset.files.formats import Checkpoints, Decompression, Format, detect
from rank_dataset.files.scan import Chunk, scan_blocks, scan_map

__all__ = [
    "CACHE_DIR_ENV",
    "MAPPED_ROWS",
    "FileKey",
    "Index",
    "SpanReader",
    "check_columns",
    "hash_ends",
    "length_bits",
    "line_mark",
    "load_index",
    "read_checkpoints",
    "read_entry",
    "refuse_cut_parquet",
    "spans_are_sane",
]


_MAGIC = b"RDIDX\x00\x00\x05"
# magic, file size, mtime_ns, ctime_ns, inode, device, samples, flags, hash of the file's ends, long lines, marks,
# bytes indexed (the decompressed size of a compressed file), the size the entries' bits are set by, format
_HEADER = struct.Struct("<8sqqqQQqq16sqqqqq")
# A compressed file's entries are laid out as a file of this size's (its decompressed size is not
# known until its index is made): starts up to 1 TiB, lengths up to 8 MiB (longer ones in the table).
_COMPRESSED_BOUND = 1 << 40
_FORMATS = {Format.TEXT: 0, Format.GZIP: 1, Format.ZSTD: 2}
_FORMAT_OF = {code: fmt for fmt, code in _FORMATS.items()}
_SEAL_AT = _HEADER.size
_FLAG_ASCII = 1
_DATA_OFFSET = 128
_ENTRY = 8  # one sample: a little-endian uint64, start << bits | length
_PAIR = 16  # a long line (sample, length) or a mark (offset, line number): two little-endian int64
_SAMPLE = 1 << 16  # bytes hashed at each end of the file
_CHECK_ROWS = 1 << 12  # entries checked at each end of a cache when it is loaded
_BUILD_TRIES = 3
MAPPED_ROWS = 1 << 12  # a read of fewer samples may take their entries from a map of the cache (see _entries_map)
_MAPPED_MIN = 1 << 16  # entries (512 KiB) a cache holds at least to be mapped; smaller ones are a few reads
_MAPS = 16  # caches kept mapped by a process, newest last (each map holds a descriptor of its file)
_maps: dict[tuple[int, int, int, int], npt.NDArray[np.uint64]] = {}
_IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class FileKey:
    """What identifies a file's content without reading it: ``fstat`` fields that change with it."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileKey:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)

    def same_file(self, other: FileKey) -> bool:
        """Equal but for the device, which one file shared over NFS has a different one on each client
        (git leaves st_dev out of its index check for that reason): what a cache is matched on."""
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode) == (
            other.size,
            other.mtime_ns,
            other.ctime_ns,
            other.inode,
        )

    def matches(self, st: os.stat_result) -> bool:
        """Whether ``st`` is this file unchanged (the common case of :meth:`change`, without objects)."""
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev) == (
            self.size,
            self.mtime_ns,
            self.ctime_ns,
            self.inode,
            self.device,
        )

    def change(self, now: FileKey) -> str | None:
        """What differs between the file as indexed (``self``) and ``now``, in words; None if nothing."""
        if (now.inode, now.device) != (self.inode, self.device):
            return "it was replaced by another file (another inode)"
        if now.size != self.size:
            return f"its size changed from {self.size:,} to {now.size:,} bytes"
        if now.mtime_ns != self.mtime_ns:
            return "it was modified (its mtime changed)"
        if now.ctime_ns != self.ctime_ns:
            return "it was modified or its mtime was set back (its ctime changed)"
        return None


def length_bits(size: int) -> int:
    """The low bits of an entry that hold a sample's length in a file of ``size`` bytes; the high
    ``bit_length(size)`` bits hold its start."""
    return 64 - max(1, size.bit_length())


@dataclass(frozen=True)
class Table:
    """An index held in memory: the entries (uint64), the long lines ``(k, 2)`` (sample, length) and
    the marks ``(k, 2)`` (offset, line number), as in a cache file."""

    entries: npt.NDArray[np.uint64]
    longs: _IntArray
    marks: _IntArray
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
    """

    key: FileKey
    ends_hash: bytes
    count: int
    ascii: bool
    cache: Path | None
    memory: Table | None = field(default=None, compare=False, repr=False)
    format: Format = Format.TEXT
    extent: int = -1
    bound: int = -1
    parquet: ParquetLayout | None = None

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
        head = _Header(
            self.key, self.ends_hash, self.count, self.ascii, 0, 0, self.size, self.bits_size, self.format
        ).pack()
        return head[:40], head[48:80]

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "memory": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)


def hash_ends(fd: int, size: int) -> bytes:
    """A hash of the first and last 64 KiB of the file open at ``fd``, of size ``size``."""
    return hashlib.blake2b(read_ends(fd, size, _SAMPLE), digest_size=16).digest()


@dataclass(frozen=True)
class _Header:
    key: FileKey
    ends_hash: bytes
    count: int
    ascii: bool
    longs: int
    marks: int
    extent: int
    bound: int
    format: Format

    def pack(self) -> bytes:
        k = self.key
        flags = _FLAG_ASCII if self.ascii else 0
        return _HEADER.pack(
            _MAGIC, k.size, k.mtime_ns, k.ctime_ns, k.inode, k.device, self.count, flags, self.ends_hash, self.longs,
            self.marks, self.extent, self.bound, _FORMATS[self.format],
        )  # fmt: skip

    def describes(self, key: FileKey, ends_hash: bytes) -> bool:
        """Whether this is the header of an index of the file ``key`` and ``ends_hash`` identify."""
        return self.key.same_file(key) and self.ends_hash == ends_hash

    @property
    def longs_at(self) -> int:
        return _DATA_OFFSET + _ENTRY * self.count

    @property
    def marks_at(self) -> int:
        return self.longs_at + _PAIR * self.longs

    @property
    def extra_at(self) -> int:
        """Where a compressed file's checkpoints start (after the marks, to the cache's end)."""
        return self.marks_at + _PAIR * self.marks


def _read_header(fd: int) -> _Header | None:
    """The header of the cache open at ``fd``; None if it is not a valid one (or not a file)."""
    raw = np.empty(_HEADER.size, np.uint8)
    try:
        pread_exact(fd, raw, 0)
        length = os.fstat(fd).st_size
    except OSError:  # ShortRead; IsADirectoryError where the cache's path is a directory
        return None
    fields = _HEADER.unpack(raw.tobytes())
    magic, size, mtime, ctime, inode, device, count, flags, ends_hash, longs, marks, extent, bound, code = fields
    if magic != _MAGIC or code not in _FORMAT_OF or min(count, longs, marks, extent, bound) < 0:
        return None
    key = FileKey(size, mtime, ctime, inode, device)
    fmt = _FORMAT_OF[code]
    header = _Header(key, ends_hash, count, bool(flags & _FLAG_ASCII), longs, marks, extent, bound, fmt)
    if length < header.extra_at or (fmt is Format.TEXT and length != header.extra_at):
        return None
    return header


def _read_pairs(fd: int, offset: int, count: int) -> _IntArray:
    raw = np.empty(_PAIR * count, np.uint8)
    pread_exact(fd, raw, offset)
    return raw.view("<i8").astype(np.int64).reshape(-1, 2)


def decode(
    entries: npt.NDArray[np.uint64], local: _IntArray, size: int, longs: _IntArray
) -> tuple[_IntArray, _IntArray]:
    """``(starts, lengths)`` of samples ``local`` of a file of ``size`` bytes from their ``entries``
    and the file's long lines. A length the entry marks as long but the table does not hold is 0 (no
    sample has it: the index is damaged)."""
    bits = length_bits(size)
    mask = (1 << bits) - 1
    starts: _IntArray = np.right_shift(entries, np.uint64(bits)).view(np.int64)
    lengths: _IntArray = np.bitwise_and(entries, np.uint64(mask)).view(np.int64)
    rows = np.flatnonzero(lengths == mask) if longs.size or bits < 32 else np.empty(0, np.int64)
    if rows.size:
        at = np.minimum(np.searchsorted(longs[:, 0], local[rows]), max(len(longs) - 1, 0))
        found = longs[at, 0] == local[rows] if longs.size else np.zeros(rows.size, bool)
        lengths[rows] = np.where(found, longs[at, 1] if longs.size else 0, 0)
    return starts, lengths


def spans_are_sane(starts: _IntArray, lengths: _IntArray, size: int, *, ordered: bool = True) -> bool:
    """Whether these spans could be samples of a file of ``size`` bytes: non-empty, inside the file
    and (``ordered``: consecutive samples) increasing without overlap, as a newline separates them."""
    if not starts.size:
        return True
    if not (int(starts.min()) >= 0 and int(lengths.min()) > 0 and int((starts + lengths).max()) <= size):
        return False
    return not ordered or bool((starts[1:] > starts[:-1] + lengths[:-1]).all())


def _cache_is_sane(fd: int, header: _Header) -> bool:
    """Check the entries at each end of a cache (all of a small one): a cache that a crash or a bad
    disk left zeroed or torn is rebuilt instead of trusted. Spans are also checked, against the
    bytes they point at, whenever a shard is built from them."""
    count, size = header.count, header.extent
    blocks = [(0, min(count, _CHECK_ROWS))]
    if count > _CHECK_ROWS:
        blocks.append((max(_CHECK_ROWS, count - _CHECK_ROWS), count))
    try:
        longs = _read_pairs(fd, header.longs_at, header.longs)
        for lo, hi in blocks:
            raw = np.empty(_ENTRY * (hi - lo), np.uint8)
            pread_exact(fd, raw, _DATA_OFFSET + _ENTRY * lo)
            starts, lengths = decode(raw.view("<u8"), np.arange(lo, hi), header.bound, longs)
            if not spans_are_sane(starts, lengths, size):
                return False
    except ShortRead:
        return False
    return bool(longs.size == 0 or (np.diff(longs[:, 0]) > 0).all())


def _open_cache(cache: Path, key: FileKey, ends_hash: bytes) -> Index | None:
    """The index in ``cache`` if it describes the file ``key`` and ``ends_hash`` identify, is sealed
    (whole on disk) and is sane."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        header = _read_header(fd)
        if header is None or not header.describes(key, ends_hash) or os.pread(fd, len(SEAL), _SEAL_AT) != SEAL:
            return None
        if not _cache_is_sane(fd, header):
            return None
        return Index(key, ends_hash, header.count, header.ascii, cache, None, *_layout(header))
    finally:
        os.close(fd)


def _layout(header: _Header) -> tuple[Format, int, int]:
    """``(format, extent, bound)`` of an :class:`Index` from its cache's header (-1: the file's size)."""
    if header.format is Format.TEXT:
        return Format.TEXT, -1, -1
    return header.format, header.extent, header.bound


@dataclass(frozen=True)
class _Part:
    """One chunk of a scan, encoded: its entries, its long lines (row in the chunk, length), what
    else the index keeps."""

    entries: npt.NDArray[np.uint64]
    longs: _IntArray
    ascii: bool
    newlines: int
    marks: _IntArray


def _encoder(size: int) -> Callable[[Chunk], _Part]:
    bits = length_bits(size)
    mask = (1 << bits) - 1

    def encode(chunk: Chunk) -> _Part:
        # Spans lie inside their chunk: only a chunk of at least `mask` bytes can hold a long line.
        lengths = chunk.lengths
        rows: npt.NDArray[np.intp] = np.empty(0, np.intp)
        if chunk.nbytes >= mask:
            rows = np.flatnonzero(lengths >= mask)
            lengths = np.minimum(lengths, mask)
        # Starts and lengths are not negative: their int64 bits are their uint64 ones.
        entries = np.left_shift(chunk.starts.view(np.uint64), np.uint64(bits), out=np.empty(chunk.starts.size, "<u8"))
        entries |= lengths.view(np.uint64)
        return _Part(entries, np.column_stack((rows, chunk.lengths[rows])), chunk.ascii, chunk.newlines, chunk.marks)

    return encode


@dataclass(frozen=True)
class _Built:
    count: int
    ascii: bool
    longs: _IntArray
    marks: _IntArray
    format: Format = Format.TEXT
    extent: int = -1
    bound: int = -1
    extra: bytes = b""  # a compressed file's checkpoints

    def header(self, key: FileKey, ends_hash: bytes) -> _Header:
        extent = key.size if self.extent < 0 else self.extent
        bound = key.size if self.bound < 0 else self.bound
        return _Header(
            key, ends_hash, self.count, self.ascii, len(self.longs), len(self.marks), extent, bound, self.format
        )

    def index(self, key: FileKey, ends_hash: bytes, cache: Path | None, memory: Table | None = None) -> Index:
        return Index(key, ends_hash, self.count, self.ascii, cache, memory, self.format, self.extent, self.bound)


def _build(path: Path, fd: int, key: FileKey, write: Callable[[npt.NDArray[np.uint64]], object]) -> _Built:
    """Scan the file open at ``fd`` (which must stay the file ``key`` describes to the end), passing
    its entries to ``write`` in order; what else its index holds.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """
    count, lines, ascii_only = 0, 0, True
    longs: list[_IntArray] = []
    marks: list[_IntArray] = []
    fmt = detect(fd)
    if fmt is Format.PARQUET:  # (load_index reads a Parquet file's footer instead)
        raise ValueError(f"{path} is a Parquet file: its index is its footer, not a scan of its lines")
    decompression = None
    if fmt.compressed:  # the decompressed bytes are scanned as a plain file's are
        decompression = Decompression(path, fd, fmt)
        parts = scan_blocks(decompression, _encoder(_COMPRESSED_BOUND))
    else:
        fmt, parts = Format.TEXT, scan_map(path, _encoder(key.size), fd=fd)
    try:
        for part in parts:
            write(part.entries)
            longs.append(part.longs + np.array([count, 0]))
            marks.append(part.marks + np.array([0, lines]))
            count += part.entries.size
            lines += part.newlines
            ascii_only = ascii_only and part.ascii
    except ShortRead as exc:
        raise MetaFileChangedError(path, "it shrank while being indexed") from exc
    what = key.change(FileKey.of(os.fstat(fd)))
    if what is not None:
        raise MetaFileChangedError(path, f"{what} while being indexed")
    if decompression is not None:
        checkpoints = decompression.checkpoints
        if checkpoints.size > _COMPRESSED_BOUND:
            raise ValueError(
                f"{path} decompresses to {checkpoints.size:,} bytes; at most {_COMPRESSED_BOUND:,} are read"
            )
        return _Built(
            count, ascii_only, _stack(longs), _stack(marks), fmt, checkpoints.size, _COMPRESSED_BOUND,
            checkpoints.to_bytes(),
        )  # fmt: skip
    return _Built(count, ascii_only, _stack(longs), _stack(marks))


def _stack(parts: list[_IntArray]) -> _IntArray:
    return np.concatenate(parts).astype(np.int64) if parts else np.empty((0, 2), np.int64)


def _write_cache(cache: Path, path: Path, fd: int, key: FileKey, ends_hash: bytes) -> tuple[Index, Seal] | None:
    """Index the file open at ``fd`` straight into ``cache``; None if ``cache`` is not writable.

    The index goes to a temporary file that is renamed into place once written, and returned with
    what seals it: a sync of the file, then the seal written and synced, then the directory synced.
    Other processes load only a sealed cache (:func:`_open_cache`), so a crash at any point leaves
    the old cache, a sealed whole one, or one that is rebuilt: never a torn one trusted. The caller
    may use the index before it is sealed (its bytes are in the page cache), and so overlap the
    sync with its build.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """
    temp = temp_beside(cache)
    if temp is None:
        return None
    tmp_fd, tmp = temp
    f = os.fdopen(tmp_fd, "wb")
    syncer = Syncer(tmp_fd)
    try:
        f.seek(_DATA_OFFSET)
        built = _build(path, fd, key, lambda entries: syncer.wrote(f.write(entries.data)))
        f.write(built.longs.astype("<i8").tobytes())
        f.write(built.marks.astype("<i8").tobytes())
        f.write(built.extra)
        f.seek(0)
        f.write(built.header(key, ends_hash).pack())
        f.flush()
        os.replace(tmp, cache)
    except BaseException as exc:
        syncer.close()
        with contextlib.suppress(OSError):
            f.close()
        discard(None, tmp)
        if isinstance(exc, OSError):  # a full disk; a directory where the cache would go
            return None
        raise
    return built.index(key, ends_hash, cache), Seal(cache, f, syncer, built.count * _ENTRY, _SEAL_AT)


def _index_in_memory(path: Path, fd: int, key: FileKey, ends_hash: bytes) -> Index:
    parts: list[npt.NDArray[np.uint64]] = []
    built = _build(path, fd, key, parts.append)
    entries = np.concatenate(parts) if parts else np.empty(0, "<u8")
    return built.index(key, ends_hash, None, Table(entries, built.longs, built.marks, built.extra))


def _stamp(cache: Path) -> int | None:
    """What tells one write of ``cache`` from another: each is a new file renamed into place, so its
    inode (not its mtime, which the seal changes)."""
    try:
        return os.stat(cache).st_ino
    except OSError:
        return None


def _parquet_index(path: Path, fd: int, key: FileKey, ends_hash: bytes, columns: Sequence[str] | None) -> Index:
    """The index of the Parquet file open at ``fd``, from its footer (read through ``path``: the
    descriptor, checked after, tells whether that was still this file)."""
    rows = ParquetRows(path, columns)
    what = key.change(FileKey.of(os.fstat(fd)))
    if what is None and not key.matches(os.stat(path)):
        what = "it was replaced while its footer was read"
    if what is not None:
        raise MetaFileChangedError(path, f"{what} while being indexed")
    return Index(key, ends_hash, len(rows), False, None, None, Format.PARQUET, parquet=rows.layout)


def refuse_cut_parquet(path: Path, fd: int, fmt: Format) -> None:
    """Raise CorruptMetaFileError if the file open at ``fd``, told as ``fmt``, is a Parquet file cut
    short: told as text, it starts with Parquet's magic and is named ``.parquet`` or holds a NUL byte
    in its first 64 KiB (text does not). Read as text, its bytes would be taken for lines."""
    if fmt is not Format.TEXT:
        return
    head = os.pread(fd, _SAMPLE, 0)
    if head[:4] == b"PAR1" and (path.suffix.lower() == ".parquet" or b"\0" in head):
        raise CorruptMetaFileError(
            path, os.fstat(fd).st_size, "it starts as a Parquet file (PAR1) but ends without its footer (truncated?)"
        )


def check_columns(path: Path, fmt: Format, columns: Sequence[str] | None) -> None:
    """Raise ValueError if ``columns`` are given for ``path``, a file of format ``fmt``, which is not
    Parquet (its samples are its lines)."""
    if columns is not None and fmt is not Format.PARQUET:
        raise ValueError(
            f"columns= picks the columns of a Parquet meta file, and {path} is {fmt.value}: "
            "its samples are its lines; leave columns=None for it"
        )


def load_index(path: Path, *, rebuild: bool = False, columns: Sequence[str] | None = None) -> Index:
    """The index of ``path``: from its cache, else built (and cached where a location is writable).

    One process builds a missing cache while others that want it at the same time wait for it
    (:mod:`rank_dataset.files._cachelock`), then load it. With ``rebuild``, an existing cache is not
    trusted (it was found inconsistent with the file), unless another process wrote it anew since.
    A Parquet file's index is read from its footer (``columns``: its chosen columns, None for all).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        MetaFileChangedError: the file kept changing while it was being indexed.
        ValueError: ``columns`` for a file that is not Parquet; a Parquet column that is missing,
            nested or binary.
        CorruptMetaFileError: a Parquet footer cannot be read.
    """
    for attempt in range(_BUILD_TRIES):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            key = FileKey.of(os.fstat(fd))
            fmt = detect(fd)
            check_columns(path, fmt, columns)
            refuse_cut_parquet(path, fd, fmt)
            ends_hash = hash_ends(fd, key.size)
            if fmt is Format.PARQUET:
                try:
                    return _parquet_index(path, fd, key, ends_hash, columns)
                except MetaFileChangedError:
                    if attempt == _BUILD_TRIES - 1:
                        raise
                    continue
            candidates = cache_paths(path)
            for cache in candidates:
                wait_for_seal(cache)
            for cache in [] if rebuild else candidates:
                index = _open_cache(cache, key, ends_hash)
                if index is not None:
                    return index
            distrusted = {cache: _stamp(cache) for cache in candidates} if rebuild else {}
            try:
                for cache in candidates:
                    with contextlib.ExitStack() as held:
                        held.enter_context(one_builder(cache))
                        # Another process may have built it while this one waited for the lock.
                        if not rebuild or _stamp(cache) != distrusted[cache]:
                            index = _open_cache(cache, key, ends_hash)
                            if index is not None:
                                return index
                        written = _write_cache(cache, path, fd, key, ends_hash)
                        # The lock is held until the cache is sealed.
                        if written is not None and written[1].after(held.pop_all()):
                            return written[0]
                # No writable cache location: index in memory.
                return _index_in_memory(path, fd, key, ends_hash)
            except MetaFileChangedError:
                if attempt == _BUILD_TRIES - 1:
                    raise
        except ShortRead as exc:  # hashing the ends: the file shrank since fstat
            if attempt == _BUILD_TRIES - 1:
                raise MetaFileChangedError(path, "it shrank while being indexed") from exc
        finally:
            os.close(fd)
    raise AssertionError("unreachable")  # pragma: no cover


def read_entry(index: Index, local: int) -> tuple[int, int]:
    """``(start, length)`` of sample ``local`` of the file: for one sample, one read of the cache's
    header (checked) and one of its entry, nothing else.

    Raises:
        LookupError: as :class:`SpanReader`.
    """
    if index.cache is None or index.count <= local:
        with SpanReader(index) as reader:
            starts, lengths = reader.take(np.array([local], np.int64))
        return int(starts[0]), int(lengths[0])
    try:
        fd = os.open(index.cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LookupError(f"the index cache {index.cache} cannot be opened ({exc.strerror})") from None
    try:
        head, raw = os.pread(fd, _HEADER.size, 0), os.pread(fd, _ENTRY, _DATA_OFFSET + _ENTRY * local)
    finally:
        os.close(fd)
    # The header as a cache of this index writes it, the device aside (as FileKey.same_file).
    key_bytes, count_bytes = index.header_fields
    if len(raw) != _ENTRY or head[:40] != key_bytes or head[48:80] != count_bytes:
        raise LookupError(f"the index cache {index.cache} was replaced or damaged")
    entry, bits = int.from_bytes(raw, "little"), length_bits(index.bits_size)
    length = entry & ((1 << bits) - 1)
    if length == (1 << bits) - 1 and head[80:88] != bytes(8):  # a long line: its length is in the table
        with SpanReader(index) as reader:
            starts, lengths = reader.take(np.array([local], np.int64))
        return int(starts[0]), int(lengths[0])
    return entry >> bits, length


class SpanReader:
    """The spans of one file's samples while a shard is built: from the cache (open until
    :meth:`close`), reading only the pages of entries asked for, with positional reads into one
    reusable buffer (nothing is mapped, so a build's resident memory holds no more of the index than
    one batch's pages); or from memory. With ``mapped`` (for a small read: a batch of random samples),
    from the process's map of a large cache instead (see :func:`_entries_map`).

    Raises (from the constructor):
        LookupError: the cache is gone or no longer holds this index (its header differs), or the
            index was in another process's memory.
    """

    def __init__(self, index: Index, *, mapped: bool = False) -> None:
        self._index = index
        self._mapped = mapped
        self._fd: int | None = None
        self._table = index.memory
        self._window = Window()
        self._size = index.bits_size
        if index.cache is None:
            if index.memory is None:
                raise LookupError("the index was built in another process's memory")
            self._longs = index.memory.longs
            return
        try:
            self._fd = os.open(index.cache, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LookupError(f"the index cache {index.cache} cannot be opened ({exc.strerror})") from None
        header = _read_header(self._fd)
        if (
            header is None
            or not header.describes(index.key, index.ends_hash)
            or (header.count, header.ascii, header.extent, header.bound)
            != (index.count, index.ascii, index.size, index.bits_size)
        ):
            self.close()
            raise LookupError(f"the index cache {index.cache} was replaced or damaged")
        self._header = header
        self._longs = self._pairs(header.longs_at, header.longs)

    def _pairs(self, offset: int, count: int) -> _IntArray:
        assert self._fd is not None
        try:
            return _read_pairs(self._fd, offset, count)
        except ShortRead:
            raise LookupError(f"the index cache {self._index.cache} was damaged") from None

    def _damaged(self) -> LookupError:
        return LookupError(f"the index cache {self._index.cache} was damaged (shorter than its header says)")

    def take(self, local: _IntArray) -> tuple[_IntArray, _IntArray]:
        """``(starts, lengths)`` of samples ``local`` of the file (in range; best roughly ascending
        and close together, as one batch of a build: the pages from the lowest to the highest entry
        that some entry asked for are read)."""
        if self._table is not None:
            entries = self._table.entries[local]
        elif not local.size:
            entries = np.empty(0, "<u8")
        else:
            fd = self._fd
            assert fd is not None  # with no table, the constructor opened the cache
            if self._mapped and self._header.count >= _MAPPED_MIN:
                try:
                    entries = _entries_map(fd, self._header.count)[local]
                except ValueError:
                    raise self._damaged() from None
            else:
                at = _DATA_OFFSET + _ENTRY * local
                try:
                    buf, shift = self._window.load(fd, at, at + _ENTRY, self._header.longs_at)
                except ShortRead:
                    raise self._damaged() from None
                # Entries start at multiples of 8 in the file, and so in buf (runs start and end at entries).
                entries = buf[: buf.size - buf.size % _ENTRY].view("<u8")[(at - shift) // _ENTRY]
        return decode(entries, local, self._size, self._longs)

    def marks(self) -> _IntArray:
        """The file's marks: ``(k, 2)`` rows (offset, line number), by offset."""
        if self._table is not None:
            return self._table.marks
        return self._pairs(self._header.marks_at, self._header.marks)

    def checkpoints(self) -> Checkpoints:
        """A compressed file's checkpoints.

        Raises:
            LookupError: the cache holds none that can be read (damaged).
        """
        if self._table is not None:
            raw = self._table.extra
        else:
            assert self._fd is not None
            at = self._header.extra_at
            raw = os.pread(self._fd, os.fstat(self._fd).st_size - at, at)
        try:
            return Checkpoints.from_bytes(raw)
        except ValueError as exc:
            raise LookupError(f"the checkpoints in the index cache {self._index.cache} are damaged ({exc})") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entries_map(fd: int, count: int) -> npt.NDArray[np.uint64]:
    """The ``count`` entries of the sealed cache open at ``fd``, through a read-only map kept for the
    process's later small takes.

    A batch of random samples (a sampler's, at the meta server) would otherwise cost a ``pread`` an
    entry, as much as reading its line; mapped, it costs a page fault the first time a page is touched
    and nothing after. A cache is never written in place (a rebuild writes a new file and renames it),
    so a map stays the bytes it was checked as; keyed by the file's identity, a replaced cache is mapped
    anew. The pages are the page cache's, shared by every process that maps them; large takes (a
    shard's build) keep reading only the pages they need, and map nothing.
    """
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    entries = _maps.get(key)
    if entries is None:
        if len(_maps) >= _MAPS:
            del _maps[next(iter(_maps))]
        # Unmapped when the array goes (it holds the map's buffer).
        entries = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), "<u8", count=count, offset=_DATA_OFFSET)
        _maps[key] = entries
    return entries


def read_checkpoints(index: Index) -> Checkpoints:
    """The checkpoints of the compressed file ``index`` describes.

    Raises:
        LookupError: as :class:`SpanReader`, or none can be read.
    """
    with SpanReader(index) as reader:
        return reader.checkpoints()


def line_mark(marks: _IntArray, start: int) -> tuple[int, int]:
    """``(offset, line)`` of the last mark at or before byte ``start`` (line numbers from 0): the
    line number of ``start``'s line is ``line`` plus the newlines in ``[offset, start)``. ``(0, 0)``
    where the marks cannot be trusted (not increasing), so the count starts at the beginning."""
    if not marks.size or not (bool((np.diff(marks, axis=0) >= 0).all()) and marks[0, 0] >= 0 and marks[0, 1] >= 0):
        return 0, 0
    at = int(np.searchsorted(marks[:, 0], start, side="right")) - 1
    return (0, 0) if at < 0 else (int(marks[at, 0]), int(marks[at, 1]))
