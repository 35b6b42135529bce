"""The shard channel and its control block (a seqlock), in one process: a pickled copy of the channel
plays the DataLoader worker."""

from __future__ import annotations

import json
import pickle
import threading

import pytest

from rank_dataset._channel import ShardChannel, pass_of
from rank_dataset._control import ControlBlock
from rank_dataset.plan import ShardSpec
from rank_dataset.shard import Shard


def _shard(tag: str, n: int = 3) -> Shard:
    return Shard.from_lines([f"{tag} {i}".encode() for i in range(n)]).shared()


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
        rank.publish(Shard.from_lines([b"x"]), _spec(1))


def test_pass_of_other_objects_does_nothing() -> None:
    with pass_of(range(3)):
        pass
    with pass_of(_Holder(object())):  # type: ignore[arg-type]
        pass


class _Holder:
    """What pass_of looks for: a ``channel``."""

    def __init__(self, channel: ShardChannel) -> None:
        self.channel = channel
