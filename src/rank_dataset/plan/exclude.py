"""Sample numbers left out: the complement of a subset (``exclude=``), without materialising what is kept.

An :class:`Exclusion` is a sorted array of distinct sample numbers to leave out (memory: 8 bytes each).
:class:`KeptIds` is what remains of a listing (all ``n`` samples of a source's files, or its listed
ids) once they are left out: position ``k`` of what is kept maps to the ``k``-th position not left
out by a binary search over the excluded positions (``select``), in O(log m) per position, so a
plan over ``n - m`` kept samples costs O(m) memory plus its own positions, never O(n).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.plan._arrays import integer_array
from rank_dataset.plan.subsets import SampleIds

__all__ = ["Exclusion", "KeptIds", "listing_of", "split_exclusion"]

_BLOCK = 1 << 20  # listed ids scanned at a time


class Exclusion:
    """Distinct sample numbers to leave out, sorted (``values``, a read-only int64 array).

    Build one with :meth:`of` from what a user gives: an array or list of ints, or the path of a
    ``.npy`` file (read once, a block at a time). Duplicates are allowed and dropped.
    """

    def __init__(self, values: npt.NDArray[np.int64]) -> None:
        values.flags.writeable = False
        self.values = values
        self._fingerprint: str | None = None

    @classmethod
    def of(cls, value: Any, what: str) -> Exclusion:
        """``value`` (ints, a 1-D integer array, a ``.npy`` path, or an Exclusion) as an Exclusion.

        Raises:
            TypeError: naming ``what``: not ints, an array or a path.
            ValueError: naming ``what``: not 1-D integers, a negative number, or an unreadable ``.npy``.
        """
        if isinstance(value, Exclusion):
            return value
        array = integer_array(value, what, unordered=True)
        parts = [np.unique(np.asarray(array[a : a + _BLOCK], np.int64)) for a in range(0, array.size, _BLOCK)]
        values = np.unique(np.concatenate(parts)) if len(parts) > 1 else parts[0] if parts else np.empty(0, np.int64)
        if values.size and int(values[0]) < 0:
            raise ValueError(f"{what} holds {int(values[0])}, a negative sample number")
        return cls(values)

    def __len__(self) -> int:
        return int(self.values.size)

    def __repr__(self) -> str:
        return f"Exclusion(n={len(self)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Exclusion) and np.array_equal(self.values, other.values)

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def union(self, other: Exclusion | npt.ArrayLike | None) -> Exclusion:
        """This exclusion and ``other``'s values together."""
        if other is None:
            return self
        more = other.values if isinstance(other, Exclusion) else np.asarray(other, np.int64).reshape(-1)
        if not more.size or np.isin(more, self.values, assume_unique=False).all():
            return self
        return Exclusion(np.union1d(self.values, more).astype(np.int64))

    @property
    def fingerprint(self) -> str:
        """A hash of the values: equal for the same set anywhere."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256(b"exclude" + self.values.astype("<i8").tobytes()).hexdigest()[:32]
        return self._fingerprint

    def check(self, num_samples: int, what: str) -> None:
        """Raise ValueError naming ``what`` if a value is ``>= num_samples``."""
        if self.values.size and int(self.values[-1]) >= num_samples:
            raise ValueError(
                f"{what}: exclude holds {int(self.values[-1])}, past the last sample ({num_samples} samples)"
            )


class KeptIds:
    """What a listing keeps once an :class:`Exclusion` is left out: a source's (or a dataset's) samples.

    Args:
        inner: the listed ids (SampleIds), or None for every sample ``[0, n)`` of the files.
        exclusion: the sample numbers (in the same numbering as ``inner``'s values) to leave out.

    :meth:`check` (called with the files' ``n`` when they are opened, as ``SampleIds.check`` is) fixes the
    excluded positions; :meth:`take` then maps positions of what is kept to sample numbers.
    """

    def __init__(self, inner: SampleIds | None, exclusion: Exclusion) -> None:
        self.inner, self.exclusion = inner, exclusion
        self._shift: npt.NDArray[np.int64] | None = None  # excluded position j minus j: nondecreasing
        self._size = -1

    def __repr__(self) -> str:
        return f"KeptIds(inner={self.inner!r}, exclude={len(self.exclusion)})"

    def __len__(self) -> int:
        if self._size < 0:
            raise RuntimeError("KeptIds has no length before check(): its files' samples are not known yet")
        return self._size

    @property
    def fingerprint(self) -> str:
        inner = "all" if self.inner is None else self.inner.fingerprint
        return hashlib.sha256(f"kept:{inner}:{self.exclusion.fingerprint}".encode()).hexdigest()[:32]

    def check(self, num_samples: int, source: str) -> None:
        """Check against the ``num_samples`` samples of the files and fix what is kept.

        Raises:
            ValueError: naming ``source``: an excluded number past the files, ids that are not distinct
                sample numbers of them, or nothing left.
        """
        self.exclusion.check(num_samples, f"source {source!r}")
        values = self.exclusion.values
        if self.inner is None:
            positions, total = values, num_samples
        else:
            self.inner.check(num_samples, source)
            view = self.inner.view()
            hits = []
            for a in range(0, view.size, _BLOCK):
                block = np.asarray(view[a : a + _BLOCK], np.int64)
                j = np.searchsorted(values, block)
                j[j == values.size] = 0
                hit = np.flatnonzero(values[j] == block) if values.size else np.empty(0, np.int64)
                hits.append(hit + a)
            positions = np.concatenate(hits) if hits else np.empty(0, np.int64)
            total = len(self.inner)
        if positions.size >= total:
            raise ValueError(f"source {source!r}: exclude leaves none of its {total} samples")
        self._shift = positions - np.arange(positions.size, dtype=np.int64)
        self._size = total - int(positions.size)

    def select(self, k: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The listing positions of kept positions ``k`` (the ``k``-th position not left out)."""
        assert self._shift is not None, "check() first"
        k = np.asarray(k, np.int64)
        if not self._shift.size:
            return k
        return k + np.searchsorted(self._shift, k, side="right")

    def take(self, k: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The sample numbers at kept positions ``k``."""
        positions = self.select(k)
        return positions if self.inner is None else self.inner.take(positions)


def listing_of(ids: SampleIds | None, exclusion: Exclusion | None) -> SampleIds | KeptIds | None:
    """The listing of a source with these ids and exclusion (a new KeptIds if something is left out)."""
    return ids if exclusion is None or not len(exclusion) else KeptIds(ids, exclusion)


def split_exclusion(
    exclusion: Exclusion, files: Sequence[Sequence[int]], file_bounds: npt.NDArray[np.int64]
) -> list[Exclusion | None]:
    """A dataset-wide exclusion (sample numbers over the distinct files) as each source's: numbers over
    its files taken as one (None where it leaves nothing of the source out)."""
    values = exclusion.values
    counts = np.diff(file_bounds)
    out: list[Exclusion | None] = []
    for mine in files:
        parts, own = [], 0
        for f in mine:
            lo, hi = np.searchsorted(values, [file_bounds[f], file_bounds[f + 1]])
            if hi > lo:
                parts.append(values[lo:hi] - int(file_bounds[f]) + own)
            own += int(counts[f])
        out.append(Exclusion(np.unique(np.concatenate(parts))) if parts else None)
    return out
