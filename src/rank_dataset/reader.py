"""Shard readers: where a dataset's shards come from. The file reader reads meta files; the server
reader (:class:`rank_dataset.client.ServerReader`) asks a meta server. No torch.

A reader knows the samples (their number and fingerprint, and for a mix each source's), builds the
shard of a :class:`~rank_dataset.plan.ShardSpec`, and names where a sample lives for error messages.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from rank_dataset._bounds import Bounds
from rank_dataset.metafile import MetaFile
from rank_dataset.mix import Source, combine_fingerprints
from rank_dataset.plan import ShardSpec
from rank_dataset.shard import Shard

__all__ = ["FileReader", "ShardReader"]


class ShardReader(Protocol):
    """What a dataset needs of where its shards come from.

    For a mix, the global sample numbers are over the sources' files in source order, and
    ``source_sizes`` and ``source_fingerprints`` give each source's ``N_s`` and fingerprint (None
    when the reader reads no mix).
    """

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
    """Shards read from meta files (what :class:`~rank_dataset.dataset.RankDataset` reads).

    Args:
        meta: the files, as one MetaFile (for a mix, every source's files in source order).
        sources: for a mix, the Sources whose paths ``meta`` holds in order; None: no mix.
    """

    def __init__(self, meta: MetaFile, sources: Sequence[Source] | None = None) -> None:
        self.meta = meta
        # Which of meta's files each source holds.
        self._groups = None if sources is None else Bounds([len(s.paths) for s in sources])

    @property
    def num_samples(self) -> int:
        return len(self.meta)

    @property
    def fingerprint(self) -> str | None:
        return self.meta.fingerprint

    @property
    def source_sizes(self) -> tuple[int, ...] | None:
        if self._groups is None:
            return None
        return tuple(np.diff(self.meta.file_bounds[self._groups.starts]).tolist())

    def source_fingerprints(self) -> tuple[str, ...]:
        assert self._groups is not None
        files = self.meta.file_fingerprints
        return tuple(combine_fingerprints(files[a:b]) for a, b in itertools.pairwise(self._groups.starts.tolist()))

    def build(self, spec: ShardSpec) -> Shard:
        return self.meta.read(spec.indices(), ids=False)

    def where(self, sample: int) -> str:
        return self.meta.where(sample)
