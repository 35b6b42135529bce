"""The shard channel and its control block (a seqlock), in one process: a pickled copy of the channel
plays the DataLoader worker."""

from __future__ import annotations

import json
import pickle
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, Sampler

from rank_dataset import RandomSampler, RankDataset, ResumableSampler
from rank_dataset.core.shard import Shard
from rank_dataset.errors import PassAuditError, PassAuditWarning
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards._control import READERS, ControlBlock
from rank_dataset.shards.audit import PassCount
from rank_dataset.shards.channel import ShardChannel, pass_of
from tests_helpers import shard_of


def _shard(tag: str, n: int = 3) -> Shard:
    return shard_of([f"{tag} {i}".encode() for i in range(n)]).shared()


def _spec(epoch: int) -> ShardSpec:
    return ShardSpec(num_samples=10, world_size=2, rank=1, epoch=epoch, seed=7)


def _worker(channel: ShardChannel) -> ShardChannel:
    return pickle.loads(pickle.dumps(channel))


# -- the control block ------------------------------------------------------------------------------


def test_control_block_publish_and_pass_slots() -> None:
    ctl = ControlBlock.create()
    try:
        first = ctl.snapshot()
        assert (first.version, first.gen, first.passes) == (0, 0, 0)
        ctl.publish(1, b"one")
        ctl.publish(2, b"two")
        snap = ctl.snapshot()
        assert snap.version == 4 and snap.gen == 2  # each write bumps the version twice: even when done
        assert snap.record(2) == b"two" and snap.record(1) is None  # one current slot
        assert ctl.start_pass() == 1
        ctl.publish(3, b"three")
        snap = ctl.snapshot()
        assert (snap.passes, snap.pass_gen, snap.gen) == (1, 2, 3)
        assert snap.record(2) == b"two" and snap.record(3) == b"three"  # the pass slot keeps the pass's shard
        other = ControlBlock.attach(ctl.handle)
        other.join(1)
        assert ctl.snapshot().joined == 1 and other.snapshot() == ctl.snapshot()
        other.segment = None
    finally:
        assert ctl.segment is not None
        ctl.segment.close()


def test_control_block_refuses_a_record_past_its_slot() -> None:
    ctl = ControlBlock.create()
    try:
        with pytest.raises(ValueError, match="bytes to describe to DataLoader workers"):
            ctl.publish(1, b"x" * (1 << 16))
        assert ctl.snapshot().version == 0  # nothing was written
    finally:
        assert ctl.segment is not None
        ctl.segment.close()


def test_seqlock_snapshots_are_consistent_under_a_writer() -> None:
    ctl = ControlBlock.create()
    stop = threading.Event()

    def write() -> None:
        gen = 0
        while not stop.is_set():
            gen += 1
            # Records of varying length: a torn read would pair one generation with another's bytes.
            ctl.publish(gen, json.dumps({"gen": gen, "pad": "x" * (gen % 997)}).encode())

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = 0
        for _ in range(3000):
            snap = ctl.snapshot()
            assert snap.version % 2 == 0
            gen, record = snap.current_slot
            if gen:
                assert json.loads(record)["gen"] == gen == snap.gen
                assert gen >= seen
                seen = gen
    finally:
        stop.set()
        writer.join()
        assert ctl.segment is not None
        ctl.segment.close()


# -- the channel ------------------------------------------------------------------------------------


def test_worker_follows_the_published_shard() -> None:
    rank = ShardChannel()
    a = _shard("a")
    rank.publish(a, _spec(0))
    assert rank.is_owner and rank.version[0] == rank.seen
    worker = _worker(rank)
    assert not worker.is_owner and worker.seen == -1  # an unpickled copy looks on first use
    served = worker.follow(holding=False)
    assert served is not None
    shard, spec = served
    assert spec == _spec(0) and shard.texts(range(3)) == a.texts(range(3))
    assert worker.seen == rank.version[0]
    assert worker.follow(holding=True) is None  # nothing changed


def test_a_pass_keeps_its_shard_in_workers() -> None:
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    worker = _worker(rank)
    assert worker.follow(holding=False) is not None
    with pass_of(_Holder(rank)):
        assert worker.follow(holding=True) is None  # the pass serves the shard held
        rank.publish(_shard("b"), _spec(1))  # set_epoch in mid-pass
        assert worker.follow(holding=True) is None
    # The next pass serves the new shard.
    with pass_of(_Holder(rank)):
        served = worker.follow(holding=True)
        assert served is not None and served[1] == _spec(1) and served[0].text(0) == "b 0"


def test_rank_refuses_to_mix_shards_in_a_pass() -> None:
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    with pass_of(_Holder(rank)):
        rank.publish(_shard("b"), _spec(1))
        assert rank.version[0] != rank.seen  # the next item is checked
        rank.follow()  # not an item read: no error, and the next item read is still checked
        with pytest.raises(RuntimeError, match="while a pass over this dataset was running"):
            rank.follow(items=True)
    rank.follow(items=True)  # the pass ended: the rank serves the new shard
    assert rank.seen == rank.version[0]


