"""The samples of a meta file grouped by a key (its label, or any function of its line), cached. No torch.

:func:`group_by` reads the file once and returns for each key the ascending sample numbers that
have it: ``key="label"`` reads the file's bytes in blocks, parsed and sorted in numpy in two threads
(:mod:`rank_dataset.files._labels`); a function of the line is called on each line, read through the
line-offset index. The result is cached beside the index and keyed like it (the
file's size, mtime, ctime, inode and a hash of its ends): a changed file is grouped again, and of
many processes that ask at once (the ranks of a node at job start), one builds the cache while the
others wait for it (:mod:`rank_dataset.files._cachelock`). A cached grouping is memory-mapped, so the
ranks of a node share one copy of it in the page cache.

A gzip or zstd meta file is grouped as the plain file of its decompressed bytes, read front to back
in one checked decompression (:func:`~rank_dataset.files.formats.decompress`, no checkpoint needed):
its cost is about one decompression of the file.

The cache file: a 128-byte header (magic, the file's key, the number of samples and keys, how the keys
are stored), then the ``C + 1`` int64 bounds of the groups, the keys (``C`` int64 or UTF-8 JSON), and
the ``N`` int64 sample numbers, group after group.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import mmap
import os
import re
import struct
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import meta_path
from rank_dataset.core.parsers import LineError, parse_label, quote
from rank_dataset.core.progress import progress_bar
from rank_dataset.core.shard import copy_rows
from rank_dataset.core.threads import THREADS
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files._cache import cache_paths, discard, fsync_dir, temp_beside
from rank_dataset.files._cachelock import load_or_build
from rank_dataset.files._labels import PAD, BlockLabels, block_labels
from rank_dataset.files._parquet import ParquetRows
from rank_dataset.files._pread import ShortRead, count_newlines, pread_exact
from rank_dataset.files.formats import DecompressedView, Format, decompress
from rank_dataset.files.index import FileKey, Index, SpanReader, line_mark, load_index
from rank_dataset.files.metafile import _FileBytes
from rank_dataset.files.scan import PathLike, _chunk_bounds

__all__ = ["group_by"]

Key = Callable[[str], Hashable]

_MAGIC = b"RDGRP\x00\x00\x01"
# magic, file size, mtime_ns, ctime_ns, inode, device, samples, keys, key bytes, key format, content sample
_HEADER = struct.Struct("<8sqqqQQqqqq16s")
_DATA_OFFSET = 128
_INT_KEYS, _JSON_KEYS = 0, 1
_BLOCK = 1 << 20  # lines read at a time for a function key
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NEWLINE, _CR = 10, 13
_CHUNK = 8 << 20  # bytes of the file parsed at a time for key="label": a block's temporaries stay in cache
_STREAM_BLOCK = 4 << 20  # decompressed bytes a compressed file's decoder hands out at a time


def group_by(meta_file: PathLike, key: str | Key = "label", *, cache_name: str | None = None) -> dict[Any, np.ndarray]:
    """The sample numbers of ``meta_file`` grouped by ``key``: ``{key: ascending int64 sample numbers}``.

    Args:
        meta_file: the path of a meta file: text, gzip or zstd (read in one decompression, the
            results those of the plain file of the same lines), or Parquet (each row a sample, its
            line all its columns joined by tabs). Sample numbers are 0-based, as
            ``RankDataset(meta_file)`` numbers them (blank lines of a text file are not samples).
        key: ``"label"``, the integer after a line's last run of whitespace (what the ``"label"``
            parser returns as the label), read from the bytes in numpy; or a function of the line's
            text returning a hashable key, called once per line in Python (a progress bar on a
            terminal, in the first process of a node).
        cache_name: with a function ``key``, the name its grouping is cached under (letters, digits,
            ``_`` and ``-``; not ``"label"``); without one it is computed anew on each call. Keep a
            name for one function: a cache is matched on the file, not on the function.

    Returns:
        A dict in ascending key order (in order of first appearance where the keys cannot be ordered);
        each value a read-only int64 array (a view of the memory-mapped cache when cached). The values
        partition ``range(N)``.

    Raises:
        FileNotFoundError: ``meta_file`` does not exist.
        ValueError: a line has no integer label (``key="label"``; the message names the file and line),
            the file holds no sample, or ``cache_name`` is invalid.
        TypeError: ``key`` returned an unhashable value (naming the line), or a key to be cached is not
            an int, float, str, bool or None, or a tuple of those.

    Memory: about 12 bytes a sample while grouping by label (the result's 8, and 4 for each block's order until it
    is placed; the result is a map of the cache file where there is one), and nothing once cached but the shared map.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a.jpg 3\\nb.jpg 1\\nc.jpg 3\\n")
        >>> {k: v.tolist() for k, v in group_by(p).items()}
        {1: [1], 3: [0, 2]}
        >>> {k: v.tolist() for k, v in group_by(p, key=lambda line: line[0]).items()}
        {'a': [0], 'b': [1], 'c': [2]}
    """
    return grouping_of(meta_file, key, cache_name).as_dict()


def grouping_of(meta_file: PathLike, key: str | Key = "label", cache_name: str | None = None) -> Grouping:
    """:func:`group_by`'s grouping as one :class:`Grouping` (its groups slices of one array)."""
    if not isinstance(meta_file, (str, os.PathLike)):
        raise TypeError(f"meta_file must be a path, got {meta_file!r} ({type(meta_file).__name__})")
    if key == "label":
        if cache_name is not None:
            raise ValueError(f'cache_name is for a function key; key="label" is cached as "label", got {cache_name!r}')
        name: str | None = "label"
    elif callable(key):
        if cache_name is not None and (not isinstance(cache_name, str) or not _NAME.fullmatch(cache_name)):
            raise ValueError(f"cache_name must be 1-64 letters, digits, '_' or '-', got {cache_name!r}")
        if cache_name == "label":
            raise ValueError('cache_name "label" is the cache of key="label": choose another name')
        name = cache_name
    else:
        raise ValueError(f'key must be "label" or a function of the line returning a hashable, got {key!r}')
    path = meta_path(meta_file)
    index = load_index(path)
    if index.count == 0:
        raise ValueError(f"no samples in {path}: every line is empty or whitespace")
    return _load_or_group(path, index, key, name)


