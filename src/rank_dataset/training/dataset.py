"""RankDataset: a map-style torch Dataset holding only this rank's shard of the meta files."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from rank_dataset.core.checks import check_int
from rank_dataset.core.parsers import Parser, resolve_parser
from rank_dataset.core.residency import freeze_inherited_objects, return_freed_memory, settle_before_each_fork
from rank_dataset.core.stages import StageTable, timed
from rank_dataset.plan.config import ReloadConfig
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards.audit import AuditMode, PassCount
from rank_dataset.shards.channel import ShardChannel
from rank_dataset.shards.failures import Failure
from rank_dataset.training._agree import agreement_fields, agreement_needed, check_ranks_agree
from rank_dataset.training._failures import FailureBook, FailurePolicy, OnError
from rank_dataset.training._items import ItemView, RankSide
from rank_dataset.training._options import is_shard_reader, timeout_timedelta
from rank_dataset.training.topology import get_rank_world_size

# A spawn or forkserver DataLoader worker imports this module to unpickle its dataset: what only the rank plans
# and builds with (the readers of meta files, their formats and index, exclusions, mixes) is imported on first use.
if TYPE_CHECKING:
    from rank_dataset.core.shard import Shard
    from rank_dataset.files.read.metafile import MetaFile
    from rank_dataset.plan.sources import Source, SourceInfo
    from rank_dataset.plan.steps import StepLayout
    from rank_dataset.shards.collective import CollectiveReader
    from rank_dataset.shards.reader import ShardReader
    from rank_dataset.training.payloads import Payloads

    MetaSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | MetaFile | Source | Sequence[Source]

__all__ = ["DATASET_KEYWORDS", "RankDataset", "ShardedDataset"]

#: The keywords of ShardedDataset that RankDataset and RankServerDataset take as it does and pass on as given.
DATASET_KEYWORDS = (
    "is_test", "reload_cfg", "rank", "world_size", "parser", "audit", "exclude", "transform", "on_error",
    "max_failures", "exclude_failures", "payloads",
)  # fmt: skip


def _is_collective(reader: ShardReader) -> TypeGuard[CollectiveReader]:
    """Whether ``reader`` is a CollectiveReader, without importing it: it is imported on first use
    (training._readers), so that where its module was never imported no reader can be one."""
    module = sys.modules.get("rank_dataset.shards.collective")
    return module is not None and isinstance(reader, module.CollectiveReader)


class ShardedDataset(Dataset[Any]):
    """What RankDataset and RankServerDataset share: this rank's shard from a shard reader, its plan, item
    access, the resume state and the pass audit.

    The plan is the ShardSpec of the shard held now (``spec``); ``reload_cfg``, ``rank``, ``world_size`` and
    ``is_test`` are read from it. Shards come from ``reader`` (a :class:`~rank_dataset.shards.reader.ShardReader`)
    and reach DataLoader workers through ``channel``. For a mix, ``sources`` are the Sources.

    The dataset's one member is its :class:`~rank_dataset.training._items.ItemView` (what a DataLoader worker
    unpickles); the rank's side (reader, MetaFile, failure book) is the view's ``rank``.
    """

    def __init__(
        self,
        reader: ShardReader,
        *,
        is_test: bool = False,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        parser: str | Parser | None = None,
        sources: Sequence[Source] | None = None,
        audit: AuditMode = "warn",
        group: Any = None,
        exclude: Any = None,
        transform: Callable[[Any], Any] | None = None,
        on_error: OnError = "raise",
        max_failures: int | float | None = 0.01,
        exclude_failures: bool = False,
        payloads: Payloads | None = None,
    ) -> None:
        if isinstance(reader, str):
            raise TypeError(
                f"reader={reader!r} names a reader of meta files, which RankDataset(meta_file, reader={reader!r}) "
                "builds; ShardedDataset takes the reader itself (a ShardReader)"
            )
        if not is_shard_reader(reader):
            raise TypeError(f"reader must be a ShardReader (build, where, set_exclusion), got {reader!r}")
        policy = FailurePolicy(transform, on_error, max_failures, exclude_failures)
        exclusion = None
        if exclude is not None:
            from rank_dataset.plan.exclude import Exclusion

            exclusion = Exclusion.of(exclude, "exclude")
        cfg = ReloadConfig.coerce(reload_cfg)
        rank, world_size = _rank_world_size(rank, world_size, group)
        if not isinstance(is_test, bool):
            raise TypeError(f"is_test must be a bool, got {is_test!r}")
        parser = resolve_parser(parser)
        if sources is None and cfg.epoch_size is not None:
            raise ValueError(
                "reload_cfg['epoch_size'] sets the epoch size of a mix: give a list of Source "
                "(e.g. [Source(path, weight=1)]) to resample plain meta files"
            )
        sources = None if sources is None else tuple(sources)
        # What fails and what the plan leaves out (see training/_failures.py); the mix, if any, is its.
        book = FailureBook(policy, exclusion, reader, sources, parser, cfg.epoch_size, cfg.aug_repeats)
        num_samples, mix = book.plan(is_test)
        book.channel = channel = ShardChannel(audit, failures=on_error == "replace")
        side = RankSide(reader, None, book, group, cfg.group, cfg.epoch_size)
        parsers = None if book.mixture is None else book.mixture.parsers
        self._view = ItemView(channel, parser, parsers, policy, side, _bound(payloads, reader))
        spec = ShardSpec(
            num_samples=num_samples,
            world_size=world_size,
            rank=rank,
            is_test=is_test,
            mini_epoch=cfg.mini_epoch,
            mini_epoch_idx=cfg.mini_epoch_idx,
            seed=cfg.seed,
            epoch=cfg.epoch,
            mix=mix,
            aug_repeats=cfg.aug_repeats,
        )
        self._load(spec)
        # A full collection where fork workers are about to share the rank's pages, not in every constructor:
        # in a large process each one scans every object (see settle_before_each_fork).
        settle_before_each_fork()
        freeze_inherited_objects()  # fork workers leave the rank's objects alone (see its docstring)

    # -- item access (the view's) -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._view)

    def __getitem__(self, i: int) -> Any:
        return self._view.item(i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once (torch's DataLoader calls this with each batch of indices); with
        ``payloads``, the batch's payloads are all asked for at once."""
        return self._view.items(indices)

    @property
    def payloads(self) -> Payloads | None:
        """Where the files the lines name are read from (None: items are the lines alone)."""
        return self._view.payloads

    def payload_of(self, i: int) -> str | None:
        """The path(s) or URL(s) item ``i``'s payload is read from, without reading it (None: no payloads)."""
        return self._view.payload_where(self._view.check_index(i))

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        """Read-only int64 array of global sample numbers: ``self[i]`` is sample ``indices[i]``.

        Computed from the plan on first use and kept until the shard changes (a shard stores its
        sample numbers only where the plan's numbers are not them: sources over subsets).
        """
        return self._view.indices

    @property
    def source_ids(self) -> npt.NDArray[np.integer[Any]] | None:
        """For a mix, a read-only integer array: the source number of each item (``self[i]`` is a sample
        of ``sources[source_ids[i]]``). None for plain meta files. Computed from the plan on first use
        and kept until the shard changes, like ``indices``."""
        return self._view.source_ids

    @property
    def shard(self) -> Shard:
        """The shard held now."""
        return self._view.held()

    # How the shard reaches the DataLoader workers; the item stages' timers (off unless a monitor is on).
    @property
    def channel(self) -> ShardChannel:
        return self._view.channel

    @property
    def stages(self) -> StageTable:
        return self._view.stages

    # -- the rank's side --------------------------------------------------------------------------

    @property
    def reader(self) -> ShardReader:
        """The reader the shards are built by (a :class:`~rank_dataset.shards.reader.ShardReader`)."""
        return self._view.rank.reader

    @property
    def process_group(self) -> Any:
        """The process group whose ranks share this dataset's plan (``group=``; None: the default group)."""
        return self._view.rank.process_group

    @property
    def _book(self) -> FailureBook:
        return self._view.rank.book

    @property
    def num_samples(self) -> int:  # the samples of the files (for a mix, of the distinct files of its sources)
        return self.reader.num_samples

    # -- what failed -------------------------------------------------------------------------------

    @property
    def failures(self) -> list[Failure]:
        """The samples whose item failed to load and was replaced (``on_error="replace"``), one record each
        (:class:`~rank_dataset.shards.failures.Failure`: ``.sample``, ``.where``, ``.error``), the first
        failure of each, in plan order (epoch, mini-epoch, position), gathered from the DataLoader workers.
        Call it in the process that created the dataset."""
        self._book.collect()
        return list(self._book.records)

    @property
    def excluded_failures(self) -> tuple[int, ...]:
        """The samples that ``exclude_failures=True`` left out of the current epoch's plan."""
        return self._book.failed

    # -- the plan ---------------------------------------------------------------------------------

    @property
    def spec(self) -> ShardSpec:
        """The ShardSpec of the shard held now."""
        view = self._view
        if view.version[0] != view.seen:
            view.sync()
        return view.spec

    @property
    def reload_cfg(self) -> ReloadConfig:
        """The ``reload_cfg`` of the shard held now (read-only: change it with ``set_epoch`` or
        ``load_state_dict``)."""
        s, side = self.spec, self._view.rank
        return ReloadConfig(s.mini_epoch, s.seed, s.mini_epoch_idx, s.epoch, side.group, side.epoch_size, s.aug_repeats)

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def is_test(self) -> bool:
        return self.spec.is_test

    def _load(self, spec: ShardSpec) -> None:
        """Build the shard of ``spec``, publish it to the workers and serve it; on any error the
        dataset stays as it was."""
        view, reader = self._view, self.reader
        self._hold(spec)  # the last pass is over: audit it before anything changes
        with timed("exchange" if _is_collective(reader) else "read"):  # the monitor's stages
            shard = reader.build(spec)
        with timed("build"):
            shard = (shard if reader.keeps_ids else shard.without_ids()).shared()
            view.channel.publish(shard, spec)
            view.serve(shard, spec)  # the old shard is unmapped here, once the new one exists
        view.seen = view.channel.seen
        return_freed_memory()

    def _hold(self, spec: ShardSpec) -> None:
        """:meth:`_load` for the shard already held, without building it again (the audit and the agreement stay)."""
        channel = self._view.channel
        channel.check_owner()
        channel.judge()
        self._agree(spec)

    def _agree(self, spec: ShardSpec) -> None:
        """Under a process group, every rank must plan from the same inputs: check it."""
        if not agreement_needed():
            return
        reader = self.reader
        context = _files_context(reader)
        if _is_collective(reader):  # on the reader's group, within its timeout
            with reader.collective("the agreement check", spec.epoch):
                check_ranks_agree(self._agreement_fields(spec), spec.rank, reader.group, context)
        else:
            check_ranks_agree(self._agreement_fields(spec), spec.rank, self._view.rank.process_group, context)

    def _agreement_fields(self, spec: ShardSpec) -> dict[str, object]:
        dataset = f"{type(self).__module__}.{type(self).__qualname__}"
        fields = agreement_fields(spec, self.reader.fingerprint, dataset)
        if self._book.exclusion_fingerprint is not None:
            fields["exclude"] = self._book.exclusion_fingerprint
        return fields

    # -- the mix ----------------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[SourceInfo, ...] | None:
        """For a mix, each source with its numbers in the current epoch: ``N_s`` (``num_samples``),
        the samples the epoch takes of it (``count``, by the schedules in force; in eval mode ``N_s``),
        its first global sample number (``offset``), what its rule asked for before rounding
        (``target``), its fingerprint, and the samples drawn from it from epoch 0 through this epoch
        (``taken``; ``passes_completed``, ``epochs_seen``). None for plain meta files."""
        if self._book.mixture is None:
            return None
        spec = self.spec
        return self._book.mixture.infos(spec.epoch, spec.aug_repeats)

    def set_epoch(self, epoch: int, mini_epoch_idx: int = 0) -> None:
        """Load this rank's shard of ``(epoch, mini_epoch_idx)`` in place of the current one.

        Within an epoch resumed by :meth:`load_state_dict`, the plan keeps the boundaries that epoch
        started with. Call it between passes: one DataLoader (``persistent_workers=True`` or not)
        serves every shard if its sampler is a :class:`~rank_dataset.training.sampler.RandomSampler` or
        :class:`~rank_dataset.training.sampler.ResumableSampler`; a pass that is running when it is called
        finishes on the shard it started with. With another sampler, build a new DataLoader after
        each call (its workers would raise rather than mix shards).
        """
        self._move(epoch, mini_epoch_idx, reuse=True)

    def use_steps(self, steps: StepLayout | None, epoch: int, mini_epoch_idx: int = 0) -> None:
        """(For :class:`~rank_dataset.training.steps.StepSampler`) load this rank's shard of window
        ``(epoch, mini_epoch_idx)`` of the step stream of ``steps`` (None: back to the epoch layout), as
        :meth:`set_epoch` loads a mini-epoch; later ``set_epoch`` calls keep the layout."""
        view = self._view
        old = view.spec
        view.spec = dataclasses.replace(old, steps=steps, resume=None)
        try:  # built even where the window is the one held: the shard held is of the other layout
            self._move(epoch, mini_epoch_idx, reuse=False)
        except BaseException:
            view.spec = old
            raise

    def _move(self, epoch: int, mini_epoch_idx: int, *, reuse: bool) -> None:
        epoch = check_int("epoch", epoch, low=0)
        spec = self.spec
        resume = spec.resume if epoch == spec.epoch else None
        new = dataclasses.replace(spec, epoch=epoch, mini_epoch_idx=mini_epoch_idx, resume=resume)
        with timed("set_epoch"):  # the monitor's stage: what the stages timed inside it leave
            if reuse and new == spec:  # the shard held (the constructor's, at the first set_epoch(0))
                self._hold(spec)
            elif self._book.policy.exclude_failures and epoch != spec.epoch:  # a new epoch: plan without what failed
                with self._book.replanned(new, self._book.agreed()) as new:
                    self._load(new)
            else:
                self._load(new)

    # -- the resume state -------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The resume point after every rank consumed ``consumed`` samples of its current shard.

        A small JSON-serialisable dict (:class:`~rank_dataset.plan.resume.ResumeState`), the same on
        every rank (so rank 0 alone can save it). It names positions of the epoch order, not ranks,
        so it can be loaded on any world size.

        Called with no argument (as torchdata's StatefulDataLoader calls it) it holds no resume point (that
        lives in ResumableSampler's state): ``{}``, or with ``on_error="replace"`` this rank's failure records
        (``{"failures": [...]}``, no collective). Pass ``consumed`` (or save ``ResumableSampler.state_dict()``)
        to resume mid-epoch; with ``on_error="replace"`` the state then holds the failure records and
        ``excluded_failures`` too, and with ``exclude_failures=True`` under a process group it all-gathers every
        rank's failures: a collective, to be called on every rank.

        Raises:
            ValueError: ``consumed`` outside ``[0, len(self)]``, or an eval shard.

        Examples:
            >>> import tempfile, os
            >>> from rank_dataset import RankDataset
            >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
            >>> _ = open(p, "w").write("".join(f"{i}.jpg {i}\\n" for i in range(10)))
            >>> old = RankDataset(p, rank=0, world_size=2)
            >>> state = old.state_dict(consumed=2)
            >>> new = RankDataset(p, rank=0, world_size=2)
            >>> new.load_state_dict(state)
            >>> new.indices.tolist() == old.indices[2:].tolist()
            True
        """
        from rank_dataset.training._state import FAILURES_ONLY, state_at  # on first use: building a shard needs neither

        book = self._book
        if consumed is None:  # no resume point: the failure records alone (what a user saving it expects kept)
            if book.policy.on_error != "replace":
                return {}
            book.collect()
            return {FAILURES_ONLY: [f.to_dict() for f in book.records]} if book.records else {}
        n = len(self)
        state = state_at(self.spec, consumed, n, self.reader, book.mixture, book.exclusion_fingerprint, book.failed)
        failures = book.to_save()
        if failures:
            state["failures"] = [f.to_dict() for f in failures]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a resume point saved by :meth:`state_dict`, on this world size.

        This rank gets its share of what was left of the interrupted mini-epoch (all ranks equally
        long, padded by wrapping within it). Afterwards ``set_epoch(same_epoch, later_idx)`` keeps
        the boundaries that epoch started with, and ``set_epoch(next_epoch)`` plans afresh. The
        state's seed and mini-epoch count replace this dataset's. ``{}`` is ignored; a state of failure
        records alone (``state_dict()`` without ``consumed``) adds them to :attr:`failures` and changes
        no shard. A state that fails a check leaves the dataset exactly as it was.

        Raises:
            ValueError: a state for other files (number of samples or fingerprint) or another mix (the
                message names the first source that differs), of another format version, with
                missing keys or a value out of range (the message names it), or an eval dataset.
        """
        from rank_dataset.training._state import read_state, resumed

        read = read_state(state, self.spec.is_test)
        if read is None:
            return
        resume, failed, failures = read
        book = self._book
        if resume is None:
            book.collect()
            book.merge(failures)
            return
        with book.replanned(self.spec, failed) as planned:
            self._load(resumed(resume, planned, self.reader, book.mixture, book.exclusion_fingerprint))
        if failures:
            book.collect()
            book.merge(failures)

    # -- the pass audit ---------------------------------------------------------------------------

    def audit(self) -> tuple[PassCount, ...]:
        """The counts of the recent passes started by rank_dataset's samplers (up to 16, oldest first): the
        indices each sampler drew, the items read, and whether the pass finished, was left early or is running.

        A finished pass that read other than it drew warns once (a :class:`~rank_dataset.errors.PassAuditWarning`;
        with ``audit="error"`` a :class:`~rank_dataset.errors.PassAuditError`) when the next pass starts or at
        ``set_epoch`` or ``load_state_dict``. Call it in the process that created the dataset.
        """
        return self.channel.audit()

    def __repr__(self) -> str:
        s = self.spec
        mode = "eval" if s.is_test else f"epoch={s.epoch}, mini_epoch={s.mini_epoch_idx}/{s.mini_epoch}"
        mix = "" if s.mix is None else f", mix of {len(s.mix.sizes)} sources"
        return f"{type(self).__name__}(rank={s.rank}/{s.world_size}, {mode}, samples={len(self)}/{s.num_samples}{mix})"


class RankDataset(ShardedDataset):
    """This rank's shard of one or more meta files, as a map-style torch Dataset.

    Each rank holds only its own ``ceil(N / (world_size * mini_epoch))`` samples (or its contiguous
    block in eval mode), read from the files through a cached line-offset index and kept in compact
    numpy buffers that DataLoader workers share.

    Args:
        meta_file: a path, a list of paths (taken as one file, in order), a MetaFile, or a mix: a
            list of :class:`~rank_dataset.plan.sources.Source` (each a file or several, or the listed samples
            of them, with a weight, a repeat or a choose, and optionally its own parser). Items of a
            mix are numbered over the distinct files of the sources, in order of first appearance
            (for sources over distinct files: sample ``k`` of source ``s`` is ``sum(N_0..N_{s-1}) +
            k``; for subsets of one file, the file's sample numbers); ``source_ids`` and ``sources``
            describe them. None only with a reader object (``reader=``), which knows its files.
        is_test: eval layout: no shuffle, no padding, one contiguous block per rank (a mix then
            reads every sample of every source once, sources in order, ignoring weights).
        reload_cfg: a dict or ReloadConfig with ``mini_epoch``, ``seed``, ``mini_epoch_idx``,
            ``epoch``, ``group`` and, for a mix, ``epoch_size`` (see ReloadConfig).
        rank: this rank; default: the process group, else ``RANK``, else 0.
        world_size: the number of ranks; default: the process group, else ``WORLD_SIZE``, else 1.
        parser: None (items are str), ``"json"``, ``"label"`` (``(path, int)``), or a callable;
            in a mix, for the sources that have no parser of their own.
        audit: ``"warn"`` (a PassAuditWarning, once), ``"error"`` (a PassAuditError) or ``"off"``:
            what a finished pass that read other than its sampler drew does (see :meth:`audit`).
        reader: how the shards are read, by name or as the reader itself: ``"file"`` (each rank reads
            its own lines through the files' cached line index: one node, or a fast local copy),
            ``"collective"`` (under an initialised process group: each rank reads 1/W of the files' bytes
            once per build and the ranks exchange the lines over a gloo group; no index. For many nodes
            on a shared file system: see the collective reader guide), or a
            :class:`~rank_dataset.shards.reader.ShardReader` already built (e.g. a
            :class:`~rank_dataset.shards.reader.FileReader` or
            :class:`~rank_dataset.shards.collective.CollectiveReader`; then no ``meta_file``, ``columns``
            nor ``timeout``). The shards are the same, byte for byte. ``ds.reader`` is the reader object.
        group: a torch.distributed process group (e.g. a DeviceMesh's data-parallel dimension,
            ``mesh["dp"].get_group()``): rank and world size are this group's (``rank`` and
            ``world_size``, if given, must agree), and its ranks check their agreement (default: the
            whole world).
        timeout: with ``reader="collective"``, how long its collectives wait for every rank: seconds (an
            int or a float) or a ``datetime.timedelta``, as every dataset takes it (default: torch's); past
            it every rank raises a :class:`~rank_dataset.errors.CollectiveError`. For meta files in object
            storage (either reader), also the budget of each request to the store with its retries.
        exclude: sample numbers to leave out (as ``indices`` numbers them; for a mix, over the distinct
            files of its sources): a 1-D integer array, a list, or the path of a ``.npy`` file. The plans
            cover what is left (every kept sample once an epoch, equal lengths, resume on any world size);
            memory: 8 bytes an excluded sample, what is kept is never materialised. See
            :func:`~rank_dataset.files.group.ids.ids_of` to exclude by path.
        transform: a function of the parsed sample (the item's line after ``parser``) that makes the item,
            run where the item is made (the DataLoader worker): the image load and decode.
        on_error: ``"raise"`` (an exception in the parser or ``transform`` propagates) or ``"replace"``:
            the item of a substitute from this rank's shard, chosen from ``(seed, epoch, mini-epoch,
            position, attempt)`` (the same run and a resume give the same), and the failure recorded in
            :attr:`failures`.
        max_failures: with ``"replace"``, the failures a pass over this rank's shard may have: a count
            (an int), a fraction of the shard (a float in [0, 1]; default 0.01), or None for no limit.
            Past it a :class:`~rank_dataset.errors.TooManyFailuresError` names the first failures.
        exclude_failures: with ``"replace"``, leave every sample that failed out of the plans of later
            epochs (under a process group the ranks all-gather them at ``set_epoch``); kept in the resume state.
        columns: for a Parquet meta file (or files), the columns whose values, joined by a tab, make a
            row's line (what the parser gets), in that order; None for all. For a mix, give each
            Source its ``columns`` instead. Not with a MetaFile (give it its own) nor for text files.
        storage_options: for meta files in object storage (``s3://``, ``gs://``, ``az://``,
            ``https://``): obstore's settings (e.g. ``endpoint``, ``access_key_id``,
            ``secret_access_key``, ``region``), over the environment's; pickled to DataLoader workers
            with the paths, never shown. For a mix, give each Source its own; for a MetaFile, the MetaFile.
        payloads: a :class:`~rank_dataset.training.payloads.Payloads`: each item (and what ``transform``
            gets) is then ``(meta, data)``, ``meta`` the item as it would be without, ``data`` the ``bytes``
            of the file its line names (a tuple of them for a tuple key), a batch's read at once; a payload
            that cannot be read is the sample's failure, as a ``transform`` that raises (see ``on_error``).

    Raises:
        ValueError: as MetaFile; ``reader="collective"`` without an initialised process group; for a
            mix, a source with no samples or counts that cannot be met (see
            :func:`~rank_dataset.plan.counts.mix_counts`), the message naming the source.

    Examples:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"img_{i}.JPEG {i % 3}\\n" for i in range(10)))
        >>> ds = RankDataset(p, reload_cfg={"seed": 1}, rank=0, world_size=2, parser="label")
        >>> len(ds), ds[0] == ("img_%d.JPEG" % ds.indices[0], ds.indices[0] % 3)
        (5, True)
    """

    def __init__(
        self,
        meta_file: MetaSource | None = None,
        is_test: bool = False,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        parser: str | Parser | None = None,
        audit: AuditMode = "warn",
        reader: str | ShardReader = "file",
        group: Any = None,
        timeout: float | datetime.timedelta | None = None,
        exclude: Any = None,
        transform: Callable[[Any], Any] | None = None,
        on_error: OnError = "raise",
        max_failures: int | float | None = 0.01,
        exclude_failures: bool = False,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        payloads: Payloads | None = None,
    ) -> None:
        given = dict(locals())  # the parameters, before anything else is bound here
        from rank_dataset.training._readers import reader_for

        shards, sources, meta = reader_for(
            meta_file, reader, columns, group, timeout_timedelta(timeout), storage_options
        )
        try:
            super().__init__(shards, sources=sources, group=group, **{k: given[k] for k in DATASET_KEYWORDS})
        except BaseException:
            close = getattr(shards, "close", None)
            if close is not None:
                close()
            raise
        self._view.rank.meta = meta

    @property
    def meta(self) -> MetaFile | None:
        """The MetaFile the reader reads through (None for the collective reader, or a reader without one)."""
        return self._view.rank.meta

    def manifest(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """What defines this dataset's plan, as a small JSON dict naming no rank (the same on every rank): the
        meta files with their fingerprints, ``reload_cfg``'s seed, mini-epochs and ``aug_repeats``, the mix
        (its sources, their rules and the plan's counts) and what ``exclude=`` leaves out. Arrays it depends on
        (``exclude=``, a source's ``ids`` or ``exclude``) are referenced by file and digest: with ``path`` (a
        ``.json`` file) the manifest is written there and the arrays beside it; without, such an array is a
        ValueError. :func:`rank_dataset.samples_of` reads it; a StepSampler's :meth:`manifest` adds the steps.

        Raises:
            ValueError: an eval dataset, the collective reader (it keeps no fingerprint per file),
                ``exclude_failures=True``, or arrays without ``path``.
        """
        from rank_dataset.training._manifest import dataset_manifest

        return dataset_manifest(self.spec, self._book, self.meta, self.reload_cfg.epoch_size, path)

    def close(self) -> None:
        """Free what the reader holds beyond the shard (the collective reader's gloo group). Every rank
        should close together; a closed dataset keeps serving its shard but cannot load another."""
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


def _bound(payloads: Any, reader: Any) -> Payloads | None:
    """``payloads`` checked, given the reader's Parquet columns (where its str key names a column)."""
    if payloads is None:
        return None
    from rank_dataset.training.payloads import Payloads

    if not isinstance(payloads, Payloads):
        raise TypeError(f"payloads must be a Payloads (rank_dataset.Payloads(root, key=...)) or None, got {payloads!r}")
    columns = getattr(getattr(reader, "meta", None), "columns", None)
    if columns and columns[0] is not None and all(c == columns[0] for c in columns):
        payloads = copy.copy(payloads)
        payloads.columns = columns[0]
    return payloads  # type: ignore[no-any-return]


def _files_context(reader: Any) -> dict[str, object]:
    """What a disagreement on the files names of this rank's: the paths it reads (or its meta server)."""
    paths = getattr(getattr(reader, "meta", None), "paths", None) or getattr(reader, "paths", None)
    if paths is not None:
        return {"paths": [os.fspath(p) for p in paths]}
    server = getattr(reader, "server", None)
    return {} if server is None else {"server": str(getattr(server, "url", server))}


def _rank_world_size(rank: int | None, world_size: int | None, group: Any) -> tuple[int, int]:
    """``(rank, world_size)``: the group's, if given (an explicit one must equal it), else as found."""
    if group is None:
        return get_rank_world_size(rank, world_size)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group= needs an initialised torch.distributed process group")
    found = dist.get_rank(group), dist.get_world_size(group)
    if found[0] < 0:
        raise ValueError("this process is not a member of the group given (group=): give one it belongs to")
    for name, given, theirs in (("rank", rank, found[0]), ("world_size", world_size, found[1])):
        if given is not None and given != theirs:
            raise ValueError(f"{name}={given!r} differs from the group's ({theirs}): leave it None with group=")
    return found
