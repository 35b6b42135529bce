"""What the collective reader's tests share: ranks as threads with the collectives simulated over a barrier
(:class:`ThreadNet`, :func:`run_ranks`; tests/shards/test_collective_exchange.py), and meta files made to catch
a slicer out (:func:`write_files`, :func:`write_texts`)."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


class Board:
    """What the threads of one simulated group share: a slot a rank, and a barrier."""

    def __init__(self, w: int) -> None:
        self.slots: list[Any] = [None] * w
        self.barrier = threading.Barrier(w, timeout=30)


class ThreadNet:
    """The collectives of ``_dist.Collectives``, between threads: every rank posts its part, all wait,
    each takes what it gets, all wait again."""

    def __init__(self, board: Board, rank: int) -> None:
        self.board, self.rank, self.world_size = board, rank, len(board.slots)
        self.epoch: int | None = None
        self.group = object()

    @contextlib.contextmanager
    def named(self, name: str) -> Iterator[None]:
        yield

    def _swap(self, mine: Any) -> list[Any]:
        self.board.slots[self.rank] = mine
        self.board.barrier.wait()
        everyone = list(self.board.slots)
        self.board.barrier.wait()
        return everyone

    def all_gather(self, values: npt.NDArray[Any], name: str) -> npt.NDArray[np.int64]:
        return np.stack(self._swap(np.ascontiguousarray(values, np.int64)))

    def all_to_all(
        self, values: npt.NDArray[Any], splits: npt.NDArray[np.int64], name: str, out_splits: Any = None
    ) -> npt.NDArray[Any]:
        everyone = self._swap((np.ascontiguousarray(values), splits))
        got = np.concatenate([np.split(v, np.cumsum(s)[:-1])[self.rank] for v, s in everyone])
        assert out_splits is None or got.size == int(np.sum(out_splits))
        return got

    def all_gather_object(self, mine: Any, name: str) -> list[Any]:
        return self._swap(mine)

    def broadcast(self, objects: list[Any], name: str) -> None:
        objects[:] = self._swap(list(objects))[0]


def run_ranks(w: int, work: Callable[[ThreadNet], Any]) -> list[Any]:
    """``work(net)`` on ``w`` threads, one a rank: what each returned, or the error it raised."""
    board = Board(w)
    out: list[Any] = [None] * w

    def rank(r: int) -> None:
        try:
            out[r] = work(ThreadNet(board, r))
        except Exception as exc:  # (one raised alone leaves the others to the barrier's timeout)
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def write_files(d: Path, n: int = 2000) -> list[Path]:
    """Blank and whitespace lines, CRLF, non-ASCII, long lines, no final newline; one gzip file."""
    lines = []
    for i in range(n):
        if i % 37 == 0:
            lines.append(" \t")
        lines.append(f"img_{i}{'é' if i % 11 == 0 else ''}{'x' * (3000 if i % 401 == 0 else 0)}.jpg {i % 5}")
    a, b, c = d / "a.txt", d / "b.txt", d / "c.txt"
    a.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    b.write_bytes(gzip.compress("".join(f"b_{i} 1\n" for i in range(300)).encode()))
    c.write_text("\n\nc_0 2\n  \nc_1 3\nc_2 4")
    return [a, b, c]


def write_texts(d: Path, n: int = 3000) -> None:
    """Meta files made to catch a slicer out: a byte order mark, CRLF endings, blank and whitespace
    lines, non-ASCII text, long lines, no final newline."""
    lines = []
    for i in range(n):
        if i % 37 == 0:
            lines.append(" \t")
        elif i % 53 == 0:
            lines.append("")
        lines.append(f"img_{i}{'é' if i % 11 == 0 else ''}{'x' * (3000 if i % 401 == 0 else 0)}.jpg {i % 5}")
    (d / "a.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    (d / "b.txt").write_text("".join(f"b_{i} 1\n" for i in range(41)))
    (d / "c.txt").write_text("\n\nc_0 2\n  \nc_1 3\nc_2 4")  # no final newline
