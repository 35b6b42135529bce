"""Shard readers: where a dataset's shards come from. The file reader reads meta files; the server
reader (:class:`rank_dataset.training.server_datasets.ServerReader`) asks a meta server. No torch.

A reader knows the samples (their number and fingerprint, and for a mix each source's), builds the
shard of a :class:`~rank_dataset.plan.spec.ShardSpec`, and names where a sample lives for error messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rank_dataset.core.shard import Shard
from rank_dataset.files.metafile import MetaFile
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
    file in several sources), which the dataset then serves as its ``indices``.
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

    def __init__(self, meta: MetaFile, sources: Sequence[Source] | None = None) -> None:
        self.meta = meta
        self._sources = None if sources is None else tuple(sources)
        self._map: SampleMap | None = None
        self.keeps_ids = False
        if sources is None:
            return
        _, self._files = distinct_files([s.paths for s in sources])
        ids, names = [s.ids for s in sources], [s.name for s in sources]
        self._map = SampleMap.of(self._files, meta.file_bounds, ids, names)
        self._sizes = self._map.sizes
        self.keeps_ids = not self._map.identity

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: it needs no ids (those held in memory would be copied).
        return {**self.__dict__, "_map": None, "_sources": None}

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
        assert self._sources is not None
        files = self.meta.file_fingerprints
        return tuple(
            combine_fingerprints([files[f] for f in mine] + ([] if s.ids is None else [s.ids.fingerprint]))
            for s, mine in zip(self._sources, self._files)
        )

    def build(self, spec: ShardSpec) -> Shard:
        # The plan is made by the read (and again if it needs it), so that no name here holds it
        # while the shard fills.
        if not self.keeps_ids:
            return self.meta._read_made(spec.indices, ids=False)
        sample_map, mix = self._map, spec.mix
        assert mix is not None and sample_map is not None
        return self.meta._read_made(lambda: sample_map.samples(spec.indices(), mix.source_of), ids=True)

    def where(self, sample: int) -> str:
        return self.meta.where(sample)


def files_of(sources: Sequence[Source]) -> list[str]:
    """The distinct files of ``sources`` in order of first appearance: what a mix's MetaFile holds."""
    return distinct_files([s.paths for s in sources])[0]