def test_worker_without_our_sampler_refuses_a_replaced_shard() -> None:
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    worker = _worker(rank)
    assert worker.follow(holding=False) is not None
    rank.publish(_shard("b"), _spec(1))
    with pytest.raises(RuntimeError, match="was not started by rank_dataset's RandomSampler"):
        worker.follow(holding=True)


def test_rank_keeps_a_replaced_shard_while_a_pass_may_need_it() -> None:
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    rank.publish(_shard("b"), _spec(1))
    assert set(rank._kept) == {2}  # no pass started with the first: released at once
    with pass_of(_Holder(rank)):
        rank.publish(_shard("c"), _spec(2))
        assert set(rank._kept) == {2, 3}  # the running pass serves 2
    assert set(rank._kept) == {2, 3}  # until the next pass starts
    with pass_of(_Holder(rank)):
        assert set(rank._kept) == {3}


def test_only_the_rank_publishes() -> None:
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    worker = _worker(rank)
    with pytest.raises(RuntimeError, match="in the process that created the dataset"):
        worker.publish(_shard("b"), _spec(1))
    assert worker.begin_pass() == 0  # a worker records no pass
    with pytest.raises(ValueError, match="must be shared"):
        rank.publish(shard_of([b"x"]), _spec(1))


def test_pass_of_other_objects_does_nothing() -> None:
    holder = _Holder(object())  # type: ignore[arg-type]
    before = vars(holder).copy()
    with pass_of(range(3), draws=3):
        pass
    with pass_of(holder, draws=3):
        pass
    assert vars(holder) == before and holder.channel.__class__ is object  # nothing set on it or its channel
    # The same body over a channel records a pass: what the two above did not.
    rank = ShardChannel()
    rank.publish(_shard("a"), _spec(0))
    with pass_of(_Holder(rank), draws=3):
        assert rank.audit() == (PassCount(1, 3, 0, "running"),)
    assert rank.audit() == (PassCount(1, 3, 0, "finished"),)


class _Holder:
    """What pass_of looks for: a ``channel``."""

    def __init__(self, channel: ShardChannel) -> None:
        self.channel = channel


# -- the pass audit ---------------------------------------------------------------------------------


class _EverySecondBatch(Sampler[list[int]]):
    """A batch sampler that keeps every second batch of another: the kind of wrapper that shards a loader
    again (accelerate's BatchSamplerShard keeps one batch in world_size)."""

    def __init__(self, batches: BatchSampler) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        for k, batch in enumerate(self.batches):
            if k % 2 == 0:
                yield batch

    def __len__(self) -> int:
        return (len(self.batches) + 1) // 2


def _audit_dataset(write_meta, n: int = 100, **kwargs: Any) -> RankDataset:
    return RankDataset(write_meta(n=n), rank=0, world_size=1, **kwargs)


