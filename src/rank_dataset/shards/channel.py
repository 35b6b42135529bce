"""The shard channel: how the rank's current shard reaches its DataLoader workers. No torch.

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

The pass audit: every reader of the dataset (each DataLoader worker, and the rank itself) counts the
items it reads in each pass (:meth:`ShardChannel.tally`, a store in the control block per batch).
When the next pass starts, or ``set_epoch`` or ``load_state_dict`` publishes a shard, the rank
compares the last pass's count with the indices its sampler drew. A pass whose sampler was left
early (a ``break``, an exception) is recorded but not judged, and so is a pass that read nothing (its
sampler listed with no loader, to look at its order: a loader sharded twice still reads part of each
pass). A finished pass that read fewer or more items than were drawn means something between the
sampler and the dataset dropped or added indices, most likely the loader was sharded a second time:
a :class:`PassAuditWarning` (once per dataset), or a :class:`PassAuditError` with ``audit="error"``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Literal

from rank_dataset.core import shm as _shm
from rank_dataset.core.shard import Shard
from rank_dataset.errors import PassAuditError, PassAuditWarning
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards._control import ControlBlock
from rank_dataset.shards.failures import Failure, FailureLog

__all__ = ["AUDIT_MODES", "PassCount", "ShardChannel", "pass_of"]

AuditMode = Literal["warn", "error", "off"]
AUDIT_MODES: tuple[AuditMode, ...] = ("warn", "error", "off")
_HISTORY = 16  # passes ds.audit() remembers
_NO_CAP = 1 << 62

_LIKELY_CAUSE = (
    "Something between the sampler and the dataset dropped or added indices; most likely the DataLoader was "
    "sharded a second time: passed through accelerate's accelerator.prepare(), given a DistributedSampler "
    "(Lightning adds one unless Trainer(use_distributed_sampler=False)), or wrapped in a batch sampler that drops "
    "batches. A rank_dataset shard is this rank's share already: use it with RandomSampler or ResumableSampler "
    "and a plain DataLoader."
)


@dataclasses.dataclass(frozen=True)
class PassCount:
    """One pass over a dataset started by rank_dataset's samplers, as its audit saw it.

    Args:
        number: the pass's number (1 for the first pass over the dataset).
        drawn: the indices its sampler hands out in a whole pass (it drew them all if ``state`` is
            ``"finished"``).
        read: the items read meanwhile by the DataLoader's workers and the rank (None: a worker
            could not count, its id being past the table).
        state: ``"finished"`` (the sampler drew every index), ``"left early"`` (a ``break`` or an
            exception closed it first: not judged) or ``"running"``. A finished pass that read nothing
            (its sampler listed with no loader) is not judged either.
    """

    number: int
    drawn: int
    read: int | None
    state: Literal["finished", "left early", "running"]

    @property
    def ok(self) -> bool:
        """False for a finished pass that read some items, but other than it drew."""
        return self.state != "finished" or self.read is None or self.read == self.drawn or self.read == 0


def _worker_id() -> int | None:
    """This process's DataLoader worker id, or None outside a worker (torch is there in a worker)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return None if info is None else int(info.id)


# A spec record longer than this (the plan of a mix of hundreds of sources and more) goes in a shared
# segment of its own, which the control block's record names: the control block stays small whatever
# the number of sources.
_INLINE = 4 << 10


# What a pickled channel carries, in this order (its other attributes are made anew where it lands).
_PICKLED = (
    "audit_mode",
    "failure_log",
    "_reader",
    "_owner",
    "_owner_pid",
    "seen",
    "_gen",
    "_passes",
    "_pass_gen",
    "_pass_open",
    "_managed",
    "_tally_word",
    "_tally_count",
    "_tally_cap",
    "_draws",
    "_finished",
    "_judged",
    "_warned",
    "_handle",
)
_UNPICKLED = ("_ctl", "version", "_kept", "_history")


