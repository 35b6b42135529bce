"""The build of a meta file's index: one scan of its lines (of its decompressed bytes, for a
compressed file), straight into a cache file, or into memory."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import Int64Array, UInt64Array
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import TEXT, Decompression, Format, detect_source
from rank_dataset.files.index._cachefile import (
    DATA_OFFSET,
    ENTRY,
    SEAL_AT,
    Header,
    Index,
    Table,
    length_bits,
    open_cache,
)
from rank_dataset.files.index.cache import Seal, Syncer, discard, temp_beside, wait_for_seal
from rank_dataset.files.index.cachelock import load_or_build
from rank_dataset.files.index.scan import Chunk, scan_blocks, scan_map
from rank_dataset.files.io import ByteSource, FileKey, LocalFile, SourceKey
from rank_dataset.files.io.pread import ShortRead

# A compressed file's entries are laid out as a file of this size's (its decompressed size is not
# known until its index is made): starts up to 1 TiB, lengths up to 8 MiB (longer ones in the table).
_COMPRESSED_BOUND = 1 << 40
#: One INFO record a build of an index (``args``: the meta file, its lines, the cache file or None for one in
#: memory): what a node spent its start on, and what the multi-host bed counts builds by.
logger = logging.getLogger("rank_dataset.index")


@dataclass(frozen=True)
class _EncodedChunk:
    """One chunk of a scan, encoded: its entries, its long lines (row in the chunk, length), what
    else the index keeps."""

    entries: UInt64Array
    longs: Int64Array
    ascii: bool
    newlines: int
    marks: Int64Array


def _encoder(size: int) -> Callable[[Chunk], _EncodedChunk]:
    bits = length_bits(size)
    mask = (1 << bits) - 1

    def encode(chunk: Chunk) -> _EncodedChunk:
        # Spans lie inside their chunk: only a chunk of at least `mask` bytes can hold a long line.
        lengths = chunk.lengths
        rows: npt.NDArray[np.intp] = np.empty(0, np.intp)
        if chunk.nbytes >= mask:
            rows = np.flatnonzero(lengths >= mask)
            lengths = np.minimum(lengths, mask)
        # Starts and lengths are not negative: their int64 bits are their uint64 ones.
        entries = np.left_shift(chunk.starts.view(np.uint64), np.uint64(bits), out=np.empty(chunk.starts.size, "<u8"))
        entries |= lengths.view(np.uint64)
        return _EncodedChunk(
            entries, np.column_stack((rows, chunk.lengths[rows])), chunk.ascii, chunk.newlines, chunk.marks
        )

    return encode


@dataclass(frozen=True)
class _IndexBody:
    count: int
    ascii: bool
    longs: Int64Array
    marks: Int64Array
    format: Format = TEXT
    extent: int = -1
    bound: int = -1
    extra: bytes = b""  # a compressed file's checkpoints

    def header(self, key: SourceKey, ends_hash: bytes) -> Header:
        extent = key.size if self.extent < 0 else self.extent
        bound = key.size if self.bound < 0 else self.bound
        return Header.of(
            key, ends_hash, self.count, self.ascii, len(self.longs), len(self.marks), extent, bound, self.format
        )

    def index(
        self, key: SourceKey, ends_hash: bytes, cache: Path | None, memory: Table | None = None, inode: int = -1
    ) -> Index:
        return Index(
            key, ends_hash, self.count, self.ascii, cache, memory, self.format, self.extent, self.bound,
            cache_inode=inode,
        )  # fmt: skip


def _scan(source: ByteSource, write: Callable[[UInt64Array], object]) -> _IndexBody:
    """Scan the lines of ``source`` (a compressed file's decompressed ones), which must stay the file its
    key describes to the end, passing its entries to ``write`` in order; what else its index holds.
    A local file's chunks are read by the scanning threads; an object's bytes are streamed once, in
    large ranged GETs each pinned to its ETag, so that a change is an error rather than a torn index.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """
    path, key = source.path, source.key
    fd = cast(LocalFile, source).fd if source.local else None
    fmt = detect_source(source)
    if fmt.rows:  # (load_index reads a Parquet file's footer instead)
        raise ValueError(f"{path} is a Parquet file: its index is its footer, not a scan of its lines")
    decompression = None
    if fmt.compressed:  # the decompressed bytes are scanned as a plain file's are
        decompression = Decompression(path, source if fd is None else fd, fmt)
        parts = scan_blocks(decompression, _encoder(_COMPRESSED_BOUND))
    elif fd is None:
        parts = scan_blocks(source.stream(), _encoder(key.size))
    else:
        parts = scan_map(path, _encoder(key.size), fd=fd)
    try:
        built = _collect(path, parts, write, fmt, decompression)
    except ShortRead as exc:
        raise MetaFileChangedError(path, "it shrank while being indexed") from exc
    if fd is None:
        source.check()
        return built
    what = key.change(FileKey.of(os.fstat(fd)))
    if what is not None:
        raise MetaFileChangedError(path, f"{what} while being indexed")
    return built


def _collect(
    path: Path,
    parts: Iterable[Any],
    write: Callable[[UInt64Array], object],
    fmt: Format,
    decompression: Decompression | None,
) -> _IndexBody:
    """Pass the scanned ``parts``' entries to ``write`` in order; what else the index holds (for a
    compressed file, its checkpoints once the decompression has ended)."""
    count, lines, ascii_only = 0, 0, True
    longs: list[Int64Array] = []
    marks: list[Int64Array] = []
    for part in parts:
        write(part.entries)
        longs.append(part.longs + np.array([count, 0]))
        marks.append(part.marks + np.array([0, lines]))
        count += part.entries.size
        lines += part.newlines
        ascii_only = ascii_only and part.ascii
    if decompression is None:
        return _IndexBody(count, ascii_only, _stack(longs), _stack(marks))
    checkpoints = decompression.checkpoints
    if checkpoints.size > _COMPRESSED_BOUND:
        raise ValueError(f"{path} decompresses to {checkpoints.size:,} bytes; at most {_COMPRESSED_BOUND:,} are read")
    return _IndexBody(
        count, ascii_only, _stack(longs), _stack(marks), fmt, checkpoints.size, _COMPRESSED_BOUND,
        checkpoints.to_bytes(),
    )  # fmt: skip


def _stack(parts: list[Int64Array]) -> Int64Array:
    return np.concatenate(parts).astype(np.int64) if parts else np.empty((0, 2), np.int64)


def write_cache(cache: Path, source: ByteSource, ends_hash: bytes) -> tuple[Index, Seal] | None:
    """Index ``source`` straight into ``cache``; None if ``cache`` is not writable.

    The index goes to a temporary file that is renamed into place once written, and returned with
    what seals it: a sync of the file, then the seal written and synced, then the directory synced.
    Other processes load only a sealed cache (:func:`open_cache`), so a crash at any point leaves
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
        f.seek(DATA_OFFSET)
        built = _scan(source, lambda entries: syncer.wrote(f.write(entries.data)))
        f.write(built.longs.astype("<i8").tobytes())
        f.write(built.marks.astype("<i8").tobytes())
        f.write(built.extra)
        f.seek(0)
        f.write(built.header(source.key, ends_hash).pack())
        f.flush()
        os.replace(tmp, cache)
        logger.info("built the index of %s (%d lines) into %s", source.path, built.count, cache)
    except BaseException as exc:
        syncer.close()
        with contextlib.suppress(OSError):
            f.close()
        discard(None, tmp)
        if isinstance(exc, OSError):  # a full disk; a directory where the cache would go
            return None
        raise
    index = built.index(source.key, ends_hash, cache, inode=os.fstat(tmp_fd).st_ino)
    return index, Seal(cache, f, syncer, built.count * ENTRY, SEAL_AT)


