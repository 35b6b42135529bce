"""The collective reader's count and exchange (``shards/collective/_slices.py`` and ``_rounds.py``) run
for real on meta files, without torch and without processes: each rank a thread, the collectives
simulated over a barrier. Their shards are the file reader's byte for byte, their fingerprints
MetaFile's, and a file changed under a slice or a bad line is the same error on every rank. (The torchrun
tests of the whole reader, with gloo: tests/shards/test_collective.py.)"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from collective_helpers import ThreadNet, run_ranks, write_files
from rank_dataset import MetaFile
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import detect_path
from rank_dataset.files.index.load import FileKey
from rank_dataset.shards.collective import _rounds
from rank_dataset.shards.collective._rounds import Exchange
from rank_dataset.shards.collective._slices import count_slices, shared_checkpoints, shared_fingerprints


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