@dataclass(frozen=True)
class Grouping:
    """Keys in order, the ``C + 1`` bounds of their groups, and the sample numbers group after group."""

    keys: list[Any]
    bounds: npt.NDArray[np.int64]
    order: npt.NDArray[np.int64]

    def as_dict(self) -> dict[Any, np.ndarray]:
        """``{key: its sample numbers}``, each a read-only view of :attr:`order`."""
        self.order.flags.writeable = False
        bounds = self.bounds.tolist()
        return {k: self.order[a:b] for k, a, b in zip(self.keys, bounds, bounds[1:])}


def _cache_candidates(path: Path, name: str) -> list[Path]:
    """Where the grouping ``name`` of ``path`` may be cached: beside each place its index may be."""
    return [cache.with_suffix(f".{name}.rdgrp") for cache in cache_paths(path)]


def _load_or_group(path: Path, index: Index, key: str | Key, name: str | None) -> Grouping:
    if name is None:
        return _group(path, index, key)
    candidates = _cache_candidates(path, name)
    for cache in candidates:
        found = _open_cache(cache, index)
        if found is not None:
            return found
    for cache in candidates:

        def load(cache: Path = cache) -> Grouping | None:
            return _open_cache(cache, index)

        def build(cache: Path = cache) -> Grouping | None:
            return _write_cache(cache, path, index, key)

        built = load_or_build(cache, load, build)
        if built is not None:
            return built
    return _group(path, index, key)  # no writable cache location


# ---------------------------------------------------------------------------------------------------
# The cache


