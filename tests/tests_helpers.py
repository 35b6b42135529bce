"""Helpers importable by tests (conftest keeps the fixtures): synthetic lines, free ports, a real server."""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from rank_dataset.demo.synthetic import imagenet_line

__all__ = ["Server", "free_port", "imagenet_line", "kill_tree"]


def _limit_fds(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A real `rank-dataset serve` process on a free loopback port."""

    def __init__(
        self,
        paths: list[Path],
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        fd_limit: int | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rank_dataset", "serve", *map(str, paths), "--port", str(self.port), *args]
        limit = None if fd_limit is None else functools.partial(_limit_fds, fd_limit)  # soft and hard: no raising it
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True, preexec_fn=limit
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("server did not become healthy")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


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
