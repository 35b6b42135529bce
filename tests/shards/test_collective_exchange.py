"""The collective reader's count and exchange (``shards/collective/_slices.py`` and ``_rounds.py``) run
for real on meta files, without torch and without processes: each rank a thread, the collectives
simulated over a barrier. Their shards are the file reader's byte for byte, their fingerprints
MetaFile's, and a file changed under a slice or a bad line is the same error on every rank. (The torchrun
tests of the whole reader, with gloo: tests/shards/test_collective.py.)"""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from rank_dataset import MetaFile
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import detect_path
from rank_dataset.files.index import FileKey
from rank_dataset.shards.collective import _rounds
from rank_dataset.shards.collective._rounds import Exchange
from rank_dataset.shards.collective._slices import count_slices, shared_checkpoints, shared_fingerprints


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


def count_and_build(
    paths: list[Path], plans: list[npt.NDArray[np.int64]], change: Callable[[], None] | None = None
) -> list[Any]:
    """The making and one build on each rank: ``(shard, fingerprints)`` or the error; ``change`` runs
    between the count and the build (on rank 0, the others waiting)."""

    def work(net: ThreadNet) -> Any:
        keys = [FileKey.of(os.stat(p)) for p in paths]
        formats = [detect_path(p) for p in paths]
        checkpoints = shared_checkpoints(net, tuple(paths), keys, formats)
        slices, starts, lengths = count_slices(net, tuple(paths), keys, formats, [None] * len(paths), checkpoints)
        fingerprints = shared_fingerprints(net, slices, keys, slices.samples.sum(axis=0))
        exchange = Exchange(net, slices, starts, lengths)
        if change is not None:
            if net.rank == 0:
                change()
            net.all_gather_object(None, "the change")
        shard, _ = exchange.build(lambda: plans[net.rank], keep_ids=False)
        return shard, fingerprints

    return run_ranks(len(plans), work)


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


@pytest.mark.parametrize(("w", "round_bytes"), [(1, 4 << 20), (2, 4 << 20), (3, 1 << 10), (5, 200)])
@pytest.mark.parametrize("repeat", [False, True])
def test_shards_are_the_file_readers_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, w: int, round_bytes: int, repeat: bool
) -> None:
    monkeypatch.setattr(_rounds, "ROUND", round_bytes)
    paths = write_files(tmp_path)
    meta = MetaFile(paths)
    rng = np.random.default_rng(w)
    n = len(meta)
    plans = [rng.integers(0, n, n // w) if repeat else rng.permutation(n)[r::w] for r in range(w)]
    for r, (shard, fingerprints) in enumerate(count_and_build(paths, plans)):
        assert fingerprints == (meta.fingerprint, meta.file_fingerprints)
        want = meta.read(plans[r], ids=False)
        assert shard.bounds.tolist() == want.bounds.tolist()
        assert shard.data.tobytes() == want.data.tobytes()


def test_a_file_changed_under_a_slice_is_the_same_error_on_every_rank(tmp_path: Path) -> None:
    paths = write_files(tmp_path)
    a = paths[0]
    n = len(MetaFile(paths))
    plans = [np.arange(r, n, 3) for r in range(3)]

    def change() -> None:  # the same size: the lines, not the length, differ
        data = a.read_bytes()
        a.write_bytes(data[: len(data) - 40] + b"x" * 40)
        os.utime(a, ns=(os.stat(a).st_atime_ns, os.stat(a).st_mtime_ns + 10**9))

    errors = count_and_build(paths, plans, change)
    assert all(isinstance(e, MetaFileChangedError) for e in errors), errors
    assert len({str(e) for e in errors}) == 1
    assert str(errors[0]).startswith(f"meta file {a} changed: it was modified")


@pytest.mark.parametrize("round_bytes", [4 << 20, 1 << 10])
def test_a_bad_line_in_one_slice_is_named_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, round_bytes: int
) -> None:
    monkeypatch.setattr(_rounds, "ROUND", round_bytes)
    lines = [f"img_{i}.jpg {i % 5}".encode() for i in range(3000)]
    lines[1700] = b"img_\xff.jpg 1"  # line 1702 of the file (two blank lines before it)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\n\n" + b"\n".join(lines) + b"\n")
    plans = [np.arange(r, 3000, 3) for r in range(3)]
    errors = count_and_build([bad], plans)
    assert [str(e) for e in errors] == [f"{bad}:1703: line is not valid UTF-8 (invalid start byte at byte 4)"] * 3
