"""Memory figures of processes: PSS (from /proc/PID/smaps_rollup, through psutil)."""

from __future__ import annotations

import collections
import os

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


def pss_by_mapping(pid: int | None = None) -> dict[str, dict[str, int]]:
    """PSS in bytes of the process and of each live descendant (by pid), by what each mapping holds: its
    file's name, ``[heap]``, ``[anon]`` (anonymous maps), or ``/memfd:...`` (shared-memory segments).
    Where a loader's memory figure goes; ``/proc/PID/smaps`` (Linux)."""
    proc = psutil.Process(pid)
    out: dict[str, dict[str, int]] = {}
    for p in [proc, *proc.children(recursive=True)]:
        sizes: collections.Counter[str] = collections.Counter()
        name = "[anon]"
        try:
            with open(f"/proc/{p.pid}/smaps") as smaps:
                for line in smaps:
                    field = line.split(maxsplit=1)[0]
                    if not field.endswith(":"):  # a mapping's header: address perms offset dev inode [path]
                        parts = line.split(maxsplit=5)
                        name = parts[5].strip() if len(parts) > 5 else "[anon]"
                        name = name.split(" (deleted)")[0]
                    elif field == "Pss:":
                        sizes[os.path.basename(name) if name.startswith("/") else name] += int(line.split()[1]) << 10
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        out[str(p.pid)] = dict(sizes)
    return out
