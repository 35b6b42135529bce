"""Sample numbers as a user gives them (a list, an array or a ``.npy`` path), checked once for every caller."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["integer_array"]


def integer_array(value: Any, name: str, *, unordered: bool = False) -> npt.NDArray[Any]:
    """``value`` as a 1-D integer array (a ``.npy`` file memory-mapped, an array as it is).

    Args:
        value: a list, tuple or range of ints (with ``unordered``, a set too), a 1-D integer array, or
            the path of a ``.npy`` file.
        name: what the value is, for messages (``"exclude"``, ``"source 'x': ids"``).
        unordered: whether a set is accepted (where order does not matter).

    Raises:
        TypeError: not one of those.
        ValueError: not 1-D integers (``1.5`` is not read as ``1``), or a ``.npy`` that cannot be read.
    """
    if isinstance(value, (str, os.PathLike)):
        try:
            array: npt.NDArray[Any] = np.load(os.fspath(value), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            hint = "" if os.fspath(value).endswith(".npy") else "; for paths of samples, use rank_dataset.ids_of"
            raise ValueError(f"{name}: the file {os.fspath(value)!r} is not a readable .npy ({exc}){hint}") from None
    elif isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (list, tuple, range)) or (unordered and isinstance(value, (set, frozenset))):
        # Without a dtype, so that floats stay floats and are refused rather than truncated.
        array = np.asarray(list(value) if isinstance(value, (set, frozenset)) else value)
        if not array.size:
            array = np.empty(0, np.int64)
    else:
        lists = "a list or set of ints" if unordered else "a list of ints"
        raise TypeError(
            f"{name} must be a 1-D integer array, {lists} or the path of a .npy file, got {type(value).__name__}"
        )
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        paths = array.dtype.kind in "US" or (array.dtype == object and any(isinstance(v, str) for v in array.flat))
        hint = (
            ": these look like paths, and it takes sample numbers; turn paths into them with "
            "rank_dataset.ids_of(meta_file, paths)"
            if paths
            else ""
        )
        raise ValueError(f"{name} must be a 1-D array of integers, got shape {array.shape} of {array.dtype}{hint}")
    return array
