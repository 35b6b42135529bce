"""What a rank found wrong reading its slice, told to every rank so that each raises the same error: a
status word (in the count's all-gather, and as the byte ahead of each owner's lines in every round),
then, where one is not :data:`OK`, the error's arguments from every rank (:func:`raise_reported`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.shards.collective._dist import Collectives

__all__ = ["CHANGED", "CORRUPT", "HEAD", "NOT_UTF8", "OK", "Failure", "error_of", "failure_of", "raise_reported"]

OK, CHANGED, NOT_UTF8, CORRUPT = 0, 1, 2, 3
HEAD = 1  # bytes of status ahead of each owner's lines to each rank, in every round


class Failure(Exception):
    """What a rank found wrong serving its slice: ``kind`` (a status word) and the error's arguments."""

    def __init__(self, kind: int, args: tuple[str, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.what = kind, args


def error_of(kind: int, args: Sequence[str]) -> Exception:
    """The error a failure of ``kind`` with ``args`` raises (on every rank alike)."""
    if kind == CHANGED:
        return MetaFileChangedError(args[0], args[1])
    if kind == CORRUPT:
        return CorruptMetaFileError(args[0], int(args[1]), args[2])
    return ValueError(args[0])


def failure_of(exc: Exception) -> Failure | None:
    """What a rank tells the others of an error met reading its slice (None: not one to tell)."""
    if isinstance(exc, MetaFileChangedError):
        return Failure(CHANGED, (str(exc.path), exc.what))
    if isinstance(exc, CorruptMetaFileError):
        return Failure(CORRUPT, (str(exc.path), str(exc.offset), exc.what))
    if isinstance(exc, ValueError):
        return Failure(NOT_UTF8, (str(exc),))
    return None


def raise_reported(net: Collectives, status: npt.NDArray[Any], failure: Failure | None) -> None:
    """Raise, on every rank alike, the error of the first owner whose status (``status[r]``: the word
    rank ``r`` reported, the same to every rank) says it could not serve its slice as counted (its
    lines are then never packed); ``failure``: this rank's. Nothing where every status is OK."""
    if not status.any():
        return
    mine = None if failure is None else (failure.kind, failure.what)
    gathered = net.all_gather_object(mine, "the error report")
    kind, what = next(g for g in gathered if g is not None)
    raise error_of(kind, what)
