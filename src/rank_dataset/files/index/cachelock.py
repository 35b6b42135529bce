"""One builder per per-file cache: a lock beside the cache, so that of many processes that find no
valid cache at once (the local ranks of a node at job start, nodes sharing a file system) one builds
it while the others wait and then load what it wrote.

The lock is an ``flock`` on ``<cache>.lock`` (the ``filelock`` package): the kernel releases it when
its holder dies, even by SIGKILL, so a killed builder cannot wedge the next one (a file left by one
is locked and removed by the next). Where no lock can
be taken (a read-only directory, a file system without locks) every process builds, as if alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = ["load_or_build", "lock_path", "one_builder"]

_T = TypeVar("_T")
_POLL = 0.05  # seconds between attempts while another process holds the lock


def lock_path(cache: Path) -> Path:
    """The lock file of ``cache``: beside it, so every process that could build it sees the same one."""
    return cache.with_name(cache.name + ".lock")


@contextlib.contextmanager
def one_builder(cache: Path, *, timeout: float | None = None) -> Iterator[bool]:
    """Hold the lock of ``cache`` for the body: one process at a time builds it.

    Yields whether the lock is held: False where locking is unavailable here (the directory cannot be
    written, the file system has no locks) or ``timeout`` seconds passed first; the body then runs
    anyway, as it would alone. With ``timeout`` None, waits as long as the holder lives.

    Example:
        >>> import tempfile
        >>> cache = Path(tempfile.mkdtemp()) / "data.idx"
        >>> with one_builder(cache) as locked:
        ...     locked
        True
    """
    import filelock  # on first use: a process that builds no index (a DataLoader worker) does without it

    lock = filelock.FileLock(
        lock_path(cache),
        timeout=-1 if timeout is None else timeout,
        poll_interval=_POLL,
        thread_local=False,
        # A soft lock (a marker file) is not released when its holder is killed: no lock is better.
        fallback_to_soft=False,
    )
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        locked = True
    # A read-only directory or none, no flock on this file system (ENOSYS), or timed out.
    except (OSError, NotImplementedError, filelock.Timeout):
        locked = False
    try:
        yield locked
    finally:
        if locked:
            # Removed while held, so nothing is left behind: a waiter that then gets the lock of the
            # removed file sees it has no name any more and locks a new one (filelock checks that).
            with contextlib.suppress(OSError):
                os.unlink(lock_path(cache))
            with contextlib.suppress(OSError):
                lock.release()


def load_or_build(
    candidates: Sequence[Path],
    load: Callable[[Path], _T | None],
    build: Callable[[contextlib.ExitStack, Path], _T | None],
    *,
    tried: Path | None = None,
) -> _T | None:
    """What ``load(cache)`` finds in the first of ``candidates`` that holds it, else what ``build(held,
    cache)`` builds into the first place it can (None: it cannot), with :func:`one_builder`'s lock of that
    place held and loading first what another process may have built while this one waited; None if no
    place takes it. ``held`` holds the lock: a build that goes on after it returns (a cache sealed in
    the background) takes it with ``held.pop_all()`` and releases it when done. ``tried``: a candidate
    the caller has loaded from without result, not loaded again before its lock is held.

    Example:
        >>> import tempfile
        >>> cache = Path(tempfile.mkdtemp()) / "answer.txt"
        >>> load = lambda place: int(place.read_text()) if place.exists() else None
        >>> def build(held, place) -> int:
        ...     _ = place.write_text("42")
        ...     return 42
        >>> load_or_build([cache], load, build), load_or_build([cache], load, lambda held, place: 0)
        (42, 42)
    """
    for cache in candidates:
        found = None if cache == tried else load(cache)
        if found is not None:
            return found
    for cache in candidates:
        with contextlib.ExitStack() as held:
            held.enter_context(one_builder(cache))
            found = load(cache)
            if found is None:
                found = build(held, cache)
        if found is not None:
            return found
    return None
