"""The definition of a run with mixture edits (rank_dataset.plan.remix), written out draw by draw: slow and
obvious, the reference of tests/plan/test_remix.py and the StepSampler's remix tests (k = 1)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from rank_dataset.plan.mix import MixPlan, source_seed
from rank_dataset.plan.permutation import permute, permute_stream
from rank_dataset.plan.remix import MixSegment
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.step_mix import StepMix

Queue = Callable[[int], int]
HORIZON = 4000  # draws the reference walks at most to find a kept source's first draws after an edit


def native_queue(kind: str, n: int, index: int, seed: int) -> Queue:
    """A source's own stream: plain files' epochs' orders, else its stream of passes keyed by its index."""
    if kind == "plain":
        return lambda j: int(permute(n, seed, j // n, [j % n])[0])  # epoch j // n of the plain order (k = 1)
    return lambda j: int(permute_stream(n, source_seed(seed, index), 0, [j])[0])


class RefSegment:
    """One mix of the reference run: for each of its draws, the source and the position in its queue."""

    def __init__(
        self, segment: MixSegment, start: int, schedule: BatchSchedule, queues: list[Queue], seed: int
    ) -> None:
        self.segment, self.start, self.schedule, self.queues, self.seed = segment, start, schedule, queues, seed
        self.names = [s.name for s in segment.sources]
        self.draws = segment.num_samples  # k = 1: an epoch's draws are its samples
        self.table: list[tuple[int, int]] = []  # (source, queue position) of draws start, start + 1, ...
        self.kept: dict[str, tuple[list[int], Queue, int]] = {}  # a kept source's pending items, old queue, resume

    def source_and_position(self, q: int) -> tuple[int, int]:
        while len(self.table) <= q - self.start:
            self._extend(2 * len(self.table) + 64)
        return self.table[q - self.start]

    def _extend(self, count: int) -> None:
        seg, table = self.segment, []
        stop = self.start + count
        if seg.kind == "plain":
            table = [(0, r) for r in range(count)]
        elif seg.kind == "epochs":
            mix = seg.mix
            assert isinstance(mix, MixPlan)
            for r in range(count):
                e, d = divmod(r, self.draws)
                counts = mix.counts_at(e)
                slot = int(permute(self.draws, self.seed, e, [d])[0])  # the epoch's interleaving of the sources' slots
                s, first = 0, 0
                while slot >= first + counts[s]:
                    first += counts[s]
                    s += 1
                before = sum(mix.counts_at(x)[s] for x in range(e))  # its items in the segment's earlier epochs
                table.append((s, before + slot - first))
        else:
            # By steps: draw q reads the source a fresh run of this mix reads there; a batch takes its sources'
            # next items, in the order the fresh run shows them: the queue position is the source's draws in the
            # segment's batches before q's, plus where the fresh run's draw stands among its items of that batch.
            mix = seg.mix
            assert isinstance(mix, StepMix)
            end = self.schedule.start(self.schedule.step_at(stop) + 1)  # whole batches
            src, pos = (a.tolist() for a in mix.locate(np.arange(end), self.schedule, self.seed))
            fresh, mine = Counter(src[: self.start]), Counter()
            t = seg.step
            while self.schedule.start(t) < stop:
                lo, hi = self.schedule.start(t), self.schedule.start(t + 1)
                table += [(src[x], mine[src[x]] + pos[x] - fresh[src[x]]) for x in range(lo, hi)]
                fresh.update(src[lo:hi])
                mine.update(src[lo:hi])
                t += 1
        self.table = table

    def item(self, q: int) -> tuple[str, int]:
        s, j = self.source_and_position(q)
        return self.names[s], self.queue_item(self.names[s], j)

    def queue_item(self, name: str, j: int) -> int:
        """Item ``j`` of source ``name``'s queue in this segment."""
        s = self.names.index(name)
        if name not in self.kept:
            return self.queues[s](j)
        # A kept source: its first draws after the edit (in draw order) read its pending items; its other draws
        # read its old queue from `resume` on, at their queue positions less the pending ones before them.
        pending, old, resume = self.kept[name]
        first: list[int] = []
        x = self.start
        while len(first) < len(pending) and x < HORIZON:  # (a mix by steps may never draw a source again)
            t, at = self.source_and_position(x)
            if t == s:
                first.append(at)
            x += 1
        if j in first:
            return pending[first.index(j)]
        return old(resume + j - sum(1 for f in first if f < j))


class Reference:
    """The run with edits, draw by draw. At an edit at draw Q, for each source of the mix in force: its epoch in
    progress is the segment's epoch holding Q (by steps: nothing pending, its queue goes on where it is); its
    pending items are its items of that epoch at draws >= Q; a kept source reads them, then its old queue from
    the end of that epoch; a new source starts its own stream; a removed source's pending items are dropped."""

    def __init__(self, segments: list[MixSegment], schedule: BatchSchedule, seed: int) -> None:
        self.schedule = schedule
        first = segments[0]
        queues = [native_queue(first.kind, s.size, i, seed) for i, s in enumerate(first.sources)]
        self.runs = [RefSegment(first, 0, schedule, queues, seed)]
        self.pending: list[dict[str, int]] = []  # each edit: each old source's pending items (dropped if removed)
        for new in segments[1:]:
            old = self.runs[-1]
            q = schedule.start(new.step)
            if old.segment.kind == "steps":
                end = q
                resume = {}
                for s, name in enumerate(old.names):
                    resume[name] = sum(1 for x in range(old.start, q) if old.source_and_position(x)[0] == s)
            else:
                e = (q - old.start) // old.draws
                end = old.start + (e + 1) * old.draws
                resume = {}
                for s, name in enumerate(old.names):
                    if old.segment.kind == "plain":
                        resume[name] = (e + 1) * old.draws
                    else:
                        mix = old.segment.mix
                        assert isinstance(mix, MixPlan)
                        resume[name] = sum(mix.counts_at(x)[s] for x in range(e + 1))
            pending: dict[str, list[int]] = {name: [] for name in old.names}
            for x in range(q, end):
                name, item = old.item(x)
                pending[name].append(item)
            if old.segment.kind == "steps":  # the rest of each queue's pass, read next (or dropped)
                sizes = {s.name: s.size for s in old.segment.sources}
                self.pending.append({n: -resume[n] % sizes[n] for n in old.names})
            else:
                self.pending.append({n: len(p) for n, p in pending.items()})
            queues = [native_queue(new.kind, source.size, i, seed) for i, source in enumerate(new.sources)]
            run = RefSegment(new, q, schedule, queues, seed)
            for source in new.sources:
                if source.name in pending:
                    old_queue: Queue = lambda j, r=old, n=source.name: r.queue_item(n, j)  # noqa: E731
                    run.kept[source.name] = (pending[source.name], old_queue, resume[source.name])
            self.runs.append(run)

    def item(self, q: int) -> tuple[str, int]:
        run = max((r for r in self.runs if r.start <= q), key=lambda r: r.start)
        return run.item(q)