def _open_cache(cache: Path, index: Index) -> Grouping | None:
    """The grouping in ``cache`` if it is one of the file ``index`` describes, and whole; else None."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = np.empty(_HEADER.size, np.uint8)
        pread_exact(fd, raw, 0)
        magic, size, mtime, ctime, inode, device, count, nkeys, key_bytes, form, sample = _HEADER.unpack(raw.tobytes())
        if (
            magic != _MAGIC
            or not FileKey(size, mtime, ctime, inode, device).same_file(index.key)
            or sample != index.ends_hash
            or count != index.count
            or not 1 <= nkeys <= count
            or form not in (_INT_KEYS, _JSON_KEYS)
        ):
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


def _order_offset(nkeys: int, key_bytes: int) -> int:
    return _DATA_OFFSET + 8 * (nkeys + 1) + -(-key_bytes // 8) * 8


def _write_cache(cache: Path, path: Path, index: Index, key: str | Key) -> Grouping | None:
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

    def place(keys: list[Any], bounds: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if all(type(k) is int and -(1 << 63) <= k < 1 << 63 for k in keys):
            form, key_part = _INT_KEYS, np.asarray(keys, "<i8").tobytes()
        else:
            form, key_part = _JSON_KEYS, _encode_keys(keys)
        k = index.key
        header = _HEADER.pack(
            _MAGIC, k.size, k.mtime_ns, k.ctime_ns, k.inode, k.device, index.count, len(keys), len(key_part), form,
            index.ends_hash,
        )  # fmt: skip
        head = header.ljust(_DATA_OFFSET, b"\0") + bounds.astype("<i8").tobytes()
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

    try:
        grouping = _group(path, index, key, place)
        del grouping
        if maps:
            maps[0].flush()
            maps[0].close()  # no view of it is left
        else:
            with open(tmp_fd, "ab", closefd=False) as f:
                f.write(written[0].order.astype("<i8", copy=False).data)
            written.clear()
        os.fsync(tmp_fd)
        os.close(tmp_fd)
        os.replace(tmp, cache)
        fsync_dir(cache.parent)
    except OSError:
        discard(tmp_fd, tmp)
        return None
    except BaseException:
        discard(tmp_fd, tmp)
        raise
    return _open_cache(cache, index)


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


# ---------------------------------------------------------------------------------------------------
# One pass over the file


class _Stream:
    """The decompressed bytes of a compressed meta file, read front to back: one checked
    decompression (:func:`~rank_dataset.files.formats.decompress`), of which only the bytes not yet
    passed are held. A grouping reads the whole file in order, so it needs no checkpoint: one pass
    costs one decompression, as the index's did."""

    def __init__(self, path: Path, fd: int, fmt: Format) -> None:
        self._blocks = decompress(path, fd, fmt, block=_STREAM_BLOCK)
        self._held = bytearray()
        self._base = 0  # the offset of _held[0]

    def read_into(self, out: npt.NDArray[np.uint8], lo: int) -> None:
        """Fill ``out`` with bytes ``[lo, lo + out.size)``; ``lo`` never below an earlier read's.

        Raises:
            ShortRead: the decompressed bytes end first.
        """
        if lo < self._base:
            raise ValueError(f"the decompressed bytes are read in order: byte {lo:,} is behind {self._base:,}")
        hi = lo + out.size
        while self._base + len(self._held) < hi:
            piece = next(self._blocks, None)
            if piece is None:
                raise ShortRead(hi)
            self._held += piece
        del self._held[: lo - self._base]
        self._base = lo
        out[:] = np.frombuffer(self._held, np.uint8, out.size)

    def chunks(self, size: int) -> Iterator[tuple[int, memoryview]]:
        """``(offset, bytes)`` of the decompressed bytes in consecutive pieces of about ``size``, each
        ending just past a newline (the last at the end of the file)."""
        offset, parts, held = 0, [bytes(self._held)] if self._held else [], len(self._held)
        self._held.clear()
        for block in self._blocks:
            parts.append(block)
            held += len(block)
            if held < size:
                continue
            data = b"".join(parts)
            cut = data.rfind(b"\n") + 1
            if not cut:  # one line longer than size: read on
                parts = [data]
                continue
            yield offset, memoryview(data)[:cut]
            offset += cut
            parts, held = [data[cut:]], len(data) - cut
        if held:
            yield offset, memoryview(b"".join(parts))


