"""The pass audit: does each pass over a dataset read as many items as its sampler drew?

Every reader of a dataset (each DataLoader worker, and the rank itself) counts the items it reads in each
pass (:meth:`PassAudit.tally`, a store in the control block per batch). When the next pass starts, or
``set_epoch`` or ``load_state_dict`` publishes a shard, the rank compares the last pass's count with the
indices its sampler drew. A pass whose sampler was left early (a ``break``, an exception) is recorded but not
judged, and so is a pass that read nothing (its sampler listed with no loader, to look at its order). A
finished pass that read fewer or more items than were drawn means something between the sampler and the
dataset dropped or added indices, most likely the loader was sharded a second time: a
:class:`~rank_dataset.errors.PassAuditWarning` (once per dataset), or a
:class:`~rank_dataset.errors.PassAuditError` with ``audit="error"``.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Literal

from rank_dataset.errors import PassAuditError, PassAuditWarning
from rank_dataset.shards._control import ControlBlock

__all__ = ["AUDIT_MODES", "AuditMode", "PassAudit", "PassCount"]

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


class PassAudit:
    """One dataset's pass audit over its control block: each reader's count (:meth:`tally`), and in the rank
    the passes' draws, their judgement and the recent history. A copy (in a worker) starts with no count."""

    def __init__(self, mode: AuditMode, ctl: ControlBlock) -> None:
        if mode not in AUDIT_MODES:
            raise ValueError(f"audit must be one of {', '.join(map(repr, AUDIT_MODES))}, got {mode!r}")
        self.mode, self._ctl = mode, ctl
        # This reader's word of the control block (-1: not counting), its count, and what the count may reach
        # (the rank's, once its pass's sampler has finished: see tally).
        self._word, self._count, self._cap = -1, 0, _NO_CAP
        self._draws = 0  # (rank) indices the latest pass's sampler hands out in a whole pass
        self._finished = 0  # (rank) the latest pass whose sampler drew every index
        self._judged = 0  # (rank) the latest pass recorded in the history
        self._warned = False
        self._history: collections.deque[PassCount] = collections.deque(maxlen=_HISTORY)

    def count_for(self, reader: int, passes: int) -> None:
        """Start counting pass ``passes`` as reader ``reader`` (0: the rank; worker k: k + 1)."""
        self._word = -1 if self.mode == "off" else self._ctl.tally_word(reader, passes)
        self._count, self._cap = 0, _NO_CAP

    def stop(self) -> None:
        """Count nothing from now on (a copy outside a DataLoader worker)."""
        self._word = -1

    def tally(self, items: int) -> None:
        """Count ``items`` read here in the current pass (once per batch, or per item). A worker's
        count is the pass's; the rank's counts only if no worker served the pass (no workers)."""
        if self._word >= 0:
            count = self._count + items
            if count > self._cap:  # (a comparison costs less than min())
                count = self._cap
            self._count = self._ctl.words[self._word] = count

    def begin(self, draws: int) -> None:
        """(Rank) a pass starts whose sampler hands out ``draws`` indices if it runs to its end."""
        self._draws = draws

    def end(self, token: int, finished: bool) -> None:
        """(Rank) pass ``token``'s sampler drew every index (``finished``) or was closed."""
        if finished:
            self._finished = token
        # Without workers, the loader reads its last batch after the sampler has ended; reads after that are the
        # program's own (ds[i] between passes): they do not count past the draws.
        self._cap = max(self._count, self._draws)

    def judge(self, number: int, running: int) -> None:
        """(Rank) record pass ``number`` (``running``: the pass whose sampler runs, 0 none), if not yet, and warn
        (or raise) if it finished having read some items, but other than it drew (see :attr:`PassCount.ok`)."""
        if not number or number == self._judged or number == running or self.mode == "off":
            return
        self._judged = number
        state: Literal["finished", "left early"] = "finished" if self._finished == number else "left early"
        count = PassCount(number, self._draws, self._ctl.items_read(number), state)
        self._history.append(count)
        if count.ok or (self._warned and self.mode == "warn"):
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
        if self.mode == "error":
            raise PassAuditError(message, count)
        self._warned = True
        warnings.warn(message, PassAuditWarning, stacklevel=3)

    def counts(self, number: int, running: int, owner: bool) -> tuple[PassCount, ...]:
        """The counts of the recent passes, oldest first, with the latest (``number``; running if it is
        ``running``, or not yet judged) if this is the rank (``owner``)."""
        counts = list(self._history)
        if owner and number and number != self._judged and self.mode != "off":
            state: Literal["finished", "left early", "running"] = (
                "running" if number == running else "finished" if self._finished == number else "left early"
            )
            counts.append(PassCount(number, self._draws, self._ctl.items_read(number), state))
        return tuple(counts)
