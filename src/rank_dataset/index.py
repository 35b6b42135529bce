"""The line-offset index of a meta file and its cache on disk. No torch.

The index of a file is the ``(n, 2)`` int64 array of the byte spans of its samples (see
:mod:`rank_dataset.scan`), cached beside the file (or in the user cache directory). A cache is keyed
by what identifies the file's content without reading all of it: size, mtime, ctime and inode (ctime
cannot be set by ``utime``, so ``touch -r`` and ``cp -p`` over the file do not pass for it), and a
hash of its first and last 64 KiB. No descriptor is kept open: the cache is mapped only while a
shard is built (:class:`SpanReader`).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psutil
from platformdirs import user_cache_dir

from rank_dataset._pread import ShortRead, pread_exact, read_ends
from rank_dataset._residency import drop_pages
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.scan import scan_chunks

__all__ = ["CACHE_DIR_ENV", "FileKey", "Index", "SpanReader", "hash_ends", "load_index"]

#: Environment variable naming a directory for index caches, used instead of the meta file's own.
CACHE_DIR_ENV = "RANK_DATASET_CACHE_DIR"

_MAGIC = b"RDIDX\x00\x00\x02"
# magic, file size, mtime_ns, ctime_ns, inode, device, number of samples, flags, hash of the file's ends
_HEADER = struct.Struct("<8sqqqQQqq16s")
_FLAG_ASCII = 1
_DATA_OFFSET = 128
_ENTRY = 16  # one span: two little-endian int64
_SAMPLE = 1 << 16  # bytes hashed at each end of the file
_CHECK_ROWS = 1 << 12  # spans checked at each end of a cache when it is loaded
_BUILD_TRIES = 3
_OTHER_HOST_TMP_AGE = 24 * 3600  # seconds after which another host's unfinished cache is abandoned
_TMP_GRACE = 60  # a temporary file this recently written is never taken for abandoned


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
        return replace(other, device=self.device) == self

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


@dataclass(frozen=True)
class Index:
    """Where the spans of a file's samples are, and what they describe.

    ``key`` is the file as this process indexed it, ``ends_hash`` the hash of its first and last
    64 KiB. The spans live in ``cache``, or in ``memory`` where no cache location was writable (not
    pickled: a process that receives the index rescans the file if it ever reads it).
    """

    key: FileKey
    ends_hash: bytes
    count: int
    ascii: bool
    cache: Path | None
    memory: npt.NDArray[np.int64] | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "memory": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)


def hash_ends(fd: int, size: int) -> bytes:
    """A hash of the first and last 64 KiB of the file open at ``fd``, of size ``size``."""
    return hashlib.blake2b(read_ends(fd, size, _SAMPLE), digest_size=16).digest()


def _cache_paths(path: Path) -> list[Path]:
    """Where the index of ``path`` may live, in order of preference."""
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    name = f"{path.name}.{digest}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return [Path(override) / name]
    return [path.with_name(f".{path.name}.rdidx"), Path(user_cache_dir("rank-dataset")) / name]


def _header(key: FileKey, ends_hash: bytes, count: int, ascii_only: bool) -> bytes:
    flags = _FLAG_ASCII if ascii_only else 0
    return _HEADER.pack(_MAGIC, key.size, key.mtime_ns, key.ctime_ns, key.inode, key.device, count, flags, ends_hash)


def _describes(header: tuple[FileKey, bytes, int, bool] | None, key: FileKey, ends_hash: bytes) -> bool:
    """Whether a cache's header is that of the file ``key`` and ``ends_hash`` identify."""
    return header is not None and header[0].same_file(key) and header[1] == ends_hash


def _read_header(fd: int) -> tuple[FileKey, bytes, int, bool] | None:
    """``(key, ends_hash, count, ascii)`` from the header of the cache open at ``fd``; None if invalid."""
    raw = np.empty(_HEADER.size, np.uint8)
    try:
        pread_exact(fd, raw, 0)
    except ShortRead:
        return None
    magic, size, mtime, ctime, inode, device, count, flags, ends_hash = _HEADER.unpack(raw.tobytes())
    if magic != _MAGIC or count < 0 or os.fstat(fd).st_size != _DATA_OFFSET + _ENTRY * count:
        return None
    return FileKey(size, mtime, ctime, inode, device), ends_hash, count, bool(flags & _FLAG_ASCII)