class _Lines:
    """The lines of an indexed file, a block of samples at a time, checked against the file (against
    its decompressed bytes, for a compressed file)."""

    def __init__(self, path: Path, index: Index, fd: int) -> None:
        self.path, self.index, self.fd = path, index, fd
        self.stream = _Stream(path, fd, index.format) if index.format.compressed else None

    def read_into(self, out: npt.NDArray[np.uint8], lo: int) -> None:
        """Fill ``out`` with bytes ``[lo, lo + out.size)`` of the file (decompressed), in order.

        Raises:
            ShortRead: the file ends first.
        """
        if self.stream is None:
            pread_exact(self.fd, out, lo)
        else:
            self.stream.read_into(out, lo)

    def blocks(self) -> Iterator[tuple[int, int, npt.NDArray[np.uint8], npt.NDArray[np.int64]]]:
        """Yield ``(first, base, buf, spans)``: samples ``first ..`` are ``buf[spans[i, 0]:spans[i, 1]]``,
        and ``buf[j]`` is byte ``base + j`` of the file; ``buf`` has :data:`~rank_dataset.files._labels.PAD`
        bytes before the first sample."""
        n, size = self.index.count, self.index.size
        try:
            with SpanReader(self.index) as reader:
                for first in range(0, n, _BLOCK):
                    starts, lengths = reader.take(np.arange(first, min(first + _BLOCK, n), dtype=np.int64))
                    spans = np.stack([starts, starts + lengths], axis=1).astype(np.int64, copy=False)
                    lo, hi = int(spans[0, 0]), int(spans[-1, 1])
                    # The byte after the last line too (its newline, if any), so every line's end is checked.
                    stop = min(hi + 1, size)
                    buf = np.empty(PAD + stop - lo + 1, np.uint8)
                    buf[:PAD] = _NEWLINE
                    buf[-1] = _NEWLINE
                    self.read_into(buf[PAD : PAD + stop - lo], lo)
                    spans += PAD - lo
                    # A line ends at a newline, a "\r\n" or the end of the file: anything else is an index
                    # that no longer describes the bytes.
                    after = buf[spans[:, 1]]
                    if not (
                        bool(((after == _NEWLINE) | (after == _CR)).all()) and bool((spans[:, 1] > spans[:, 0]).all())
                    ):
                        raise MetaFileChangedError(self.path, "its lines no longer end where its index says")
                    yield first, lo - PAD, buf, spans
        except ShortRead:
            raise MetaFileChangedError(self.path, "it shrank while being read") from None
        except LookupError as exc:
            raise MetaFileChangedError(self.path, f"its index cache changed while it was read ({exc})") from None

    def text_blocks(self) -> Iterator[list[tuple[str, Callable[[], str]]]]:
        """Each block's samples as ``(text, where)``."""
        for _, base, buf, spans in self.blocks():
            data = buf.tobytes()
            yield [
                (data[start:end].decode("utf-8", "replace"), functools.partial(self.where, base + start))
                for start, end in spans.tolist()
            ]

    def where(self, start: int) -> str:
        """``path:line`` of the line starting at byte ``start`` of the file (decompressed)."""
        if self.stream is None:
            return f"{self.path}:{count_newlines(self.fd, start) + 1}"
        # From the index's mark before it and the checkpoint before that, through a descriptor of
        # its own (a decoder moves its descriptor's position; the stream reads by position).
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return f"{self.path}, decompressed byte {start:,}"
        try:
            if self.index.key.change(FileKey.of(os.fstat(fd))) is not None:
                return f"{self.path}, decompressed byte {start:,}"
            with SpanReader(self.index) as reader:
                offset, line = line_mark(reader.marks(), start)
                checkpoints = reader.checkpoints()
            with DecompressedView(self.path, fd, checkpoints) as view:
                line += view.read(offset, start).count(b"\n")
            return f"{self.path}:{line + 1}"
        except (LookupError, CorruptMetaFileError):
            return f"{self.path}, decompressed byte {start:,}"
        finally:
            os.close(fd)


@contextlib.contextmanager
def _open_checked(path: Path, index: Index) -> Iterator[_Lines | _ParquetLines]:
    """The file's lines, checked on entry and exit to be those of the file ``index`` describes; an
    error while they are read (a line without a label, corrupt compressed data) from a file that has
    changed meanwhile is that change. A Parquet file's rows are checked as the file reader checks them.
    """
    if index.format is Format.PARQUET:
        with _FileBytes(path).rows(index) as rows:
            yield _ParquetLines(path, index, rows)
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MetaFileChangedError(path, "it was deleted or moved") from None
    try:
        for when in ("", " while it was grouped"):
            what = index.key.change(FileKey.of(os.fstat(fd)))
            if what is not None:
                raise MetaFileChangedError(path, what + when)
            if not when:
                try:
                    yield _Lines(path, index, fd)
                except ValueError as exc:  # CorruptMetaFileError too
                    what = index.key.change(FileKey.of(os.fstat(fd)))
                    if what is None or isinstance(exc, MetaFileChangedError):
                        raise
                    raise MetaFileChangedError(path, what + " while it was grouped") from exc
    finally:
        os.close(fd)


#: Given the keys and the bounds of their groups, the int64 array the sample numbers are placed in.
Place = Callable[[list[Any], npt.NDArray[np.int64]], npt.NDArray[np.int64]]


