"""The samples of a meta file grouped by a key (its label, or any function of its line), cached.

:func:`group_by` reads the file once: ``key="label"`` parses blocks of its bytes in numpy in two threads
(:mod:`~rank_dataset.files.group._labels`); a function of the line is called on each line. A gzip or zstd
file is grouped as its decompressed bytes, in one checked decompression; an object is read front to back
in ranged GETs pinned to its ETag. The grouping is cached beside the index and keyed like it, one process
of many building it while the others wait (:mod:`rank_dataset.files.index.cachelock`), and memory-mapped,
so that the ranks of a node share one copy (:mod:`~rank_dataset.files.group._cache`). The lines are read
through :mod:`~rank_dataset.files.group._lines`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rank_dataset.core.arrays import Int64Array, prefix_sums
from rank_dataset.core.checks import meta_path, with_storage
from rank_dataset.core.progress import progress_bar
from rank_dataset.files.group import _lines as _group_lines
from rank_dataset.files.group._cache import cache_candidates, open_cache, write_cache
from rank_dataset.files.group._labels import Grouping, Place, in_memory, label_grouping, parquet_label_grouping
from rank_dataset.files.group._lines import ParquetLines, TextLines, open_checked
from rank_dataset.files.index.cachelock import load_or_build
from rank_dataset.files.index.load import Index, load_index
from rank_dataset.files.index.scan import PathLike

__all__ = ["Grouping", "group_by", "grouping_of"]

Key = Callable[[str], Hashable]
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def group_by(
    meta_file: PathLike,
    key: str | Key = "label",
    *,
    cache_name: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[Any, np.ndarray]:
    """The sample numbers of ``meta_file`` grouped by ``key``: ``{key: ascending int64 sample numbers}``.

    Args:
        meta_file: the path of a meta file: text, gzip or zstd (read in one decompression, the
            results those of the plain file of the same lines), or Parquet (each row a sample, its
            line all its columns joined by tabs). Sample numbers are 0-based, as
            ``RankDataset(meta_file)`` numbers them (blank lines of a text file are not samples).
        key: ``"label"``, the integer after a line's last run of whitespace (what the ``"label"``
            parser returns as the label), read from the bytes in numpy; or a function of the line's
            text returning a hashable key, called once per line in Python (a progress bar on a
            terminal, in the first process of a node).
        cache_name: with a function ``key``, the name its grouping is cached under (letters, digits,
            ``_`` and ``-``; not ``"label"``); without one it is computed anew on each call. Keep a
            name for one function: a cache is matched on the file, not on the function.
        storage_options: for a meta file in object storage (its URL: ``s3://``, ``gs://``, ``az://``,
            ``https://``, read front to back in ranged GETs pinned to its ETag; the grouping cached on
            this node): obstore's settings, over the environment's.

    Returns:
        A dict in ascending key order (in order of first appearance where the keys cannot be ordered);
        each value a read-only int64 array (a view of the memory-mapped cache when cached). The values
        partition ``range(N)``.

    Raises:
        FileNotFoundError: ``meta_file`` does not exist.
        ValueError: a line has no integer label (``key="label"``; the message names the file and line),
            the file holds no sample, or ``cache_name`` is invalid.
        TypeError: ``key`` returned an unhashable value (naming the line), or a key to be cached is not
            an int, float, str, bool or None, or a tuple of those.

    Memory: about 12 bytes a sample while grouping by label (the result's 8, and 4 for each block's order until it
    is placed; the result is a map of the cache file where there is one), and nothing once cached but the shared map.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a.jpg 3\\nb.jpg 1\\nc.jpg 3\\n")
        >>> {k: v.tolist() for k, v in group_by(p).items()}
        {1: [1], 3: [0, 2]}
        >>> {k: v.tolist() for k, v in group_by(p, key=lambda line: line[0]).items()}
        {'a': [0], 'b': [1], 'c': [2]}
    """
    return grouping_of(with_storage(meta_file, storage_options), key, cache_name).as_dict()


def grouping_of(meta_file: PathLike, key: str | Key = "label", cache_name: str | None = None) -> Grouping:
    """:func:`group_by`'s grouping as one :class:`Grouping` (its groups slices of one array); an
    object's URL read through its settings (a :class:`~rank_dataset.core.checks.UrlPath`'s)."""
    if not isinstance(meta_file, (str, os.PathLike)):
        raise TypeError(f"meta_file must be a path, got {meta_file!r} ({type(meta_file).__name__})")
    if key == "label":
        if cache_name is not None:
            raise ValueError(f'cache_name is for a function key; key="label" is cached as "label", got {cache_name!r}')
        name: str | None = "label"
    elif callable(key):
        if cache_name is not None and (not isinstance(cache_name, str) or not _NAME.fullmatch(cache_name)):
            raise ValueError(f"cache_name must be 1-64 letters, digits, '_' or '-', got {cache_name!r}")
        if cache_name == "label":
            raise ValueError('cache_name "label" is the cache of key="label": choose another name')
        name = cache_name
    else:
        raise ValueError(f'key must be "label" or a function of the line returning a hashable, got {key!r}')
    path = meta_path(meta_file)
    index = load_index(path)
    if index.count == 0:
        raise ValueError(f"no samples in {path}: every line is empty or whitespace")
    return _load_or_group(path, index, key, name)


def _load_or_group(path: Path, index: Index, key: str | Key, name: str | None) -> Grouping:
    if name is None:
        return _group(path, index, key)
    built = load_or_build(
        cache_candidates(path, index, name),
        lambda cache: open_cache(cache, index),
        lambda _held, cache: write_cache(cache, index, lambda place: _group(path, index, key, place)),
    )
    return _group(path, index, key) if built is None else built  # None: no writable cache location


def _group(path: Path, index: Index, key: str | Key, place: Place = in_memory) -> Grouping:
    with open_checked(path, index) as lines:
        if key == "label":
            if isinstance(lines, ParquetLines):
                return parquet_label_grouping(lines, place)
            return label_grouping(lines, place)
        assert callable(key)
        codes, keys = _key_codes(lines, key)
    try:
        rank = sorted(range(len(keys)), key=keys.__getitem__)
    except TypeError:  # keys that cannot be ordered keep the order they first appeared in
        rank = list(range(len(keys)))
    new_code = np.empty(len(keys), np.int64)
    new_code[rank] = np.arange(len(keys))
    counts = np.bincount(new_code[codes], minlength=len(keys))
    ordered, bounds = [keys[i] for i in rank], prefix_sums(counts)
    order = place(ordered, bounds)
    _scatter(order, counts, lambda a, b: new_code[codes[a:b]])
    return Grouping(ordered, bounds, order)


def each_line(meta_file: PathLike, desc: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """Every sample of ``meta_file`` as ``(text, where)``, in order, ``where()`` giving its ``path:line``;
    a progress bar on a terminal (in the first process of a node). For functions of the line."""
    path = meta_path(meta_file)
    index = load_index(path)
    with open_checked(path, index) as lines:
        yield from _texts(lines, desc)


def _texts(lines: TextLines | ParquetLines, desc: str) -> Iterator[tuple[str, Callable[[], str]]]:
    with progress_bar(lines.index.count, f"{desc} {lines.path}", unit="lines", min_total=1 << 16) as bar:
        for block in lines.text_blocks():
            yield from block
            bar.update(len(block))


def _key_codes(lines: TextLines | ParquetLines, key: Key) -> tuple[Int64Array, list[Any]]:
    """For every sample, the number of its key in order of first appearance, and the keys."""
    codes = np.empty(lines.index.count, np.int64)
    number: dict[Any, int] = {}
    keys: list[Any] = []
    for i, (text, where) in enumerate(_texts(lines, "grouping")):
        value = key(text)
        try:
            code = number.get(value)
        except TypeError:
            raise TypeError(f"{where()}: key returned {value!r} ({type(value).__name__}), not hashable") from None
        if code is None:
            code = number[value] = len(keys)
            keys.append(value)
        codes[i] = code
    return codes, keys


def _scatter(
    order: Int64Array,
    counts: Int64Array,
    codes_of: Callable[[int, int], Int64Array],
) -> None:
    """Place the sample numbers ``0..n-1`` in ``order``, grouped by code (``codes_of(a, b)``: the codes
    of samples ``a..b-1``), ascending within each group: a stable counting sort, a block at a time,
    so that only the result is N-sized."""
    n = order.size
    cursor = prefix_sums(counts)[:-1]
    # A stable sort of 16-bit codes is a radix sort, several times faster than one of wider ints.
    narrow = np.uint16 if counts.size <= 1 << 16 else np.int64
    for a in range(0, n, _group_lines.BLOCK):
        codes = codes_of(a, min(a + _group_lines.BLOCK, n))
        perm = np.argsort(codes.astype(narrow), kind="stable")
        sorted_codes = codes[perm]
        head = np.flatnonzero(np.diff(sorted_codes, prepend=-1))  # the first of each run of one code
        run_start = np.repeat(head, np.diff(np.append(head, codes.size)))
        order[cursor[sorted_codes] + np.arange(codes.size) - run_start] = perm + a
        cursor[sorted_codes[head]] += np.diff(np.append(head, codes.size))
