"""The collective reader's routing arithmetic: where the slices lie, which rank owns each sample and in
which round it serves it, and how requests, lengths and lines are laid out in each exchange.

Pure numpy functions of arrays: no torch, no I/O, so that every rule here is tested without processes
(tests/shards/test_collective_routing.py). The numbers: the files are taken as one text, cut into one slice a
rank (``cuts``, in bytes; ``offsets`` where each file starts); rank ``r`` owns the global samples
``[owned[r], owned[r + 1])``, and serves its ``local`` sample ``j`` in round ``j // per_round``. Running
sums are :mod:`rank_dataset.core.arrays`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums

__all__ = [
    "bitmapped",
    "distinct",
    "piece",
    "pieces",
    "request_bytes",
    "rounds_of",
    "split_sums",
    "starts_of",
    "take_parts",
]

_Ints = npt.NDArray[np.int64]


def starts_of(counts: _Ints) -> _Ints:
    """Where each part of ``counts`` (in row-major order) starts, back to back, in its shape."""
    return prefix_sums(counts.reshape(-1))[:-1].reshape(counts.shape)


def take_parts(parts: Sequence[npt.NDArray[Any]], rows: _Ints) -> _Ints:
    """``np.concatenate(parts)[rows]``, without joining the parts (each of ``rows`` below their total)."""
    at = prefix_sums([p.size for p in parts])
    which = np.searchsorted(at, rows, side="right") - 1
    return np.array([int(parts[i][r - at[i]]) for i, r in zip(which.tolist(), np.asarray(rows).tolist())], np.int64)


def split_sums(lengths: _Ints, splits: _Ints) -> _Ints:
    """The sum of each consecutive part of ``lengths`` cut by ``splits``."""
    ends, cuts = prefix_sums(lengths), prefix_sums(splits)
    sums: _Ints = ends[cuts[1:]] - ends[cuts[:-1]]
    return sums


# -- the slices -------------------------------------------------------------------------------------


def piece(offsets: _Ints, cuts: _Ints, rank: int, file: int) -> tuple[int, int]:
    """``(lo, hi)``: the bytes of ``file`` (which starts at ``offsets[file]`` of the text taken as one)
    in ``rank``'s slice ``[cuts[rank], cuts[rank + 1])`` (empty: lo == hi)."""
    start = int(offsets[file])
    size = int(offsets[file + 1]) - start
    lo = min(max(int(cuts[rank]) - start, 0), size)
    hi = min(max(int(cuts[rank + 1]) - start, 0), size)
    return lo, max(lo, hi)


def pieces(offsets: _Ints, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
    """``(file, a, b)`` of each file's bytes ``[a, b)`` in the range ``[lo, hi)`` of the text taken as
    one (the files start at ``offsets``, their end last)."""
    for f in range(offsets.size - 1):
        start = int(offsets[f])
        a, b = max(lo - start, 0), min(hi, int(offsets[f + 1])) - start
        if a < b:
            yield f, a, b


def rounds_of(held: _Ints, text_bytes: int, round_bytes: int) -> tuple[int, int]:
    """``(per_round, rounds)``: the samples an owner serves in a round (about ``round_bytes`` bytes of
    lines, at the files' mean length) and the rounds the largest slice (of ``held`` samples a rank)
    takes, at least one."""
    per_round = max(1, round_bytes * int(held.sum()) // max(text_bytes, 1))
    return per_round, max(1, -(-int(held.max()) // per_round))


# -- routing a build's requests ---------------------------------------------------------------------


def distinct(values: _Ints) -> tuple[_Ints, _Ints]:
    """``np.unique(values, return_inverse=True)`` by one sort (numpy's own takes a slower hash path on a
    plan's numbers)."""
    order = np.argsort(values)
    ordered = values[order]
    first = np.ones(ordered.size, bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(values.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def bitmapped(held: _Ints, asks: _Ints, itemsize: int) -> npt.NDArray[np.bool_]:
    """For each owner (of ``held`` samples) asked for ``asks`` of them: whether the requests go as a bitmap of
    its slice (a bit a sample, ``ceil(held / 8)`` bytes), which is the case where it is smaller than their
    numbers (``itemsize`` bytes each). Asked for none: no bitmap."""
    return (np.asarray(held, np.int64) + 7) // 8 < np.asarray(asks, np.int64) * itemsize


def request_bytes(held: _Ints, asks: _Ints, itemsize: int, bitmap: npt.NDArray[np.bool_] | None = None) -> _Ints:
    """The bytes of the requests to each owner, as :func:`bitmapped` sends them (``bitmap``: what it gives
    for these arguments, where the caller has it)."""
    held, asks = np.asarray(held, np.int64), np.asarray(asks, np.int64)
    bitmap = bitmapped(held, asks, itemsize) if bitmap is None else bitmap
    out: _Ints = np.where(bitmap, (held + 7) // 8, asks * itemsize)
    return out
