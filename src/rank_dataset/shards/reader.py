"""Shard readers: where a dataset's shards come from. The file reader reads meta files; the server
reader (:class:`rank_dataset.training.client.ServerReader`) asks a meta server. No torch.

A reader knows the samples (their number and fingerprint, and for a mix each source's), builds the
shard of a :class:`~rank_dataset.plan.spec.ShardSpec`, and names where a sample lives for error messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rank_dataset.core.shard import Shard
from rank_dataset.files.metafile import MetaFile
from rank_dataset.plan.exclude import Exclusion, KeptIds, listing_of, split_exclusion
from rank_dataset.plan.mix import Source, combine_fingerprints
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.subsets import SampleMap, distinct_files

__all__ = ["FileReader", "ShardReader"]


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


class FileReader:
    """Shards read from meta files (what :class:`~rank_dataset.training.dataset.RankDataset` reads).

    Args:
        meta: the files, as one MetaFile (for a mix, the distinct files of the sources in order of
            first appearance: see :func:`files_of`).
        sources: for a mix, the Sources; None: no mix.

    Raises:
        ValueError: a source's ids that are not distinct sample numbers of its files (naming it).
    """

    def __init__(
        self, meta: MetaFile, sources: Sequence[Source] | None = None, exclude: Exclusion | None = None
    ) -> None:
        self.meta = meta
        self._sources = None if sources is None else tuple(sources)
        self._map: SampleMap | None = None
        self._kept: KeptIds | None = None
        self.keeps_ids = False
        if sources is not None:
            _, self._files = distinct_files([s.paths for s in sources])
        self.set_exclusion(exclude)

    def set_exclusion(self, exclusion: Exclusion | None) -> None:
        """Leave the global sample numbers ``exclusion`` out of the plans from now on (None: none but
        the sources' own). Raises ValueError if one is past the files or nothing of a source is left."""
        self._kept = None
        if self._sources is None:
            if exclusion is not None and len(exclusion):
                kept = KeptIds(None, exclusion)
                kept.check(len(self.meta), "the meta files")
                self._kept = kept
            self.keeps_ids = self._kept is not None
            return
        sources, bounds = self._sources, self.meta.file_bounds
        if exclusion is not None:
            exclusion.check(len(self.meta), "exclude")
        extra = [None] * len(sources) if exclusion is None else split_exclusion(exclusion, self._files, bounds)
        listings = [listing_of(s.ids, _union(s.exclude, e)) for s, e in zip(sources, extra)]
        self._map = SampleMap.of(self._files, bounds, listings, [s.name for s in sources])
        self._sizes = self._map.sizes
        self.keeps_ids = not self._map.identity

    @property
    def plan_size(self) -> int:
        return len(self.meta) if self._kept is None else len(self._kept)

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: it needs no ids (those held in memory would be copied).
        return {**self.__dict__, "_map": None, "_sources": None, "_kept": None}

    @property
    def num_samples(self) -> int:
        return len(self.meta)

    @property
    def fingerprint(self) -> str | None:
        return self.meta.fingerprint

    @property
    def source_sizes(self) -> tuple[int, ...] | None:
        return None if self._sources is None else self._sizes

    def source_fingerprints(self) -> tuple[str, ...]:
        """Each source's: its files', and for a subset the hash of its ids (read once, when asked)."""
        assert self._sources is not None and self._map is not None
        files = self.meta.file_fingerprints
        return tuple(
            combine_fingerprints([files[f] for f in mine] + ([] if listed is None else [listed.fingerprint]))
            for listed, mine in zip(self._map.ids, self._files)
        )

    def build(self, spec: ShardSpec) -> Shard:
        # The plan is made by the read (and again if it needs it), so that no name here holds it
        # while the shard fills.
        if not self.keeps_ids:
            return self.meta._read_made(spec.indices, ids=False)
        if self._kept is not None:
            kept = self._kept
            return self.meta._read_made(lambda: kept.take(spec.indices()), ids=True)
        sample_map, mix = self._map, spec.mix
        assert mix is not None and sample_map is not None
        return self.meta._read_made(lambda: sample_map.samples(spec.indices(), mix.source_of), ids=True)

    def where(self, sample: int) -> str:
        return self.meta.where(sample)


def _union(a: Exclusion | None, b: Exclusion | None) -> Exclusion | None:
    return b if a is None else a.union(b)


def files_of(sources: Sequence[Source]) -> list[str]:
    """The distinct files of ``sources`` in order of first appearance: what a mix's MetaFile holds."""
    return distinct_files([s.paths for s in sources])[0]
