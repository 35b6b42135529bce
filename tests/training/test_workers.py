"""DataLoader workers and shards: one copy of a shard per rank and workers, one DataLoader for every
set_epoch (persistent workers included), set_epoch in mid-pass, and old shards released everywhere."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from torch.utils.data import DataLoader, SequentialSampler

from rank_dataset import RandomSampler, RankDataset, ResumableSampler
from rank_dataset.core import shm as _shm
from rank_dataset.shards.channel import pass_of
from tests_helpers import imagenet_line, spawn_workers, start_methods

CONTEXTS = start_methods("fork", "spawn", "forkserver")


def _memfd_inodes(pid: int) -> set[int]:
    """Inodes of the memfds a process maps or holds a descriptor to."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "/memfd:rank_dataset" in line:
                    found.add(int(line.split()[4]))
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:rank_dataset"):
                    found.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
            except OSError:
                continue
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def _infrastructure(proc: psutil.Process) -> bool:
    """multiprocessing's own helpers (resource tracker, fork server): one per interpreter, by design."""
    try:
        cmd = " ".join(proc.cmdline())
        direct = proc.ppid() == os.getpid()  # a fork server's workers are its children, not ours
    except psutil.Error:
        return True
    return direct and ("resource_tracker" in cmd or "forkserver" in cmd)


def _workers() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if not _infrastructure(c)]


def _family() -> list[int]:
    me = psutil.Process()
    return [me.pid, *(c.pid for c in _workers())]


