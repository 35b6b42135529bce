"""The collective reader itself: the making (checks, the agreement, the count of the slices, the
fingerprints) and the ShardReader protocol, on top of the slices (``_slices``), the build's
exchange (``_rounds``) and the collectives (``_dist``)."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rank_dataset.core.checks import meta_path, timeout_timedelta
from rank_dataset.core.residency import small_pages
from rank_dataset.core.shard import Shard
from rank_dataset.files.formats import TEXT, detect_path, refuse_cut_source
from rank_dataset.files.index.load import check_columns
from rank_dataset.files.io import FileKey, LocalFile, SourceKey
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards.collective._dist import Collectives, require_process_group
from rank_dataset.shards.collective._objects import shared_objects
from rank_dataset.shards.collective._rounds import Exchange
from rank_dataset.shards.collective._slices import Slices, count_slices, shared_checkpoints, shared_fingerprints
from rank_dataset.shards.reader import SampledReader

__all__ = ["Agree", "CollectiveReader"]

Agree = Callable[[Mapping[str, object], Any], None]


class CollectiveReader(SampledReader):
    """Shards exchanged between the ranks of a process group, each rank reading 1/W of the files.

    Args:
        paths: the meta files (for a mix, the distinct files of the sources in order of first appearance).
        sources: for a mix, the Sources; None: no mix.
        group: the process group whose ranks share the reading (default: the whole world). Its rank and
            size are this reader's; the exchange runs on a gloo group over the same ranks, made here.
        timeout: how long a collective waits for every rank, in seconds or a ``timedelta`` (default: torch's).
        agree: called as ``agree(fields, gloo_group)`` before the first collective that depends on the
            files: the ranks' agreement check (it raises the same error on every rank if they differ).
        columns: for each file, a Parquet file's chosen columns (None: all); None for every file.

    Raises:
        ValueError: no initialised process group; the files hold no sample; ``columns`` for a file
            that is not Parquet, or a missing, nested or binary column (as the file reader words it).
        FileNotFoundError: a file does not exist.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        sources: Sequence[Source] | None = None,
        *,
        group: Any = None,
        timeout: float | datetime.timedelta | None = None,
        agree: Agree | None = None,
        columns: Sequence[Sequence[str] | None] | None = None,
    ) -> None:
        require_process_group()
        timeout = timeout_timedelta(timeout)
        self.paths = tuple(meta_path(p) for p in paths)
        if not self.paths:
            raise ValueError("no meta files given: give at least one")
        chosen = [None if c is None else tuple(c) for c in (columns or [None] * len(self.paths))]
        if len(chosen) != len(self.paths):
            raise ValueError(f"give one columns entry a file: {len(self.paths)} paths, {len(chosen)} entries")
        #: What the last build (or the making, before one) cost this rank: bytes of the files read, bytes
        #: sent and received over gloo in its exchange (requests, lengths, lines, status bytes), and bytes
        #: of lines copied from its host's ranks' shared memory.
        self.stats = {"read": 0, "sent": 0, "received": 0, "shared": 0}
        self._exchange: Exchange | None = None
        self._net = Collectives(group, timeout)
        self.rank, self.world_size = self._net.rank, self._net.world_size
        try:
            with small_pages():  # the count's and the tables' new arrays (see small_pages)
                self._setup(self._net, sources, agree, chosen)
        except BaseException:
            self.close()
            raise

    def _setup(
        self,
        net: Collectives,
        sources: Sequence[Source] | None,
        agree: Agree | None,
        columns: list[tuple[str, ...] | None],
    ) -> None:
        objects = shared_objects(net, self.paths)  # objects' URLs: one HEAD (rank 0's), told to all
        keys: list[SourceKey] = [
            objects[i][0] if i in objects else FileKey.of(os.stat(p)) for i, p in enumerate(self.paths)
        ]
        formats = [objects[i][1] if i in objects else detect_path(p) for i, p in enumerate(self.paths)]
        for i, (path, key, fmt, cols) in enumerate(zip(self.paths, keys, formats, columns)):
            check_columns(path, fmt, cols)
            if fmt is TEXT and i not in objects:  # a Parquet file cut short is not text: no lines
                with LocalFile(path, key) as source:
                    refuse_cut_source(path, source, fmt)
                    source.check()
        if agree is not None:
            with net.named("the agreement check"):
                fields = {"reader": "collective", "files": len(keys), "sizes": tuple(k.size for k in keys)}
                if any(c is not None for c in columns):
                    fields["columns"] = tuple(columns)
                agree({**fields, "formats": tuple(f.value for f in formats)}, net.group)
        checkpoints = shared_checkpoints(net, self.paths, keys, formats)
        slices, starts, lengths = count_slices(net, self.paths, keys, formats, columns, checkpoints)
        self._slices: Slices = slices
        self.stats["read"] = slices.read_bytes()
        if slices.bounds.total == 0:
            names = ", ".join(str(p) for p in self.paths)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")
        self._exchange = Exchange(net, slices, starts, lengths)
        file_samples = slices.samples.sum(axis=0)
        self._fingerprint, self._file_fingerprints = shared_fingerprints(net, slices, keys, file_samples)
        self._sample(slices.bounds.total, slices.bounds.starts, sources, None)

    # -- the ShardReader protocol ------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        return self._slices.bounds.total

    @property
    def fingerprint(self) -> str | None:
        """The files' fingerprint, as
        :attr:`MetaFile.fingerprint <rank_dataset.files.read.metafile.MetaFile.fingerprint>` computes it (a
        resume state saved with either reader loads with the other)."""
        return self._fingerprint

    def source_fingerprints(self) -> tuple[str, ...]:
        """Each source's: its files', and for a subset the hash of its ids (as the file reader's)."""
        assert self._sampling is not None
        return self._sampling.source_fingerprints(self._file_fingerprints)

    def build(self, spec: ShardSpec) -> Shard:
        """The shard of ``spec``: every rank of the group must call it together (a collective)."""
        if self.group is None or self._exchange is None:
            raise ValueError("this collective reader was closed (or is a copy in a DataLoader worker): it cannot build")
        self._net.epoch = spec.epoch
        assert self._sampling is not None
        with small_pages():  # the plan's, the routing's and the offsets' new arrays, each filled once
            shard, exchanged = self._exchange.build(self._sampling.samples_of(spec), self.keeps_ids)
        self.stats = {"read": self._slices.read_bytes(), **exchanged}
        return shard

    def where(self, sample: int) -> str:
        """``path:line`` of global sample ``sample`` (found by reading the slice that holds it)."""
        return self._slices.where(sample)

    # -- collectives and lifetime ------------------------------------------------------------------

    @property
    def group(self) -> Any:
        """The gloo group the reader's collectives run on (None once closed, and in a DataLoader worker)."""
        return self._net.group

    @contextlib.contextmanager
    def collective(self, name: str, epoch: int | None) -> Iterator[None]:
        """Run a collective on :attr:`group` (e.g. the ranks' agreement check before the build of
        ``epoch``): its failure or timeout raises :class:`CollectiveError` naming ``name`` and the epoch."""
        self._net.epoch = epoch
        with self._net.named(name):
            yield

    def pending(self) -> int:
        """Tensors this reader handed to gloo that are still alive: 0 once a build (or the making) has
        returned. Each collective returns only once gloo's worker thread has let go of its tensors, so no
        gloo thread is left to free one of them as the process exits (which aborts it)."""
        return self._net.pending()

    def close(self) -> None:
        """Free the reader's gloo group (every rank should close; a closed reader cannot build). Where the
        reader made the group for itself (a timeout, or a group without gloo), its threads are joined
        here; nothing of the reader's is in flight in it by then (see :meth:`pending`). Its shared
        memory is unmapped here too (the kernel frees it once no rank of the host maps it)."""
        self._exchange = None
        self._net.close()

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: no group (the collectives pickle without it), no ids, nor the starts
        # and lengths.
        return {**self.__dict__, "_exchange": None, "_sampling": None}
