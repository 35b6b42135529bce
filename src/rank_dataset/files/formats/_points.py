"""Checkpoints of a compressed file as an ``(n, 2)`` array of ``(output offset, input offset)`` rows,
increasing from ``(0, 0)``."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["row_at"]


def row_at(points: npt.NDArray[np.int64], offset: int) -> int:
    """The row of the last checkpoint at or before output ``offset`` (row 0 is output 0)."""
    return max(int(np.searchsorted(points[:, 0], offset, side="right")) - 1, 0)
