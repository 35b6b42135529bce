"""RankDataset: a map-style torch Dataset holding only this rank's shard of the meta files."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeGuard, TypeVar, overload

from torch.utils.data import Dataset

from rank_dataset.core.checks import check_int
from rank_dataset.core.deferred import Deferred
from rank_dataset.core.parsers import Parser, resolve_parser
from rank_dataset.core.residency import freeze_inherited_objects, return_freed_memory
from rank_dataset.core.stages import StageTable, timed
from rank_dataset.plan.config import ReloadConfig
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards.channel import AuditMode, PassCount, ShardChannel
from rank_dataset.shards.failures import Failure
from rank_dataset.training._agree import agreement_fields, agreement_needed, check_ranks_agree
from rank_dataset.training._failures import FailureBook, FailurePolicy, OnError
from rank_dataset.training._items import ShardItems
from rank_dataset.training._options import is_shard_reader, timeout_timedelta
from rank_dataset.training._state import Resumable
from rank_dataset.training.topology import get_rank_world_size

# A spawn or forkserver DataLoader worker imports this module to unpickle its dataset: what only the rank plans
# and builds with (the readers of meta files, their formats and index, exclusions, mixes) is imported on first use.
if TYPE_CHECKING:
    from rank_dataset.files.read.metafile import MetaFile
    from rank_dataset.plan.sources import Source, SourceInfo
    from rank_dataset.plan.steps import StepLayout
    from rank_dataset.shards.collective import CollectiveReader
    from rank_dataset.shards.reader import ShardReader

    MetaSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | MetaFile | Source | Sequence[Source]

__all__ = ["RankDataset", "ShardedDataset"]


def __getattr__(name: str) -> Any:
    if name == "as_sources":  # named here before the mix's modules were imported on first use
        from rank_dataset.plan.sources import as_sources

        return as_sources
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_T = TypeVar("_T")


class _RankSide(Generic[_T]):
    """An attribute only the rank plans and builds with (``reader``, ``meta``, the failure book). A spawn or
    forkserver worker receives the dataset's together as one :class:`~rank_dataset.core.deferred.Deferred`,
    unpickled (their modules imported) when it first reads one of them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_held_{name.lstrip('_')}"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _RankSide[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        held = obj.__dict__
        if self.slot not in held and "_deferred" in held:
            held.update(held.pop("_deferred").load())
        try:
            return held[self.slot]
        except KeyError:
            raise AttributeError(f"{type(obj).__name__!r} object has no attribute {self.name!r}") from None

    def __set__(self, obj: Any, value: _T) -> None:
        obj.__dict__[self.slot] = value


def _is_collective(reader: ShardReader) -> TypeGuard[CollectiveReader]:
    """Whether ``reader`` is a CollectiveReader, without importing it: it is imported on first use
    (training._readers), so that where its module was never imported no reader can be one."""
    module = sys.modules.get("rank_dataset.shards.collective")
    return module is not None and isinstance(reader, module.CollectiveReader)