def _in_memory(keys: list[Any], bounds: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.empty(int(bounds[-1]), np.int64)


def _group(path: Path, index: Index, key: str | Key, place: Place = _in_memory) -> Grouping:
    with _open_checked(path, index) as lines:
        if key == "label":
            if isinstance(lines, _ParquetLines):
                return _parquet_label_grouping(lines, place)
            return _label_grouping(lines, place)
        assert callable(key)
        codes, keys = _key_codes(lines, key)
    try:
        rank = sorted(range(len(keys)), key=keys.__getitem__)
    except TypeError:  # keys that cannot be ordered keep the order they first appeared in
        rank = list(range(len(keys)))
    new_code = np.empty(len(keys), np.int64)
    new_code[rank] = np.arange(len(keys))
    counts = np.bincount(new_code[codes], minlength=len(keys))
    ordered, bounds = [keys[i] for i in rank], _bounds(counts)
    order = place(ordered, bounds)
    _scatter(order, counts, lambda a, b: new_code[codes[a:b]])
    return Grouping(ordered, bounds, order)


def _label_grouping(lines: _Lines, place: Place) -> Grouping:
    """Group the samples by their integer label: each block of the file parsed and sorted by label on
    its own (two threads; numpy releases the GIL), then every block's samples scattered to their
    places, a stable counting sort. Only the result is N-sized, and each block's order (4 bytes a
    sample) until it is placed. A compressed file's blocks are decompressed in this thread, in
    order (the decoders release the GIL too), while the threads parse the blocks before."""
    fd, size = lines.fd, lines.index.size
    scratch = threading.local()

    def part(lo: int, hi: int, data: memoryview | None = None) -> _Part:
        buf = getattr(scratch, "buf", None)
        if buf is None or buf.size < PAD + hi - lo + 1:
            buf = scratch.buf = np.empty(max(PAD + _CHUNK + 1, PAD + hi - lo + 1), np.uint8)
        end = PAD + hi - lo
        buf[:PAD] = _NEWLINE
        if data is not None:
            buf[PAD:end] = np.frombuffer(data, np.uint8)
        else:
            try:
                pread_exact(fd, buf[PAD:end], lo)
            except ShortRead:
                raise MetaFileChangedError(lines.path, "it shrank while being read") from None
        if buf[end - 1] != _NEWLINE:
            if hi != size:  # blocks end just past a newline
                raise MetaFileChangedError(lines.path, "it changed while it was grouped")
            buf[end] = _NEWLINE  # the last line has no newline of its own
            end += 1
        found = block_labels(buf[:end], end, file_start=lo == 0)
        _parse_others(buf, found, lambda row, start: lines.where(lo + start - PAD))
        return _Part.of(found.labels)

    with ThreadPoolExecutor(THREADS) as pool:
        parsing: list[Future[_Part]] = []
        try:
            if lines.stream is None:
                with open(fd, "rb", closefd=False) as f:
                    bounds = _chunk_bounds(f, size, _CHUNK)
                parsing = [pool.submit(part, lo, hi) for lo, hi in itertools.pairwise(bounds)]
            else:
                read = 0
                for lo, data in lines.stream.chunks(_CHUNK):
                    parsing.append(pool.submit(part, lo, lo + len(data), data))
                    read = lo + len(data)
                    if len(parsing) > THREADS:  # hold the bytes of a few blocks only
                        parsing[-THREADS - 1].result()
                if read != size:
                    raise MetaFileChangedError(lines.path, f"it decompresses to {read:,} bytes, its index {size:,}")
            parts = [job.result() for job in parsing]  # the first bad line of the file is the one named
        except BaseException:
            for job in parsing:
                job.cancel()
            raise
        return _merge(parts, lines.path, lines.index.count, place, pool)


def _merge(parts: list[_Part], path: Path, count: int, place: Place, pool: ThreadPoolExecutor) -> Grouping:
    """The grouping of the file whose blocks, in order, are ``parts``: each block's samples scattered
    to their places (a stable counting sort over the blocks)."""
    found = sum(p.perm.size for p in parts)
    if found != count:
        raise MetaFileChangedError(path, f"it holds {found:,} samples, its index {count:,}")
    keys = np.unique(np.concatenate([p.keys for p in parts]))
    codes = [np.searchsorted(keys, p.keys) for p in parts]
    totals = np.zeros(keys.size, np.int64)
    for code, p in zip(codes, parts):
        totals[code] += p.sizes  # a block's keys are distinct
    group_bounds = _bounds(totals)
    keys_list = keys.tolist()
    order = place(keys_list, group_bounds)
    cursor = group_bounds[:-1].copy()
    placed: list[Future[None]] = []
    base = 0
    for code, p in zip(codes, parts):
        placed.append(pool.submit(p.place, order, cursor[code], base))
        cursor[code] += p.sizes
        base += p.perm.size
    for done in placed:
        done.result()
    return Grouping(keys_list, group_bounds, order)


def _parse_others(buf: npt.NDArray[np.uint8], found: BlockLabels, where: Callable[[int, int], str]) -> None:
    """Fill in the labels of the block's samples that are not of the common form (``found.todo``),
    each by the label parser; ``where(row, start)`` names a line that has none."""
    for row, start, stop in zip(found.todo.tolist(), found.starts.tolist(), found.ends.tolist()):
        line = buf[start:stop].tobytes().decode("utf-8", "replace")
        try:
            found.labels[row] = parse_label(line)[1]
        except LineError as exc:
            raise ValueError(f"{where(row, start)}: {exc}") from None
        except OverflowError:
            raise ValueError(f"{where(row, start)}: label outside the int64 range in line {quote(line)}") from None


class _ParquetLines:
    """The rows of an indexed Parquet file (checked by :meth:`MetaFile.rows`), a row group at a time:
    every row is a sample, its line the chosen columns joined by tabs, as the file reader gives it."""

    def __init__(self, path: Path, index: Index, rows: ParquetRows) -> None:
        self.path, self.index, self.rows = path, index, rows

    def where(self, row: int) -> str:
        return f"{self.path}, row {row}"

    def text_blocks(self) -> Iterator[list[tuple[str, Callable[[], str]]]]:
        """Each row group's rows as ``(text, where)``."""
        bounds = self.rows.bounds.tolist()
        for g, first in enumerate(bounds[:-1]):
            data, offsets = self.rows.group(g)
            cuts = offsets.tolist()
            yield [
                (data[a:b].decode("utf-8", "replace"), functools.partial(self.where, first + k))
                for k, (a, b) in enumerate(itertools.pairwise(cuts))
            ]

    def labels(self, g: int) -> npt.NDArray[np.int64]:
        """The label of every row of row group ``g``: in numpy as for text where each row is one
        non-blank line (the rows put back to back, each with a newline), else row by row; or, where
        the last column holds them (integers, none null), that column alone."""
        labels = self.rows.last_integers(g)
        if labels is not None:
            return labels
        data, offsets = self.rows.group_array(g)
        first, n = int(self.rows.bounds[g]), offsets.size - 1
        step = np.arange(n, dtype=np.int64)
        if n and not bool(((data == _NEWLINE) | (data == _CR)).any()):
            buf = np.empty(PAD + data.size + n, np.uint8)
            buf[:PAD] = _NEWLINE
            lengths = np.diff(offsets)
            copy_rows(data, offsets[:-1], lengths, buf, PAD + offsets[:-1] + step)
            buf[PAD + offsets[1:] + step] = _NEWLINE
            found = block_labels(buf, buf.size, file_start=False)
            if found.labels.size == n:  # no blank row (a text file would skip it; here it is a sample)
                _parse_others(buf, found, lambda row, start: self.where(first + row))
                return found.labels
        rows = BlockLabels(np.empty(n, np.int64), step, offsets[:-1], offsets[1:])
        _parse_others(data, rows, lambda row, start: self.where(first + row))
        return rows.labels


def _parquet_label_grouping(lines: _ParquetLines, place: Place) -> Grouping:
    """Group a Parquet file's rows by label, a row group a block (decoded and sorted by label in the pool)."""
    with ThreadPoolExecutor(THREADS) as pool:
        parsing: list[Future[_Part]] = []
        try:
            for g in range(len(lines.rows.bounds) - 1):  # pyarrow releases the GIL: two row groups at once
                parsing.append(pool.submit(lambda g: _Part.of(lines.labels(g)), g))
                if len(parsing) > THREADS:
                    parsing[-THREADS - 1].result()
            parts = [job.result() for job in parsing]
        except BaseException:
            for job in parsing:
                job.cancel()
            raise
        return _merge(parts, lines.path, lines.index.count, place, pool)


@dataclass(frozen=True)
class _Part:
    """One block's samples in label order: ``perm`` (stable, numbered within the block), and the
    block's distinct labels, ascending, with how many samples have each."""

    perm: npt.NDArray[np.uint32]
    keys: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]

    @classmethod
    def of(cls, labels: npt.NDArray[np.int64]) -> _Part:
        if not labels.size:
            return cls(np.empty(0, np.uint32), np.empty(0, np.int64), np.empty(0, np.int64))
        lo = int(labels.min())
        span = int(labels.max()) - lo
        if span < 1 << 16:  # a stable sort of 16-bit values is a radix sort: linear
            offset = (labels - lo).astype(np.uint16)
            perm = np.argsort(offset, kind="stable")
            sizes = np.bincount(offset, minlength=span + 1)
            keys = np.flatnonzero(sizes)
            return cls(perm.astype(np.uint32), keys + lo, sizes[keys])
        if span < 1 << 32:  # two radix passes, low half then high half
            offset = (labels - lo).astype(np.uint32)
            perm = np.argsort((offset & 0xFFFF).astype(np.uint16), kind="stable")
            perm = perm[np.argsort((offset[perm] >> 16).astype(np.uint16), kind="stable")]
        else:
            perm = np.argsort(labels, kind="stable")
        ordered = labels[perm]
        heads = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1))
        return cls(perm.astype(np.uint32), ordered[heads], np.diff(np.append(heads, ordered.size)))

    def place(self, order: npt.NDArray[np.int64], at: npt.NDArray[np.int64], base: int) -> None:
        """Write samples ``base + perm`` into ``order``, those of key ``keys[k]`` from ``at[k]`` on."""
        firsts = np.cumsum(self.sizes) - self.sizes
        where = np.repeat(at - firsts, self.sizes)
        where += np.arange(self.perm.size)
        order[where] = self.perm.astype(np.int64) + base


