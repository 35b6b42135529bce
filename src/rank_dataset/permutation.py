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

from rank_dataset._checks import MAX_EXACT

__all__ = ["permute"]

_ROUNDS = 6
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FMIX1 = np.uint32(0x85EBCA6B)
_FMIX2 = np.uint32(0xC2B2AE35)
_S16, _S13 = np.uint32(16), np.uint32(13)


def _splitmix64(x: int) -> int:
    """One step of splitmix64 on a Python int, for deriving round keys."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _round_keys(seed: int, epoch: int) -> list[np.uint32]:
    state = _splitmix64(_splitmix64(seed & _MASK64) ^ (epoch & _MASK64))
    keys = []
    for _ in range(_ROUNDS):
        state = _splitmix64(state)
        keys.append(np.uint32(state >> 32))
    return keys


def _grid(n: int) -> tuple[int, int]:
    """``(rows, col_bits)``: a grid of ``rows * 2**col_bits >= n`` cells, both sides near sqrt(n)."""
    col_bits = max(0, (n - 1).bit_length() + 1) // 2
    rows = -(-n // (1 << col_bits))
    return rows, col_bits


def _hash(x: npt.NDArray[np.uint32], key: np.uint32) -> npt.NDArray[np.uint32]:
    """A keyed 32-bit mix of ``x`` (murmur3's finaliser); all arithmetic wraps modulo 2**32."""
    h = x ^ key
    h ^= h >> _S16
    h *= _FMIX1
    h ^= h >> _S13
    h *= _FMIX2
    h ^= h >> _S16
    return h


def _feistel(
    hi: npt.NDArray[np.uint32], lo: npt.NDArray[np.uint32], keys: list[np.uint32], rows: int, col_bits: int
) -> None:
    """Apply the rounds in place to the grid coordinates ``hi`` in [0, rows) and ``lo`` in [0, 2**col_bits)."""
    col_mask = np.uint32((1 << col_bits) - 1)
    r = np.uint32(rows)
    for i, key in enumerate(keys):
        if i % 2 == 0:
            lo += _hash(hi, key)
            lo &= col_mask
        else:
            h = _hash(lo, key)
            h %= r
            hi += h
            # hi + h < 2 * rows: subtracting rows where it wraps is the cheap modulo.
            np.minimum(hi, hi - r, out=hi)


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
            return out.reshape(pos.shape)
        # Walk the cells that fell outside [0, n) again until they land inside.
        hi = (out[todo] >> col_bits).astype(np.uint32)
        lo = (out[todo] & ((1 << col_bits) - 1)).astype(np.uint32)
