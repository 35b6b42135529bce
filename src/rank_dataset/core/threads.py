"""Work split over threads: numpy's array passes and positional reads release the GIL, so two
threads use two cores for them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["HELPED_ITEMS", "THREADS", "in_threads", "wait_released"]

#: Threads a build splits its work over: two cores where the process may use two (a DataLoader
#: worker or a rank pinned to one core gets one). More rarely pays: the passes are memory-bound.
THREADS = min(2, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else 1

#: Rows (or positions) a pass must have to be split over threads at all. A helper thread costs a
#: malloc arena whose top glibc keeps resident for the rest of the process (see in_threads): a few
#: MiB, held by the rank and shared by every DataLoader worker forked from it; from 1M rows on, that
#: is a small part of the shard.
HELPED_ITEMS = 1 << 20


def in_threads(work: Callable[[tuple[int, int]], None], k: int = THREADS) -> None:
    """``work((t, k))`` for each part ``t`` of ``k``, in ``k`` threads (in this one for ``k == 1``);
    the first error raised, if any, once all are done.

    Examples:
        >>> seen = []
        >>> in_threads(seen.append, 2)
        >>> sorted(seen)
        [(0, 2), (1, 2)]
    """
    if k == 1:
        work((0, 1))
        return
    # Part 0 in this thread: one thread fewer to start, and one malloc arena fewer. glibc gives each
    # thread an arena of its own, whose top it keeps resident for good (malloc_trim leaves the top of
    # a thread's arena alone): a few MiB a thread, held by the process and shared with every
    # DataLoader worker it forks, where this thread's freed temporaries go back to the OS.
    with ThreadPoolExecutor(max_workers=k - 1) as pool:
        done = [pool.submit(work, (t, k)) for t in range(1, k)]
        first: BaseException | None = None
        try:
            work((0, k))
        except BaseException as exc:  # raised once the others are done, as theirs are
            first = exc
    if first is not None:
        raise first
    for future in done:
        future.result()


def wait_released(tensors: Iterable[Any]) -> None:
    """Return once the caller holds the only reference to each of ``tensors`` (torch tensors handed to a
    collective that has returned).

    A torch.distributed collective returns when its work is done, but the gloo worker thread that ran it
    lets go of the work (and so of its tensors) a moment later. Were its reference the last one, that
    thread would free the tensors, and freeing a tensor made in Python takes the GIL (for its Python
    object, or the numpy array under it): at a rank's exit, with the interpreter finalizing, the thread is
    then stopped inside a C++ destructor and the process aborts (``terminate called without an active
    exception``). Waiting here, which takes a moment (the thread is not blocked), leaves the tensors to be
    freed by the caller, in its own thread.
    """
    for tensor in tensors:
        spins = 0
        while tensor._use_count() > 1:
            spins += 1
            time.sleep(0 if spins < 100 else 0.001)
