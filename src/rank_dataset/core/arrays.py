"""Parts laid back to back, as numpy arrays: where each part starts, and the numbers each part covers;
and the array types the signatures name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Int64Array", "IntegerArray", "UInt8Array", "UInt32Array", "UInt64Array", "prefix_sums", "ranges"]

#: The array types most signatures name: where they need another dtype, ``numpy.typing`` is imported.
Int64Array = npt.NDArray[np.int64]
UInt8Array = npt.NDArray[np.uint8]
UInt32Array = npt.NDArray[np.uint32]
UInt64Array = npt.NDArray[np.uint64]
IntegerArray = npt.NDArray[np.integer[Any]]  # of any integer dtype


def prefix_sums(sizes: Sequence[int] | IntegerArray) -> Int64Array:
    """``[0, sizes[0], sizes[0] + sizes[1], ...]`` (int64): where each part starts, back to back, then their end.

    Examples:
        >>> prefix_sums([2, 0, 3]).tolist()
        [0, 2, 2, 5]
    """
    out = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(np.asarray(sizes, np.int64), out=out[1:])
    return out


def ranges(starts: int | Int64Array, counts: Int64Array) -> Int64Array:
    """The runs ``[starts[i], starts[i] + counts[i])`` one after the other (int64), without a loop.

    Examples:
        >>> ranges(np.array([5, 0]), np.array([2, 3])).tolist(), ranges(0, np.array([2, 1])).tolist()
        ([5, 6, 0, 1, 2], [0, 1, 0])
    """
    ends = prefix_sums(counts)
    out: Int64Array = np.repeat(np.asarray(starts, np.int64) - ends[:-1], counts)
    out += np.arange(int(ends[-1]), dtype=np.int64)
    return out