class ShardedDataset(ShardItems, Resumable, Dataset[Any]):
    """What RankDataset and RankServerDataset share: a shard reader, a shard channel and, for a mix,
    a mixture; the plan, item access, resume and parsing.

    The plan lives in one place, the ShardSpec of the shard held now (``spec``); ``reload_cfg``,
    ``rank``, ``world_size`` and ``is_test`` are read from it. Shards come from ``reader`` (a
    :class:`~rank_dataset.shards.reader.ShardReader`: meta files, or a meta server; the object itself, as
    ``RankDataset(reader=...)`` takes one), and reach DataLoader workers through ``channel``
    (:mod:`rank_dataset.shards.channel`).

    For a mix, ``sources`` are the Sources; the global sample numbers are then over the sources'
    files in source order, ``num_samples`` is ``sum(N_s)``, and the spec carries the mix (its
    ``num_samples`` being the epoch size ``T0``).

    Item access (``len``, ``ds[i]``, batches, ``indices``) is :class:`~rank_dataset.training._items.ShardItems`,
    the resume state :class:`~rank_dataset.training._state.Resumable`; this class plans and loads shards.
    """

    reader: _RankSide[ShardReader] = _RankSide()
    _book: _RankSide[FailureBook] = _RankSide()

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
    ) -> None:
        if isinstance(reader, str):
            raise TypeError(
                f"reader={reader!r} names a reader of meta files, which RankDataset(meta_file, reader={reader!r}) "
                "builds; ShardedDataset takes the reader itself (a ShardReader)"
            )
        if not is_shard_reader(reader):
            raise TypeError(f"reader must be a ShardReader (build, where, set_exclusion), got {reader!r}")
        self._policy = policy = FailurePolicy(transform, on_error, max_failures, exclude_failures)
        self._made_by_policy = policy.active  # read once per item: a plain attribute, not the property
        self._transform = transform
        self._replace = on_error == "replace"
        exclusion = None
        if exclude is not None:
            from rank_dataset.plan.exclude import Exclusion

            exclusion = Exclusion.of(exclude, "exclude")
        cfg = ReloadConfig.coerce(reload_cfg)
        rank, world_size = _rank_world_size(rank, world_size, group)
        self._process_group = group  # the ranks that agree (default: the world)
        if not isinstance(is_test, bool):
            raise TypeError(f"is_test must be a bool, got {is_test!r}")
        self.reader = reader
        self.num_samples = reader.num_samples
        self._group = cfg.group
        self._epoch_size = cfg.epoch_size
        self._parser = resolve_parser(parser)
        if sources is None and cfg.epoch_size is not None:
            raise ValueError(
                "reload_cfg['epoch_size'] sets the epoch size of a mix: give a list of Source "
                "(e.g. [Source(path, weight=1)]) to resample plain meta files"
            )
        sources = None if sources is None else tuple(sources)
        # What fails and what the plan leaves out (see training/_failures.py); the mix, if any, is its.
        self._book = FailureBook(policy, exclusion, reader, sources, self._parser, cfg.epoch_size, cfg.aug_repeats)
        num_samples, mix = self._book.plan(is_test)
        self._parsers = None if self._book.mixture is None else self._book.mixture.parsers
        self.channel = self._book.channel = ShardChannel(audit, failures=self._replace)
        self._tally = self.channel.tally  # bound once: item access calls it directly
        self.stages = StageTable.create()  # the monitor's item timers (rank_dataset.monitor), off until it runs
        self._version, self._seen = self.channel.version, self.channel.seen  # the per-item check (see _sync)
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
        freeze_inherited_objects()  # fork workers leave the rank's objects alone (see its docstring)

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
        if self._version[0] != self._seen:
            self._sync()
        return self._spec

    @property
    def reload_cfg(self) -> ReloadConfig:
        """The ``reload_cfg`` of the shard held now (read-only: change it with ``set_epoch`` or
        ``load_state_dict``)."""
        s = self.spec
        return ReloadConfig(
            s.mini_epoch, s.seed, s.mini_epoch_idx, s.epoch, self._group, self._epoch_size, s.aug_repeats
        )

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
        self.channel.check_owner()
        self.channel.judge()  # the last pass is over: audit it before anything changes
        self._agree(spec)
        with timed("exchange" if _is_collective(self.reader) else "read"):  # the monitor's stages
            shard = self.reader.build(spec)
        with timed("build"):
            shard = (shard if self.reader.keeps_ids else shard.without_ids()).shared()
            self.channel.publish(shard, spec)
            self._serve(shard, spec)  # the old shard is unmapped here, once the new one exists
        self._seen = self.channel.seen
        return_freed_memory()

    def _hold(self, spec: ShardSpec) -> None:
        """:meth:`_load` for the shard already held, without building it again (the audit and the agreement stay)."""
        self.channel.check_owner()
        self.channel.judge()
        self._agree(spec)

    def _agree(self, spec: ShardSpec) -> None:
        """Under a process group, every rank must plan from the same inputs: check it."""
        if not agreement_needed():
            return
        context = _files_context(self.reader)
        if _is_collective(self.reader):  # on the reader's group, within its timeout
            with self.reader.collective("the agreement check", spec.epoch):
                check_ranks_agree(self._agreement_fields(spec), spec.rank, self.reader.group, context)
        else:
            check_ranks_agree(self._agreement_fields(spec), spec.rank, self._process_group, context)

    def _agreement_fields(self, spec: ShardSpec) -> dict[str, object]:
        dataset = f"{type(self).__module__}.{type(self).__qualname__}"
        fields = agreement_fields(spec, self.reader.fingerprint, dataset)
        if self._book.exclusion_fingerprint is not None:
            fields["exclude"] = self._book.exclusion_fingerprint
        return fields

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to reach a spawn or forkserver worker: the channel's handle, never a shard's bytes.
        state = self.__dict__.copy()
        for name in ("_version", "_shard", "_text", "_indices", "_source_ids", "_tally", "_process_group"):
            state.pop(name, None)
        # The FailureBook goes without its records or what is left out: workers never plan. It, the reader and
        # the meta files go as one pickle the worker unpickles on first use (see _RankSide).
        held = {k: state.pop(k) for k in [k for k in state if k.startswith("_held_")]}
        if held:
            state["_deferred"] = Deferred(held, state)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        deferred = state.get("_deferred")
        if deferred is not None:
            deferred.bind(dict(state))  # the objects it names: these, as unpickled (not as they change later)
        self.__dict__.update(state)
        self._process_group = None  # a worker joins no collective
        self._version, self._seen = self.channel.version, self.channel.seen  # -1: look on first use
        self._tally = self.channel.tally
        self._shard = self._text = None  # type: ignore[assignment]  # mapped on first use
        self._indices = self._source_ids = None

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
        old = self._spec
        self._spec = dataclasses.replace(old, steps=steps, resume=None)
        try:  # built even where the window is the one held: the shard held is of the other layout
            self._move(epoch, mini_epoch_idx, reuse=False)
        except BaseException:
            self._spec = old
            raise

    def _move(self, epoch: int, mini_epoch_idx: int, *, reuse: bool) -> None:
        epoch = check_int("epoch", epoch, low=0)
        spec = self._spec
        resume = spec.resume if epoch == spec.epoch else None
        new = dataclasses.replace(spec, epoch=epoch, mini_epoch_idx=mini_epoch_idx, resume=resume)
        with timed("set_epoch"):  # the monitor's stage: what the stages timed inside it leave
            if reuse and new == spec:  # the shard held (the constructor's, at the first set_epoch(0))
                self._hold(spec)
            elif self._policy.exclude_failures and epoch != spec.epoch:  # a new epoch: plan without what failed
                with self._book.replanned(new, self._book.agreed()) as new:
                    self._load(new)
            else:
                self._load(new)

    # -- the pass audit ---------------------------------------------------------------------------

    def audit(self) -> tuple[PassCount, ...]:
        """The counts of the recent passes over this dataset started by rank_dataset's samplers (up to
        16, oldest first): for each, the indices its sampler drew, the items the DataLoader's workers
        (or the rank, without workers) read, and whether it finished, was left early or is running.

        A finished pass that read fewer or more items than it drew warns once (a
        :class:`~rank_dataset.errors.PassAuditWarning`; with ``audit="error"`` a
        :class:`~rank_dataset.errors.PassAuditError`), when the next pass starts or at ``set_epoch``
        or ``load_state_dict``: the loader was most likely sharded a second time. Call it in the
        process that created the dataset.
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

    meta: _RankSide[MetaFile | None] = _RankSide()

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
    ) -> None:
        from rank_dataset.training._readers import reader_for

        shards, sources, self.meta = reader_for(
            meta_file, reader, columns, group, timeout_timedelta(timeout), storage_options
        )
        try:
            super().__init__(
                shards,
                is_test=is_test,
                reload_cfg=reload_cfg,
                rank=rank,
                world_size=world_size,
                parser=parser,
                sources=sources,
                audit=audit,
                group=group,
                exclude=exclude,
                transform=transform,
                on_error=on_error,
                max_failures=max_failures,
                exclude_failures=exclude_failures,
            )
        except BaseException:
            close = getattr(shards, "close", None)
            if close is not None:
                close()
            raise

    def close(self) -> None:
        """Free what the reader holds beyond the shard (the collective reader's gloo group). Every rank
        should close together; a closed dataset keeps serving its shard but cannot load another."""
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


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
