"""The cache of a grouping: beside the index, keyed like it (the file's key and the hash of its
ends), written once by one process, memory-mapped by all.

The file: a 128-byte header (magic, the file's key, the number of samples and keys, how the keys are
stored), then the ``C + 1`` int64 bounds of the groups, the keys (``C`` int64 or UTF-8 JSON), and the
``N`` int64 sample numbers, group after group.

Columns of one uint32 a sample (``sizes_of``'s widths and heights) are cached the same way, in a file of the
same header (its own magic) followed by the columns.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt32Array
from rank_dataset.core.checks import is_url
from rank_dataset.files.group._labels import Grouping, Place
from rank_dataset.files.index.cache import cache_paths, discard, fsync_dir, temp_beside
from rank_dataset.files.index.load import Index
from rank_dataset.files.io.pread import pread_exact

_MAGIC = b"RDGRP\x00\x00\x02"
# magic, file size, the key's digest (SourceKey.digest), samples, keys, key bytes, key format, content sample
_HEADER = struct.Struct("<8sq24s8xqqqq16s")
_DATA_OFFSET = 128
_INT_KEYS, _JSON_KEYS = 0, 1


def cache_candidates(path: Path, index: Index, name: str, ext: str = "rdgrp") -> list[Path]:
    """Where the grouping (``ext="rdcol"``: the columns) ``name`` of ``path`` may be cached: beside each
    place its index may be; an object's beside its index in this node's cache only (never in the bucket)."""
    if is_url(path):
        return [] if index.cache is None else [index.cache.with_suffix(f".{name}.{ext}")]
    return [cache.with_suffix(f".{name}.{ext}") for cache in cache_paths(path)]


def open_cache(cache: Path, index: Index) -> Grouping | None:
    """The grouping in ``cache`` if it is one of the file ``index`` describes, and whole; else None."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = np.empty(_HEADER.size, np.uint8)
        pread_exact(fd, raw, 0)
        nkeys, key_bytes, form = _fields(raw.tobytes(), _MAGIC, index)
        count = index.count
        if not 1 <= nkeys <= count or form not in (_INT_KEYS, _JSON_KEYS):
            return None
        order_at = _order_offset(nkeys, key_bytes)
        if os.fstat(fd).st_size != order_at + 8 * count:
            return None
        head = np.empty(order_at - _DATA_OFFSET, np.uint8)
        pread_exact(fd, head, _DATA_OFFSET)
        bounds = head[: 8 * (nkeys + 1)].view("<i8").astype(np.int64)
        if bounds[0] != 0 or bounds[-1] != count or not bool((np.diff(bounds) > 0).all()):
            return None
        key_part = head[8 * (nkeys + 1) : 8 * (nkeys + 1) + key_bytes]
        keys = key_part.view("<i8").tolist() if form == _INT_KEYS else _decode_keys(key_part.tobytes())
        if keys is None or len(keys) != nkeys:
            return None
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)
    order = np.memmap(cache, dtype="<i8", mode="r", offset=order_at, shape=(count,))
    if not (0 <= int(order[0]) < count and 0 <= int(order[-1]) < count):
        return None
    return Grouping(keys, bounds, order)


def _fields(raw: bytes, magic: bytes, index: Index) -> tuple[int, int, int]:
    """The three fields of a cache's header after the file's (its keys' or columns' number, its key
    bytes, its form), if it is ``magic``'s of the file ``index`` describes; else ValueError."""
    found, size, digest, count, *fields, sample = _HEADER.unpack(raw)
    key = index.key
    if (found, size, digest, count, sample) != (magic, key.size, key.digest(), index.count, index.ends_hash):
        raise ValueError("a cache of another file")
    return fields[0], fields[1], fields[2]


def _header(magic: bytes, index: Index, n: int, key_bytes: int, form: int) -> bytes:
    """The header :func:`_fields` reads, padded to the data's offset."""
    key = index.key
    header = _HEADER.pack(magic, key.size, key.digest(), index.count, n, key_bytes, form, index.ends_hash)
    return header.ljust(_DATA_OFFSET, b"\0")


