"""Shard readers: where a dataset's shards come from. The file reader reads meta files; the server
reader (:class:`rank_dataset.training.server_datasets.ServerReader`) asks a meta server.

A reader knows the samples (their number and fingerprint, and for a mix each source's), builds the
shard of a :class:`~rank_dataset.plan.spec.ShardSpec`, and names where a sample lives for error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from rank_dataset.core.shard import Shard
from rank_dataset.core.stages import timed_result
from rank_dataset.plan.spec import ShardSpec

if TYPE_CHECKING:
    from rank_dataset.files.read.metafile import MetaFile

    # Imported where a mix, a subset or an exclusion is given: a reader of plain files plans none.
    from rank_dataset.plan.exclude import Exclusion, KeptIds
    from rank_dataset.plan.mix import MixPlan
    from rank_dataset.plan.sources import Source
    from rank_dataset.plan.subsets import SampleMap

__all__ = ["FileReader", "SampledReader", "Sampling", "ShardReader"]


class ShardReader(Protocol):
    """What a dataset needs of where its shards come from.

    For a mix, the global sample numbers are over the distinct files of the sources, in order of
    first appearance, and ``source_sizes`` and ``source_fingerprints`` give each source's ``N_s``
    and fingerprint (None when the reader reads no mix). ``keeps_ids``: its shards keep each line's
    sample number (where the plan's numbers are not the sample numbers: sources over subsets, or a
    file in several sources, or samples left out), which the dataset then serves as its ``indices``.

    An exclusion (:meth:`set_exclusion`: sample numbers over all its files left out) changes the plan's
    size: ``plan_size`` for plain files, ``source_sizes`` for a mix.
    """

    keeps_ids: bool

    @property
    def num_samples(self) -> int:
        """The samples of every file together."""
        ...

    @property
    def fingerprint(self) -> str | None:
        """A hash of the files (None: unknown); resume states are checked against it."""
        ...

    @property
    def source_sizes(self) -> tuple[int, ...] | None:
        """For a mix, ``N_s`` of each source."""
        ...

    def source_fingerprints(self) -> tuple[str, ...]:
        """For a mix, the fingerprint of each source's files (see ``combine_fingerprints``)."""
        ...

    @property
    def plan_size(self) -> int:
        """For plain files, the samples a plan covers: ``num_samples`` less those left out."""
        ...

    def set_exclusion(self, exclusion: Exclusion | None) -> None:
        """Leave these global sample numbers out of the plans from now on (None: none)."""
        ...

    def build(self, spec: ShardSpec) -> Shard:
        """The shard of ``spec`` (its samples in ``spec.indices()`` order; ids need not be kept)."""
        ...

    def where(self, sample: int) -> str:
        """Where global sample ``sample`` lives, for error messages."""
        ...


class Sampling:
    """How a reader turns a plan's numbers into global sample numbers: as they are (plain files), through
    the numbers kept after an exclusion (plain files), or through a mix's sample map (sources over subsets,
    a file in several sources, samples left out). Shared by the file and collective readers.

    Args:
        total: the samples of every file together.
        starts: where each file's samples start in the global numbering (``total`` last).
        sources: for a mix, the Sources; None: no mix.
        what: the files, as an exclusion past them names them.
    """

    def __init__(
        self,
        total: int,
        starts: npt.NDArray[np.int64],
        sources: Sequence[Source] | None,
        what: str = "the meta files",
    ) -> None:
        self.total, self._starts, self._what = total, starts, what
        self.sources = None if sources is None else tuple(sources)
        self.files: tuple[tuple[int, ...], ...] = () if sources is None else _distinct(sources)[1]
        self.map: SampleMap | None = None
        self.kept: KeptIds | None = None
        self.keeps_ids = False
        self.sizes: tuple[int, ...] | None = None

    def exclude(self, exclusion: Exclusion | None) -> None:
        """Leave the global sample numbers ``exclusion`` out of the plans from now on (None: none but
        the sources' own). Raises ValueError if one is past the files or nothing of a source is left."""
        self.kept = None
        if self.sources is None:
            if exclusion is not None and len(exclusion):
                from rank_dataset.plan.exclude import KeptIds

                kept = KeptIds(None, exclusion)
                kept.check(self.total, self._what)
                self.kept = kept
            self.keeps_ids = self.kept is not None
            return
        if exclusion is not None:
            exclusion.check(self.total, "exclude")
        from rank_dataset.plan.exclude import listing_of, split_exclusion
        from rank_dataset.plan.subsets import SampleMap

        sources = self.sources
        extra = [None] * len(sources) if exclusion is None else split_exclusion(exclusion, self.files, self._starts)
        listings = [listing_of(s.ids, _union(s.exclude, e)) for s, e in zip(sources, extra)]
        self.map = SampleMap.of(self.files, self._starts, listings, [s.name for s in sources])
        self.sizes = self.map.sizes
        self.keeps_ids = not self.map.identity

    @property
    def plan_size(self) -> int:
        return self.total if self.kept is None else len(self.kept)

    def source_fingerprints(self, files: Sequence[str]) -> tuple[str, ...]:
        """Each source's, from its files' (``files``): and for a subset the hash of its ids."""
        assert self.map is not None
        from rank_dataset.plan.mix import combine_fingerprints

        return tuple(
            combine_fingerprints([files[f] for f in mine] + ([] if listed is None else [listed.fingerprint]))
            for listed, mine in zip(self.map.ids, self.files)
        )

    @timed_result("plan")  # the monitor's plan stage
    def samples_of(self, spec: ShardSpec) -> Callable[[], npt.NDArray[np.int64]]:
        """What makes the global sample numbers of ``spec``'s plan (called when they are needed, so that
        no name holds them while the shard fills)."""
        if not self.keeps_ids:
            return spec.indices
        if self.kept is not None:  # what is left out now, whatever a later exclusion sets
            kept = self.kept
            return lambda: kept.take(spec.indices())
        sample_map, mix = self.map, spec.mix
        assert mix is not None and sample_map is not None
        return lambda: sample_map.samples(spec.indices(), mix.source_of)

    def global_of(self, numbers: npt.NDArray[np.int64], mix: MixPlan | None) -> npt.NDArray[np.int64]:
        """The global sample numbers of the plan's ``numbers`` (of the plan ``mix``, for a mix)."""
        if not self.keeps_ids:
            return numbers
        if self.kept is not None:
            return self.kept.take(numbers)
        assert mix is not None and self.map is not None
        return self.map.samples(numbers, mix.source_of)