def each_line(meta_file: PathLike, desc: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """Every sample of ``meta_file`` as ``(text, where)``, in order, ``where()`` giving its ``path:line``;
    a progress bar on a terminal (in the first process of a node). For functions of the line."""
    path = meta_path(meta_file)
    index = load_index(path)
    with _open_checked(path, index) as lines:
        yield from _texts(lines, desc)


def _texts(lines: _Lines | _ParquetLines, desc: str) -> Iterator[tuple[str, Callable[[], str]]]:
    with progress_bar(lines.index.count, f"{desc} {lines.path}", unit="lines", min_total=1 << 16) as bar:
        for block in lines.text_blocks():
            yield from block
            bar.update(len(block))


def _key_codes(lines: _Lines | _ParquetLines, key: Key) -> tuple[npt.NDArray[np.int64], list[Any]]:
    """For every sample, the number of its key in order of first appearance, and the keys."""
    codes = np.empty(lines.index.count, np.int64)
    number: dict[Any, int] = {}
    keys: list[Any] = []
    for i, (text, where) in enumerate(_texts(lines, "grouping")):
        value = key(text)
        try:
            code = number.get(value)
        except TypeError:
            raise TypeError(f"{where()}: key returned {value!r} ({type(value).__name__}), not hashable") from None
        if code is None:
            code = number[value] = len(keys)
            keys.append(value)
        codes[i] = code
    return codes, keys


def _bounds(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _scatter(
    order: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    codes_of: Callable[[int, int], npt.NDArray[np.int64]],
) -> None:
    """Place the sample numbers ``0..n-1`` in ``order``, grouped by code (``codes_of(a, b)``: the codes
    of samples ``a..b-1``), ascending within each group: a stable counting sort, a block at a time,
    so that only the result is N-sized."""
    n = order.size
    cursor = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    # A stable sort of 16-bit codes is a radix sort, several times faster than one of wider ints.
    narrow = np.uint16 if counts.size <= 1 << 16 else np.int64
    for a in range(0, n, _BLOCK):
        codes = codes_of(a, min(a + _BLOCK, n))
        perm = np.argsort(codes.astype(narrow), kind="stable")
        sorted_codes = codes[perm]
        head = np.flatnonzero(np.diff(sorted_codes, prepend=-1))  # the first of each run of one code
        run_start = np.repeat(head, np.diff(np.append(head, codes.size)))
        order[cursor[sorted_codes] + np.arange(codes.size) - run_start] = perm + a
        cursor[sorted_codes[head]] += np.diff(np.append(head, codes.size))