def _order_offset(nkeys: int, key_bytes: int) -> int:
    return _DATA_OFFSET + 8 * (nkeys + 1) + -(-key_bytes // 8) * 8


def write_cache(cache: Path, index: Index, group: Callable[[Place], Grouping]) -> Grouping | None:
    """Group the file into ``cache`` (a temporary file renamed into place, as the index is); None if
    ``cache`` cannot be written.

    The sample numbers are placed straight into a shared map of the temporary file, its space
    reserved first (so that writing the map cannot fail): no copy of them in memory, no write of
    them to the file (which costs more than the grouping's parsing on some kernels)."""
    temp = temp_beside(cache)
    if temp is None:
        return None
    tmp_fd, tmp = temp
    maps: list[mmap.mmap] = []
    written: list[Grouping] = []

    def place(keys: list[Any], bounds: Int64Array) -> Int64Array:
        if all(type(k) is int and -(1 << 63) <= k < 1 << 63 for k in keys):
            form, key_part = _INT_KEYS, np.asarray(keys, "<i8").tobytes()
        else:
            form, key_part = _JSON_KEYS, _encode_keys(keys)
        head = _header(_MAGIC, index, len(keys), len(key_part), form) + bounds.astype("<i8").tobytes()
        head += key_part.ljust(-(-len(key_part) // 8) * 8, b"\0")
        size = len(head) + 8 * index.count
        try:
            os.posix_fallocate(tmp_fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            written.append(Grouping(keys, bounds, np.empty(index.count, np.int64)))  # write it afterwards
            return written[0].order
        os.pwrite(tmp_fd, head, 0)
        maps.append(mmap.mmap(tmp_fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE))
        return np.frombuffer(maps[0], "<i8", count=index.count, offset=len(head))

    def write() -> None:
        grouping = group(place)
        del grouping
        if maps:
            maps[0].flush()
            maps[0].close()  # no view of it is left
        else:
            with open(tmp_fd, "ab", closefd=False) as f:
                f.write(written[0].order.astype("<i8", copy=False).data)
            written.clear()

    return open_cache(cache, index) if _commit(tmp_fd, tmp, cache, write) else None


def _commit(fd: int, tmp: str, cache: Path, write: Callable[[], None]) -> bool:
    """``write`` the temporary file ``tmp`` (open at ``fd``), sync it and rename it to ``cache``; False, the
    temporary file removed, if an OSError stops that (any other error is raised, the file removed too)."""
    try:
        write()
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, cache)
        fsync_dir(cache.parent)
    except OSError:
        discard(fd, tmp)
        return False
    except BaseException:
        discard(fd, tmp)
        raise
    return True


def _encode_keys(keys: Sequence[Any]) -> bytes:
    def tag(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, tuple):
            return {"t": [tag(v) for v in value]}
        raise TypeError(
            f"a key to be cached must be an int, float, str, bool, None or a tuple of those, got {value!r} "
            f"({type(value).__name__}); return one of those, or leave cache_name unset"
        )

    return json.dumps([tag(k) for k in keys], allow_nan=True).encode()


def _decode_keys(data: bytes) -> list[Any] | None:
    def untag(value: Any) -> Any:
        return tuple(untag(v) for v in value["t"]) if isinstance(value, dict) else value

    try:
        keys = json.loads(data)
    except ValueError:
        return None
    return [untag(k) for k in keys] if isinstance(keys, list) else None


# Columns of uint32, one value a sample each (sizes_of): the grouping's header with its own magic, the number of
# columns where a grouping has its number of keys, then the columns one after another.
_COLUMNS_MAGIC = b"RDCOL\x00\x00\x01"
_UINT32_COLUMNS = 2


def open_columns(cache: Path, index: Index, ncols: int) -> UInt32Array | None:
    """The ``(ncols, N)`` read-only uint32 columns in ``cache``, memory-mapped, if they are of the file ``index``
    describes and whole; else None."""
    count = index.count
    try:
        with open(cache, "rb") as f:
            cols, _, form = _fields(f.read(_HEADER.size), _COLUMNS_MAGIC, index)
            whole = os.fstat(f.fileno()).st_size == _DATA_OFFSET + 4 * ncols * count
    except (OSError, ValueError, struct.error):
        return None
    if (cols, form) != (ncols, _UINT32_COLUMNS) or not whole:
        return None
    columns: UInt32Array = np.memmap(cache, "<u4", mode="r", offset=_DATA_OFFSET, shape=(ncols, count))
    return columns


#: ``put(row, first, values)``: ``values`` into column ``row`` of the columns being filled, from sample ``first`` on.
Put = Callable[[int, int, UInt32Array], None]


def write_columns(
    cache: Path, index: Index, ncols: int, fill: Callable[[UInt32Array, Put], None]
) -> UInt32Array | None:
    """``fill(columns, put)`` the ``(ncols, N)`` uint32 columns of the file ``index`` describes, in a temporary file
    beside ``cache`` renamed into place once whole (as a grouping is): ``columns`` a shared map of it, ``put`` a
    write into it (runs of values, with no page faults on the map); the columns as :func:`open_columns` maps them,
    or None if ``cache`` cannot be written."""
    temp = temp_beside(cache)
    if temp is None:
        return None
    fd, tmp = temp
    header = _header(_COLUMNS_MAGIC, index, ncols, 0, _UINT32_COLUMNS)
    size = _DATA_OFFSET + 4 * ncols * index.count

    def write() -> None:
        os.ftruncate(fd, size)
        os.pwrite(fd, header, 0)
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            view = np.frombuffer(mapped, "<u4", count=ncols * index.count, offset=_DATA_OFFSET)

            def put(row: int, first: int, values: UInt32Array) -> None:
                data = np.ascontiguousarray(values, "<u4").data.cast("B")
                if not (0 <= row < ncols and 0 <= first <= first + len(data) // 4 <= index.count):
                    raise ValueError(f"{len(data) // 4} values from sample {first} of column {row} do not fit")
                at = _DATA_OFFSET + 4 * (row * index.count + first)
                while data:  # a regular file's write is whole but for an error; loop all the same
                    done = os.pwrite(fd, data, at)
                    data, at = data[done:], at + done

            fill(view.reshape(ncols, index.count), put)
            del view
            mapped.flush()
        finally:
            with contextlib.suppress(BufferError):
                mapped.close()

    return open_columns(cache, index, ncols) if _commit(fd, tmp, cache, write) else None
