"""A dataset's worker-side view: item access over the shard held now, and what a DataLoader worker unpickles.

:class:`ItemView` holds the channel's handle (which shard to serve), the parser (or a mix's parsers), the
failure policy (``transform``, ``on_error``, ``max_failures``) with its substitutes, and the stage timers. Per
item it reads one word of the control block (has anything changed?), checks the index inline and slices the
shard; parsing, ``transform`` and ``on_error`` are a branch each.

What only the rank plans and builds with (:class:`RankSide`: the reader of the meta files, its MetaFile, the
failure book) travels with the view as a pickle of its own, unpickled (its modules imported: the readers, their
formats and index, a mix's) only where it is first used, in an error message naming a sample's file and line or
a mix's ``source_ids``: a spawn or forkserver worker imports what its items need.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_index
from rank_dataset.core.parsers import Parser, parse_line
from rank_dataset.core.stages import (
    CURRENT,
    FETCH,
    ITEM_STAGES,
    ITEMS,
    PARSE,
    SINCE,
    STAGE,
    StageTable,
    add_transformed,
    item_hook,
)
from rank_dataset.shards.channel import ShardChannel
from rank_dataset.training._failures import FailurePolicy, Substitutes

if TYPE_CHECKING:
    from rank_dataset.core.shard import Shard
    from rank_dataset.files.read.metafile import MetaFile
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.shards.reader import ShardReader
    from rank_dataset.training._failures import FailureBook
    from rank_dataset.training.payloads import Payloads

__all__ = ["ItemView", "RankSide"]


@dataclass
class RankSide:
    """What the rank plans and builds with: the reader, its MetaFile (if it reads through one), the failure
    book, the process group the ranks agree on (never pickled) and the ``reload_cfg`` keys the spec lacks."""

    reader: ShardReader
    meta: MetaFile | None
    book: FailureBook
    process_group: Any
    group: int
    epoch_size: int | None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "process_group": None}  # a worker joins no collective


class ItemView:
    """Item access over the shard a dataset holds now (see the module); ``spec`` is the plan of that shard."""

    spec: ShardSpec
    shard: Shard | None
    _text: Callable[[int], str] | None
    _indices: npt.NDArray[np.int64] | None
    _source_ids: npt.NDArray[np.integer[Any]] | None

    def __init__(
        self,
        channel: ShardChannel,
        parser: Parser | None,
        parsers: Sequence[Parser | None] | None,
        policy: FailurePolicy,
        rank: RankSide,
        payloads: Payloads | None = None,
    ) -> None:
        self.channel, self.parser, self.parsers, self.policy = channel, parser, parsers, policy
        self.payloads = payloads
        self.stages = StageTable.create()  # the monitor's item timers (rank_dataset.monitor), off until it runs
        self._rank: RankSide | None = rank
        self._rank_pickle = b""
        self._start()

    def _start(self) -> None:
        """The per-process part: the channel's words and counter bound once, no shard mapped yet."""
        policy, channel = self.policy, self.channel
        self.transform = policy.transform
        self.replace = policy.on_error == "replace"
        self.made_by_policy = policy.active or self.payloads is not None  # read once per item: a plain attribute
        self.plain = self.parser is None and self.parsers is None
        self.substitutes = Substitutes(policy, channel)
        self.version, self.seen, self.tally = channel.version, channel.seen, channel.tally
        self.shard = self._text = self._indices = self._source_ids = None
        self.n = 0

    def __getstate__(self) -> dict[str, Any]:
        rank = self._rank
        data = self._rank_pickle if rank is None else pickle.dumps(rank, pickle.HIGHEST_PROTOCOL)
        return {"channel": self.channel, "parser": self.parser, "parsers": self.parsers, "policy": self.policy,
                "stages": self.stages, "payloads": self.payloads, "_rank": None, "_rank_pickle": data}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()  # the shard is mapped on first use

    @property
    def rank(self) -> RankSide:
        """The rank's side, unpickled here on first use in a worker (its book given this view's channel)."""
        if self._rank is None:
            self._rank = pickle.loads(self._rank_pickle)
            self._rank.book.channel = self.channel
            self._rank_pickle = b""
        return self._rank

    def payload_where(self, i: int) -> str | None:
        """The path(s) or URL(s) item ``i``'s payload is read from (None: no payloads); nothing is read."""
        if self.payloads is None:
            return None
        text = self.held().text(i)
        try:
            meta = text if self.plain else self.parse(text, i)
        except Exception as exc:
            return f"(no path: {exc})"
        return self.payloads.where(text, meta)

    def where(self, sample: int) -> str:
        """``file:line`` of ``sample`` (or the server and sample)."""
        return self.rank.reader.where(sample)

    def serve(self, shard: Shard, spec: ShardSpec) -> None:
        self.shard, self.n, self.spec = shard, len(shard), spec
        self._indices = self._source_ids = None
        self._text = shard.text  # the shard's own slicing, bound once: item access calls it directly

    def sync(self, items: bool = False) -> None:
        """The control block changed since this process last looked (``version[0] != seen``, the
        per-item check): let the channel act on it, and serve the shard it says to."""
        served = self.channel.follow(items, holding=self.shard is not None)
        if served is not None:
            self.serve(*served)
        self.seen = self.channel.seen

    def held(self) -> Shard:
        """The shard held now."""
        if self.version[0] != self.seen:
            self.sync()
        assert self.shard is not None
        return self.shard

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        if self.version[0] != self.seen:
            self.sync()
        if self._indices is None:
            ids = self.held().ids
            indices = self.spec.indices() if ids is None else np.array(ids)
            indices.flags.writeable = False
            self._indices = indices
        return self._indices

    @property
    def source_ids(self) -> npt.NDArray[np.integer[Any]] | None:
        if self._source_ids is None:  # (None for plain meta files, each time)
            mixture = self.rank.book.mixture
            if mixture is None:
                return None
            # The source of a plan number (not of a sample: one sample may be in several sources).
            plan = self.spec.indices() if self.held().ids is not None else self.indices
            source_ids = mixture.source_ids(plan)
            source_ids.flags.writeable = False
            self._source_ids = source_ids
        return self._source_ids

    def __len__(self) -> int:
        if self.version[0] != self.seen:
            self.sync()
        return self.n

    def check_index(self, i: Any) -> int:
        n = self.n
        return check_index(i, n, label="dataset index", of=f"a shard of {n} samples")

    def make(self, text: str, i: int) -> Any:
        """Item ``i`` of line ``text``: parsed and transformed (with payloads: paired with its bytes first)."""
        if self.payloads is not None:
            from rank_dataset.training.payloads import payload_one  # imported where payloads are read

            return payload_one(self, text, i)
        item = text if self.plain else self.parse(text, i)
        return item if self.transform is None else self.transform(item)

    def made(self, text: str, i: int) -> Any:
        """:meth:`make`; with ``on_error="replace"``, a substitute's item if that raises."""
        try:
            return self.make(text, i)
        except Exception as exc:
            if not self.replace:
                raise
            return self.substitute(i, exc)

    def substitute(self, i: int, exc: Exception) -> Any:
        """The item of item ``i``'s substitute (``exc``: why item ``i`` failed)."""
        remade = lambda j: self.make(self._text(j), j)  # type: ignore[misc]  # noqa: E731
        return self.substitutes.substitute(self.spec, self.n, i, exc, remade, self.indices, self.where)

    def parse(self, text: str, i: int) -> Any:
        # In a mix whose sources have parsers of their own, item i's source chooses.
        parser = self.parser if self.parsers is None else self.parsers[self.source_ids[i]]  # type: ignore[index]
        return parse_line(parser, text, lambda: self.where(int(self.indices[i])))

    def item(self, i: int) -> Any:
        # Once per sample: one word of the control block says whether anything changed, the inline
        # check is the fast path, the shard does the slicing.
        if self.payloads is not None:
            return self.items([i])[0]
        try:  # an error before the count below: see uncounted
            if self.version[0] != self.seen:
                self.sync(items=True)
            if not (type(i) is int and 0 <= i < self.n):
                i = self.check_index(i)
        except BaseException:
            self.channel.uncounted()
            raise
        if self.stages.words[0]:  # a monitor is on: the timed path (timed_items)
            return timed_items(self, [i])[0]
        text = self._text(i)  # type: ignore[misc]
        self.tally(1)
        if self.made_by_policy:
            return self.made(text, i)
        return text if self.plain else self.parse(text, i)

    def items(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once."""
        try:  # an error before the count below (the shard, an index): the rank must not wait for this batch
            if self.version[0] != self.seen:
                self.sync(items=True)
            n = self.n
            if not all(type(i) is int and 0 <= i < n for i in indices):
                indices = [self.check_index(i) for i in indices]
        except BaseException:
            self.channel.uncounted()
            raise
        if self.payloads is not None:  # the batch's payloads asked for at once, its items made as they come
            texts = self.shard.texts(indices)  # type: ignore[union-attr]
            self.tally(len(texts))
            from rank_dataset.training.payloads import payload_items  # imported where payloads are read

            return payload_items(self, texts, indices)
        if self.stages.words[0]:  # a monitor is on: the timed path (timed_items)
            return timed_items(self, indices)
        texts = self.shard.texts(indices)  # type: ignore[union-attr]
        self.tally(len(texts))  # the pass audit: a store in the control block per batch (a replaced item counts)
        if self.made_by_policy:
            return [self.made(t, i) for t, i in zip(texts, indices)]
        if self.plain:
            return texts
        return [self.parse(t, i) for t, i in zip(texts, indices)]


# -- the item path with its stages timed ----------------------------------------------------------------
# What ds[i] and a batch run while a monitor is on (the dataset's StageTable, one word read per batch or per item):
# the items are made as the plain path makes them, and this process's row of the table gets the nanoseconds and
# counts of ``fetch`` (slicing the lines out of the shard), ``parse``, ``transform`` and ``replaced`` (making a
# substitute for an item that failed), and the shard index of the item being made (what a stall dump names) with
# since when its batch started. Clock reads are per batch; per item there is one store (the item's index) when a
# ``transform`` runs: no lock, no system call.

_clock = time.monotonic_ns
_RUNNING = {stage: k + 1 for k, stage in enumerate(ITEM_STAGES)}  # the row's STAGE word while a stage runs


def timed_items(ds: ItemView, indices: Sequence[int]) -> list[Any]:
    """Items ``indices`` (checked shard indices) of ``ds``, timed stage by stage."""
    table = ds.stages
    w = table.words
    row = table.claim()
    n = len(indices)
    t0 = _clock()
    w[row + CURRENT] = indices[0] if n else -1
    w[row + SINCE] = t0
    w[row + STAGE] = _RUNNING["fetch"]
    texts = ds.shard.texts(indices)  # type: ignore[union-attr]
    ds.tally(n)
    t1 = _clock()
    w[row + FETCH] += t1 - t0
    w[row + FETCH + 1] += n
    w[row + ITEMS] += n
    parsed = not ds.plain
    transform = ds.transform
    if not parsed and transform is None:
        w[row + CURRENT] = w[row + STAGE] = -1
        return texts
    hook = item_hook()  # the profiler's ranges: only where the items are made in the rank
    if hook is not None and not ds.channel.is_owner:
        hook = None
    items: list[Any] = texts
    if parsed:
        w[row + STAGE] = _RUNNING["parse"]
        try:
            if hook is None:
                items = [ds.parse(t, i) for t, i in zip(texts, indices)]
            else:
                with hook("rank_dataset.parse"):
                    items = [ds.parse(t, i) for t, i in zip(texts, indices)]
        except Exception:
            if not ds.replace:
                raise
            return _one_by_one(ds, texts, indices, row)  # a line that fails: item by item, as the plain path
        t2 = _clock()
        w[row + PARSE] += t2 - t1
        w[row + PARSE + 1] += n
    if transform is None:
        w[row + CURRENT] = w[row + STAGE] = -1
        return items
    out = []
    replaced = substitutes = 0
    current = row + CURRENT
    start = _clock()
    w[row + SINCE] = start
    w[row + STAGE] = _RUNNING["transform"]
    for item, i in zip(items, indices):
        w[current] = i  # per item, a store: the item a stall dump names
        try:
            if hook is None:
                out.append(transform(item))
            else:
                with hook("rank_dataset.transform"):
                    out.append(transform(item))
        except Exception as exc:
            if not ds.replace:
                raise
            b = _clock()
            out.append(ds.substitute(i, exc))
            substitutes += _clock() - b
            replaced += 1
    add_transformed(w, row, _clock() - start - substitutes, n, replaced, substitutes)
    return out


def _one_by_one(ds: ItemView, texts: list[str], indices: Sequence[int], row: int) -> list[Any]:
    """The batch item by item (a line of it failed to parse, ``on_error="replace"``), timed as transform."""
    w = ds.stages.words
    out = []
    spent = replaced = substitutes = 0
    w[row + STAGE] = _RUNNING["transform"]
    for text, i in zip(texts, indices):
        w[row + CURRENT] = i
        a = _clock()
        w[row + SINCE] = a
        try:
            out.append(ds.make(text, i))
        except Exception as exc:
            b = _clock()
            out.append(ds.substitute(i, exc))
            c = _clock()
            substitutes += c - b
            spent -= c - b
            replaced += 1
        spent += _clock() - a
    add_transformed(w, row, spent, len(out), replaced, substitutes)
    return out
