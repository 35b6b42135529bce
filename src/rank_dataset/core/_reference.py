"""The numpy reference of each native kernel: the kernels :mod:`rank_dataset.core.native` runs where the
library does not load, and what the tests compare the library with, byte for byte.

Each function computes what its kernel in ``_kernels.c`` does, with the same arguments and results (the
kernels check their arguments more strictly: a span outside its buffer is a ValueError there).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import Int64Array, IntegerArray, UInt8Array, UInt32Array, prefix_sums, ranges

if TYPE_CHECKING:
    import array

__all__ = [
    "BLANK",
    "BOM",
    "CR",
    "FUSED",
    "MARK",
    "NEWLINE",
    "OPEN_HIT",
    "OPEN_MISS",
    "OPEN_NOT_FILE",
    "LineScan",
    "bucket_order",
    "check_lines",
    "checked_keys",
    "copy_lines",
    "copy_rows",
    "count_byte",
    "find_byte",
    "gather_lines",
    "line_fields",
    "lines_bad",
    "mix32",
    "open_files",
    "pack_requests",
    "pack_rows",
    "pack_runs",
    "packed_args",
    "permute_cells",
    "place_lines",
    "route_items",
    "scan_lines",
    "scatter_bounds",
    "split_args",
    "split_costs",
    "utf8_first_invalid",
    "verify_lines",
]


NEWLINE, CR = 10, 13
#: The UTF-8 byte order mark, skipped at the start of a file.
BOM = b"\xef\xbb\xbf"
#: A scan marks the first line at or after every multiple of this many bytes (``files.index.scan.MARK``).
MARK = 4 << 20
#: Byte -> whether it is ASCII whitespace (space, tab, newline, CR, VT, FF).
BLANK = np.zeros(256, dtype=bool)
BLANK[[9, 10, 11, 12, 13, 32]] = True
#: :func:`open_files`' status of a file: open and its pages in the page cache; open (not known to be); not a
#: regular file (closed). Any other status is ``-errno`` of the open (nothing left open).
OPEN_HIT, OPEN_MISS, OPEN_NOT_FILE = 0, 1, 2
_HIGH_BITS = np.uint64(0x8080808080808080)
# Rows of a length no longer than this are copied by length group (one gather per group).
_GROUPED_MAX = 1 << 16
# A length group this small is copied row by row (a slice copy is cheaper than two fancy indexings).
_SMALL_GROUP = 4
# Rows of at most this many bytes in all are copied byte by byte, in one gather.
_BYTEWISE_MAX = 1 << 16
_UTF8_RUN = 1 << 16  # rows decoded at a time
#: Whether :func:`check_lines` and :func:`gather_lines` check a window's rows in one pass over its bytes,
#: newlines inside rows included. Here they are several numpy passes each: a caller does better with
#: separate bound and blank checks and one newline search of the copied shard.
FUSED = False


class LineScan(NamedTuple):
    """What a scan finds in a buffer of whole lines (see :func:`scan_lines`)."""

    starts: Int64Array
    lengths: Int64Array
    ascii: bool
    newlines: int
    marks: Int64Array


def count_byte(buf: UInt8Array, byte: int = NEWLINE) -> int:
    """How many bytes of ``buf`` are ``byte``."""
    return int(np.count_nonzero(buf == byte))


def find_byte(buf: UInt8Array, byte: int = NEWLINE) -> Int64Array:
    """Where the bytes of ``buf`` equal to ``byte`` are, ascending (int64)."""
    return np.flatnonzero(buf == byte).astype(np.int64, copy=False)


def _is_ascii(buf: UInt8Array) -> bool:
    whole = buf.size - buf.size % 8
    return not (np.bitwise_or.reduce(buf[:whole].view(np.uint64)) & _HIGH_BITS) and not (buf[whole:] >= 0x80).any()


def scan_lines(buf: UInt8Array, offset: int, last: bool, mark: int = MARK) -> LineScan:
    """The samples of the complete lines of ``buf``, which holds bytes ``offset`` onwards of a file and
    starts a line: the chunk scan of :func:`rank_dataset.files.index.scan.scan_buffer` (its numpy passes, the
    same results). With ``last``, bytes after the final newline form a line too; at offset 0 a byte
    order mark is skipped. ``marks``: ``(k, 2)`` rows ``(offset, line)``, for each multiple of
    ``mark`` in the buffer, where the first line at or after it starts and its number."""
    if not buf.size:
        empty = np.empty(0, np.int64)
        return LineScan(empty, empty, True, 0, np.empty((0, 2), np.int64))
    newline_at = np.flatnonzero(buf == NEWLINE)
    line_starts = np.empty(newline_at.size + 1, np.int64)
    line_starts[0] = 0
    np.add(newline_at, 1, out=line_starts[1:])
    first_mark = -(-offset // mark) * mark
    targets = np.arange(first_mark, offset + buf.size, mark, dtype=np.int64) - offset
    lines = np.searchsorted(line_starts, targets)
    found = lines < line_starts.size
    marks = np.column_stack((line_starts[lines[found]] + offset, lines[found])).astype(np.int64)
    ends = newline_at
    if last and line_starts[-1] < buf.size:
        ends = np.append(ends, buf.size)
    starts = line_starts[: ends.size]
    bom = offset == 0 and buf[: len(BOM)].tobytes() == BOM
    if bom and starts.size:
        starts[0] = len(BOM)
    lengths = ends - starts
    # "\r\n" loses its "\r" (an empty first line reads buf[-1]: harmless, its span is blank either way).
    lengths -= buf.take(ends - 1, mode="wrap") == CR
    maybe_blank = buf.take(starts, mode="clip") <= ord(" ")
    if bom and starts.size:
        maybe_blank[0] |= lengths[0] <= 0
    if maybe_blank.any():
        rows = np.flatnonzero(maybe_blank)
        keep = np.ones(ends.size, dtype=bool)
        keep[rows] = False
        sized = rows[lengths[rows] > 0]
        if sized.size:
            content = ~BLANK[buf]
            bounds: Int64Array = np.column_stack((starts[sized], starts[sized] + lengths[sized])).reshape(-1)
            if bounds[-1] == buf.size:
                bounds = bounds[:-1]
            keep[sized] = np.logical_or.reduceat(content, bounds)[::2]
        starts, lengths = starts[keep], lengths[keep]
    return LineScan(starts + offset, lengths.astype(np.int64), _is_ascii(buf), int(newline_at.size), marks)


def copy_rows(
    src: UInt8Array,
    src_starts: IntegerArray,
    lengths: IntegerArray,
    dst: UInt8Array,
    dst_starts: IntegerArray,
) -> None:
    """``dst[dst_starts[k]:][:lengths[k]] = src[src_starts[k]:][:lengths[k]]`` for every ``k``, exactly.

    Vectorised by length: the rows of one length ``L`` are one gather from a view of ``src`` whose
    elements are ``L``-byte records starting at every byte, and one scatter into the same kind of
    view of ``dst``. Nothing is written outside the rows, so rows may be copied in any order and in
    as many calls as convenient.
    """
    count = len(lengths)
    if not count:
        return
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total <= _BYTEWISE_MAX:
        # Few bytes: one gather of every byte, from where each row's bytes are to where they go.
        step = np.arange(total, dtype=np.int64) - np.repeat(prefix_sums(lengths)[:-1], lengths)
        dst[np.repeat(np.asarray(dst_starts, np.int64), lengths) + step] = src[
            np.repeat(np.asarray(src_starts, np.int64), lengths) + step
        ]
        return
    # A 16-bit key, which numpy sorts by radix (a wider one by a merge sort); lengths past it are
    # copied row by row, wherever the sort leaves them.
    key = np.minimum(lengths, 0xFFFF).astype(np.uint16)
    order = np.argsort(key, kind="stable")
    by_length = lengths[order]
    # Both ends in length order, so that each group's are slices (one gather each, not one a group).
    src_at, dst_at = np.asarray(src_starts)[order], np.asarray(dst_starts)[order]
    cuts = [0, *(np.flatnonzero(by_length[1:] != by_length[:-1]) + 1).tolist(), count]
    for lo, hi in itertools.pairwise(cuts):
        width = int(by_length[lo])
        if width == 0:
            continue
        if width > _GROUPED_MAX or hi - lo <= _SMALL_GROUP:
            for s, d in zip(src_at[lo:hi].tolist(), dst_at[lo:hi].tolist()):
                dst[d : d + width] = src[s : s + width]
            continue
        records = f"V{width}"
        src_view: npt.NDArray[np.void] = np.ndarray((src.size - width + 1,), records, buffer=src, strides=(1,))
        dst_view: npt.NDArray[np.void] = np.ndarray((dst.size - width + 1,), records, buffer=dst, strides=(1,))
        dst_view[dst_at[lo:hi]] = src_view[src_at[lo:hi]]


def pack_rows(
    src: UInt8Array, starts: IntegerArray, lengths: IntegerArray, dst: UInt8Array, offsets: IntegerArray
) -> None:
    """Rows ``src[starts[k]:][:lengths[k]]`` back to back into ``dst`` from its first byte, and
    ``offsets`` (``n + 1`` of them, uint32 or int64) where each begins, the last where they end."""
    lengths = np.asarray(lengths, np.int64)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:], dtype=offsets.dtype)
    if int(offsets[-1]) > dst.size:
        raise ValueError(f"{int(offsets[-1])} bytes of rows do not fit {dst.size} bytes")
    copy_rows(src, starts, lengths, dst, offsets[:-1])


def utf8_first_invalid(data: UInt8Array, bounds: IntegerArray) -> int:
    """The first row ``data[bounds[i]:bounds[i + 1]]`` that is not valid UTF-8 (as Python's strict
    decoder judges it), or -1."""
    starts, ends = bounds[:-1], bounds[1:]
    nonempty = np.flatnonzero(ends > starts)
    first = data[starts[nonempty]]
    # A row that starts with a continuation byte is invalid on its own. Before the first such row,
    # a sequence cut at a row boundary cannot pass as valid, so whole runs of rows can be decoded.
    cont = nonempty[(first >= 0x80) & (first < 0xC0)]
    limit = int(cont[0]) if cont.size else starts.size
    view = data.data
    for a, b in itertools.pairwise([*range(0, limit, _UTF8_RUN), limit]):
        lo, hi = int(bounds[a]), int(bounds[b])
        try:
            str(view[lo:hi], "utf-8")
        except UnicodeDecodeError as exc:
            return int(np.searchsorted(bounds, lo + exc.start, side="right")) - 1
    return limit if cont.size else -1


def lines_bad(buf: UInt8Array, starts: Int64Array, ends: Int64Array) -> int:
    """The first row ``buf[starts[k]:ends[k]]`` that is not a sample's text: one that holds a newline,
    or nothing but ASCII whitespace (an empty row too); -1 if none."""
    if not starts.size:
        return -1
    if not buf.size:  # every row empty
        return 0
    newline_at = np.flatnonzero(buf == NEWLINE)
    nearest = np.searchsorted(newline_at, starts)  # the first newline at or after each start
    bad = nearest < newline_at.size
    bad[bad] = newline_at[nearest[bad]] < ends[bad]
    # Only a row that starts with whitespace (or is empty) can be blank: check those in full.
    maybe = np.flatnonzero(~bad & ((ends <= starts) | BLANK[buf[np.minimum(starts, buf.size - 1)]]))
    for k, s, e in zip(maybe.tolist(), starts[maybe].tolist(), ends[maybe].tolist()):
        if bool(BLANK[buf[s:e]].all()):
            bad[k] = True
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else -1


_FMIX1, _FMIX2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)
_S16, _S13 = np.uint32(16), np.uint32(13)


def open_files(dirfd: int, names: Sequence[str], probe_max: int) -> array.array[int] | None:
    """Open each of ``names`` (relative paths) beneath the directory ``dirfd`` in one call: a symlink that
    stays under the directory is followed, one that leaves it, an absolute one, a ``..`` above it or a magic
    link is refused (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS``); a regular file of at most
    ``probe_max`` bytes (< 0: none) has its last byte read without waiting for a disk (``RWF_NOWAIT``), which
    tells a page-cache hit. The library's returns an int64 array ``out`` of ``3 * len(names)``: file ``i``'s
    descriptor at ``out[i]`` (-1: none; the others are the caller's to close), its size at ``out[n + i]`` and
    its status at ``out[2n + i]`` (:data:`OPEN_HIT`, ...), or None where it cannot (no ``openat2``, not Linux).

    The reference opens nothing and returns None: the caller's own walk, which opens the files one at a time,
    is what the library's results are compared with. (The library raises ValueError for a name that is empty
    or holds a NUL byte.)
    """
    return None


def mix32(x: UInt32Array, key: np.uint32) -> UInt32Array:
    """A keyed 32-bit mix of ``x`` (murmur3's finaliser); all arithmetic wraps modulo 2**32."""
    h = x ^ key
    h ^= h >> _S16
    h *= _FMIX1
    h ^= h >> _S13
    h *= _FMIX2
    h ^= h >> _S16
    return h


def _feistel(hi: UInt32Array, lo: UInt32Array, keys: Sequence[int], rows: int, col_bits: int) -> None:
    """Apply the rounds in place to the grid coordinates ``hi`` in [0, rows) and ``lo`` in [0, 2**col_bits)."""
    col_mask, r = np.uint32((1 << col_bits) - 1), np.uint32(rows)
    for i, key in enumerate(keys):
        if i % 2 == 0:
            lo += mix32(hi, np.uint32(key))
            lo &= col_mask
        else:
            h = mix32(lo, np.uint32(key))
            h %= r
            hi += h
            # hi + h < 2 * rows: subtracting rows where it wraps is the cheap modulo.
            np.minimum(hi, hi - r, out=hi)


def permute_cells(n: int, rows: int, col_bits: int, keys: Sequence[int], positions: Int64Array) -> Int64Array:
    """The keyed permutation of ``[0, n)`` at ``positions`` (``plan.permutation.permute`` given its grid
    and round keys): each position a cell ``(hi, lo)`` of ``rows x 2**col_bits``, mixed by a Feistel
    round per key, walked again while it lands at ``n`` or past it (cycle walking)."""
    flat = np.asarray(positions, np.int64).reshape(-1)
    hi = (flat >> col_bits).astype(np.uint32)
    lo = (flat & ((1 << col_bits) - 1)).astype(np.uint32)
    todo = None
    while True:
        _feistel(hi, lo, keys, rows, col_bits)
        cell = hi.astype(np.int64)
        cell <<= col_bits
        cell |= lo
        if todo is None:
            out = cell
            todo = np.flatnonzero(out >= n)
        else:
            out[todo] = cell
            todo = todo[cell >= n]
        if not todo.size:
            return out
        # Walk the cells that fell outside [0, n) again until they land inside.
        hi = (out[todo] >> col_bits).astype(np.uint32)
        lo = (out[todo] & ((1 << col_bits) - 1)).astype(np.uint32)


def check_lines(
    buf: UInt8Array,
    at: Int64Array,
    starts: Int64Array,
    lengths: Int64Array,
    file_size: int,
    bom: bool,
) -> int:
    """The first row that is not a sample of the file, or -1: row ``k`` is bytes ``starts[k]`` to
    ``starts[k] + lengths[k]`` of a file of ``file_size`` bytes (with a byte order mark: ``bom``), held at
    ``buf[at[k]:]`` with the byte before it and the two after it where the file has them. A sample starts
    the file (after its byte order mark) or follows a newline, ends at the end of the file or at a line
    ending (``\\n`` not after ``\\r``, ``\\r\\n``, ``\\r`` at the end), holds no newline and is not blank
    (what :func:`rank_dataset.files.read.lines.bounds_ok` and ``rows_ok`` check, and a newline search)."""
    if not starts.size:
        return -1
    rs, re_ = at, at + lengths
    ends = starts + lengths
    take = functools.partial(np.take, buf, mode="clip")
    after_newline = take(rs - 1) == NEWLINE
    start_ok = np.where(starts == 0, not bom, after_newline | ((starts == len(BOM)) & bom))
    last, c1, c2 = take(re_ - 1), take(re_), take(re_ + 1)
    at_eof = ends >= file_size
    plain_end = (at_eof | (c1 == NEWLINE)) & (last != CR)
    cr_end = ~at_eof & (c1 == CR) & ((ends + 1 >= file_size) | (c2 == NEWLINE))
    ok = start_ok & (plain_end | cr_end) & (lengths > 0)
    newline_at = np.flatnonzero(buf == NEWLINE)
    nearest = np.searchsorted(newline_at, rs)
    inside = nearest < newline_at.size
    inside[inside] = newline_at[nearest[inside]] < re_[inside]
    ok &= ~inside
    for k in np.flatnonzero(ok & BLANK[take(rs)]).tolist():
        ok[k] = not bool(BLANK[buf[rs[k] : re_[k]]].all())
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else -1


def checked_keys(keys: Any, buckets: int, dtype: Any) -> npt.NDArray[np.uint16]:
    """``keys`` as an array, checked to be what :func:`bucket_order` takes with ``buckets`` and ``dtype``
    (each key below ``buckets`` apart)."""
    keys = np.asarray(keys)
    if keys.dtype != np.uint16 or keys.ndim != 1:
        raise TypeError(f"keys must be a 1-D uint16 array, got {keys.dtype} with shape {keys.shape}")
    if np.dtype(dtype) not in (np.dtype(np.uint32), np.dtype(np.int64)):
        raise TypeError(f"the order's dtype must be uint32 or int64, got {np.dtype(dtype)}")
    if not 1 <= buckets <= 1 << 16:
        raise ValueError(f"buckets must be in [1, 65536], got {buckets}")
    return cast("npt.NDArray[np.uint16]", keys)


def bucket_order(keys: npt.NDArray[np.uint16], buckets: int, dtype: Any = np.int64) -> tuple[np.ndarray, Int64Array]:
    """``(order, counts)``: the items of ``keys`` (each below ``buckets``) in ascending key order,
    stably, as ``dtype`` (uint32 or int64), and how many items hold each key."""
    keys = checked_keys(keys, buckets, dtype)
    if keys.size and int(keys.max()) >= buckets:
        item = int(np.flatnonzero(keys >= buckets)[0])
        raise ValueError(f"key {int(keys[item])} (item {item}) is not below buckets ({buckets})")
    order = np.argsort(keys, kind="stable").astype(dtype)  # a radix sort of 16-bit keys
    return order, np.bincount(keys, minlength=buckets).astype(np.int64)


def _check_bounds(name: str, bounds: Int64Array, n: int) -> None:
    """ValueError naming ``name`` unless ``bounds`` rises from 0 to ``n``, never decreasing."""
    if bounds.size < 1 or bounds[0] != 0 or bounds[-1] != n or np.any(np.diff(bounds) < 0):
        raise ValueError(f"{name} must rise from 0 to the {n} costs, got {bounds.tolist()[:8]}")


def packed_args(costs: Any, bounds: Any, limit: int, fill: Any) -> tuple[Int64Array, Int64Array, int, Int64Array]:
    """The arguments of :func:`pack_runs` as int64 arrays, checked: ``bounds`` from 0 to ``len(costs)``,
    never decreasing; ``limit`` >= 0; one ``fill`` per segment, each in ``[0, limit]``."""
    c = np.ascontiguousarray(costs, dtype=np.int64).reshape(-1)
    b = np.ascontiguousarray(bounds, dtype=np.int64).reshape(-1)
    f = np.ascontiguousarray(fill, dtype=np.int64).reshape(-1)
    limit = int(limit)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    _check_bounds("bounds", b, c.size)
    if f.size != b.size - 1 or (f.size and (f.min() < 0 or f.max() > limit)):
        raise ValueError(f"fill must hold one total in [0, {limit}] per segment ({b.size - 1})")
    return c, b, limit, f


def pack_runs(costs: Any, bounds: Any, limit: int, fill: Any) -> tuple[UInt8Array, Int64Array]:
    """Greedy packing of each segment ``costs[bounds[b]:bounds[b+1]]`` into runs of total at most ``limit``,
    its first run continuing an open run of total ``fill[b]``: ``(starts, totals)``, ``starts[i]`` 1 where
    item ``i`` does not fit the run before it (so begins a new one), and each segment's last run's total.
    A cost outside ``[0, limit]`` is a ValueError naming the item."""
    c, b, limit, f = packed_args(costs, bounds, limit, fill)
    bad = np.flatnonzero((c < 0) | (c > limit))
    if bad.size:
        raise ValueError(f"cost {int(c[bad[0]])} of item {int(bad[0])} is outside [0, {limit}]")
    starts = np.zeros(c.size, np.uint8)
    totals = f.copy()
    cum = prefix_sums(c)
    for seg in range(f.size):
        i, z, t = int(b[seg]), int(b[seg + 1]), int(f[seg])
        while i < z:  # one search per run: items [i, j) fit what is left of the run
            j = min(int(np.searchsorted(cum, int(cum[i]) + limit - t, side="right")) - 1, z)
            if j == z:
                t += int(cum[z] - cum[i])
                break
            starts[j], t, i = 1, 0, j
        totals[seg] = t
    return starts, totals


def split_args(costs: Any, offsets: Any, world: int) -> tuple[Int64Array, Int64Array, int]:
    """The arguments of :func:`split_costs` as int64 arrays, checked: ``offsets`` from 0 to ``len(costs)``,
    never decreasing; ``world`` >= 1."""
    c = np.ascontiguousarray(costs, dtype=np.int64).reshape(-1)
    off = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
    world = int(world)
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    _check_bounds("offsets", off, c.size)
    return c, off, world


def split_costs(costs: Any, offsets: Any, world: int) -> Int64Array:
    """The rank of each item of the batches ``costs[offsets[i]:offsets[i+1]]``, split by rounds among ``world``
    ranks: a batch's items taken by cost, highest first (ties: the earlier); round ``k`` hands its ``world``
    items, highest first, to the ranks in order of their total so far, lowest first (ties: the lower rank)."""
    cost, off, world = split_args(costs, offsets, world)
    out = np.zeros(cost.size, np.int64)
    lengths = np.diff(off)
    if world == 1 or not cost.size:
        return out
    nb = lengths.size
    batch = np.repeat(np.arange(nb), lengths)
    within = np.arange(cost.size) - off[:-1][batch]
    order = np.lexsort((-cost, batch))  # by batch, then cost high first (stable: then position)
    rounds = -(-int(lengths.max()) // world)
    grid = np.full((nb, rounds * world), -1, np.int64)  # the item at each slot of its batch, by cost
    grid[batch, within] = order  # sorting kept the batches in place: item i's slot in its batch is within[i]
    totals = np.zeros((nb, world), np.int64)
    rows = np.arange(nb)[:, None]
    for k in range(rounds):
        items = grid[:, k * world : (k + 1) * world]
        ranks = np.argsort(totals, axis=1, kind="stable")
        real = items >= 0
        out[items[real]] = ranks[real]
        # A row's ranks are a permutation of 0..W-1: no index repeats in a row, so += adds each once.
        totals[rows, ranks] += np.where(real, cost[np.maximum(items, 0)], 0)
    return out


def gather_lines(
    buf: UInt8Array,
    shift: int,
    starts: Int64Array,
    rows: IntegerArray,
    bounds: IntegerArray,
    dst: UInt8Array,
    file_size: int,
    bom: bool,
) -> int:
    """The gather of one window: row ``k`` (bytes ``starts[k]`` on of the file, held at
    ``buf[starts[k] - shift:]``) checked as :func:`check_lines` checks it and copied to
    ``dst[bounds[r]:bounds[r + 1]]``, ``r = rows[k]``, in order. Returns the first row that is not a
    sample (the rows before it copied), or -1 (all copied). A row outside its buffers (``r`` not a row
    of ``bounds``, its place outside ``dst``, its bytes or those its checks need outside ``buf``) is
    a ValueError, the rows before it copied."""
    if shift < 0:
        raise ValueError(f"shift must be >= 0, got {shift}")
    starts = np.asarray(starts, np.int64)
    r = np.asarray(rows, np.int64)
    b = np.asarray(bounds, np.int64)
    n = r.size
    known = (r >= 0) & (r < b.size - 1)
    rr = np.where(known, r, 0)
    d = np.where(known, b[rr] if b.size else 0, 0)
    lengths = np.where(known, b[np.minimum(rr + 1, max(b.size - 1, 0))] - d if b.size else 0, 0)
    at, ends = starts - shift, starts + lengths
    # What the kernel's range check refuses: the row's place, its bytes, and the bytes its checks read.
    needs_before = ~((starts == 0) | ((starts == len(BOM)) & bom))
    needs_after = ends < file_size
    re_ = at + lengths
    after = np.take(buf, re_, mode="clip") if buf.size else np.zeros(n, np.uint8)
    outside = (
        ~known
        | (d < 0)
        | (lengths < 0)
        | (d > dst.size - lengths)
        | (starts < 0)
        | (at < 0)
        | (at > buf.size - lengths)
        | (starts > file_size - lengths)
        | (needs_before & (at < 1))
        | (needs_after & (re_ >= buf.size))
        | (needs_after & (after == CR) & (ends + 1 < file_size) & (re_ + 1 >= buf.size))
    )
    first_out = int(np.argmax(outside)) if bool(outside.any()) else n
    inside = slice(0, first_out)
    bad = check_lines(buf, at[inside], starts[inside], lengths[inside], file_size, bom) if first_out else -1
    done = bad if bad >= 0 else first_out
    copy_rows(buf, at[:done], lengths[:done], dst, d[:done])
    if bad < 0 and first_out < n:
        raise ValueError(f"gather_lines: a span lies outside its buffer (row {first_out})")
    return bad


# -- the collective reader's exchange (rank_dataset.shards.collective) ---------------------------------


def _split_sums(values: Int64Array, counts: Int64Array) -> Int64Array:
    """The sum of each consecutive group of ``values``, ``counts[k]`` of them in group ``k``."""
    ends, cuts = prefix_sums(values), prefix_sums(counts)
    return ends[cuts[1:]] - ends[cuts[:-1]]


def _part_places(ln: Int64Array, counts: Int64Array, head: int) -> Int64Array:
    """Where each line goes in parts laid back to back, part ``k`` being ``head`` bytes, then its
    ``counts[k]`` lines of ``ln`` bytes back to back."""
    return prefix_sums(ln)[:-1] + head * np.repeat(np.arange(1, counts.size + 1, dtype=np.int64), counts)


def _checked_parts(at: Any, counts: Any, size: int) -> tuple[Int64Array, Int64Array]:
    at, counts = np.asarray(at, np.int64), np.asarray(counts, np.int64)
    if at.shape != counts.shape or ((at < 0) | (counts < 0) | (at + counts > size)).any():
        raise ValueError(f"ranges at {at.tolist()} of {counts.tolist()} items are not within {size} items")
    return at, counts


def route_items(
    items: Int64Array, owned: Int64Array, rounds: int, per_round: int, check: bool, req: Any
) -> tuple[Int64Array, np.ndarray, np.ndarray] | None:
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


def scatter_bounds(lengths: IntegerArray, order: IntegerArray, counts: Int64Array, bounds: IntegerArray) -> Int64Array:
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
    src: UInt8Array,
    lo: int,
    starts: IntegerArray,
    lengths: IntegerArray,
    rows: IntegerArray,
    at: Any,
    counts: Any,
    head: int,
    status: int,
    send: UInt8Array | None = None,
) -> Int64Array:
    """What an owner sends in a round: for each requester ``r``, ``head`` bytes of ``status``, then the
    lines of its rows ``rows[at[r]:at[r] + counts[r]]``, back to back, into ``send`` (with a nonzero
    ``status``, the heads alone: the lines' bytes zeros): the line of ``rows[i]`` is
    ``src[starts[rows[i]] - lo:][:lengths[i]]``. Returns the bytes for each requester; with ``send``
    None, only those."""
    if np.shape(lengths) != np.shape(rows):
        raise ValueError(f"{np.size(rows)} rows and {np.size(lengths)} lengths")
    at, counts = _checked_parts(at, counts, rows.size)
    i = ranges(at, counts)
    r = np.asarray(rows, np.int64)[i]
    if r.size and (int(r.min()) < 0 or int(r.max()) >= starts.size):
        raise ValueError(f"a row outside [0, {starts.size})")
    ln = np.asarray(lengths, np.int64)[i]
    sizes = _split_sums(ln, counts) + head
    if send is None:
        return sizes
    if send.size != int(sizes.sum()):
        raise ValueError(f"{send.size} bytes to send, not {int(sizes.sum())}")
    heads = (prefix_sums(sizes)[:-1, None] + np.arange(head)).reshape(-1)
    if status:
        send[:] = 0
        send[heads] = status
        return sizes
    s = np.asarray(starts, np.int64)[r] - lo
    if s.size and (int(s.min()) < 0 or int((s + ln).max()) > src.size):
        raise ValueError(f"a line outside the {src.size} bytes read")
    send[heads] = 0
    copy_rows(src, s, ln, send, _part_places(ln, counts, head))
    return sizes


def place_lines(
    got: UInt8Array,
    parts: Any,
    order: IntegerArray,
    at: Any,
    counts: Any,
    head: int,
    bounds: IntegerArray,
    data: UInt8Array,
) -> None:
    """A requester's round into its shard: ``got`` holds each owner ``o``'s part of ``parts[o]`` bytes,
    back to back: ``head`` bytes, then the lines of the items ``order[at[o]:at[o] + counts[o]]`` back
    to back; item ``row``'s line goes to ``data[bounds[row]:bounds[row + 1]]``."""
    at, counts = _checked_parts(at, counts, order.size)
    idx = np.asarray(order, np.int64)[ranges(at, counts)]
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
    copy_rows(got, _part_places(ln, counts, head), ln, data, dst)


def copy_lines(
    src: UInt8Array,
    lo: int,
    starts: IntegerArray,
    request: IntegerArray,
    rows: IntegerArray,
    bounds: IntegerArray,
    data: UInt8Array,
) -> None:
    """A round's lines from an owner's buffer straight into a shard: the line of ``request[i]`` (one of
    the owner's samples, ``src[starts[request[i]] - lo:]``) goes to row ``rows[i]`` of the shard
    (``data[bounds[row]:bounds[row + 1]]``, its length the row's). A request or row outside its table, or a
    span outside its buffer, is a ValueError."""
    q, r, b = np.asarray(request, np.int64), np.asarray(rows, np.int64), np.asarray(bounds, np.int64)
    if q.shape != r.shape or not b.size:
        raise ValueError(f"{q.size} requests and {r.size} rows; {b.size} bounds")
    if r.size and (int(r.min()) < 0 or int(r.max()) >= b.size - 1 or int(q.min()) < 0 or int(q.max()) >= len(starts)):
        raise ValueError("copy_lines: a request or a row outside its table")
    at = np.asarray(starts, np.int64)[q] - lo
    dst = b[r]
    lengths = b[r + 1] - dst
    if lengths.size and (
        int(lengths.min()) < 0
        or int(at.min()) < 0
        or int((at + lengths).max()) > src.size
        or int(dst.min()) < 0
        or int((dst + lengths).max()) > data.size
    ):
        raise ValueError("copy_lines: a span lies outside its buffer")
    copy_rows(src, at, lengths, data, dst)


def verify_lines(
    buf: UInt8Array, offset: int, last: bool, starts: IntegerArray, base: int, lengths: IntegerArray
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


#: The longest field :func:`line_fields` decodes: 10 digits (``2**32 - 1`` has 10).
FIELD_DIGITS = 10
#: Byte -> whether ``str.split()`` takes it as whitespace (of the ASCII bytes: 9-13 and 28-32).
FIELD_SPACE = np.zeros(256, dtype=bool)
FIELD_SPACE[[*range(9, 14), *range(28, 33)]] = True
#: Byte -> whether ``str.split()`` may split a line holding it otherwise than :data:`FIELD_SPACE` says: the
#: control bytes it does not take as whitespace (0-8, 14-27), and the lead bytes of the Unicode spaces
#: (U+0085, U+00A0, U+1680, U+2000-U+205F, U+3000) and of a byte order mark.
FIELD_UNSURE = np.zeros(256, dtype=bool)
FIELD_UNSURE[[*range(9), *range(14, 28), 0xC2, 0xE1, 0xE2, 0xE3, 0xEF]] = True


def line_fields(
    buf: UInt8Array,
    first: int,
    second: int,
    out_first: UInt32Array,
    out_second: UInt32Array,
) -> tuple[int, int]:
    """Fields ``first`` and ``second`` (0-based) of each sample of ``buf``, a run of whole lines, as numbers.

    A line ends at a newline or at the end of ``buf``; it is a sample if it holds a byte other than ASCII
    whitespace (as :func:`scan_lines` counts them). Its fields are the maximal runs of bytes not in
    :data:`FIELD_SPACE`. For sample ``i < out_first.size``, ``out_first[i]`` and ``out_second[i]`` get the two
    fields' values; both get 0 (the line is flagged, for the caller to judge) if the line has fewer than
    ``max(first, second) + 1`` fields, holds a byte of :data:`FIELD_UNSURE` before the end of field
    ``max(first, second)``, or if either field is not 1 to :data:`FIELD_DIGITS` ASCII digits of a value in
    ``[1, 2**32)``. Returns ``(samples, flagged)``: the samples of ``buf`` (those past ``out_first.size`` counted,
    not written) and the flagged ones among those written."""
    if first < 0 or second < 0:
        raise ValueError(f"field positions must be >= 0, got {first} and {second}")
    if out_first.shape != out_second.shape or out_first.ndim != 1:
        raise ValueError(f"{out_first.shape} and {out_second.shape} outputs")
    size = buf.size
    newline_at = np.flatnonzero(buf == NEWLINE)
    line_starts = np.concatenate(([0], newline_at + 1)).astype(np.int64)
    line_ends = np.concatenate((newline_at, [size])).astype(np.int64)
    content = np.zeros(size + 1, np.int64)
    np.cumsum(~BLANK[buf], out=content[1:])
    is_sample = content[line_ends] > content[line_starts]
    starts, ends = line_starts[is_sample], line_ends[is_sample]
    samples = starts.size
    m = min(samples, out_first.size)
    starts, ends = starts[:m], ends[:m]
    space = FIELD_SPACE[buf]
    solid = ~space
    field_starts = np.flatnonzero(solid & np.concatenate(([True], space[:-1])))
    field_ends = np.flatnonzero(solid & np.concatenate((space[1:], [True]))) + 1
    line_first = np.searchsorted(field_starts, starts)
    last = max(first, second)
    ok = np.searchsorted(field_starts, ends) - line_first > last
    values = {}
    if field_starts.size:
        last_end = field_ends[np.where(ok, line_first + last, 0)]
        unsure = np.flatnonzero(FIELD_UNSURE[buf])
        ok &= np.searchsorted(unsure, last_end) == np.searchsorted(unsure, starts)
        padded = np.concatenate((buf, np.zeros(FIELD_DIGITS, np.uint8))).astype(np.int64)
        for field in {first, second}:
            at = np.where(ok, line_first + field, 0)
            start, length = field_starts[at], field_ends[at] - field_starts[at]
            ok &= (length >= 1) & (length <= FIELD_DIGITS)
            value = np.zeros(m, np.int64)
            for d in range(FIELD_DIGITS):
                inside = d < length
                digit = padded[start + d] - ord("0")
                ok &= ~inside | ((digit >= 0) & (digit <= 9))
                value = np.where(inside, value * 10 + digit, value)
            ok &= (value >= 1) & (value <= 0xFFFF_FFFF)
            values[field] = value
    else:
        ok[:] = False
    out_first[:m] = np.where(ok, values.get(first, 0), 0)
    out_second[:m] = np.where(ok, values.get(second, 0), 0)
    return samples, int(m - np.count_nonzero(ok))
