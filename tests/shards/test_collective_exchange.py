"""The collective reader's count and exchange (``shards/collective/_slices.py`` and ``_rounds.py``) run
for real on meta files, without torch and without processes: each rank a thread, the collectives
simulated over a barrier. Their shards are the file reader's byte for byte, their fingerprints
MetaFile's, and a file changed under a slice or a bad line is the same error on every rank; the threads
stand for the ranks of one host or of several (``hosts``): the lines of a rank's host come through shared
memory, the others' through the collectives. (The torchrun tests of the whole reader, with gloo:
tests/shards/test_collective.py.)"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from collective_helpers import ThreadNet, run_ranks, write_files
from rank_dataset import MetaFile
from rank_dataset.core import shm
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import detect_path
from rank_dataset.files.index.load import FileKey
from rank_dataset.shards.collective import _rounds, _routing
from rank_dataset.shards.collective._rounds import Exchange
from rank_dataset.shards.collective._slices import count_slices, shared_checkpoints, shared_fingerprints


def count_and_build(
    paths: list[Path],
    plans: list[npt.NDArray[np.int64]],
    change: Callable[[], None] | None = None,
    hosts: list[int] | None = None,
) -> list[Any]:
    """The making and one build on each rank: ``(shard, fingerprints, stats)`` or the error; ``change``
    runs between the count and the build (on rank 0, the others waiting); ``hosts``: each rank's host
    (None: the threads' own, one host)."""

    def work(net: ThreadNet) -> Any:
        keys = [FileKey.of(os.stat(p)) for p in paths]
        formats = [detect_path(p) for p in paths]
        checkpoints = shared_checkpoints(net, tuple(paths), keys, formats)
        slices, starts, lengths = count_slices(net, tuple(paths), keys, formats, [None] * len(paths), checkpoints)
        fingerprints = shared_fingerprints(net, slices, keys, slices.samples.sum(axis=0))
        exchange = Exchange(net, slices, starts, lengths, hosts)
        if change is not None:
            if net.rank == 0:
                change()
            net.all_gather_object(None, "the change")
        shard, stats = exchange.build(lambda: plans[net.rank], keep_ids=False)
        return shard, fingerprints, stats

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
    for r, (shard, fingerprints, _) in enumerate(count_and_build(paths, plans)):
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


@pytest.mark.parametrize(
    ("hosts", "round_bytes"),
    [([0, 0, 1, 1], 4 << 20), ([0, 0, 1, 1], 300), ([0, 1, 2], 1 << 10), ([1, 0, 0, 1, 1], 200), ([0] * 4, 200)],
)
@pytest.mark.parametrize("plan", ["permutation", "repeat", "sparse"])
@pytest.mark.parametrize("long_lines", [True, False])
def test_shards_across_hosts_are_the_file_readers_and_only_far_lines_cross(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[int], round_bytes: int, plan: str, long_lines: bool
) -> None:
    # Ranks of several hosts: each rank's shard is the file reader's, and what it received through the
    # collectives is its far lines (those of other hosts' slices), each headed by a status byte a
    # round, with their requests and lengths; the lines of its own host's slices came through memory.
    monkeypatch.setattr(_rounds, "ROUND", round_bytes)
    paths = write_files(tmp_path)
    if not long_lines:  # every line under 256 bytes (up to 255): lengths cross gloo a byte each
        paths[0].write_text("".join(f"img_{i}{'x' * (235 if i % 97 == 0 else 0)}.jpg {i % 5}\n" for i in range(2000)))
    meta = MetaFile(paths)
    w, n = len(hosts), len(meta)
    longest = int(np.diff(meta.read(np.arange(n), ids=False).bounds.astype(np.int64)).max())
    assert (longest < 256) != long_lines, longest
    rng = np.random.default_rng(len(hosts) + round_bytes)
    # A permutation's share (and a plan repeating samples) asks for a bitmap's worth of each slice: its
    # requests go as bitmaps; a sparse plan's as numbers.
    share = {"permutation": None, "sparse": n // (64 * w)}
    plans = [
        rng.integers(0, n, n // w) if plan == "repeat" else rng.permutation(n)[r::w][: share[plan]] for r in range(w)
    ]
    results = count_and_build(paths, plans, hosts=hosts)
    owned, rounds = count_only(paths, w)
    owner_of = np.searchsorted(owned[1:], np.arange(n), side="right")
    far_lines = far_items = request_bytes = 0
    for r, (shard, _, stats) in enumerate(results):
        want = meta.read(plans[r], ids=False)
        assert shard.bounds.tolist() == want.bounds.tolist()
        assert shard.data.tobytes() == want.data.tobytes()
        distinct = np.unique(plans[r])
        lengths = np.diff(meta.read(distinct, ids=False).bounds.astype(np.int64))
        far = np.array([hosts[o] != hosts[r] for o in owner_of[distinct]], bool)
        assert stats["shared"] == int(lengths[~far].sum()), (r, stats)
        far_lines, far_items = far_lines + int(lengths[far].sum()), far_items + int(far.sum())
        # Its requests to each owner of another host: their numbers (4 bytes each), or a bitmap of the
        # owner's slice where that is smaller.
        for o in range(w):
            asked = int(np.count_nonzero(owner_of[distinct] == o)) if hosts[o] != hosts[r] else 0
            bitmap = -(-int(owned[o + 1] - owned[o]) // 8)
            request_bytes += bitmap if bitmap < 4 * asked else 4 * asked
    # All ranks together received their far lines, the requests for them and their lengths (a byte each
    # where every line is under 256 bytes, else 4 here), a status byte from each rank in each round, and on
    # more than one host the request sizes (8 bytes a rank and round); nothing else.
    heads = w * w * rounds
    width = 1 if longest < 256 else 4
    want_received = far_lines + request_bytes + width * far_items + heads + (8 * heads if len(set(hosts)) > 1 else 0)
    assert sum(stats["received"] for _, _, stats in results) == want_received
    assert sum(stats["sent"] for _, _, stats in results) == want_received


def count_only(paths: list[Path], w: int) -> tuple[npt.NDArray[np.int64], int]:
    """The first global sample of each rank's slice (and the end) as ``w`` ranks count them, and the
    rounds of their exchange."""

    def work(net: ThreadNet) -> Any:
        keys = [FileKey.of(os.stat(p)) for p in paths]
        formats = [detect_path(p) for p in paths]
        checkpoints = shared_checkpoints(net, tuple(paths), keys, formats)
        slices, _, _ = count_slices(net, tuple(paths), keys, formats, [None] * len(paths), checkpoints)
        return slices.owned, _routing.rounds_of(slices.held, slices.text_bytes, _rounds.ROUND)[1]

    return run_ranks(w, work)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("hosts", [[0, 0, 1], [0, 1, 1], [0, 1, 2]])
def test_a_bad_line_near_or_far_is_named_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[int]
) -> None:
    # Found by the rank that copies it from its host's memory (then told at the build's end), or by
    # its owner serving it to another host: the same error on every rank.
    monkeypatch.setattr(_rounds, "ROUND", 1 << 10)
    lines = [f"img_{i}.jpg {i % 5}".encode() for i in range(3000)]
    lines[1700] = b"img_\xff.jpg 1"  # line 1702 of the file (two blank lines before it)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\n\n" + b"\n".join(lines) + b"\n")
    plans = [np.arange(r, 3000, 3) for r in range(3)]
    errors = count_and_build([bad], plans, hosts=hosts)
    assert [str(e) for e in errors] == [f"{bad}:1703: line is not valid UTF-8 (invalid start byte at byte 4)"] * 3


@pytest.mark.parametrize("hosts", [[0, 0, 1], [0, 1, 2]])
def test_a_file_changed_under_a_slice_across_hosts_is_the_same_error_on_every_rank(
    tmp_path: Path, hosts: list[int]
) -> None:
    paths = write_files(tmp_path)
    a = paths[0]
    n = len(MetaFile(paths))
    plans = [np.arange(r, n, 3) for r in range(3)]

    def change() -> None:
        data = a.read_bytes()
        a.write_bytes(data[: len(data) - 40] + b"x" * 40)
        os.utime(a, ns=(os.stat(a).st_atime_ns, os.stat(a).st_mtime_ns + 10**9))

    errors = count_and_build(paths, plans, change, hosts=hosts)
    assert all(isinstance(e, MetaFileChangedError) for e in errors), errors
    assert len({str(e) for e in errors}) == 1


def test_a_host_whose_ranks_cannot_map_each_others_memory_exchanges_through_the_collectives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One rank of the host cannot map a peer's segment (as under another user): every rank of the host
    # then gets its lines through the collectives, its own slice's still from its own memory.
    attach, refused = shm.attach, threading.Lock()

    def attach_once_refused(handle: shm.Handle, **kw: Any) -> Any:
        if refused.acquire(blocking=False):
            raise PermissionError(f"cannot open shared segment {handle.open_path()}")
        return attach(handle, **kw)

    monkeypatch.setattr(shm, "attach", attach_once_refused)
    paths = write_files(tmp_path)
    meta = MetaFile(paths)
    n, w = len(meta), 3
    plans = [np.random.default_rng(1).permutation(n)[r::w] for r in range(w)]
    with pytest.warns(RuntimeWarning, match="cannot map the shared memory of another rank of this host"):
        results = count_and_build(paths, plans)
    owned, _ = count_only(paths, w)
    for r, (shard, _, stats) in enumerate(results):
        want = meta.read(plans[r], ids=False)
        assert shard.data.tobytes() == want.data.tobytes()
        mine = plans[r][(plans[r] >= owned[r]) & (plans[r] < owned[r + 1])]
        assert stats["shared"] == int(np.diff(meta.read(mine, ids=False).bounds.astype(np.int64)).sum())
        assert stats["received"] > int(want.bounds[-1]) - stats["shared"]
