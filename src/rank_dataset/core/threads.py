"""Work split over threads: numpy's array passes and positional reads release the GIL, so two
threads use two cores for them. No torch."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["THREADS", "in_threads"]

#: Threads a build splits its work over: two cores where the process may use two (a DataLoader
#: worker or a rank pinned to one core gets one). More rarely pays: the passes are memory-bound.
THREADS = min(2, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else 1


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
    with ThreadPoolExecutor(max_workers=k) as pool:
        done = [pool.submit(work, (t, k)) for t in range(k)]
    for future in done:
        future.result()
