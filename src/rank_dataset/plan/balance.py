"""Class-balanced and repeat-factor sampling as plain numbers: weights per class, repeat factors per
sample, and the groups of samples that share a factor.

A mix expresses both recipes exactly: class-balanced sampling is one source per class weighted
``n_c ** power``; repeat-factor sampling is one source per distinct factor ``r`` with ``repeat=r``.
So that the second stays a handful of sources, factors are first rounded to a grid
(:data:`FACTOR_GRID`): multiples of 1/16, at least 1/16. Integer factors are on the grid, so a sample
with ``r = 3`` is read exactly three times every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FACTOR_GRID", "check_factors", "class_weights", "factor_groups", "lvis_factors", "round_factors"]

#: Repeat factors are rounded to multiples of ``1 / FACTOR_GRID`` (halves to even), at least that much.
FACTOR_GRID = 16


def class_weights(counts: npt.ArrayLike, power: float) -> npt.NDArray[np.float64]:
    """``n_c ** power`` for each class's sample count ``n_c``: the weight of its source in a balanced mix.

    ``power=0`` draws every class equally often, ``0.5`` is square-root sampling, ``1`` the natural
    frequencies. Weights are scaled so the largest is 1 (only their ratios matter).

    Raises:
        ValueError: a count below 1, or ``power`` not a finite number.

    Examples:
        >>> class_weights([100, 25, 4], 0.5).round(6).tolist()
        [1.0, 0.5, 0.2]
    """
    n = np.asarray(counts)
    if n.ndim != 1 or not n.size or not np.issubdtype(n.dtype, np.integer):
        raise ValueError(f"counts must be a non-empty 1-D array of ints, got {counts!r}")
    if int(n.min()) < 1:
        raise ValueError(f"every class count must be >= 1, got {int(n.min())}")
    if isinstance(power, bool) or not isinstance(power, (int, float, np.integer, np.floating)):
        raise TypeError(f"power must be a number, got {power!r}")
    if not math.isfinite(power):
        raise ValueError(f"power must be a finite number, got {power!r}")
    # In logs, relative to the largest: a large power over a wide range of counts does not overflow.
    logs = float(power) * np.log(n.astype(np.float64))
    weights: npt.NDArray[np.float64] = np.exp(logs - logs.max())
    return weights


def check_factors(factors: npt.ArrayLike, n: int | None = None, *, name: str = "factors") -> npt.NDArray[np.float64]:
    """``factors`` as a 1-D float64 array of finite numbers > 0 (of length ``n`` if given), else ValueError."""
    r = np.asarray(factors)
    if r.ndim != 1 or not (np.issubdtype(r.dtype, np.integer) or np.issubdtype(r.dtype, np.floating)):
        raise ValueError(f"{name} must be a 1-D array of numbers, got shape {r.shape} of {r.dtype}")
    if n is not None and r.size != n:
        raise ValueError(f"{name} must hold one factor per sample: {n}, got {r.size}")
    r = r.astype(np.float64)
    bad = np.flatnonzero(~(np.isfinite(r) & (r > 0)))
    if bad.size:
        raise ValueError(f"{name} must be finite and > 0, got {float(r[bad[0]])!r} for sample {int(bad[0])}")
    return r


def round_factors(factors: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Each factor rounded to the nearest multiple of ``1/16`` (halves to even), at least ``1/16``.

    Examples:
        >>> round_factors([1, 1.03, 1.04, 2.5, 0.01]).tolist()
        [1.0, 1.0, 1.0625, 2.5, 0.0625]
    """
    r = check_factors(factors)
    return np.maximum(np.round(r * FACTOR_GRID), 1) / FACTOR_GRID


def factor_groups(factors: npt.ArrayLike) -> dict[float, npt.NDArray[np.int64]]:
    """The samples grouped by their rounded factor (:func:`round_factors`): ``{factor: ascending
    sample numbers}``, factors ascending.

    Examples:
        >>> {r: ids.tolist() for r, ids in factor_groups([1, 3, 1.02, 2.99]).items()}
        {1.0: [0, 2], 3.0: [1, 3]}
    """
    steps = (round_factors(factors) * FACTOR_GRID).astype(np.int64)  # exact: FACTOR_GRID is a power of two
    order = np.argsort(steps, kind="stable")
    sorted_steps = steps[order]
    cuts = np.flatnonzero(np.diff(sorted_steps)) + 1
    return {
        float(sorted_steps[a]) / FACTOR_GRID: order[a:b]
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), steps.size])
    }


def lvis_factors(categories: Iterable[Iterable[Hashable]], threshold: float) -> npt.NDArray[np.float64]:
    """LVIS's repeat factors: ``r_i = max(1, max over categories c of sample i of sqrt(t / f_c))``,
    ``f_c`` being the fraction of samples that contain ``c`` (a sample without categories: 1).

    Args:
        categories: for each sample, the ids of the categories it contains (repeats count once).
        threshold: ``t``, a number in (0, 1]: categories in fewer than this fraction of the samples
            are repeated.

    Examples:
        >>> lvis_factors([["cat"], ["cat", "dog"], ["cat"], []], threshold=0.5).round(3).tolist()
        [1.0, 1.414, 1.0, 1.0]
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise TypeError(f"threshold must be a number, got {threshold!r}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    number: dict[Any, int] = {}
    flat: list[int] = []
    bounds = [0]
    for cats in categories:
        for c in set(cats):
            flat.append(number.setdefault(c, len(number)))
        bounds.append(len(flat))
    n = len(bounds) - 1
    if not n:
        raise ValueError("categories is empty: give the categories of each sample")
    codes = np.asarray(flat, np.int64)
    frequency = np.bincount(codes, minlength=len(number)) / n
    per_category = np.maximum(1.0, np.sqrt(threshold / np.maximum(frequency, 1e-300)))
    factors = np.ones(n, np.float64)
    starts = np.asarray(bounds[:-1], np.int64)
    has = np.flatnonzero(np.diff(bounds))
    if has.size:
        factors[has] = np.maximum.reduceat(per_category[codes], starts[has])
    return factors