class SampledReader:
    """What the file, collective and server readers share: their :class:`Sampling` and the protocol members it
    answers (``keeps_ids``, :meth:`set_exclusion`, ``plan_size``, ``source_sizes``)."""

    keeps_ids: bool = False
    _sampling: Sampling | None

    def _sample(
        self,
        total: int,
        starts: npt.NDArray[np.int64],
        sources: Sequence[Source] | None,
        exclude: Exclusion | None,
        what: str = "the meta files",
    ) -> None:
        self._sampling = Sampling(total, starts, sources, what)
        self._is_mix = sources is not None
        self.set_exclusion(exclude)

    def set_exclusion(self, exclusion: Exclusion | None) -> None:
        """See :meth:`Sampling.exclude`."""
        assert self._sampling is not None
        self._sampling.exclude(exclusion)
        self.keeps_ids = self._sampling.keeps_ids
        self._plan_size, self._sizes = self._sampling.plan_size, self._sampling.sizes

    @property
    def plan_size(self) -> int:
        return self._plan_size

    @property
    def source_sizes(self) -> tuple[int, ...] | None:
        return self._sizes if self._is_mix else None


class FileReader(SampledReader):
    """Shards read from meta files (what :class:`~rank_dataset.training.dataset.RankDataset` reads).

    Args:
        meta: the files, as one MetaFile (for a mix, the distinct files of the sources in order of
            first appearance: see :func:`files_of`).
        sources: for a mix, the Sources; None: no mix.
        exclude: global sample numbers left out of the plans (see :meth:`Sampling.exclude`).

    Raises:
        ValueError: a source's ids that are not distinct sample numbers of its files (naming it).
    """

    def __init__(
        self, meta: MetaFile, sources: Sequence[Source] | None = None, exclude: Exclusion | None = None
    ) -> None:
        self.meta = meta
        self._sample(len(meta), meta.file_bounds, sources, exclude)

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: it needs no ids (those held in memory would be copied).
        return {**self.__dict__, "_sampling": None}

    @property
    def num_samples(self) -> int:
        return len(self.meta)

    @property
    def fingerprint(self) -> str | None:
        return self.meta.fingerprint

    def source_fingerprints(self) -> tuple[str, ...]:
        """Each source's: its files', and for a subset the hash of its ids (read once, when asked)."""
        assert self._sampling is not None
        return self._sampling.source_fingerprints(self.meta.file_fingerprints)

    def build(self, spec: ShardSpec) -> Shard:
        assert self._sampling is not None
        return self.meta._read_made(self._sampling.samples_of(spec), ids=self.keeps_ids)

    def where(self, sample: int) -> str:
        return self.meta.where(sample)


def _union(a: Exclusion | None, b: Exclusion | None) -> Exclusion | None:
    return b if a is None else a.union(b)


def files_of(sources: Sequence[Source]) -> list[str]:
    """The distinct files of ``sources`` in order of first appearance: what a mix's MetaFile holds."""
    return _distinct(sources)[0]


def columns_of(sources: Sequence[Source]) -> list[tuple[str, ...] | None]:
    """The columns of each of :func:`files_of`'s files (its sources' ``columns``): what a mix's
    MetaFile reads them with.

    Raises:
        ValueError: one file named by sources with different columns (one file is indexed and read
            once, with one choice of columns).
    """
    paths, numbers = _distinct(sources)
    chosen: list[tuple[str, ...] | None] = [None] * len(paths)
    seen: list[Source | None] = [None] * len(paths)
    for source, mine in zip(sources, numbers):
        for f in mine:
            first = seen[f]
            if first is not None and first.columns != source.columns:
                raise ValueError(
                    f"{paths[f]} is in the sources {first.name!r} with columns={first.columns} and "
                    f"{source.name!r} with columns={source.columns}: a file is read with one choice of columns"
                )
            seen[f], chosen[f] = source, source.columns
    return chosen


def _distinct(sources: Sequence[Source]) -> tuple[list[str], tuple[tuple[int, ...], ...]]:
    """:func:`~rank_dataset.plan.subsets.distinct_files` of the sources' paths."""
    from rank_dataset.plan.subsets import distinct_files

    return distinct_files([s.paths for s in sources])
