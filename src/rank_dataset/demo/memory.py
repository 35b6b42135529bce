"""Memory figures of processes: PSS (from /proc/PID/smaps_rollup, through psutil). No torch."""

from __future__ import annotations

import psutil


def pss_with_children(pid: int | None = None) -> tuple[int, int]:
    """``(PSS of the process, summed PSS of its live children)`` in bytes, e.g. a rank and its workers.

    PSS divides each shared page among the processes that map it, so the PSS of several processes
    adds up to the memory they use together: the right sum over ranks and their DataLoader workers.
    """
    proc = psutil.Process(pid)
    own = int(proc.memory_full_info().pss)
    children = 0
    for child in proc.children():
        try:
            children += int(child.memory_full_info().pss)
        except psutil.NoSuchProcess:
            continue  # ended meanwhile
    return own, children
