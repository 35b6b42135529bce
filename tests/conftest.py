"""Shared fixtures: meta files written to a temporary directory, and an isolated index cache."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests_helpers import Server, imagenet_line


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