def _loader(ds: RankDataset, workers: int, sampler: Sampler[int] | None = None, **kwargs: Any) -> DataLoader:
    extra = {"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}
    return DataLoader(ds, batch_size=8, sampler=sampler or RandomSampler(ds), num_workers=workers, **extra, **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_dropping_batches_is_caught(write_meta, workers: int) -> None:
    ds = _audit_dataset(write_meta)
    sampler = RandomSampler(ds)
    loader = DataLoader(
        ds,
        batch_sampler=_EverySecondBatch(BatchSampler(sampler, 8, drop_last=False)),
        num_workers=workers,
        **({"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}),
    )
    read = [item for batch in loader for item in batch]
    assert len(read) == 52  # batches 0, 2, ..., 12 of 13: 6 * 8 + 4
    with pytest.warns(PassAuditWarning) as caught:
        ds.set_epoch(1)  # the pass is over: audited here
    message = str(caught[0].message)
    assert "pass 1 over this rank's shard read 52 items, but its sampler drew 100 indices" in message
    assert "accelerator.prepare()" in message and "DistributedSampler" in message and "batch sampler" in message
    assert ds.audit()[0] == PassCount(1, 100, 52, "finished")
    # Once per dataset: the next short pass is recorded, not warned again.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = [batch for batch in loader]
        _ = iter(sampler), list(loader)  # the next pass starting judges the previous one
    assert [c.read for c in ds.audit()[:3]] == [52, 52, 52] and not any(c.ok for c in ds.audit()[:3])


@pytest.mark.parametrize("workers", [0, 2])
def test_full_and_interrupted_passes_stay_quiet(write_meta, workers: int) -> None:
    ds = _audit_dataset(write_meta)
    loader = _loader(ds, workers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            ds.set_epoch(epoch)
            loader.sampler.set_epoch(epoch)
            assert sorted(x for batch in loader for x in batch) == sorted(ds[i] for i in range(100))
        for batch_index, _ in enumerate(loader):  # left early: not judged
            if batch_index == 2:
                break
        for _ in loader:  # an exception in the loop: left early too
            break
        ds.set_epoch(3)
        assert len([x for batch in loader for x in batch]) == 100
        ds.set_epoch(4)
    states = [(c.number, c.drawn, c.read, c.state) for c in ds.audit()]
    assert states[:3] == [(1, 100, 100, "finished"), (2, 100, 100, "finished"), (3, 100, 100, "finished")]
    assert [s[3] for s in states[3:5]] == ["left early", "left early"]
    assert states[5] == (6, 100, 100, "finished")
    assert all(c.ok for c in ds.audit())


def test_resumable_sampler_passes_and_the_running_pass(write_meta) -> None:
    ds = _audit_dataset(write_meta, n=40)
    sampler = ResumableSampler(ds)
    it = iter(sampler)
    first = [next(it) for _ in range(5)]
    [ds[i] for i in first]
    assert ds.audit() == (PassCount(1, 40, 5, "running"),)
    it.close()
    assert ds.audit() == (PassCount(1, 40, 5, "left early"),)
    ds.load_state_dict(ds.state_dict(consumed=5))  # judged here: left early, quiet
    loader = DataLoader(ds, batch_size=4, sampler=ResumableSampler(ds))
    assert len([x for b in loader for x in b]) == 35
    assert ds.audit()[-1] == PassCount(2, 35, 35, "finished")


def test_audit_error_mode_and_off(write_meta) -> None:
    ds = _audit_dataset(write_meta, audit="error")
    sampler = RandomSampler(ds)
    loader = DataLoader(ds, batch_sampler=_EverySecondBatch(BatchSampler(sampler, 8, drop_last=False)))
    _ = list(loader)
    with pytest.raises(PassAuditError, match="read 52 items, but its sampler drew 100") as raised:
        ds.set_epoch(1)
    assert raised.value.count == PassCount(1, 100, 52, "finished")
    assert ds.spec.epoch == 0  # the dataset is as it was
    ds.set_epoch(1)  # judged once
    off = _audit_dataset(write_meta, audit="off")
    loader = DataLoader(off, batch_sampler=_EverySecondBatch(BatchSampler(RandomSampler(off), 8, drop_last=False)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = list(loader)
        off.set_epoch(1)
    assert off.audit() == ()
    with pytest.raises(ValueError, match="audit must be one of 'warn', 'error', 'off', got 'loud'"):
        _audit_dataset(write_meta, audit="loud")


def test_a_sampler_listed_without_a_loader_stays_quiet(write_meta) -> None:
    ds = _audit_dataset(write_meta, n=500)
    sampler = RandomSampler(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first, second = list(sampler), list(sampler)  # one epoch's order, looked at twice
        ds.set_epoch(1)
    assert first == second and sorted(first) == list(range(500))
    assert ds.audit() == (PassCount(1, 500, 0, "finished"), PassCount(2, 500, 0, "finished"))
    assert all(c.ok for c in ds.audit())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_listed_sampler_then_a_loader_reading_part_of_a_pass_is_still_caught(write_meta, workers: int) -> None:
    ds = _audit_dataset(write_meta)
    sampler = RandomSampler(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = list(sampler)  # a pass that read nothing: quiet
    loader = DataLoader(
        ds,
        batch_sampler=_EverySecondBatch(BatchSampler(sampler, 8, drop_last=False)),
        num_workers=workers,
        **({"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}),
    )
    assert len([item for batch in loader for item in batch]) == 52
    with pytest.warns(PassAuditWarning, match="pass 2 over this rank's shard read 52 items, but its sampler drew 100"):
        ds.set_epoch(1)
    assert ds.audit() == (PassCount(1, 100, 0, "finished"), PassCount(2, 100, 52, "finished"))
    erroring = _audit_dataset(write_meta, audit="error")
    loader = DataLoader(erroring, batch_sampler=_EverySecondBatch(BatchSampler(RandomSampler(erroring), 8, False)))
    _ = list(loader.batch_sampler.batches.sampler), list(loader)
    with pytest.raises(PassAuditError, match="pass 2 over this rank's shard read 52 items, but its sampler drew 100"):
        erroring.set_epoch(1)


def test_more_items_read_than_drawn_is_caught_too(write_meta) -> None:
    ds = _audit_dataset(write_meta, n=10)
    for i in RandomSampler(ds):
        ds[i], ds[i]  # every item read twice
    with pytest.warns(PassAuditWarning, match="read 20 items, but its sampler drew 10"):
        ds.set_epoch(1)


def test_a_worker_past_the_tally_table_is_not_judged() -> None:
    ctl = ControlBlock.create()
    try:
        assert ctl.tally_word(0, 1) > 0 and ctl.tally_word(READERS, 1) == -1
        assert ctl.items_read(1) is None and ctl.items_read(2) == 0
        word = ctl.tally_word(3, 2)
        ctl.words[word] = 17
        assert ctl.items_read(2) == 17 and ctl.items_read(3) == 0
    finally:
        assert ctl.segment is not None
        ctl.segment.close()