class ShardChannel:
    """One dataset's channel to its workers: the rank side (:meth:`publish`, :meth:`begin_pass`,
    :meth:`end_pass`) and the worker side (:meth:`follow`). Pickles itself to the control block's handle.

    ``seen`` is the control block version this process last acted on: while ``version[0] == seen``
    nothing needs doing (the per-item check of the dataset).
    """

    def __init__(self, audit: AuditMode = "warn", failures: bool = False) -> None:
        if audit not in AUDIT_MODES:
            raise ValueError(f"audit must be one of {', '.join(map(repr, AUDIT_MODES))}, got {audit!r}")
        self.audit_mode = audit
        # The failure records of items that could not be made (only for a dataset that replaces them).
        self.failure_log = FailureLog.create() if failures else None
        self._reader = 0  # this process's reader number: 0 the rank, k + 1 DataLoader worker k, -1 a copy
        self._ctl = ControlBlock.create()
        self.version = self._ctl.words  # word 0: the control block's version
        self._owner, self._owner_pid = True, os.getpid()
        self.seen = 0  # the control block version this process last acted on
        self._gen = 0  # generation of the shard served here
        self._passes = 0  # passes started by our samplers, as last seen here
        self._pass_gen = 0  # (rank) the shard the latest of those passes started with
        self._pass_open = 0  # (rank) the pass whose sampler is running, 0: none
        self._managed = False  # (worker) passes are started by our samplers
        self._kept: dict[int, list[_shm.Segment]] = {}  # (rank) segments of shards (and specs) a pass may need
        # The audit. Each reader: the word of its count in the control block (-1: not counting), the count,
        # and what the count may reach (the rank's, once its pass's sampler has finished: see tally).
        self._tally_word, self._tally_count, self._tally_cap = -1, 0, _NO_CAP
        self._draws = 0  # (rank) indices the latest pass's sampler hands out in a whole pass
        self._finished = 0  # (rank) the latest pass whose sampler drew every index
        self._judged = 0  # (rank) the latest pass recorded in the history
        self._warned = False
        self._history: collections.deque[PassCount] = collections.deque(maxlen=_HISTORY)

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
        self._draws = draws
        self._count_for(0)  # the rank reads the items itself when the DataLoader has no workers
        self._release(keep={self._gen})
        self.seen = self.version[0]
        return self._passes

    def end_pass(self, token: int, finished: bool = False) -> None:
        """(Rank) the pass of ``token`` ended: its sampler drew every index (``finished``) or was closed."""
        if token and self._pass_open == token:
            self._pass_open = 0
            if finished:
                self._finished = token
            # Without workers, the loader reads its last batch after the sampler has ended; reads
            # after that are the program's own (ds[i] between passes): they do not count past the draws.
            self._tally_cap = max(self._tally_count, self._draws)

    # -- the audit --------------------------------------------------------------------------------

    def _count_for(self, reader: int) -> None:
        """Start counting the current pass as reader ``reader`` (0: the rank; worker k: k + 1)."""
        self._reader = reader
        self._tally_word = -1 if self.audit_mode == "off" else self._ctl.tally_word(reader, self._passes)
        self._tally_count, self._tally_cap = 0, _NO_CAP

    def tally(self, items: int) -> None:
        """Count ``items`` read here in the current pass (once per batch, or per item). A worker's
        count is the pass's; the rank's counts only if no worker served the pass (no workers)."""
        if self._tally_word >= 0:
            count = self._tally_count + items
            if count > self._tally_cap:  # (a comparison costs less than min())
                count = self._tally_cap
            self._tally_count = self.version[self._tally_word] = count

    def judge(self) -> None:
        """(Rank) record the latest pass, if not yet, and warn (or raise) if it finished having read
        some items, but other than it drew (see :attr:`PassCount.ok`). Its readers are done with it: the
        next pass starts, or set_epoch or load_state_dict is called (after the loop, as they must be)."""
        number = self._passes
        if not number or number == self._judged or number == self._pass_open or self.audit_mode == "off":
            return
        self._judged = number
        state: Literal["finished", "left early"] = "finished" if self._finished == number else "left early"
        count = PassCount(number, self._draws, self._ctl.items_read(number), state)
        self._history.append(count)
        if count.ok or (self._warned and self.audit_mode == "warn"):
            return
        message = (
            f"rank_dataset pass audit: pass {number} over this rank's shard read {count.read} items, but its sampler "
            f"drew {count.drawn} indices. {_LIKELY_CAUSE}"
        )
        if count.read is not None and count.read > count.drawn:
            message += (
                " Or the training process read items of the dataset itself while the pass ran without DataLoader "
                "workers (ds[i] inside the loop)."
            )
        if self.audit_mode == "error":
            raise PassAuditError(message, count)
        self._warned = True
        warnings.warn(message, PassAuditWarning, stacklevel=2)

    def audit(self) -> tuple[PassCount, ...]:
        """The counts of the recent passes, oldest first, the latest (running, or not yet judged) included."""
        counts = list(self._history)
        number = self._passes
        if self.is_owner and number and number != self._judged and self.audit_mode != "off":
            state: Literal["finished", "left early", "running"] = (
                "running" if number == self._pass_open else "finished" if self._finished == number else "left early"
            )
            counts.append(PassCount(number, self._draws, self._ctl.items_read(number), state))
        return tuple(counts)

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
            worker = _worker_id()
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
            reader = _worker_id()
            if reader is None:  # a copy of the dataset outside a DataLoader worker: not audited
                self._tally_word, self._reader = -1, -1
            else:
                self._count_for(reader + 1)
        self._passes, self._managed = snap.passes, managed
        self.seen = snap.version
        return served

    # -- pickling ---------------------------------------------------------------------------------

    def __getstate__(self) -> tuple[Any, ...]:
        # Pickled to reach a spawn or forkserver worker: the control block's handle, never a segment; the
        # values alone, in the order of _PICKLED (each worker receives it with every dataset).
        state = {**self.__dict__, "_handle": self._ctl.handle, "_owner": False, "_pass_open": 0, "_tally_word": -1}
        for name in _UNPICKLED:
            del state[name]
        if state.keys() != set(_PICKLED):  # an attribute added without a place here would be lost
            raise TypeError(f"ShardChannel cannot pickle {sorted(state.keys() ^ set(_PICKLED))}: update _PICKLED")
        return tuple(state[name] for name in _PICKLED)

    def __setstate__(self, values: tuple[Any, ...]) -> None:
        state = dict(zip(_PICKLED, values))
        handle = state.pop("_handle")
        self.__dict__.update(state)
        self._ctl = ControlBlock.attach(handle)
        self.version = self._ctl.words
        self._kept = {}
        self._history = collections.deque(maxlen=_HISTORY)
        self.seen = -1  # look at the control block on first use


def _read_spec(handle: _shm.Handle) -> Any:
    """The spec a rank wrote to a segment of its own (see :data:`_INLINE`)."""
    with _shm.attach(handle) as mm:
        return json.loads(mm[: handle.size])


@contextlib.contextmanager
def pass_of(data_source: object, draws: int = 0) -> Iterator[None]:
    """A sampler's pass over ``data_source``, which hands out ``draws`` indices if it runs to its end:
    if it is a dataset with a shard channel, its workers serve the shard current now until the next
    pass starts, and the pass is audited (see the module). Iteration starts in the main process
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
