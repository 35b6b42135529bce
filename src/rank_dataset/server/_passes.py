"""Shared passes: concurrent ``/shard`` requests of one plan read the meta files once between them.

Requests that differ only in their rank join one *pass*: one read of the union of their samples, cut
into each request's shard, which its client decodes to byte for byte the shard it would get alone.

Group commit, per plan: a request whose plan has no pass under way starts one, and those that arrive
while it runs go together in the next. A pass waits for more of its plan's ranks until all ``W`` are
in, none came for ``linger`` seconds, or the first has waited ``max_linger``. It takes at most
``max_samples`` samples (but at least one request); waiting requests that fill a pass start it at once.
A pass holds one build slot (:class:`BuildSlots`) until the last of its answers is sent or abandoned,
or answers all its requests :class:`Busy` if none comes free in time. A pass that fails (a file
changed, a line that is not UTF-8) is read again request by request, so that each gets the answer it
would get alone. Passes are shared within one server process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from starlette.concurrency import run_in_threadpool

from rank_dataset.core.shard import Shard
from rank_dataset.files.read.metafile import MetaFile, bucket_order

__all__ = ["BuildSlots", "Busy", "Part", "SharedPasses"]


class Busy(Exception):
    """No build slot came free in time: the server answers 503 with Retry-After."""


class BuildSlots:
    """At most ``count`` builds at once; :meth:`acquire` waits up to ``wait`` seconds for one (one event
    loop runs them all: a counter and a queue of futures)."""

    def __init__(self, count: int, wait: float) -> None:
        self.free = count
        self.wait = wait
        self.waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> bool:
        """Whether a slot was taken within ``wait`` seconds (then :meth:`release` it)."""
        if self.free and not self.waiting:
            self.free -= 1
            return True
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), self.wait)
            return True
        except asyncio.TimeoutError:
            if slot.done():  # handed over just as the wait ran out: it is ours
                return True
            self.waiting.remove(slot)
            return False
        except BaseException:  # the caller was cancelled while it waited
            if slot.done():
                self.release()  # it had been handed a slot: pass it on
            else:
                self.waiting.remove(slot)
            raise

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft().set_result(None)  # straight to the longest waiting build
        else:
            self.free += 1


class _Pass:
    """One read for ``members`` requests: it holds a build slot until each is done with its shard."""

    def __init__(self, slots: BuildSlots, members: int) -> None:
        self.slots, self.left = slots, members

    def done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.slots.release()


@dataclass(frozen=True, eq=False)
class Part:
    """A request's answer: ``shard`` holds its samples ``ids`` (the request's own numbers), sample
    ``i`` at row ``order[i]`` (row ``i`` where ``order`` is None): frame it with
    :func:`~rank_dataset.server.protocol.encode_frame`."""

    shard: Shard
    ids: npt.NDArray[np.int64]
    order: npt.NDArray[np.intp] | None = None


@dataclass(eq=False)
class _Request:
    indices: npt.NDArray[np.int64]
    answer: asyncio.Future[Part]
    arrived: float  # the event loop's time
    read_by: _Pass | None = None  # set with the answer


@dataclass(eq=False)
class _Plan:
    """The requests of one plan waiting for a pass, and its passes under way."""

    source: MetaFile
    ranks: int  # requests the plan has in all (its world size)
    waiting: deque[_Request] = field(default_factory=deque)
    samples: int = 0  # of the waiting requests
    running: int = 0
    timer: asyncio.TimerHandle | None = None  # a pass waiting for more ranks starts then


class SharedPasses:
    """Reads of rank shards, shared by the requests of one plan (see the module's docstring).

    Args:
        slots: the server's build slots (a pass takes one).
        max_samples: samples one pass reads at most (a request of more is read alone).
        linger: seconds a pass waits for another of its plan's ranks before it starts.
        max_linger: seconds a pass waits for them at most, from its first request's arrival.
    """

    def __init__(self, slots: BuildSlots, max_samples: int, linger: float = 0.2, max_linger: float = 1.0) -> None:
        self.slots = slots
        self.max_samples = max_samples
        self.linger, self.max_linger = linger, max_linger
        self._plans: dict[Hashable, _Plan] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the event loop keeps weak references only

    @contextlib.asynccontextmanager
    async def shard(
        self, key: Hashable, source: MetaFile, indices: npt.NDArray[np.int64], ranks: int = 1
    ) -> AsyncIterator[Part]:
        """The shard of samples ``indices`` of ``source``, read in a pass with the other requests of
        plan ``key`` (every field of the request but the rank: ``source`` is the same for all), which
        has ``ranks`` requests in all. Leave the context once the shard is sent (or will not be):
        that frees the pass.

        Raises:
            Busy: no build slot came free in time.
            MetaFileChangedError, ValueError: what :meth:`MetaFile.read` of ``indices`` alone raises.
        """
        plan = self._plans.setdefault(key, _Plan(source, ranks))
        loop = asyncio.get_running_loop()
        request = _Request(indices, loop.create_future(), loop.time())
        plan.waiting.append(request)
        plan.samples += indices.size
        self._start(key, plan)
        try:
            shard = await request.answer  # cancelled with the caller
        except asyncio.CancelledError:
            if request in plan.waiting:  # no pass took it
                plan.waiting.remove(request)
                plan.samples -= indices.size
                self._forget_if_idle(key, plan)
            elif request.read_by is not None:  # answered just before the caller was cancelled
                request.read_by.done()
            raise
        try:
            yield shard
        finally:
            del shard
            assert request.read_by is not None
            request.read_by.done()

    def _start(self, key: Hashable, plan: _Plan) -> None:
        """Start passes for the waiting requests: one if none is under way (once it has waited for
        more ranks: see the module's docstring), and any that are full."""
        if plan.timer is not None:
            plan.timer.cancel()
            plan.timer = None
        while plan.waiting and (not plan.running or plan.samples >= self.max_samples):
            if plan.samples < self.max_samples and len(plan.waiting) < plan.ranks:
                loop = asyncio.get_running_loop()
                due = min(plan.waiting[-1].arrived + self.linger, plan.waiting[0].arrived + self.max_linger)
                if due > loop.time():
                    plan.timer = loop.call_at(due, self._start, key, plan)
                    return
            members = [plan.waiting.popleft()]
            taken = members[0].indices.size
            while plan.waiting and taken + plan.waiting[0].indices.size <= self.max_samples:
                members.append(plan.waiting.popleft())
                taken += members[-1].indices.size
            plan.samples -= taken
            plan.running += 1
            task = asyncio.get_running_loop().create_task(self._run(key, plan, members))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, key: Hashable, plan: _Plan, members: list[_Request]) -> None:
        try:
            if not await self.slots.acquire():
                for m in members:
                    if not m.answer.done():
                        m.answer.set_exception(Busy())
                return
            read = _Pass(self.slots, len(members))
            try:
                outcomes = await run_in_threadpool(_read, plan.source, [m.indices for m in members])
            except BaseException:  # cancelled: the server is stopping
                self.slots.release()
                for m in members:
                    m.answer.cancel()
                raise
            for m, outcome in zip(members, outcomes):
                if m.answer.done():  # its caller is gone
                    read.done()
                elif isinstance(outcome, Exception):
                    m.answer.set_exception(outcome)
                    read.done()
                else:
                    m.read_by = read
                    m.answer.set_result(outcome)
        finally:
            plan.running -= 1
            self._start(key, plan)
            self._forget_if_idle(key, plan)

    def _forget_if_idle(self, key: Hashable, plan: _Plan) -> None:
        if not plan.running and not plan.waiting and self._plans.get(key) is plan:
            if plan.timer is not None:
                plan.timer.cancel()
            del self._plans[key]


def _read(source: MetaFile, parts: Sequence[npt.NDArray[np.int64]]) -> list[Part | Exception]:
    """Each of ``parts`` read from ``source``: in one read of all of them if it succeeds, else each
    alone (the shard, or the exception it raises alone).

    The one read takes each part's samples in file order (:func:`bucket_order`), so that it writes
    the lines about in the order it reads them; each part is framed with its lines in that order and
    its client packs them (see :func:`~rank_dataset.server.protocol.encode_frame`). A part's sample
    numbers are the part itself, so no read keeps them.
    """
    if len(parts) > 1:
        orders = [bucket_order(p, len(source)) for p in parts]
        # Each part taken in its order straight into one array: no temporary of each, nor a copy of all.
        union = np.empty(sum(p.size for p in parts), np.int64)
        for p, o, (a, b) in zip(parts, orders, _cuts(parts)):
            np.take(p, o, out=union[a:b])
        try:
            whole: Shard | None = source.read(union, ids=False, shared=False)
        except Exception:  # some part's read fails: each gets the answer it would get alone
            whole = None
        del union
        if whole is not None:
            return [Part(whole.rows(a, b), p, _inverse(o)) for (a, b), o, p in zip(_cuts(parts), orders, parts)]
    outcomes: list[Part | Exception] = []
    for part in parts:
        try:
            outcomes.append(Part(source.read(part, ids=False, shared=False), part))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def _cuts(parts: Sequence[npt.NDArray[np.int64]]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each part in their concatenation."""
    return list(itertools.pairwise(itertools.accumulate((p.size for p in parts), initial=0)))


def _inverse(order: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Where each item went: ``inverse[order[k]] == k``."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return inverse
