"""Helpers importable by tests (conftest keeps the fixtures): synthetic lines, free ports, a real server."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import psutil

from rank_dataset._localserver import LocalServer, free_port
from rank_dataset.demo.synthetic import imagenet_line

__all__ = ["Server", "free_port", "imagenet_line", "kill_tree", "rewrite"]


class Server(LocalServer):
    """A real `rank-dataset serve` process on a free loopback port, its stdout piped."""

    def __init__(
        self,
        paths: list[Path],
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        fd_limit: int | None = None,
    ):
        super().__init__(paths, *args, port=port, env=env, stdout=subprocess.PIPE, fd_limit=fd_limit)


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return [root, *root.children(recursive=True)]
    return []


def kill_tree(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> None:
    """SIGKILL ``proc`` and every process under it, and wait until all are gone.

    Descendants are found by parent links, not by process group or session: torchrun starts its
    ranks in new sessions, so ``os.killpg`` on torchrun's group misses them and their DataLoader
    workers. The tree is frozen (SIGSTOP) before it is killed, so that nothing forks or is
    reparented away while it is being listed.
    """
    try:
        root = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        proc.wait(timeout=timeout)
        return
    seen: dict[int, psutil.Process] = {}
    while True:  # until no stopped process has a child not yet stopped
        fresh = [p for p in _tree(root) if p.pid not in seen]
        if not fresh:
            break
        for p in fresh:
            seen[p.pid] = p
            with contextlib.suppress(psutil.NoSuchProcess):
                p.suspend()
    for p in seen.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=timeout)
    _, alive = psutil.wait_procs([p for p in seen.values() if p.pid != proc.pid], timeout=timeout)
    if alive:
        raise RuntimeError(f"processes still alive {timeout}s after SIGKILL: {[p.pid for p in alive]}")


def rewrite(path: Path, lines: list[str], *, keep_times: bool = False) -> None:
    """Rewrite ``path`` in place (same inode), as an editor or ``cat > file`` does."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write("".join(f"{line}\n" for line in lines).encode())
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
