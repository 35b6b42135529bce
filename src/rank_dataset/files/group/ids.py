"""Sample numbers of keys: a blocklist of paths into ``exclude=``.

:func:`ids_of` groups the meta file by a key of each line (by default its first field, e.g. the image
path) once, through :func:`~rank_dataset.files.group.grouping.grouping_of` and its cache (so the second call,
and every rank of a node, reads the cached grouping), and looks the keys up in it.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Literal

import numpy as np

from rank_dataset.core.arrays import Int64Array
from rank_dataset.core.checks import with_storage
from rank_dataset.files.group.grouping import Key, grouping_of
from rank_dataset.files.index.scan import PathLike

__all__ = ["first_field", "ids_of"]

_NAMED = 5  # keys not found that a message names


def first_field(line: str) -> str:
    """The line's first whitespace-separated field (``"a/b.jpg 3"`` -> ``"a/b.jpg"``): ids_of's default key."""
    head = line.split(maxsplit=1)
    return head[0] if head else ""


def ids_of(
    meta_file: PathLike,
    keys: Iterable[Hashable],
    key: Key | None = None,
    *,
    cache_name: str | None = None,
    missing: Literal["raise", "warn", "ignore"] = "raise",
    storage_options: Mapping[str, Any] | None = None,
) -> Int64Array:
    """The sample numbers of ``meta_file`` whose line has one of ``keys``: ascending, distinct, int64.

    A blocklist of paths becomes ``RankDataset(meta_file, exclude=ids_of(meta_file, bad_paths))``.

    Args:
        meta_file: the path of a meta file (samples numbered as ``RankDataset(meta_file)`` numbers them).
        keys: the keys to look up (e.g. paths); a key that several lines have gives all of them.
        key: a function of the line's text giving its key; default :func:`first_field`.
        cache_name: the name the grouping by ``key`` is cached under (as for ``group_by``); the default
            key is cached as ``"first_field"``; a function without a name is grouped anew on each call.
        missing: what keys that no line has do: ``"raise"`` (a KeyError naming the first few),
            ``"warn"`` (a UserWarning naming them) or ``"ignore"``.
        storage_options: for a meta file in object storage, obstore's settings (as ``group_by``).

    Memory: the grouping's keys are held while looking up (one Python object a distinct key); the sample
    numbers are a map of the cache file.

    Raises:
        KeyError: with ``missing="raise"``, keys that no line has (the message names the first few).
        ValueError: as ``group_by``; ``missing`` not one of its values.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a.jpg 3\\nb.jpg 1\\nc.jpg 3\\n")
        >>> ids_of(p, ["c.jpg", "a.jpg"]).tolist()
        [0, 2]
    """
    if missing not in ("raise", "warn", "ignore"):
        raise ValueError(f"missing must be 'raise', 'warn' or 'ignore', got {missing!r}")
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"keys must be a list of keys, got the single {type(keys).__name__} {keys!r}: wrap it in a list"
        )
    if key is None:
        if cache_name is not None:
            raise ValueError(
                f"the default key is cached as 'first_field': give cache_name only with key=, got {cache_name!r}"
            )
        key, cache_name = first_field, "first_field"
    grouping = grouping_of(with_storage(meta_file, storage_options), key, cache_name)
    found = _lookup(grouping.keys, list(dict.fromkeys(keys)))
    bounds = grouping.bounds
    parts = [np.asarray(grouping.order[bounds[g] : bounds[g + 1]], np.int64) for g in found.values() if g >= 0]
    absent = [k for k, g in found.items() if g < 0]
    if absent and missing != "ignore":
        named = ", ".join(repr(k) for k in absent[:_NAMED]) + (
            f" and {len(absent) - _NAMED} more" if len(absent) > _NAMED else ""
        )
        message = f"{len(absent)} of {len(found)} keys are in no line of {meta_file}: {named}"
        if missing == "raise":
            raise KeyError(f"{message} (missing='warn' or 'ignore' to go on without them)")
        warnings.warn(message, UserWarning, stacklevel=2)
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def _lookup(table: list[Any], wanted: list[Any]) -> dict[Any, int]:
    """The group number of each wanted key in ``table`` (-1: absent): by binary search in a table in
    ascending order (as a grouping of orderable keys is), else through a dict."""
    found: dict[Any, int] = {}
    try:
        for k in wanted:
            g = bisect.bisect_left(table, k)
            found[k] = g if g < len(table) and table[g] == k else -1
        return found
    except TypeError:  # keys that cannot be ordered: in order of first appearance
        number = {k: g for g, k in enumerate(table)}
        return {k: number.get(k, -1) for k in wanted}
