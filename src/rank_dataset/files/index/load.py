"""The line-offset index of a meta file and its cache on disk.

The index of a file holds the byte span of each of its samples (see :mod:`rank_dataset.files.index.scan`) in
8 bytes: one little-endian uint64 ``start << bits | length``, where ``bits = 64 - bit_length(size)``
(a line too long for its field, which only a file over 4 GiB can hold, has an all-ones length and
its true length in a table of long lines). After the entries come that table and the file's marks:
where the first line after every 4 MiB starts and its line number, so that a sample's line number is
found by reading less than 4 MiB. It is cached beside the file (or in the user cache directory),
built by one process while others that want it wait (:mod:`rank_dataset.files.index.cachelock`), and
keyed by size, mtime, ctime and inode (``touch -r`` and ``cp -p`` cannot set ctime) and a hash of the
file's first and last 64 KiB. A build reads the entries it needs with positional reads
(:class:`SpanReader`), so that it holds no more of the index than one batch's pages; a small read (a
batch of random samples, as the meta server's) maps a large cache instead, once a process
(:func:`~rank_dataset.files.index._entries._entries_map`).

The parts: the cache file's format and :class:`Index` (:mod:`~rank_dataset.files.index._cachefile`), the
build (:mod:`~rank_dataset.files.index._build`), the readers (:mod:`~rank_dataset.files.index._entries`).
A Parquet file has no entries and no cache: its index (:class:`~rank_dataset.files.formats.ParquetLayout`)
is read from its footer each time, keeping the file's key and ends' hash as a cache would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import Format, detect_source, refuse_cut_source
from rank_dataset.files.index._cachefile import Index, Table, decode, length_bits, open_cache, spans_are_sane
from rank_dataset.files.index._entries import MAPPED_ROWS, SpanReader, line_mark, read_checkpoints, read_entry
from rank_dataset.files.index.cache import (
    CACHE_DIR_ENV,
    cache_paths,
    first_cache_path,
    object_cache_path,
    wait_for_seal,
)
from rank_dataset.files.io import ByteSource, FileKey, LocalFile, SourceKey, hash_ends, open_source
from rank_dataset.files.io.pread import ShortRead

if TYPE_CHECKING:
    from rank_dataset.files.formats import Checkpoints

__all__ = [
    "CACHE_DIR_ENV",
    "MAPPED_ROWS",
    "FileKey",
    "Index",
    "SpanReader",
    "Table",
    "check_columns",
    "checkpoints_of",
    "decode",
    "length_bits",
    "line_mark",
    "load_index",
    "read_checkpoints",
    "read_entry",
    "spans_are_sane",
]

_BUILD_TRIES = 3


def _rows_index(source: ByteSource, fmt: Format, ends_hash: bytes, columns: Sequence[str] | None) -> Index:
    """The index of the Parquet file ``source``, from its footer. A local file's footer is read through
    its path: its descriptor, checked after, tells whether that was still this file (an object's reads
    are pinned to its ETag)."""
    from rank_dataset.files.formats import source_rows  # on first use: a Parquet file's

    rows = source_rows(source, columns)
    path, key = source.path, source.key
    if isinstance(key, FileKey):
        what = key.change(FileKey.of(os.fstat(cast(LocalFile, source).fd)))
        if what is None and not key.matches(os.stat(path)):
            what = "it was replaced while its footer was read"
        if what is not None:
            raise MetaFileChangedError(path, f"{what} while being indexed")
    return Index(key, ends_hash, len(rows), False, None, None, fmt, parquet=rows.layout)


def check_columns(path: Path, fmt: Format, columns: Sequence[str] | None) -> None:
    """Raise ValueError if ``columns`` are given for ``path``, a file of format ``fmt``, which is not
    Parquet (its samples are its lines)."""
    if columns is not None and not fmt.rows:
        raise ValueError(
            f"columns= picks the columns of a Parquet meta file, and {path} is {fmt.value}: "
            "its samples are its lines; leave columns=None for it"
        )


def load_index(path: Path, *, distrust: Index | None = None, columns: Sequence[str] | None = None) -> Index:
    """The index of ``path``: from its cache, else built (and cached where a location is writable).

    One process builds a missing cache while others that want it at the same time wait for it
    (:mod:`rank_dataset.files.index.cachelock`), then load it. ``distrust`` is an index of ``path`` found
    inconsistent with it: the cache it was read from is rebuilt, unless another process wrote it anew since.
    A Parquet file's index is read from its footer (``columns``: its chosen columns, None for all). An
    object's is built by one streaming pass and cached on this node, never in the bucket (in memory
    where no cache directory is writable).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        PermissionError, OSError: an object cannot be had (naming its URL and the HTTP status).
        MetaFileChangedError: the file kept changing while it was being indexed (an object: it was
            replaced while it was being indexed).
        ValueError: ``columns`` for a file that is not Parquet; a Parquet column that is missing,
            nested or binary.
        CorruptMetaFileError: a Parquet footer cannot be read.
        ImportError: a Parquet object without pyarrow.
    """
    for attempt in range(_BUILD_TRIES):
        source = open_source(path)
        try:
            fmt = detect_source(source)
            check_columns(path, fmt, columns)
            refuse_cut_source(path, source, fmt)
            ends_hash = hash_ends(source)
            if fmt.rows:
                return _rows_index(source, fmt, ends_hash, columns)
            key = source.key
            # A cache sealed at the first place is the index, the build and its modules unneeded. An
            # object's index is cached on this node only.
            first = first_cache_path(path) if source.local else object_cache_path(str(path), key)
            wait_for_seal(first)
            index = open_cache(first, key, ends_hash, distrust)
            if index is not None:
                return index
            from rank_dataset.files.index._build import cached_index, index_in_memory  # on first use (see above)

            candidates = cache_paths(path) if source.local else [first]
            if not source.local:
                with contextlib.suppress(OSError):
                    first.parent.mkdir(parents=True, exist_ok=True)
            try:
                return cached_index(candidates, source, ends_hash, distrust=distrust, tried=first)
            except OSError:  # an object's cache directory is not writable: the lock cannot be taken either
                if source.local:
                    raise
                return index_in_memory(source, ends_hash)
        except MetaFileChangedError:  # a local file changed while it was indexed: indexed again
            if attempt == _BUILD_TRIES - 1 or not source.local:
                raise
        except ShortRead as exc:  # hashing the ends: the file shrank since fstat
            if attempt == _BUILD_TRIES - 1:
                raise MetaFileChangedError(path, "it shrank while being indexed") from exc
        finally:
            source.close()
    raise AssertionError("unreachable")  # pragma: no cover


def checkpoints_of(path: Path, key: SourceKey) -> Checkpoints:
    """The checkpoints of the compressed file ``path`` from its index (made if there is none), which
    must be of the file ``key`` describes.

    Raises:
        MetaFileChangedError: the file is no longer the one of ``key``.
    """
    index = load_index(path)
    try:
        checkpoints = read_checkpoints(index)
    except LookupError:  # the cache was removed or replaced meanwhile: the file's index as it is now
        index = load_index(path, distrust=index)
        checkpoints = read_checkpoints(index)
    what = key.change(index.key)
    if what is not None:
        raise MetaFileChangedError(path, what)
    return checkpoints
