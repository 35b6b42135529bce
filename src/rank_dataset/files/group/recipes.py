"""Uneven sampling recipes as plain lists of :class:`~rank_dataset.plan.sources.Source`: class-balanced
(:func:`class_balanced`) and repeat-factor (:func:`repeat_factor`) sampling.

Each returns one source per class, or per distinct repeat factor, over a subset of one meta file, so
the recipe mixes with other sources and keeps everything a mix guarantees: exact per-source counts
each epoch, every sample of a source used before any repeats, the same epoch on any world size, and
exact resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import Int64Array
from rank_dataset.core.checks import meta_path, with_storage
from rank_dataset.core.parsers import Parser
from rank_dataset.files.group.grouping import Key, each_line, grouping_of
from rank_dataset.files.index.load import load_index
from rank_dataset.files.index.scan import PathLike
from rank_dataset.plan.balance import check_factors, class_weights, factor_groups, lvis_factors
from rank_dataset.plan.sources import Source
from rank_dataset.plan.subsets import SampleIds

__all__ = ["class_balanced", "repeat_factor"]


def _trusted(ids: Int64Array, name: str) -> SampleIds:
    """Ids this library made (distinct, in range): not checked again by every rank."""
    sample_ids = SampleIds.of(ids, name)
    sample_ids.checked = True
    return sample_ids


def class_balanced(
    meta_file: PathLike,
    key: str | Key = "label",
    power: float = 0.0,
    *,
    cache_name: str | None = None,
    parser: str | Parser | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Source]:
    """One source per class of ``meta_file``, weighted ``n_c ** power``: class-balanced sampling.

    ``power=0`` draws every class equally often, ``0.5`` is square-root sampling, ``1`` the natural
    frequencies. With the default epoch size, an epoch reads as many samples as the file holds (a
    weighted mix's default); set ``reload_cfg["epoch_size"]`` for another. A class smaller than its
    share is repeated, a larger one is sampled without replacement across epochs (every sample once
    before any twice).

    Args:
        meta_file: the meta file.
        key, cache_name: how samples are grouped into classes (see :func:`~rank_dataset.files.group.grouping.group_by`).
        power: a finite number.
        parser: the sources' parser (None: the dataset's).
        storage_options: for a meta file in object storage, obstore's settings (as ``group_by``),
            which its sources carry.

    Returns:
        The sources in ascending key order, named ``"<file name>[<key>]"``; their ids are views of the
        cached grouping (memory-mapped, shared by the ranks of a node).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"img{i}.jpg {int(i >= 8)}\\n" for i in range(10)))
        >>> [(s.name, len(s.ids), round(s.weight, 3)) for s in class_balanced(p, power=0.5)]
        [('meta.txt[0]', 8, 1.0), ('meta.txt[1]', 2, 0.5)]
    """
    meta_file = with_storage(meta_file, storage_options)
    grouping = grouping_of(meta_file, key, cache_name)
    grouping.order.flags.writeable = False
    bounds = grouping.bounds.tolist()
    weights = class_weights(np.diff(grouping.bounds), power)
    base = os.path.basename(os.fspath(meta_file))
    sources = []
    for k, a, b, w in zip(grouping.keys, bounds, bounds[1:], weights.tolist()):
        # Slices of the grouping's array (its cache's map): made here, not found back from views.
        ids = SampleIds(grouping.order, a, b, checked=True)
        sources.append(Source(meta_file, ids=ids, weight=w, parser=parser, name=f"{base}[{k}]"))
    return sources


def repeat_factor(
    meta_file: PathLike,
    factors: npt.ArrayLike | PathLike | None = None,
    *,
    categories: Callable[[str], Iterable[Hashable]] | None = None,
    threshold: float | None = None,
    parser: str | Parser | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Source]:
    """Repeat-factor sampling: sample ``i`` read about ``r_i`` times an epoch.

    The factors are rounded to multiples of 1/16 (:data:`~rank_dataset.plan.balance.FACTOR_GRID`; at least
    1/16) and the samples grouped by factor, each group a source with ``repeat=r``: every epoch takes
    ``round(r * n)`` samples of a group of ``n``, and from epoch 0 to any epoch each sample has been
    read ``floor`` or ``ceil`` of ``epochs * r`` times (an integer factor: exactly ``r`` times every
    epoch). The epoch is ``sum(round(r * n))`` samples.

    Give either ``factors`` (one ``r_i > 0`` per sample: an array, or the path of a ``.npy`` file), or
    ``categories`` and ``threshold`` for LVIS's rule ``r_i = max(1, max over categories c of sample i of
    sqrt(t / f_c))``, ``f_c`` being the fraction of samples containing ``c`` (``categories(line)``
    returns the category ids of a line; evaluated once per line in Python).

    ``storage_options``: for a meta file in object storage, obstore's settings (as ``group_by``).

    Returns:
        One source per distinct rounded factor, ascending, named ``"<file name>[r=<factor>]"``.

    Raises:
        ValueError: ``factors`` not one finite number > 0 per sample (naming the first bad one), or
            not exactly one of ``factors`` and ``categories`` (with ``threshold``).

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"img{i}.jpg {i}\\n" for i in range(4)))
        >>> [(s.name, s.repeat, len(s.ids)) for s in repeat_factor(p, [1, 2, 1, 2.5])]
        [('meta.txt[r=1]', 1.0, 2), ('meta.txt[r=2]', 2.0, 1), ('meta.txt[r=2.5]', 2.5, 1)]
    """
    if (factors is None) == (categories is None):
        raise ValueError("give either factors (one per sample) or categories with threshold")
    meta_file = with_storage(meta_file, storage_options)
    if categories is not None:
        if threshold is None:
            raise ValueError("categories needs threshold: LVIS's t, a fraction of the samples in (0, 1]")
        if not callable(categories):
            raise TypeError(f"categories must be a function of the line, got {categories!r}")
        per_sample = (categories(text) for text, _ in each_line(meta_file, "categories of"))
        r = lvis_factors(per_sample, threshold)
    else:
        if threshold is not None:
            raise ValueError("threshold goes with categories; factors are used as given")
        r = check_factors(_load_factors(factors), _count(meta_file))
    base = os.path.basename(os.fspath(meta_file))
    sources = []
    for factor, ids in factor_groups(r).items():
        name = f"{base}[r={factor:g}]"
        sources.append(Source(meta_file, ids=_trusted(ids, name), repeat=factor, parser=parser, name=name))
    return sources


def _load_factors(factors: Any) -> Any:
    if isinstance(factors, (str, os.PathLike)):
        try:
            return np.load(os.fspath(factors), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"factors file {os.fspath(factors)!r} is not a readable .npy ({exc})") from None
    return factors


def _count(meta_file: PathLike) -> int:
    path = meta_path(meta_file)
    return load_index(path).count
