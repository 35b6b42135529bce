"""Where index and grouping caches live on disk and how one is written: beside the meta file or in
the user cache directory, as a temporary file named for its builder (``<cache>.<pid>@<host>.*.tmp``,
so a later builder removes a dead one's leftovers) that is renamed into place once written, then
made durable: synced while it is written (:class:`Syncer`) and sealed after (:class:`Seal`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rank_dataset.core.checks import UrlPath

if TYPE_CHECKING:
    from rank_dataset.files.io import SourceKey

__all__ = [
    "CACHE_DIR_ENV",
    "SEAL",
    "Seal",
    "Syncer",
    "cache_paths",
    "discard",
    "first_cache_path",
    "fsync_dir",
    "object_cache_path",
    "temp_beside",
    "wait_for_seal",
]

_log = logging.getLogger(__name__)

#: Environment variable naming a directory for index caches, used instead of the meta file's own.
CACHE_DIR_ENV = "RANK_DATASET_CACHE_DIR"


# After the header: written, and synced, only once the rest of the cache is on disk. Other processes
# load only a sealed cache (see :func:`~rank_dataset.files.index._build.write_cache`).
SEAL = b"RDSEALED"


OTHER_HOST_TMP_AGE = 24 * 3600  # seconds after which another host's unfinished cache is abandoned


SYNC_EVERY = 64 << 20  # bytes of a cache written between two syncs while it is being built


SEAL_APART = 4 << 20  # bytes of entries from which a cache is sealed in a thread of its own


def _cache_name(path: Path) -> str:
    return f"{path.name}.{hashlib.sha256(os.fsencode(path)).hexdigest()[:32]}.rdidx"


def first_cache_path(path: Path) -> Path:
    """The first of :func:`cache_paths`, found without asking where the user cache directory is."""
    override = os.environ.get(CACHE_DIR_ENV)
    return Path(override) / _cache_name(path) if override else path.with_name(f".{path.name}.rdidx")


def cache_paths(path: Path) -> list[Path]:
    """Where the index of ``path`` may live, in order of preference."""
    first = first_cache_path(path)
    if os.environ.get(CACHE_DIR_ENV):
        return [first]
    # On first use: a rank whose index lies beside its file, and a DataLoader worker, never import it.
    from platformdirs import user_cache_dir

    return [first, Path(user_cache_dir("rank-dataset")) / _cache_name(path)]


def object_cache_path(url: str, key: SourceKey) -> Path:
    """Where the index of the object ``url`` (``key``: its URL, size and ETag) is cached on this node:
    never in the bucket."""
    name = f"{UrlPath(url).name}.{key.size}.{key.digest().hex()[:32]}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override) / name
    from platformdirs import user_cache_dir  # on first use, as in cache_paths

    return Path(user_cache_dir("rank-dataset")) / "objects" / name


def tmp_prefix(cache: Path) -> str:
    # The builder's pid and host are in the name, so that a later builder can tell a dead one's
    # leftover from a live one's work in progress.
    return f"{cache.name}.{os.getpid()}@{socket.gethostname()}."


def remove_abandoned(cache: Path) -> None:
    """Remove the temporary files that dead builders of ``cache`` left: on this host, those whose
    builder's pid is gone (at once: a live builder's pid is alive); from other hosts (whose pids mean
    nothing here), those untouched for a day."""
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
        if tmp_host == host and pid_text.isdigit():
            import psutil  # on first use (few processes find a build left by another)

            abandoned = not psutil.pid_exists(int(pid_text))
        else:
            try:
                abandoned = now - entry.stat().st_mtime > OTHER_HOST_TMP_AGE
            except OSError:
                continue
        if abandoned:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform or file system can sync a directory
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Syncer:
    """Syncs a file to disk in a thread of its own each time another ``SYNC_EVERY`` bytes have
    been written to it, so that the seal (:class:`Seal`) has only the last ones left: the disk
    writes while the scan goes on, instead of after it (a third of a cold index of 100M lines).

    The thread starts with the first sync due, so a small cache (the many files of a mix) costs none.
    :meth:`close` returns the OSError of a sync that failed (the data may not be on disk), if any.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._written = self._synced = 0
        self._closed = False
        self._error: OSError | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def wrote(self, nbytes: int) -> None:
        with self._cond:
            self._written += nbytes
            if self._written - self._synced >= SYNC_EVERY:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="rank-dataset-index-sync", daemon=True)
                    self._thread.start()
                self._cond.notify()

    def _run(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._written - self._synced >= SYNC_EVERY)
                if self._written - self._synced < SYNC_EVERY:  # closed, and no sync due
                    return
                target = self._written
            try:
                sync(self._fd)
            except OSError as exc:
                self._error = exc
                return
            with self._cond:
                self._synced = target

    def close(self) -> OSError | None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        return self._error