def spans_are_sane(spans: npt.NDArray[np.int64], size: int, *, ordered: bool = True) -> bool:
    """Whether ``spans`` could be samples of a file of ``size`` bytes: non-empty, inside the file
    and (``ordered``: consecutive samples) increasing without overlap, as a newline separates them."""
    if not spans.size:
        return True
    s, e = spans[:, 0], spans[:, 1]
    if not (int(s.min()) >= 0 and int(e.max()) <= size and bool((e > s).all())):
        return False
    return not ordered or bool((s[1:] > e[:-1]).all())


def _cache_is_sane(fd: int, count: int, size: int) -> bool:
    """Check the spans at each end of a cache (all of a small one): a cache that a crash or a bad
    disk left zeroed or torn is rebuilt instead of trusted. Spans are also checked, against the
    bytes they point at, whenever a shard is built from them."""
    blocks = [(0, min(count, _CHECK_ROWS))]
    if count > _CHECK_ROWS:
        blocks.append((max(_CHECK_ROWS, count - _CHECK_ROWS), count))
    for lo, hi in blocks:
        raw = np.empty(_ENTRY * (hi - lo), np.uint8)
        try:
            pread_exact(fd, raw, _DATA_OFFSET + _ENTRY * lo)
        except ShortRead:
            return False
        if not spans_are_sane(raw.view("<i8").reshape(-1, 2), size):
            return False
    return True


def _open_cache(cache: Path, key: FileKey, ends_hash: bytes) -> Index | None:
    """The index in ``cache`` if it describes the file ``key`` and ``ends_hash`` identify, and is sane."""
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        header = _read_header(fd)
        if header is None or not _describes(header, key, ends_hash):
            return None
        count, ascii_only = header[2], header[3]
        if not _cache_is_sane(fd, count, key.size):
            return None
        return Index(key, ends_hash, count, ascii_only, cache)
    finally:
        os.close(fd)


def _tmp_prefix(cache: Path) -> str:
    # The builder's pid and host are in the name, so that a later builder can tell a dead one's
    # leftover from a live one's work in progress.
    return f"{cache.name}.{os.getpid()}@{socket.gethostname()}."


