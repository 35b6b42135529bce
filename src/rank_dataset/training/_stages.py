"""The item path with its stages timed: what ``ds[i]`` and a batch run while a monitor is on.

:class:`~rank_dataset.training._items.ShardItems` takes this path when the dataset's
:class:`~rank_dataset.core.stages.StageTable` is on (one word read per batch, or per item). It makes the
items as the plain path does (parser, ``transform``, ``on_error="replace"``), and writes into this process's
row of the table: the shard index of the item being made and since when (what a stall dump names), then
nanoseconds and counts of ``fetch`` (slicing the lines out of the shard), ``parse``, ``transform`` and
``replaced`` (making a substitute for an item that failed). No lock and no system call: clock reads and
stores into shared memory.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rank_dataset.core import stages as _st

if TYPE_CHECKING:
    from rank_dataset.training._items import ShardItems

__all__ = ["timed_items"]

_clock = time.monotonic_ns


def timed_items(ds: ShardItems, indices: Sequence[int]) -> list[Any]:
    """Items ``indices`` (checked shard indices) of ``ds``, timed stage by stage."""
    table = ds.stages
    w = table.words
    row = table.claim()
    t0 = _clock()
    w[row + _st.CURRENT] = indices[0] if indices else -1
    w[row + _st.SINCE] = t0
    texts = ds._shard.texts(indices)
    ds._tally(len(texts))
    t1 = _clock()
    w[row + _st.FETCH] += t1 - t0
    w[row + _st.FETCH + 1] += len(texts)
    parsed = ds._parser is not None or ds._parsers is not None
    if not parsed and ds._transform is None:
        w[row + _st.ITEMS] += len(texts)
        w[row + _st.CURRENT] = -1
        return texts  # type: ignore[no-any-return]
    hook = _st.item_hook()  # the profiler's ranges: only where the items are made in the rank
    if hook is not None and not ds.channel.is_owner:
        hook = None
    out = []
    parse_ns = transform_ns = 0
    for text, i in zip(texts, indices):
        w[row + _st.CURRENT] = i
        a = _clock()
        w[row + _st.SINCE] = a
        try:
            if hook is None:
                item = ds._parse(text, i) if parsed else text
                b = _clock()
                if ds._transform is not None:
                    item = ds._transform(item)
            else:
                with hook("rank_dataset.parse"):
                    item = ds._parse(text, i) if parsed else text
                b = _clock()
                if ds._transform is not None:
                    with hook("rank_dataset.transform"):
                        item = ds._transform(item)
            c = _clock()
            parse_ns += b - a
            transform_ns += c - b
        except Exception as exc:
            if not ds._replace:
                raise
            b = _clock()
            item = ds._book.substitute(ds._spec, ds._n, i, exc, ds._made, ds.indices)
            c = _clock()
            transform_ns += b - a  # the attempt that failed
            w[row + _st.REPLACED] += c - b
            w[row + _st.REPLACED + 1] += 1
        out.append(item)
    n = len(out)
    w[row + _st.PARSE] += parse_ns
    w[row + _st.TRANSFORM] += transform_ns
    if parsed:
        w[row + _st.PARSE + 1] += n
    if ds._transform is not None:
        w[row + _st.TRANSFORM + 1] += n
    w[row + _st.ITEMS] += n
    w[row + _st.CURRENT] = -1
    return out