@dataclass(frozen=True)
class Seal:
    """Seals a cache written and renamed into place (see :func:`~rank_dataset.files.index._build.write_cache`),
    through ``file``, open on it."""

    cache: Path
    file: io.BufferedWriter
    syncer: Syncer  # the syncs while it was written (one may still be under way)
    nbytes: int  # of its entries
    at: int  # where the seal goes: a header's field

    def __call__(self) -> bool:
        """Whether the cache's data is on disk; False if a sync of it failed (the data may not be,
        and a later sync would not say so): it is left unsealed, so the next process that loads it
        rebuilds it. Once the data is on disk the seal is written and synced (if that fails, the
        cache is whole but unsealed, and rebuilt by the next process)."""
        sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        with self.file as f:
            error = self.syncer.close()
            if error is not None:
                self._failed("a sync of its data while it was written", error)
                return False
            try:
                sync(f.fileno())
            except OSError as exc:
                self._failed("the sync of its data", exc)
                return False
            try:
                os.pwrite(f.fileno(), SEAL, self.at)
                sync(f.fileno())
            except OSError as exc:
                self._failed("the seal's write or sync (its data is on disk)", exc)
        fsync_dir(self.cache.parent)
        return True

    def _failed(self, step: str, error: OSError) -> None:
        _log.warning(
            "could not seal the index cache %s: %s failed: %s; it is not trusted, and is rebuilt by the next load",
            self.cache,
            step,
            error,
        )

    def after(self, held: contextlib.ExitStack) -> bool:
        """Seal, then let go of what ``held`` holds (the builder's lock). A large cache is sealed in
        a thread of its own, so that the caller builds its shard meanwhile, and the processes waiting
        for the lock find it sealed; a small one here (a mix of thousands of files starts no thread).
        False if a small one's seal failed: it is removed, and the caller goes on to its next cache
        location (else to an index in memory)."""
        if self.nbytes >= SEAL_APART:
            # Not a daemon (whatever the caller's thread is): an exiting interpreter waits for it, so
            # a job that ends at once still leaves a sealed cache for the next.
            thread = threading.Thread(
                target=self._seal_and_release, args=(held,), name="rank-dataset-index-seal", daemon=False
            )
            with SEALING_LOCK:  # registered before its end can unregister it
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had: seal here
                    pass
                else:
                    SEALING[self.cache] = thread
                    return True
        with held:
            if self():
                return True
            with contextlib.suppress(OSError):
                os.unlink(self.cache)
            return False

    def _seal_and_release(self, held: contextlib.ExitStack) -> None:
        try:
            with held:
                self()
        finally:
            with SEALING_LOCK:
                if SEALING.get(self.cache) is threading.current_thread():
                    del SEALING[self.cache]


# The caches this process is sealing in the background, and their threads: a load of one waits for
# its seal rather than for the lock the seal holds (which this process took, in another thread).
SEALING: dict[Path, threading.Thread] = {}


SEALING_LOCK = threading.Lock()


def wait_for_seal(cache: Path) -> None:
    with SEALING_LOCK:
        thread = SEALING.get(cache)
    if thread is not None:
        thread.join()


def _after_fork_in_child() -> None:
    # The seal threads are the parent's (a child waits for their lock instead), and a fork while one
    # of them held SEALING_LOCK would leave the child's copy held for good.
    global SEALING_LOCK
    SEALING_LOCK = threading.Lock()
    SEALING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def temp_beside(cache: Path) -> tuple[int, str] | None:
    """A new temporary file beside ``cache`` (created with its directory), open for writing, named for
    this builder, after removing what dead builders of ``cache`` left; None if it cannot be written."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(cache)
        return tempfile.mkstemp(dir=cache.parent, prefix=tmp_prefix(cache), suffix=".tmp")
    except OSError:
        return None


def discard(fd: int | None, tmp: str) -> None:
    """Close (if ``fd`` is given) and remove a temporary file that will not be put in place."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
    Path(tmp).unlink(missing_ok=True)
