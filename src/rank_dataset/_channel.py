"""The shard channel: how the rank's current shard reaches its DataLoader workers. No torch.

The process that creates a dataset (the rank) builds every shard straight into shareable memory and
:meth:`ShardChannel.publish` es it in a control block (:mod:`rank_dataset._control`, a seqlock) under a
new *generation*. A DataLoader worker holds a copy of the channel (forked, or unpickled from a handle
under spawn and forkserver): its dataset compares one word of the control block (:attr:`version`)
with what it saw last, and when it changed, :meth:`ShardChannel.follow` says which shard to serve now.

Passes: rank_dataset's samplers wrap each iteration in :func:`pass_of`, which records, when a pass
starts, the shard current then; workers serve that shard for the whole pass (a ``set_epoch`` during a
pass takes effect in workers at the next pass). Workers of a DataLoader whose sampler is not one of
ours cannot tell passes apart: they serve the shard they started with and raise if it is replaced
under them. The rank keeps a replaced shard reachable until the next pass starts (a running pass may
still need it), then releases it; each worker unmaps it when it first serves the new pass.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from rank_dataset import _shm
from rank_dataset._control import ControlBlock
from rank_dataset.plan import ShardSpec
from rank_dataset.shard import Shard

__all__ = ["ShardChannel", "pass_of"]


class ShardChannel:
    """One dataset's channel to its workers: the rank side (:meth:`publish`, :meth:`begin_pass`,
    :meth:`end_pass`) and the worker side (:meth:`follow`). Pickles itself to the control block's handle.

    ``seen`` is the control block version this process last acted on: while ``version[0] == seen``
    nothing needs doing (the per-item check of the dataset).
    """

    def __init__(self) -> None:
        self._ctl = ControlBlock.create()
        self.version = self._ctl.words  # word 0: the control block's version
        self._owner, self._owner_pid = True, os.getpid()
        self.seen = 0  # the control block version this process last acted on
        self._gen = 0  # generation of the shard served here
        self._passes = 0  # passes started by our samplers, as last seen here
        self._pass_gen = 0  # (rank) the shard the latest of those passes started with
        self._pass_open = 0  # (rank) the pass whose sampler is running, 0: none
        self._managed = False  # (worker) passes are started by our samplers
        self._kept: dict[int, _shm.Segment] = {}  # (rank) segments of shards a pass may need

    @property
    def is_owner(self) -> bool:
        """Whether this is the rank: the process that created the channel, not a worker or a copy."""
        return self._owner and os.getpid() == self._owner_pid

    def check_owner(self) -> None:
        """Raise RuntimeError unless this is the rank (only the rank loads shards)."""
        if not self.is_owner:
            raise RuntimeError(
                "set_epoch and load_state_dict must be called in the process that created the dataset, "
                "not in a DataLoader worker or a copy of the dataset"
            )

    # -- the rank ---------------------------------------------------------------------------------

    def publish(self, shard: Shard, spec: ShardSpec) -> None:
        """(Rank) make ``shard`` (shared, see :meth:`Shard.shared`) of ``spec`` the current shard.

        The caller serves it from now on. The previous shard's segment stays reachable for workers
        only if a pass started with it (until the next pass starts).
        """
        self.check_owner()
        if shard.handle is None or shard.segment is None:
            raise ValueError("a published shard must be shared (Shard.shared())")
        gen = self._gen + 1
        record = json.dumps({"handle": shard.handle.to_dict(), "spec": spec.to_dict()}).encode()
        self._ctl.publish(gen, record)
        self._kept[gen] = shard.segment
        self._gen = gen
        self._release(keep={gen, self._pass_gen} if self._passes else {gen})
        if not self._pass_open:
            self.seen = self.version[0]

    def begin_pass(self) -> int:
        """(Rank) a pass starts: workers serve the current shard until the next pass starts, whatever
        set_epoch does meanwhile. Returns a token for :meth:`end_pass` (0 outside the rank: nothing
        is recorded)."""
        if not self.is_owner:
            return 0
        self._passes = self._ctl.start_pass()
        self._pass_gen = self._gen
        self._pass_open = self._passes
        self._release(keep={self._gen})
        self.seen = self.version[0]
        return self._passes

    def end_pass(self, token: int) -> None:
        """(Rank) the pass of ``token`` ended (its sampler was exhausted or closed)."""
        if token and self._pass_open == token:
            self._pass_open = 0

    def _release(self, keep: set[int]) -> None:
        for gen in [g for g in self._kept if g not in keep]:
            self._kept.pop(gen).close()

    # -- both sides -------------------------------------------------------------------------------

    def follow(self, items: bool = False, holding: bool = True) -> tuple[Shard, ShardSpec] | None:
        """The control block changed since this process last looked: act on it.

        In the rank: nothing to switch (it always serves the current shard), but an item read
        (``items``) during a pass that started with another shard and that no worker serves (a
        DataLoader without workers, after a set_epoch in mid-pass) would mix shards: that raises.
        In a worker: the shard and spec to serve now, if not the one held (``holding``: a shard of
        the generation served here is mapped); None if it stays.
        """
        if self.is_owner:
            snap = self._ctl.snapshot()
            mixing = self._pass_open and self._pass_gen != self._gen and snap.joined != self._pass_open
            if mixing and items:
                raise RuntimeError(
                    "set_epoch (or load_state_dict) was called while a pass over this dataset was running in "
                    "this process (a DataLoader without workers): its remaining items would come from the new "
                    "shard. Finish or drop the pass (or its iterator) before calling set_epoch."
                )
            if not mixing:
                self.seen = snap.version
            return None
        served = None
        for _ in range(100):
            snap = self._ctl.snapshot()
            if snap.passes != self._passes:  # a pass started by one of our samplers: serve its shard
                target = snap.pass_gen
                managed = True
            elif self._managed or snap.gen == self._gen:
                target, managed = self._gen, self._managed
            else:
                raise RuntimeError(
                    f"the shard of this dataset was replaced (set_epoch or load_state_dict) after this DataLoader "
                    f"worker started, and the pass it serves was not started by rank_dataset's RandomSampler or "
                    f"ResumableSampler, so it cannot tell which shard the pass needs (it held generation "
                    f"{self._gen}, the dataset is at {snap.gen}). Use one of those samplers with persistent "
                    f"workers, or build a new DataLoader after each set_epoch."
                )
            if target == self._gen and holding:
                break
            record = snap.record(target)
            try:
                if record is None:
                    raise _shm.SegmentGone(f"generation {target} is no longer published")
                info = json.loads(record)
                shard = Shard.attach(_shm.Handle.from_dict(info["handle"]))
            except _shm.SegmentGone:
                if self._ctl.snapshot().version != snap.version:
                    continue  # the rank moved on meanwhile: look again
                raise RuntimeError(
                    f"the shard (generation {target}) this DataLoader worker must serve has been released by "
                    f"the rank (pid {self._owner_pid}): a pass still running when the next one started?"
                ) from None
            served = shard, ShardSpec.from_dict(info["spec"])
            self._gen = target
            break
        else:  # pragma: no cover - the rank would have to publish a hundred times during one attach
            raise RuntimeError("the dataset's control block kept changing while a worker read it")
        if managed and snap.passes != self._passes:
            self._ctl.join(snap.passes)
        self._passes, self._managed = snap.passes, managed
        self.seen = snap.version
        return served

    # -- pickling ---------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to reach a spawn or forkserver worker: the control block's handle, never a segment.
        state = self.__dict__.copy()
        for name in ("_ctl", "version", "_kept"):
            del state[name]
        return {**state, "_handle": self._ctl.handle, "_owner": False, "_pass_open": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        handle = state.pop("_handle")
        self.__dict__.update(state)
        self._ctl = ControlBlock.attach(handle)
        self.version = self._ctl.words
        self._kept = {}
        self.seen = -1  # look at the control block on first use


@contextlib.contextmanager
def pass_of(data_source: object) -> Iterator[None]:
    """A sampler's pass over ``data_source``: if it is a dataset with a shard channel, its workers
    serve the shard current now until the next pass starts (see the module). Iteration starts in the
    main process before any index reaches a worker, so the pass is recorded in time."""
    channel = getattr(data_source, "channel", None)
    if not isinstance(channel, ShardChannel):
        yield
        return
    token = channel.begin_pass()
    try:
        yield
    finally:
        channel.end_pass(token)