def _shard_pss(pid: int, inode: int) -> int:
    """PSS (bytes) of the mappings of memfd ``inode`` in process ``pid``."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                inside = len(parts) >= 6 and parts[5].startswith("/memfd:rank_dataset") and int(parts[4]) == inode
            elif inside and line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.fixture
def meta(write_meta) -> Path:
    return write_meta(n=6000)


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    def ours() -> set[str]:  # named segments (the fallback) carry the creating pid
        pids = {f"_{pid}_" for pid in _family()}
        return {p for p in os.listdir("/dev/shm") if p.startswith("rank_dataset") and any(x in p for x in pids)}

    shm_before = ours()
    # Processes that were there before the test (a session fixture's server, started by an earlier test
    # in this pytest process) are not this test's.
    before = {c.pid for c in _workers()}
    yield
    gc.collect()
    started = [c for c in _workers() if c.pid not in before]
    for child in started:
        with contextlib.suppress(psutil.TimeoutExpired):  # reported below
            child.wait(timeout=30)  # workers of a finished DataLoader exit on their own
    left = ours() - shm_before
    assert not left, f"shared-memory segments left behind: {left}"
    assert not [c for c in started if c.is_running()], "processes left behind"


def _sampler(kind: str, ds: RankDataset) -> RandomSampler | ResumableSampler:
    return RandomSampler(ds, seed=5) if kind == "random" else ResumableSampler(ds)


def _read(loader: DataLoader) -> list[str]:
    return [line for batch in loader for line in batch]


def _expect(ds: RankDataset) -> list[str]:
    return [imagenet_line(int(i)) for i in ds.indices]


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("kind", ["random", "resumable"])
def test_one_persistent_dataloader_for_every_set_epoch(meta: Path, context: str, kind: str) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=1, world_size=2)
    sampler = _sampler(kind, ds)
    loader = DataLoader(
        ds, batch_size=97, sampler=sampler, num_workers=2, persistent_workers=True, multiprocessing_context=context
    )
    seen = []
    for epoch, mini in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        ds.set_epoch(epoch, mini)
        if isinstance(sampler, RandomSampler):
            sampler.set_epoch(epoch * 2 + mini)
        got = _read(loader)
        assert sorted(got) == sorted(_expect(ds))
        if kind == "resumable":
            assert got == _expect(ds)  # in order
        seen.append(tuple(ds.indices.tolist()))
    assert len(set(seen)) == 4
    # After a resume (load_state_dict) the same workers read the resumed shard.
    state = ds.state_dict(consumed=1000)
    ds.set_epoch(2)
    _read(loader)
    ds.load_state_dict(state)
    got = _read(loader)
    assert sorted(got) == sorted(_expect(ds)) and len(got) == 1500 - 1000
    del loader


@pytest.mark.parametrize("context", CONTEXTS)
def test_set_epoch_mid_pass_finishes_the_pass_on_its_shard(meta: Path, context: str) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 2}, rank=0, world_size=2)
    loader = DataLoader(
        ds, batch_size=50, sampler=ResumableSampler(ds), num_workers=2, persistent_workers=True,
        multiprocessing_context=context, prefetch_factor=1,
    )  # fmt: skip
    first = _expect(ds)
    got = []
    for k, batch in enumerate(loader):
        got += batch
        if k == 3:
            ds.set_epoch(1)  # during the pass: it finishes on the shard it started with
    assert got == first
    assert _read(loader) == _expect(ds) != first  # the next pass reads the new shard
    del loader


def test_set_epoch_mid_pass_without_workers_raises(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 2}, rank=0, world_size=2)
    it = iter(DataLoader(ds, batch_size=50, sampler=ResumableSampler(ds)))
    next(it)
    ds.set_epoch(1)
    with pytest.raises(RuntimeError, match="while a pass over this dataset was running"):
        next(it)
    assert len(ds) == 3000  # len works; items again once the pass is dropped
    del it
    gc.collect()
    assert ds[0] == imagenet_line(int(ds.indices[0]))
    assert _read(DataLoader(ds, batch_size=50, sampler=ResumableSampler(ds))) == _expect(ds)


@pytest.mark.slow  # DataLoader workers that raise: torch's shutdown of them waits 5 s each
@pytest.mark.parametrize("context", start_methods("fork", "spawn"))
def test_foreign_sampler_with_persistent_workers_fails_loudly(meta: Path, context: str) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 2}, rank=0, world_size=2)
    loader = DataLoader(
        ds, batch_size=64, sampler=SequentialSampler(ds), num_workers=1, persistent_workers=True,
        multiprocessing_context=context,
    )  # fmt: skip
    assert _read(loader) == _expect(ds)
    ds.set_epoch(1)
    with pytest.raises(RuntimeError, match="was not started by rank_dataset's RandomSampler or ResumableSampler"):
        _read(loader)
    del loader


@pytest.mark.parametrize("context", CONTEXTS)
def test_foreign_sampler_with_a_dataloader_per_set_epoch(meta: Path, context: str) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 2}, rank=0, world_size=2)
    # Two spawn workers on one shard: the persistent loaders' tests here.
    for epoch in range(2):
        ds.set_epoch(epoch)
        loader = DataLoader(
            ds, batch_size=64, shuffle=True, num_workers=spawn_workers(context), multiprocessing_context=context
        )
        assert sorted(_read(loader)) == sorted(_expect(ds))


@pytest.mark.parametrize("context", CONTEXTS)
def test_old_shards_are_released_everywhere(meta: Path, context: str) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 3, "mini_epoch": 3}, rank=0, world_size=1)
    sampler = RandomSampler(ds)
    loader = DataLoader(
        ds, batch_size=100, sampler=sampler, num_workers=2, persistent_workers=True, multiprocessing_context=context
    )
    inodes = []
    for mini in range(3):
        ds.set_epoch(0, mini)
        assert ds.shard.handle is not None
        inodes.append(ds.shard.handle.ino)
        _read(loader)
        # The rank and both workers hold the current shard, and no older one.
        held = [_memfd_inodes(pid) for pid in _family()]
        assert all(inodes[-1] in h for h in held if h)
        assert not any(h & set(inodes[:-1]) for h in held), (inodes, held)
    del loader
    gc.collect()
    ds.set_epoch(1)
    with pass_of(ds):  # a pass starts with the new shard: the rank lets go of the last one
        pass
    assert not _memfd_inodes(os.getpid()) & set(inodes)


@pytest.mark.parametrize("context", CONTEXTS)
def test_rank_and_workers_hold_the_shard_once(write_meta, context: str) -> None:
    ds = RankDataset(write_meta(n=100_000), rank=0, world_size=1)
    sampler = RandomSampler(ds)
    loader = DataLoader(
        ds, batch_size=500, sampler=sampler, num_workers=2, persistent_workers=True, multiprocessing_context=context
    )
    _read(loader)  # every worker has touched (most of) the shard
    inode = ds.shard.handle.ino if ds.shard.handle else -1
    pss = sum(_shard_pss(pid, inode) for pid in _family())
    size = ds.shard.handle.size if ds.shard.handle else 0
    assert 0.9 * size < pss < 1.1 * size, (pss, size)
    del loader


def test_pickling_the_dataset_does_not_copy_the_shard(write_meta) -> None:
    ds = RankDataset(write_meta(n=400_000), rank=0, world_size=1)
    gc.collect()
    proc = psutil.Process()
    before = proc.memory_info().rss
    blob = pickle.dumps(ds)
    grown = proc.memory_info().rss - before
    assert grown < 0.1 * ds.shard.nbytes, (grown, ds.shard.nbytes)
    assert len(blob) < 20_000
    view = pickle.loads(blob)  # a view, as a worker would hold (here in the same process)
    assert view[7] == ds[7] and len(view) == len(ds)
    with pytest.raises(RuntimeError, match="process that created the dataset"):
        view.set_epoch(1)


def test_a_dataset_of_100k_lines_pickles_under_2_kib(write_meta) -> None:
    # What a spawn or forkserver worker receives: the channel's handle, the parser, the failure policy and the
    # rank's side (the reader and its meta file, without the index); never a shard's bytes or its line offsets.
    ds = RankDataset(write_meta(n=100_000), rank=0, world_size=1)
    assert len(pickle.dumps(ds)) < 2048


def test_bytes_per_sample(write_meta) -> None:
    ds = RankDataset(write_meta(n=50_000), rank=0, world_size=2)
    shard = ds.shard
    text = sum(len(imagenet_line(int(i))) for i in ds.indices)
    assert shard.ids is None and shard.text_bytes == text
    assert shard.nbytes <= text + 4 * len(ds) + 4  # the lines and one offset each
    assert shard.handle is not None and shard.handle.size <= text + 8 * len(ds)  # the segment, header included


def test_segments_without_memfd_leave_no_file(meta: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shm, "USE_MEMFD", False)
    ds = RankDataset(meta, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=0, world_size=1)
    sampler = RandomSampler(ds)
    loader = DataLoader(ds, batch_size=100, sampler=sampler, num_workers=1, persistent_workers=True)
    for mini in range(2):
        ds.set_epoch(0, mini)
        assert sorted(_read(loader)) == sorted(_expect(ds))
    del loader, ds, sampler
    gc.collect()  # the fixture checks that /dev/shm holds nothing of ours


def test_indices_contract(meta: Path) -> None:
    ds = RankDataset(meta, reload_cfg={"seed": 1}, rank=0, world_size=3)
    idx = ds.indices
    assert idx.dtype == np.int64 and not idx.flags.writeable and idx is ds.indices
    assert [ds[i] for i in range(5)] == [imagenet_line(int(j)) for j in idx[:5]]
    ds.set_epoch(1)
    assert ds.indices is not idx and not np.array_equal(ds.indices, idx)


def test_a_fork_loader_starts_with_one_full_collection_and_building_runs_none(meta: Path) -> None:
    # So that the rank's next full collection, which writes to every tracked object's header (copying the pages
    # its fork workers share), waits for many new survivors instead of falling in the pass; and so that a
    # process that builds datasets without forking (a long test process, a rank without workers) never scans
    # its whole heap for them.
    full: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    # Automatic collections off: what is counted is what the dataset and its hook ask for.
    enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(record)
    try:
        ds = RankDataset(meta, reload_cfg={"mini_epoch": 2}, rank=0, world_size=2)
        ds.set_epoch(0, 1)
        built = len(full)
        gc.collect(1)  # survivors moved into the oldest generation since its last collection, as a pass leaves
        loader = DataLoader(ds, batch_size=100, num_workers=2, multiprocessing_context="fork")
        assert sorted(_read(loader)) == sorted(_expect(ds))
        forked = len(full) - built
        again = len(full)
        assert sorted(_read(loader)) == sorted(_expect(ds))  # new workers, nothing new in the oldest generation
        forked_again = len(full) - again
    finally:
        gc.callbacks.remove(record)
        if enabled:
            gc.enable()
    assert built == 0  # neither the first build nor a rebuild scans the heap
    assert forked == 1  # the first worker's fork collects; the second finds nothing new
    assert forked_again == 0
