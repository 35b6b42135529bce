"""A keyed pseudo-random permutation of ``[0, n)`` that can be evaluated at any positions.

The permutation is fixed by ``(n, seed, epoch)`` alone. Evaluating it at ``k`` positions costs
O(k) time and memory, whatever ``n`` is, so no rank ever holds an ``n``-sized array.

Construction: a position ``x`` is written as a pair ``(hi, lo) = divmod(x, cols)`` on a grid of
``rows * cols >= n`` cells, ``cols`` a power of two and both sides near ``sqrt(n)``. Each of six
rounds adds a keyed 32-bit hash of one coordinate to the other, modulo its size (a mixed-radix
Feistel network, Black and Rogaway 2002), which is a bijection of the grid. Cells ``>= n`` are
walked again until they land in ``[0, n)`` (cycle walking); as the grid exceeds ``n`` by less than
``2 * sqrt(n) + 1`` cells, the walk almost never takes a second step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.checks import MAX_EXACT
from rank_dataset.core.threads import HELPED_ITEMS, THREADS, in_threads

__all__ = [
    "grid_each",
    "hash_keys",
    "permute",
    "permute_keyed",
    "permute_stream",
    "round_keys_each",
    "splitmix64",
    "splitmix64_array",
]

_ROUNDS = 6
_FEW_PASSES = 8  # up to this many passes in one request, group positions by masks, not a sort
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_SLICE = 1 << 17  # positions permuted at a time


def splitmix64(x: int) -> int:
    """One step of splitmix64 on a Python int, for deriving round keys."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def hash_keys(*values: int) -> int:
    """A 64-bit keyed hash of the ints ``values`` in order (splitmix64 chained, as the round keys are
    derived): the same anywhere for the same values.

    Examples:
        >>> hash_keys(1, 2, 3) == hash_keys(1, 2, 3) != hash_keys(1, 2, 4)
        True
    """
    state = 0
    for value in values:
        state = splitmix64(state ^ (int(value) & _MASK64))
    return state


def _round_keys(seed: int, epoch: int) -> list[int]:
    state = splitmix64(splitmix64(seed & _MASK64) ^ (epoch & _MASK64))
    keys = []
    for _ in range(_ROUNDS):
        state = splitmix64(state)
        keys.append(state >> 32)
    return keys


