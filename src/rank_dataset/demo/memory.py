"""Memory figures of processes: PSS (from /proc/PID/smaps_rollup, through psutil). No torch."""

from __future__ import annotations

import psutil


def pss_with_children(pid: int | None = None) -> tuple[int, int]:
    """``(PSS of the process, summed PSS of its live descendants)`` in bytes, e.g. a rank and its workers.

    PSS divides each shared page among the processes that map it, so the PSS of several processes
    adds up to the memory they use together: the right sum over ranks and their DataLoader workers.
    Descendants, not only children: forkserver workers are children of the rank's fork server
    (which is counted too, as is multiprocessing's resource tracker; both exist, unchanged, in the
    baseline the demo subtracts).
    """
    proc = psutil.Process(pid)
    own = int(proc.memory_full_info().pss)
    children = 0
    for child in proc.children(recursive=True):
        try:
            children += int(child.memory_full_info().pss)
        except psutil.NoSuchProcess:
            continue  # ended meanwhile
    return own, children
