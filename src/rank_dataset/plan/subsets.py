"""Sources over subsets of their files: the listed sample numbers (``SampleIds``), and the map from a
mix's plan numbers to the sample numbers of the distinct files of all sources (``SampleMap``).

A mix plans over its sources' positions: position ``k`` of source ``s`` has the plan number
``offset_s + k`` (:class:`~rank_dataset.plan.mix.MixPlan`). For a source over a subset, position ``k`` is
its ``k``-th listed sample; its files may be named by other sources too. The map turns plan numbers
into sample numbers over the distinct files (in order of first appearance), reading only the listed
ids at the positions asked for: ids kept in a file (a ``.npy``, or a grouping's cache) are
memory-mapped, and pickled as a reference to the file, never copied into every rank and worker.
"""

from __future__ import annotations

import functools
import hashlib
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.plan._arrays import integer_array

__all__ = ["SampleIds", "SampleMap"]

_BLOCK = 1 << 20  # ids checked or hashed at a time


class SampleIds:
    """The sample numbers a source lists: ``base[start:stop]`` of a 1-D integer array, which several
    sources may share (the groups of one grouping are slices of one memory-mapped array).

    Build one with :meth:`of` from what a user gives: an array (a view of a memory-mapped array keeps
    its file), or the path of a ``.npy`` file (memory-mapped).
    """

    def __init__(self, base: npt.NDArray[np.integer[Any]], start: int, stop: int, *, checked: bool = False) -> None:
        self.base, self.start, self.stop = base, start, stop
        self.checked = checked  # known to be distinct sample numbers in range (made by this library)
        self._fingerprint: str | None = None

    @classmethod
    def of(cls, ids: Any, source: str) -> SampleIds:
        """``ids`` (a 1-D integer array or a ``.npy`` path) as SampleIds of the source named ``source``.

        Raises:
            ValueError: naming the source: an empty list, a negative number, not 1-D integers, or a
                ``.npy`` file that cannot be read.
        """
        if isinstance(ids, SampleIds):
            return ids
        array = integer_array(ids, f"source {source!r}: ids")
        if not array.size:
            raise ValueError(f"source {source!r}: ids is empty; a source lists at least one sample")
        base, start = _root(array)
        return cls(base, start, start + array.size)

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        where = f", file={self.base.filename!r}" if isinstance(self.base, np.memmap) else ""
        return f"SampleIds(n={len(self)}{where})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SampleIds) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __reduce__(self) -> tuple[Any, ...]:
        base = self.base
        if isinstance(base, np.memmap) and base.filename is not None and base.flags.c_contiguous:
            # A reference to the file, mapped again where it is unpickled (a spawn worker, a server).
            file = (os.fspath(base.filename), int(base.offset), base.dtype.str, base.size)
            return (_from_file, (file, self.start, self.stop, self.checked))
        return (_from_array, (np.asarray(base[self.start : self.stop]), self.checked))

    def view(self) -> npt.NDArray[np.integer[Any]]:
        """The listed ids (a view: memory-mapped ones are not read)."""
        return self.base[self.start : self.stop]

    def take(self, k: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The ids at positions ``k`` (reading only those)."""
        return np.asarray(self.base[k + self.start], np.int64)

    @property
    def fingerprint(self) -> str:
        """A hash of the listed ids as int64, in order: equal for the same list anywhere."""
        if self._fingerprint is None:
            h = hashlib.sha256(b"ids")
            view = self.view()
            for a in range(0, view.size, _BLOCK):
                h.update(np.ascontiguousarray(view[a : a + _BLOCK], "<i8").data)
            self._fingerprint = h.hexdigest()[:32]
        return self._fingerprint

    def check(self, num_samples: int, source: str) -> None:
        """Raise ValueError naming ``source`` and one offending value unless the ids are distinct
        sample numbers in ``[0, num_samples)``. Reads them all once, a block at a time."""
        if self.checked:
            return
        view = self.view()
        seen = np.zeros(num_samples, bool) if len(self) * 8 >= num_samples else None
        parts = []
        for a in range(0, view.size, _BLOCK):
            block = np.asarray(view[a : a + _BLOCK], np.int64)
            low, high = int(block.min()), int(block.max())
            if low < 0:
                raise ValueError(f"source {source!r}: ids holds {low}, a negative sample number")
            if high >= num_samples:
                raise ValueError(
                    f"source {source!r}: ids holds {high}, past the last sample of its files ({num_samples} samples)"
                )
            if seen is None:
                parts.append(block)
            else:
                hit = seen[block]
                if hit.any():
                    raise ValueError(f"source {source!r}: ids lists sample {int(block[np.argmax(hit)])} twice")
                seen[block] = True
                if int(np.count_nonzero(seen)) != a + block.size:  # a repeat within the block
                    raise ValueError(f"source {source!r}: ids lists sample {_repeated(block)} twice")
        if parts:
            ordered = np.sort(np.concatenate(parts))
            same = np.flatnonzero(ordered[1:] == ordered[:-1])
            if same.size:
                raise ValueError(f"source {source!r}: ids lists sample {int(ordered[same[0]])} twice")
        self.checked = True


def _repeated(block: npt.NDArray[np.int64]) -> int:
    ordered = np.sort(block)
    return int(ordered[np.flatnonzero(ordered[1:] == ordered[:-1])[0]])


def _root(array: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], int]:
    """The 1-D array that ``array`` is a contiguous slice of (following views back to a memory map
    where there is one), and where the slice starts in it."""
    root, start = array, 0
    base = array.base
    while isinstance(base, np.ndarray):
        if base.ndim != 1 or base.dtype != array.dtype or not base.flags.c_contiguous or not array.flags.c_contiguous:
            break
        offset, extra = divmod(array.ctypes.data - base.ctypes.data, array.itemsize)
        if extra or not 0 <= offset <= base.size - array.size:
            break
        root, start = base, offset
        if isinstance(base, np.memmap):
            break
        base = base.base
    return root, start


def _from_array(array: npt.NDArray[np.integer[Any]], checked: bool) -> SampleIds:
    return SampleIds(array, 0, array.size, checked=checked)


# The maps made by unpickling, by file: the sources of one grouping share one map (and one descriptor),
# as they do where they were pickled.
_MAPS: weakref.WeakValueDictionary[tuple[str, int, str, int], np.memmap] = weakref.WeakValueDictionary()


def _from_file(file: tuple[str, int, str, int], start: int, stop: int, checked: bool) -> SampleIds:
    base = _MAPS.get(file)
    if base is None:
        path, offset, dtype, size = file
        base = _MAPS[file] = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(size,))
    return SampleIds(base, start, stop, checked=checked)


@dataclass(frozen=True)
class SampleMap:
    """From plan numbers to sample numbers over the distinct files of a mix's sources.

    Args:
        sizes: ``N_s`` of each source (its listed ids, or its files' samples).
        files: for each source, the numbers of its files among the distinct files.
        file_bounds: the cumulative sample counts of the distinct files (``F + 1`` entries).
        ids: for each source, its SampleIds, or None for all the samples of its files, or a listing
            with ``take`` (a :class:`~rank_dataset.plan.exclude.KeptIds`: what is left once some are excluded).
    """

    sizes: tuple[int, ...]
    files: tuple[tuple[int, ...], ...]
    file_bounds: npt.NDArray[np.int64]
    ids: tuple[Any, ...]

    @classmethod
    def of(
        cls,
        files: tuple[tuple[int, ...], ...],
        file_bounds: npt.NDArray[np.int64],
        ids: Sequence[Any],
        names: Sequence[str],
    ) -> SampleMap:
        """The map of sources with these files, ids and names; each source's ids are checked against
        its files' samples (ValueError naming the source and one offending value)."""
        counts = np.diff(file_bounds)
        sizes = []
        for mine, listed, name in zip(files, ids, names):
            n = int(counts[list(mine)].sum())
            if listed is not None:
                listed.check(n, name)
                n = len(listed)
            sizes.append(n)
        return cls(tuple(sizes), files, file_bounds, tuple(ids))

    @property
    def identity(self) -> bool:
        """Whether plan numbers are the sample numbers (no subsets, each file in one source, in order)."""
        flat = [f for files in self.files for f in files]
        return all(i is None for i in self.ids) and flat == list(range(len(self.file_bounds) - 1))

    @functools.cached_property
    def _slices(self) -> tuple[npt.NDArray[np.integer[Any]], int, int] | None:
        """``(base, shift, first)`` when every source lists a slice of one array, the slices in the
        sources' order and back to back (the classes of a grouping, in key order), and all of them
        samples of one file: plan number ``p`` is then sample ``base[p + shift] + first``."""
        ids = [i for i in self.ids if isinstance(i, SampleIds)]
        if not ids or len(ids) < len(self.ids) or any(i.base is not ids[0].base for i in ids):
            return None
        if any(files != self.files[0] or len(files) != 1 for files in self.files):
            return None
        plan_starts = prefix_sums(self.sizes)[:-1]
        shifts = np.array([i.start for i in ids], np.int64) - plan_starts
        if (shifts != shifts[0]).any():
            return None
        return ids[0].base, int(shifts[0]), int(self.file_bounds[self.files[0][0]])

    def samples(
        self,
        plan: npt.NDArray[np.int64],
        source_of: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.integer[Any]]],
    ) -> npt.NDArray[np.int64]:
        """The sample numbers of plan numbers ``plan`` (``source_of(plan)`` gives their sources, asked
        only where needed), in a few vectorised passes: one gather per distinct ids array (the groups
        of one grouping share one)."""
        if self.identity:
            return np.asarray(plan, np.int64)
        if self._slices is not None:
            base, shift, first = self._slices
            direct = np.asarray(base[plan + shift if shift else plan], np.int64)
            direct += first
            return direct
        src = np.asarray(source_of(plan), np.int64)
        offsets = prefix_sums(self.sizes)[:-1]
        out: npt.NDArray[np.int64] = plan - offsets[src]  # the position within the source
        for s, ids in enumerate(self.ids):
            if ids is not None and not isinstance(ids, SampleIds):  # a listing of its own (what an exclusion keeps)
                mine = np.flatnonzero(src == s)
                out[mine] = ids.take(out[mine])
        bases: dict[int, int] = {}
        base_of = np.full(len(self.sizes), -1, np.int64)
        start_of = np.zeros(len(self.sizes), np.int64)
        arrays: list[npt.NDArray[np.integer[Any]]] = []
        for s, ids in enumerate(self.ids):
            if isinstance(ids, SampleIds):
                base_of[s] = bases.setdefault(id(ids.base), len(arrays))
                if base_of[s] == len(arrays):
                    arrays.append(ids.base)
                start_of[s] = ids.start
        if arrays:
            which = base_of[src]
            for b, base in enumerate(arrays):
                rows = np.flatnonzero(which == b) if len(arrays) > 1 or (which < 0).any() else slice(None)
                out[rows] = np.asarray(base[out[rows] + start_of[src[rows]]], np.int64)
        # Now numbers over each source's files taken as one: place them among the distinct files.
        single = np.array([self.file_bounds[f[0]] if len(f) == 1 else -1 for f in self.files], np.int64)
        if (single >= 0).all():
            out += single[src]
            return out
        counts = np.diff(self.file_bounds)
        for s, files in enumerate(self.files):
            rows = np.flatnonzero(src == s)
            if not rows.size:
                continue
            if len(files) == 1:
                out[rows] += single[s]
                continue
            own = prefix_sums(counts[list(files)])
            j = np.searchsorted(own, out[rows], side="right") - 1
            out[rows] += self.file_bounds[np.asarray(files)[j]] - own[j]
        return out


def distinct_files(paths: Sequence[Sequence[str]]) -> tuple[list[str], tuple[tuple[int, ...], ...]]:
    """The distinct paths of all sources in order of first appearance (compared as resolved paths), and
    each source's files as numbers among them."""
    number: dict[str, int] = {}
    order: list[str] = []
    files = []
    resolved: dict[str, str] = {}  # the sources of one grouping name one path thousands of times
    for source in paths:
        mine = []
        for p in source:
            key = resolved.get(p)
            if key is None:
                key = resolved[p] = os.path.realpath(os.path.expanduser(p))
            if key not in number:
                number[key] = len(order)
                order.append(p)
            mine.append(number[key])
        files.append(tuple(mine))
    return order, tuple(files)