def index_in_memory(source: ByteSource, ends_hash: bytes) -> Index:
    parts: list[UInt64Array] = []
    built = _scan(source, parts.append)
    entries = np.concatenate(parts) if parts else np.empty(0, "<u8")
    logger.info("built the index of %s (%d lines) into %s", source.path, built.count, None)
    return built.index(source.key, ends_hash, None, Table(entries, built.longs, built.marks, built.extra))


def cached_index(
    candidates: list[Path],
    source: ByteSource,
    ends_hash: bytes,
    *,
    distrust: Index | None,
    tried: Path | None = None,
) -> Index:
    """The index of ``source``, its key and ``ends_hash`` its identity: from the first of the
    ``candidates`` caches that holds it, else built into the first writable one (one process builds
    while the others wait, the lock held until the cache is sealed), else in memory. The cache
    ``distrust`` was read from (found inconsistent with the file) is not loaded again; one written
    anew since, by any process, is. ``tried``: a candidate the caller has waited for and found
    without the index, not opened again before its lock is held.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """

    def load(cache: Path) -> Index | None:
        return open_cache(cache, source.key, ends_hash, distrust)

    def build(held: contextlib.ExitStack, cache: Path) -> Index | None:
        written = write_cache(cache, source, ends_hash)
        return written[0] if written is not None and written[1].after(held.pop_all()) else None

    for cache in candidates:
        if cache != tried:
            wait_for_seal(cache)
    index = load_or_build(candidates, load, build, tried=tried)
    if index is not None:
        return index
    return index_in_memory(source, ends_hash)