def _grid(n: int) -> tuple[int, int]:
    """``(rows, col_bits)``: a grid of ``rows * 2**col_bits >= n`` cells, both sides near sqrt(n)."""
    col_bits = max(0, (n - 1).bit_length() + 1) // 2
    rows = -(-n // (1 << col_bits))
    return rows, col_bits


def permute(n: int, seed: int, epoch: int, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Return ``P[positions]`` for the permutation ``P`` of ``[0, n)`` fixed by ``(seed, epoch)``.

    Args:
        n: size of the permuted range, at least 1 (at most 2**62).
        seed: any integer; with ``epoch`` it selects the permutation.
        epoch: any integer.
        positions: integers in ``[0, n)``, of any shape.

    Returns:
        An int64 array of the same shape: the sample number at each position.

    Examples:
        >>> p = permute(10, seed=0, epoch=0, positions=range(10))
        >>> sorted(p.tolist()) == list(range(10))
        True
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= MAX_EXACT:
        raise ValueError(f"n must be in [1, 2**62], got {n}")
    pos = np.asarray(positions)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        bad = int(pos.min()) if int(pos.min()) < 0 else int(pos.max())
        raise ValueError(f"position {bad} is outside [0, {n})")
    if n == 1 or pos.size == 0:
        return np.zeros(pos.shape, np.int64)
    rows, col_bits = _grid(int(n))
    keys = _round_keys(int(seed), int(epoch))
    flat = pos.reshape(-1)
    out = np.empty(flat.size, np.int64)
    slices = range(0, flat.size, _SLICE)

    # A slice at a time: its temporaries stay in the CPU cache and small, so a rank's plan costs its
    # output and little more. Part t of k takes every k-th slice.
    def work(part: tuple[int, int]) -> None:
        for lo in slices[part[0] :: part[1]]:
            out[lo : lo + _SLICE] = native.permute_cells(n, rows, col_bits, keys, flat[lo : lo + _SLICE])

    in_threads(work, THREADS if flat.size >= HELPED_ITEMS else 1)  # fewer: one thread (see HELPED_ITEMS)
    return out.reshape(pos.shape)


def permute_stream(
    n: int, seed: int, start: int, offsets: npt.ArrayLike, stop: int | None = None
) -> npt.NDArray[np.int64]:
    """The samples at positions ``start + offsets`` of the endless stream of passes over ``[0, n)``.

    Pass ``j`` of the stream is the permutation ``permute(n, seed, j, .)``, so stream position ``t``
    holds ``permute(n, seed, t // n, t % n)``: no sample repeats before all ``n`` have appeared, and
    the first ``t`` positions hold each sample ``floor`` or ``ceil`` of ``t / n`` times. Costs
    O(len(offsets)) whatever ``start`` is.

    Args:
        n: the number of samples, at least 1 (at most 2**62).
        seed: any integer; the key of the stream.
        start: an int >= 0, the stream position of offset 0 (any size: a Python int).
        offsets: ints >= 0 (below 2**62), of any shape.
        stop: if given, a bound the caller knows: every offset is in ``[0, stop)`` (not checked; it
            spares two passes over ``offsets``, as a plan asks for slots of a known range).

    Example:
        >>> permute_stream(5, 0, 3, [0, 1, 2]).tolist() == [*permute(5, 0, 0, [3, 4]), *permute(5, 0, 1, [0])]
        True
    """
    first_pass, head = divmod(int(start), n)
    t = np.asarray(offsets, dtype=np.int64)
    if not t.size:
        return np.zeros(t.shape, np.int64)
    if stop is None:
        if int(t.min()) < 0:
            raise ValueError(f"stream offsets must be >= 0, got {int(t.min())}")
        low, high = (int(t.min()) + head) // n, (int(t.max()) + head) // n
    else:
        low, high = head // n, (head + max(stop, 1) - 1) // n
    if head:
        t = t + head
    if low == high:
        return permute(n, seed, first_pass + low, t - low * n if low else t)
    out = np.empty_like(t)
    if high - low < _FEW_PASSES:  # a few passes: one mask each, cheaper than a sort
        for j in range(low, high + 1):
            mask = (t >= j * n) & (t < (j + 1) * n)
            out[mask] = permute(n, seed, first_pass + j, t[mask] - j * n)
        return out
    passes, within = np.divmod(t.reshape(-1), n)
    order = np.argsort(passes, kind="stable")
    cuts = np.flatnonzero(np.diff(passes[order])) + 1
    flat = out.reshape(-1)
    for group in np.split(order, cuts):
        flat[group] = permute(n, seed, first_pass + int(passes[group[0]]), within[group])
    return out


def splitmix64_array(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """:func:`splitmix64` of each element (uint64 arithmetic wraps as the Python version masks)."""
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return out


def round_keys_each(seed: npt.NDArray[np.uint64], epoch: npt.NDArray[np.int64]) -> list[npt.NDArray[np.uint32]]:
    """The round keys of ``(seed[i], epoch[i])`` for every ``i`` (as :func:`_round_keys`), one array a round."""
    with np.errstate(over="ignore"):
        state = splitmix64_array(splitmix64_array(seed.astype(np.uint64)) ^ epoch.astype(np.int64).view(np.uint64))
        keys = []
        for _ in range(_ROUNDS):
            state = splitmix64_array(state)
            keys.append((state >> np.uint64(32)).astype(np.uint32))
    return keys


def grid_each(n: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(rows, col_bits)`` of :func:`_grid` for every ``n[i]``."""
    n = np.asarray(n, np.int64)
    below = np.maximum(n - 1, 0)
    bit_length = np.where(below > 0, np.frexp(below.astype(np.float64))[1], 0).astype(np.int64)
    # float64 rounds n - 1 >= 2**53 up to a power of two at most: correct the exponent where it did.
    over = (bit_length > 53) & ((np.int64(1) << np.minimum(bit_length - 1, 62)) > below)
    bit_length -= over
    col_bits = (bit_length + 1) // 2
    return -(-n // (np.int64(1) << col_bits)), col_bits


def permute_keyed(
    n: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    col_bits: npt.NDArray[np.int64],
    keys: list[npt.NDArray[np.uint32]],
    positions: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """``permute(n[i], seed[i], epoch[i], positions[i])`` for every ``i`` at once (1-D arrays of one length), each
    element's grid (:func:`grid_each`) and round keys (:func:`round_keys_each` of its seed and epoch) given: many
    small permutations (the sources of a large mix) in a fixed number of numpy passes. Arguments are not checked."""
    out = np.empty(n.shape, np.int64)
    todo = np.arange(n.size)
    cells = positions.astype(np.int64)
    while todo.size:
        first = todo.size == n.size
        cb = col_bits if first else col_bits[todo]
        r = (rows if first else rows[todo]).astype(np.uint32)
        hi = (cells >> cb).astype(np.uint32)
        lo = (cells & ((np.int64(1) << cb) - 1)).astype(np.uint32)
        col_mask = ((np.int64(1) << cb) - 1).astype(np.uint32)
        with np.errstate(over="ignore"):
            for i, all_keys in enumerate(keys):
                key = all_keys if first else all_keys[todo]
                if i % 2 == 0:
                    lo += native.mix32(hi, key)  # type: ignore[arg-type]
                    lo &= col_mask
                else:
                    h = native.mix32(lo, key)  # type: ignore[arg-type]
                    h %= r
                    hi += h
                    np.minimum(hi, hi - r, out=hi)
        cells = (hi.astype(np.int64) << cb) | lo
        inside = cells < n[todo]
        out[todo[inside]] = cells[inside]
        todo, cells = todo[~inside], cells[~inside]
    return out
