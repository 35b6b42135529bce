"""The shard channel: how the rank's current shard reaches its DataLoader workers.

The process that creates a dataset (the rank) builds every shard straight into shareable memory and
:meth:`ShardChannel.publish` es it in a control block (:mod:`rank_dataset.shards._control`, a seqlock) under a
new *generation*. A DataLoader worker holds a copy of the channel (forked, or unpickled from a handle
under spawn and forkserver): its dataset compares one word of the control block (:attr:`version`)
with what it saw last, and when it changed, :meth:`ShardChannel.follow` says which shard to serve now.

Passes: rank_dataset's samplers wrap each iteration in :func:`pass_of`, which records, when a pass
starts, the shard current then; workers serve that shard for the whole pass (a ``set_epoch`` during a
pass takes effect in workers at the next pass). Workers of a DataLoader whose sampler is not one of
ours cannot tell passes apart: they serve the shard they started with and raise if it is replaced
under them. The rank keeps a replaced shard reachable until the next pass starts (a running pass may
still need it), then releases it; each worker unmaps it when it first serves the new pass.

The channel carries the dataset's :class:`~rank_dataset.shards.audit.PassAudit` (the items each pass read)
and, for a dataset that replaces failed items, its :class:`~rank_dataset.shards.failures.FailureLog`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from rank_dataset.core import shm as _shm
from rank_dataset.core.shard import Shard
from rank_dataset.core.stages import worker_id
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards._control import ControlBlock
from rank_dataset.shards.audit import AuditMode, PassAudit, PassCount
from rank_dataset.shards.failures import Failure, FailureLog

__all__ = ["ShardChannel", "pass_of"]

# A spec record longer than this (the plan of a mix of hundreds of sources and more) goes in a shared
# segment of its own, which the control block's record names: the control block stays small whatever
# the number of sources.
_INLINE = 4 << 10


class ShardChannel:
    """One dataset's channel to its workers: the rank side (:meth:`publish`, :meth:`begin_pass`,
    :meth:`end_pass`) and the worker side (:meth:`follow`). Pickles to the control block's handle.

    ``seen`` is the control block version this process last acted on: while ``version[0] == seen``
    nothing needs doing (the per-item check of the dataset). ``tally`` counts items read for the pass audit.
    """

    def __init__(self, audit: AuditMode = "warn", failures: bool = False) -> None:
        self._attach(ControlBlock.create(), audit, FailureLog.create() if failures else None, os.getpid())
        self._owner = True
        self._reader = 0  # this process's reader number: 0 the rank, k + 1 DataLoader worker k, -1 a copy
        self.seen = 0

    def _attach(self, ctl: ControlBlock, audit: AuditMode, log: FailureLog | None, owner_pid: int) -> None:
        self._ctl = ctl
        self.version = ctl.words  # word 0: the control block's version
        self.pass_audit = PassAudit(audit, ctl)
        self.tally = self.pass_audit.tally  # bound once: item access calls it directly
        self.failure_log = log  # the failure records of items that could not be made (on_error="replace")
        self._owner, self._owner_pid = False, owner_pid
        self._gen = 0  # generation of the shard served here
        self._passes = 0  # passes started by our samplers, as last seen here
        self._pass_gen = 0  # (rank) the shard the latest of those passes started with
        self._pass_open = 0  # (rank) the pass whose sampler is running, 0: none
        self._managed = False  # (worker) passes are started by our samplers
        self._kept: dict[int, list[_shm.Segment]] = {}  # (rank) segments of shards (and specs) a pass may need

    def __reduce__(self) -> tuple[Any, ...]:
        # To reach a spawn or forkserver worker: the control block's handle, never a segment.
        state = (self._reader, self._gen, self._passes, self._pass_gen, self._managed)
        return _copy, (self._ctl.handle, self.audit_mode, self.failure_log, self._owner_pid, state)

    @property
    def audit_mode(self) -> AuditMode:
        return self.pass_audit.mode

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
        self.judge()  # set_epoch or load_state_dict: the last pass is over
        gen = self._gen + 1
        segments = [shard.segment]
        described = json.dumps(spec.to_dict()).encode()
        if len(described) > _INLINE:
            spec_segment = _shm.Segment(len(described), name="rank_dataset_spec")
            with spec_segment.map() as mm:
                mm[: len(described)] = described
            segments.append(spec_segment)
            record = json.dumps({"handle": shard.handle.to_dict(), "spec_handle": spec_segment.handle.to_dict()})
        else:
            record = json.dumps({"handle": shard.handle.to_dict(), "spec": spec.to_dict()})
        self._ctl.publish(gen, record.encode())
        self._kept[gen] = segments
        self._gen = gen
        self._release(keep={gen, self._pass_gen} if self._passes else {gen})
        if not self._pass_open:
            self.seen = self.version[0]

    def begin_pass(self, draws: int = 0) -> int:
        """(Rank) a pass starts: workers serve the current shard until the next pass starts, whatever
        set_epoch does meanwhile; its sampler will hand out ``draws`` indices if it runs to its end.
        Returns a token for :meth:`end_pass` (0 outside the rank: nothing is recorded)."""
        if not self.is_owner:
            return 0
        self.judge()
        self._passes = self._ctl.start_pass()
        self._pass_gen = self._gen
        self._pass_open = self._passes
        self.pass_audit.begin(draws)
        self._count_for(0)  # the rank reads the items itself when the DataLoader has no workers
        self._release(keep={self._gen})
        self.seen = self.version[0]
        return self._passes

    def end_pass(self, token: int, finished: bool = False) -> None:
        """(Rank) the pass of ``token`` ended: its sampler drew every index (``finished``) or was closed."""
        if token and self._pass_open == token:
            self._pass_open = 0
            self.pass_audit.end(token, finished)

    def uncounted(self) -> None:
        """(Worker) a read raised before it counted its items (the DataLoader raises the error in the rank): the
        pass is marked uncounted, so that a sampler waiting for its reads stops waiting."""
        if not self.is_owner:
            self._ctl.untallied()

    def _count_for(self, reader: int) -> None:
        """Start counting the current pass as reader ``reader`` (0: the rank; worker k: k + 1)."""
        self._reader = reader
        self.pass_audit.count_for(reader, self._passes)

    def judge(self) -> None:
        """(Rank) audit the latest pass (see :meth:`PassAudit.judge`): its readers are done with it (the next
        pass starts, or set_epoch or load_state_dict is called, after the loop as they must be)."""
        self.pass_audit.judge(self._passes, self._pass_open)

    def audit(self) -> tuple[PassCount, ...]:
        """The counts of the recent passes, oldest first, the latest (running, or not yet judged) included."""
        return self.pass_audit.counts(self._passes, self._pass_open, self.is_owner)

    # -- failures ---------------------------------------------------------------------------------

    @property
    def passes(self) -> int:
        """The pass this process serves (0 before any pass started by rank_dataset's samplers)."""
        return self._passes

    def record_failure(self, failure: Failure) -> int:
        """Record ``failure`` for the rank; return this rank's failures in the current pass so far."""
        if self.failure_log is None:
            raise RuntimeError("this dataset's channel keeps no failure records (on_error is not 'replace')")
        reader = self._reader
        if not self.is_owner and reader == 0:  # a worker not yet told its pass: its id, else a copy
            worker = worker_id()
            reader = self._reader = -1 if worker is None else worker + 1
        return self.failure_log.add(reader, self._passes, failure)

    def collect_failures(self) -> tuple[list[Failure], int]:
        """(Rank) the failure records written since the last call, and how many were lost."""
        if self.failure_log is None or not self.is_owner:
            return [], 0
        return self.failure_log.collect()

    def _release(self, keep: set[int]) -> None:
        for gen in [g for g in self._kept if g not in keep]:
            for segment in self._kept.pop(gen):
                segment.close()

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
                if "spec_handle" in info:
                    info["spec"] = _read_spec(_shm.Handle.from_dict(info["spec_handle"]))
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
            self._passes = snap.passes
            reader = worker_id()
            if reader is None:  # a copy of the dataset outside a DataLoader worker: not audited
                self.pass_audit.stop()
                self._reader = -1
            else:
                self._count_for(reader + 1)
        self._passes, self._managed = snap.passes, managed
        self.seen = snap.version
        return served


def _copy(
    handle: _shm.Handle, audit: AuditMode, log: FailureLog | None, owner_pid: int, state: tuple[Any, ...]
) -> ShardChannel:
    """A pickled channel, where it lands: a copy that looks at the control block on first use."""
    channel = ShardChannel.__new__(ShardChannel)
    channel._attach(ControlBlock.attach(handle), audit, log, owner_pid)
    channel._reader, channel._gen, channel._passes, channel._pass_gen, channel._managed = state
    channel.seen = -1
    return channel


def _read_spec(handle: _shm.Handle) -> Any:
    """The spec a rank wrote to a segment of its own (see :data:`_INLINE`)."""
    with _shm.attach(handle) as mm:
        return json.loads(mm[: handle.size])


@contextlib.contextmanager
def pass_of(data_source: object, draws: int = 0) -> Iterator[None]:
    """A sampler's pass over ``data_source``, which hands out ``draws`` indices if it runs to its end:
    if it is a dataset with a shard channel, its workers serve the shard current now until the next
    pass starts, and the pass is audited (:mod:`rank_dataset.shards.audit`). Iteration starts in the main process
    before any index reaches a worker, so the pass is recorded in time. The pass is finished if the
    body ends without an exception (a closed sampler raises GeneratorExit in it: left early)."""
    channel = getattr(data_source, "channel", None)
    if not isinstance(channel, ShardChannel):
        yield
        return
    token = channel.begin_pass(draws)
    finished = False
    try:
        yield
        finished = True
    finally:
        channel.end_pass(token, finished)
