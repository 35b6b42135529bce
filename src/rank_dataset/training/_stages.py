"""The item path with its stages timed: what ``ds[i]`` and a batch run while a monitor is on.

:class:`~rank_dataset.training._items.ShardItems` takes this path when the dataset's
:class:`~rank_dataset.core.stages.StageTable` is on (one word read per batch, or per item). It makes the
items as the plain path does (parser, ``transform``, ``on_error="replace"``) and writes into this process's
row of the table: nanoseconds and counts of ``fetch`` (slicing the lines out of the shard), ``parse``,
``transform`` and ``replaced`` (making a substitute for an item that failed), and the shard index of the item
being made (what a stall dump names) with since when its batch started. Clock reads are per batch; per item
there is one store (the item's index) when a ``transform`` runs: no lock, no system call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rank_dataset.core.stages import CURRENT, FETCH, ITEMS, PARSE, REPLACED, SINCE, TRANSFORM, item_hook

if TYPE_CHECKING:
    from rank_dataset.training._items import ShardItems

__all__ = ["timed_items"]

_clock = time.monotonic_ns


def timed_items(ds: ShardItems, indices: Sequence[int]) -> list[Any]:
    """Items ``indices`` (checked shard indices) of ``ds``, timed stage by stage."""
    table = ds.stages
    w = table.words
    row = table.claim()
    n = len(indices)
    t0 = _clock()
    w[row + CURRENT] = indices[0] if n else -1
    w[row + SINCE] = t0
    texts = ds._shard.texts(indices)
    ds._tally(n)
    t1 = _clock()
    w[row + FETCH] += t1 - t0
    w[row + FETCH + 1] += n
    w[row + ITEMS] += n
    parsed = ds._parser is not None or ds._parsers is not None
    transform = ds._transform
    if not parsed and transform is None:
        w[row + CURRENT] = -1
        return texts
    hook = item_hook()  # the profiler's ranges: only where the items are made in the rank
    if hook is not None and not ds.channel.is_owner:
        hook = None
    items: list[Any] = texts
    if parsed:
        try:
            if hook is None:
                items = [ds._parse(t, i) for t, i in zip(texts, indices)]
            else:
                with hook("rank_dataset.parse"):
                    items = [ds._parse(t, i) for t, i in zip(texts, indices)]
        except Exception:
            if not ds._replace:
                raise
            return _one_by_one(ds, texts, indices, row)  # a line that fails: item by item, as the plain path
        t2 = _clock()
        w[row + PARSE] += t2 - t1
        w[row + PARSE + 1] += n
    if transform is None:
        w[row + CURRENT] = -1
        return items
    out = []
    replaced = substitutes = 0
    current = row + CURRENT
    start = _clock()
    w[row + SINCE] = start
    for item, i in zip(items, indices):
        w[current] = i  # per item, a store: the item a stall dump names
        try:
            if hook is None:
                out.append(transform(item))
            else:
                with hook("rank_dataset.transform"):
                    out.append(transform(item))
        except Exception as exc:
            if not ds._replace:
                raise
            b = _clock()
            out.append(ds._book.substitute(ds._spec, ds._n, i, exc, ds._made, ds.indices))
            substitutes += _clock() - b
            replaced += 1
    _account(w, row, _clock() - start - substitutes, n, replaced, substitutes)
    return out


def _one_by_one(ds: ShardItems, texts: list[str], indices: Sequence[int], row: int) -> list[Any]:
    """The batch item by item (a line of it failed to parse, ``on_error="replace"``), timed as transform."""
    w = ds.stages.words
    out = []
    spent = replaced = substitutes = 0
    for text, i in zip(texts, indices):
        w[row + CURRENT] = i
        a = _clock()
        w[row + SINCE] = a
        try:
            item = ds._parse(text, i)
            out.append(item if ds._transform is None else ds._transform(item))
        except Exception as exc:
            b = _clock()
            out.append(ds._book.substitute(ds._spec, ds._n, i, exc, ds._made, ds.indices))
            c = _clock()
            substitutes += c - b
            spent -= c - b
            replaced += 1
        spent += _clock() - a
    _account(w, row, spent, len(out), replaced, substitutes)
    return out


def _account(w: Any, row: int, spent: int, n: int, replaced: int, substitutes: int) -> None:
    """Add a batch's transform time and its items, and its substitutes' apart; mark the row idle."""
    w[row + TRANSFORM] += spent
    w[row + TRANSFORM + 1] += n
    if replaced:
        w[row + REPLACED] += substitutes
        w[row + REPLACED + 1] += replaced
    w[row + CURRENT] = -1