def _remove_abandoned(cache: Path) -> None:
    """Remove the temporary files that dead builders of ``cache`` left: on this host, those whose
    builder's pid is gone; from other hosts (whose pids mean nothing here), those untouched for a
    day. Any written to within the last minute are left alone (a live builder writes steadily)."""
    host, now = socket.gethostname(), time.time()
    try:
        entries = list(os.scandir(cache.parent))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not (name.startswith(cache.name) and name.endswith(".tmp")):
            continue
        # "<cache>.<pid>@<host>.<random>.tmp"; a name without a pid (an older version's) counts as
        # another host's.
        pid_text, _, rest = name[len(cache.name) :].removeprefix(".").partition("@")
        tmp_host = rest.rpartition(".")[0].rpartition(".")[0]
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue
        ours = tmp_host == host and pid_text.isdigit()
        if age >= _TMP_GRACE and (not psutil.pid_exists(int(pid_text)) if ours else age > _OTHER_HOST_TMP_AGE):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform or file system can sync a directory
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_cache(cache: Path, path: Path, fd: int, key: FileKey, ends_hash: bytes) -> Index | None:
    """Index the file open at ``fd`` straight into ``cache``; None if ``cache`` is not writable.

    The index goes to a temporary file that is synced and then renamed into place (and the directory
    synced), so concurrent builders all succeed, a reader never sees half a file, and a crash leaves
    the old cache or the new one, never a torn one.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(cache)
        tmp_fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=_tmp_prefix(cache), suffix=".tmp")
    except OSError:
        return None
    try:
        with os.fdopen(tmp_fd, "wb") as f:
            f.seek(_DATA_OFFSET)
            count, ascii_only = 0, True
            for spans, ascii_chunk in _scan(path, fd, key):
                f.write(spans.astype("<i8", copy=False).data)
                count += len(spans)
                ascii_only = ascii_only and ascii_chunk
            f.seek(0)
            f.write(_header(key, ends_hash, count, ascii_only))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, cache)
        _fsync_dir(cache.parent)
        return Index(key, ends_hash, count, ascii_only, cache)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _scan(path: Path, fd: int, key: FileKey) -> Iterator[tuple[npt.NDArray[np.int64], bool]]:
    """``scan_chunks`` of the file open at ``fd``, which must stay the file ``key`` describes to the end.

    Raises:
        MetaFileChangedError: the file changed while it was being indexed.
    """
    try:
        yield from scan_chunks(path, fd=fd)
    except ShortRead as exc:
        raise MetaFileChangedError(path, "it shrank while being indexed") from exc
    what = key.change(FileKey.of(os.fstat(fd)))
    if what is not None:
        raise MetaFileChangedError(path, f"{what} while being indexed")


def _index_in_memory(path: Path, fd: int, key: FileKey, ends_hash: bytes) -> Index:
    parts, ascii_only = [], True
    for spans, ascii_chunk in _scan(path, fd, key):
        parts.append(spans)
        ascii_only = ascii_only and ascii_chunk
    spans = np.concatenate(parts) if parts else np.empty((0, 2), np.int64)
    return Index(key, ends_hash, len(spans), ascii_only, None, spans)


def load_index(path: Path, *, rebuild: bool = False) -> Index:
    """The index of ``path``: from its cache, else built (and cached where a location is writable).

    With ``rebuild``, an existing cache is not trusted (it was found inconsistent with the file).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        MetaFileChangedError: the file kept changing while it was being indexed.
    """
    for attempt in range(_BUILD_TRIES):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            key = FileKey.of(os.fstat(fd))
            ends_hash = hash_ends(fd, key.size)
            candidates = _cache_paths(path)
            for cache in [] if rebuild else candidates:
                index = _open_cache(cache, key, ends_hash)
                if index is not None:
                    return index
            try:
                for cache in candidates:
                    index = _write_cache(cache, path, fd, key, ends_hash)
                    if index is not None:
                        return index
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


class SpanReader:
    """The spans of one file's samples while a shard is built, from the cache (open until
    :meth:`close`; mapped for large reads, read entry by entry for a few) or from memory.

    The cache is only ever replaced by a rename, never truncated in place, so the map cannot fault.

    Raises (from the constructor):
        LookupError: the cache is gone or no longer holds this index (its header differs), or the
            index was in another process's memory.
    """

    _FEW = 8  # entries read one by one rather than through a map

    def __init__(self, index: Index) -> None:
        self._index = index
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._spans: npt.NDArray[np.int64] | None = None
        if index.cache is None:
            if index.memory is None:
                raise LookupError("the index was built in another process's memory")
            self._spans = index.memory
            return
        try:
            self._fd = os.open(index.cache, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LookupError(f"the index cache {index.cache} cannot be opened ({exc.strerror})") from None
        header = _read_header(self._fd)
        if (
            header is None
            or not _describes(header, index.key, index.ends_hash)
            or header[2:] != (index.count, index.ascii)
        ):
            self.close()
            raise LookupError(f"the index cache {index.cache} was replaced or damaged")

    def take(self, local: npt.NDArray[np.int64], out: npt.NDArray[np.int64]) -> None:
        """Write the spans of samples ``local`` of the file (in range, roughly ascending) into
        ``out``, dropping the cache pages read from this process's resident set."""
        if self._spans is None and self._fd is not None and local.size <= self._FEW:
            for row, i in enumerate(local.tolist()):
                pread_exact(self._fd, out[row].view(np.uint8), _DATA_OFFSET + _ENTRY * i)
            return
        if self._spans is None and self._fd is not None:
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self._spans = np.frombuffer(self._map, "<i8", count=2 * self._index.count, offset=_DATA_OFFSET)
            self._spans = self._spans.reshape(-1, 2)
        assert self._spans is not None
        # np.take of whole rows is several times faster than fancy indexing the 2-D index.
        np.take(self._spans, local, axis=0, out=out, mode="clip")
        if self._map is not None and local.size:
            start, stop = _DATA_OFFSET + _ENTRY * int(local.min()), _DATA_OFFSET + _ENTRY * int(local.max() + 1)
            drop_pages(self._map, start, stop)

    def close(self) -> None:
        self._spans = None  # no view may outlive the map
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
