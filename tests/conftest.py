"""Shared fixtures: meta files written to a temporary directory, and an isolated index cache."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests_helpers import imagenet_line


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test gets its own index cache, so no test sees another's.
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def write_meta(tmp_path: Path) -> Callable[..., Path]:
    """Write lines (or ``n`` synthetic ones) to a new file and return its path."""
    counter = iter(range(1_000_000))

    def write(lines: Iterable[str] | None = None, *, n: int | None = None, name: str | None = None) -> Path:
        path = tmp_path / (name or f"meta_{next(counter)}.txt")
        if lines is None:
            assert n is not None
            lines = (imagenet_line(i) for i in range(n))
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return path

    return write


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A real `rank-dataset serve` process on a free loopback port."""

    def __init__(self, paths: list[Path], *args: str, env: dict[str, str] | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rank_dataset", "serve", *map(str, paths), "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True)
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


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: Any, **kwargs: Any) -> Server:
        server = Server(*args, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
