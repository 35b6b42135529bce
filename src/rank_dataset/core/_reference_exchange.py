"""The numpy references of the collective reader's exchange kernels (:mod:`rank_dataset.shards.collective._rounds`;
see :mod:`rank_dataset.core._reference`, which names them too)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core._reference import copy_rows, scan_lines

__all__ = ["pack_requests", "place_lines", "route_items", "scatter_bounds", "verify_lines"]

_IntArray = npt.NDArray[np.integer[Any]]


def _exclusive(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each of ``counts`` starts, back to back from 0."""
    return (np.cumsum(counts) - counts).astype(np.int64)


def _ranges(at: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``[at[0], at[0] + counts[0]), [at[1], ...), ...`` one after the other."""
    return np.repeat(at - _exclusive(counts), counts) + np.arange(int(counts.sum()), dtype=np.int64)


def _split_sums(values: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The sum of each consecutive group of ``values``, ``counts[k]`` of them in group ``k``."""
    ends = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    cuts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sums: npt.NDArray[np.int64] = (ends[cuts[1:]] - ends[cuts[:-1]]).astype(np.int64)
    return sums


def _checked_parts(at: Any, counts: Any, size: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    at, counts = np.asarray(at, np.int64), np.asarray(counts, np.int64)
    if at.shape != counts.shape or ((at < 0) | (counts < 0) | (at + counts > size)).any():
        raise ValueError(f"ranges at {at.tolist()} of {counts.tolist()} items are not within {size} items")
    return at, counts


def route_items(
    items: npt.NDArray[np.int64], owned: npt.NDArray[np.int64], rounds: int, per_round: int, check: bool, req: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any], npt.NDArray[Any]] | None:
    """A build's requests grouped: ``(counts, order, request)``, or None where ``check`` and a sample
    occurs twice in ``items``. Rank ``o`` owns the global samples ``[owned[o], owned[o + 1])`` and
    serves its ``j``-th in round ``j // per_round``; an item's key is ``o * rounds + round``.
    ``counts``: the items of each key (``w * rounds``); ``order`` (int32 below 2**31 items, else
    int64): the items' indices grouped by key, stably; ``request`` (dtype ``req``): each grouped
    item's number within its owner's slice."""
    items, owned = np.asarray(items, np.int64), np.asarray(owned, np.int64)
    w, total = owned.size - 1, int(owned[-1])
    if items.size and (int(items.min()) < 0 or int(items.max()) >= total):
        raise ValueError(f"sample numbers must be in [0, {total})")
    if check and items.size > 1:
        if total <= 8 * items.size:  # a flag a sample, no more than 8 bytes an item: no sort
            seen = np.zeros(total, bool)
            seen[items] = True
            if int(np.count_nonzero(seen)) < items.size:
                return None
        elif np.unique(items).size < items.size:
            return None
    owner = np.searchsorted(owned[1:], items, side="right")
    local = items - owned[owner]
    key = owner * rounds + local // per_round
    if key.size and int((local // per_round).max()) >= rounds:
        raise ValueError(f"a sample's round is not below {rounds}")
    parts = w * rounds
    counts = np.bincount(key, minlength=parts).astype(np.int64)
    # Keys of 1 or 2 bytes where they fit: numpy sorts those by radix (a wider one by a merge sort).
    small = np.uint8 if parts <= 1 << 8 else np.uint16 if parts <= 1 << 16 else np.int64
    order = np.argsort(key.astype(small), kind="stable").astype(np.int32 if items.size < 1 << 31 else np.int64)
    return counts, order, local[order].astype(req)


def scatter_bounds(
    lengths: _IntArray, order: _IntArray, counts: npt.NDArray[np.int64], bounds: _IntArray
) -> npt.NDArray[np.int64]:
    """A requester's shard offsets from its owners' lengths: ``bounds[1 + order[j]] = lengths[j]``, then
    ``bounds[0] = 0`` and the running sums in place (``bounds``: ``n + 1`` offsets, uint32 or int64).
    Returns the bytes of each consecutive group of ``counts[k]`` of the lengths."""
    n = order.size
    counts = np.asarray(counts, np.int64)
    if lengths.size != n or bounds.size != n + 1 or int(counts.sum()) != n or (counts < 0).any():
        raise ValueError(f"{lengths.size} lengths, {n} items, {bounds.size} bounds, counts of {int(counts.sum())}")
    if n and (int(np.min(order)) < 0 or int(np.max(order)) >= n):
        raise ValueError(f"an item outside [0, {n})")
    bounds[0] = 0
    bounds[1:][order] = lengths
    total = np.cumsum(bounds[1:], dtype=np.int64)
    if total.size and int(total[-1]) > np.iinfo(bounds.dtype).max:
        raise ValueError("the offsets overflow their dtype")
    bounds[1:] = total
    return _split_sums(np.asarray(lengths, np.int64), counts)


def pack_requests(
    src: npt.NDArray[np.uint8],
    lo: int,
    starts: _IntArray,
    lengths: _IntArray,
    rows: _IntArray,
    at: Any,
    counts: Any,
    head: int,
    status: int,
    send: npt.NDArray[np.uint8] | None,
) -> npt.NDArray[np.int64]:
    """What an owner sends in a round: for each requester ``r``, ``head`` bytes of ``status``, then the
    lines of its rows ``rows[at[r]:at[r] + counts[r]]``, back to back, into ``send`` (with a nonzero
    ``status``, the heads alone: the lines' bytes zeros): the line of ``rows[i]`` is
    ``src[starts[rows[i]] - lo:][:lengths[i]]``. Returns the bytes for each requester; with ``send``
    None, only those."""
    if np.shape(lengths) != np.shape(rows):
        raise ValueError(f"{np.size(rows)} rows and {np.size(lengths)} lengths")
    at, counts = _checked_parts(at, counts, rows.size)
    i = _ranges(at, counts)
    r = np.asarray(rows, np.int64)[i]
    if r.size and (int(r.min()) < 0 or int(r.max()) >= starts.size):
        raise ValueError(f"a row outside [0, {starts.size})")
    ln = np.asarray(lengths, np.int64)[i]
    sizes = _split_sums(ln, counts) + head
    if send is None:
        return sizes
    if send.size != int(sizes.sum()):
        raise ValueError(f"{send.size} bytes to send, not {int(sizes.sum())}")
    heads = (_exclusive(sizes)[:, None] + np.arange(head)).reshape(-1)
    if status:
        send[:] = 0
        send[heads] = status
        return sizes
    s = np.asarray(starts, np.int64)[r] - lo
    if s.size and (int(s.min()) < 0 or int((s + ln).max()) > src.size):
        raise ValueError(f"a line outside the {src.size} bytes read")
    send[heads] = 0
    dst = np.cumsum(ln) - ln + head * np.repeat(np.arange(1, counts.size + 1, dtype=np.int64), counts)
    copy_rows(src, s, ln, send, dst)
    return sizes


def place_lines(
    got: npt.NDArray[np.uint8],
    parts: Any,
    order: _IntArray,
    at: Any,
    counts: Any,
    head: int,
    bounds: _IntArray,
    data: npt.NDArray[np.uint8],
) -> None:
    """A requester's round into its shard: ``got`` holds each owner ``o``'s part of ``parts[o]`` bytes,
    back to back: ``head`` bytes, then the lines of the items ``order[at[o]:at[o] + counts[o]]`` back
    to back; item ``row``'s line goes to ``data[bounds[row]:bounds[row + 1]]``."""
    at, counts = _checked_parts(at, counts, order.size)
    idx = np.asarray(order, np.int64)[_ranges(at, counts)]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= bounds.size - 1):
        raise ValueError(f"an item outside [0, {bounds.size - 1})")
    dst = np.asarray(bounds, np.int64)[idx]
    ln = np.asarray(bounds, np.int64)[idx + 1] - dst
    parts = np.asarray(parts, np.int64)
    if (
        parts.shape != counts.shape
        or int(parts.sum()) != got.size
        or not np.array_equal(_split_sums(ln, counts) + head, parts)
        or (ln.size and (int(ln.min()) < 0 or int(dst.min()) < 0 or int((dst + ln).max()) > data.size))
    ):
        raise ValueError("the lines received do not fill their owners' parts, or do not fit the shard")
    src = np.cumsum(ln) - ln + head * np.repeat(np.arange(1, counts.size + 1, dtype=np.int64), counts)
    copy_rows(got, src, ln, data, dst)


def verify_lines(
    buf: npt.NDArray[np.uint8], offset: int, last: bool, starts: _IntArray, base: int, lengths: _IntArray
) -> tuple[int, int, bool]:
    """``(bad, newlines, ascii)``: whether ``buf`` (bytes ``offset`` onwards of a file, starting a line;
    with ``last``, bytes after its final newline form a line too) holds exactly the samples at
    ``starts[k] - base`` of ``lengths[k]`` bytes, as :func:`scan_lines` finds them: ``bad`` -1 if so,
    else the first ``k`` that differs (``len(starts)``: ``buf`` holds more); and the scan's newlines
    and whether ``buf`` is all ASCII."""
    scan = scan_lines(buf, offset, last)
    want_s = np.asarray(starts, np.int64) - base
    want_l = np.asarray(lengths, np.int64)
    m = min(want_s.size, scan.starts.size)
    differ = np.flatnonzero((scan.starts[:m] - offset != want_s[:m]) | (scan.lengths[:m] != want_l[:m]))
    bad = int(differ[0]) if differ.size else (-1 if want_s.size == scan.starts.size else m)
    return bad, scan.newlines, scan.ascii
