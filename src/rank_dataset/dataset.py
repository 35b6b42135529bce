"""RankDataset: a map-style torch Dataset holding only this rank's shard of the meta files."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from rank_dataset import _shm
from rank_dataset._agree import agreement_needed, check_ranks_agree
from rank_dataset._checks import check_index, check_int
from rank_dataset._control import ControlBlock
from rank_dataset._residency import return_freed_memory
from rank_dataset.config import ReloadConfig
from rank_dataset.metafile import MetaFile
from rank_dataset.mix import MixPlan, Source, SourceInfo, combine_fingerprints, mix_draws, mix_targets
from rank_dataset.parsers import LineError, Parser, resolve_parser
from rank_dataset.plan import ResumePoint, ShardSpec
from rank_dataset.resume import MixRecord, ResumeState, SourceRecord
from rank_dataset.shard import Shard
from rank_dataset.topology import get_rank_world_size

__all__ = ["RankDataset", "ShardedDataset"]

MetaSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | MetaFile | Source | Sequence[Source]


def as_sources(value: Any) -> tuple[Source, ...] | None:
    """``value`` as a tuple of Sources if it is a Source or a list of them; None if it holds none.

    Raises:
        TypeError: a list that holds Sources and other things.
    """
    if isinstance(value, Source):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        kinds = [isinstance(v, Source) for v in value]
        if all(kinds):
            return tuple(value)
        if any(kinds):
            bad = next(v for v, k in zip(value, kinds) if not k)
            raise TypeError(f"a list of sources must hold only Source objects, got {bad!r}: wrap each path in a Source")
    return None


def _source_id_dtype(count: int) -> np.dtype[Any]:
    """The smallest signed dtype holding source numbers ``[0, count)``."""
    for dtype in (np.int8, np.int16, np.int32):
        if count <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)  # pragma: no cover - more than 2**31 sources


class ShardedDataset(Dataset[Any]):
    """What RankDataset and RankServerDataset share: a shard, its plan, item access and parsing.

    The plan lives in one place, the ShardSpec of the shard held now (``spec``); ``reload_cfg``,
    ``rank``, ``world_size`` and ``is_test`` are read from it.

    For a mix, ``sources`` are the Sources and ``source_sizes`` their ``N_s``; the global sample
    numbers are then over the sources' files in source order, ``num_samples`` is ``sum(N_s)``, and
    the spec carries the mix (its ``num_samples`` being the epoch size ``T0``).

    Shards and DataLoader workers. The process that creates the dataset (the rank) builds every
    shard straight into shareable memory and publishes it in a small control block (see
    :mod:`rank_dataset._control`) under a new *generation*. A DataLoader worker holds a view of the
    dataset (forked, or unpickled from a handle under spawn and forkserver): on each item it compares
    one word of the control block with what it saw last, and when it changed it maps the shard it
    should now serve and unmaps the one it held. Which one: rank_dataset's samplers record, when a
    pass starts, the shard current then, and workers serve that shard for the whole pass (a
    ``set_epoch`` during a pass takes effect in workers at the next pass). Workers of a DataLoader
    whose sampler is not one of ours cannot tell passes apart: they serve the shard they started
    with and raise if it is replaced under them. The rank keeps a replaced shard reachable until the
    next pass starts (a running pass may still need it), then releases it; each worker unmaps it
    when it first serves the new pass.
    """

    def __init__(
        self,
        num_samples: int,
        is_test: bool,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None,
        rank: int | None,
        world_size: int | None,
        parser: str | Parser | None,
        sources: Sequence[Source] | None = None,
        source_sizes: Sequence[int] | None = None,
    ) -> None:
        cfg = ReloadConfig.coerce(reload_cfg)
        rank, world_size = get_rank_world_size(rank, world_size)
        if not isinstance(is_test, bool):
            raise TypeError(f"is_test must be a bool, got {is_test!r}")
        self.num_samples = num_samples
        self._group = cfg.group
        self._epoch_size = cfg.epoch_size
        self._parser = resolve_parser(parser)
        self._sources: tuple[Source, ...] | None = None
        self._parsers: tuple[Parser | None, ...] | None = None
        mix = None
        if sources is None:
            if cfg.epoch_size is not None:
                raise ValueError(
                    "reload_cfg['epoch_size'] sets the epoch size of a mix: give a list of Source "
                    "(e.g. [Source(path, weight=1)]) to resample plain meta files"
                )
        else:
            assert source_sizes is not None and len(source_sizes) == len(sources)
            for i, (source, n) in enumerate(zip(sources, source_sizes)):
                if n == 0:
                    raise ValueError(f"source {i} {source.name!r} has no samples: every line is empty or whitespace")
            self._sources = tuple(sources)
            # Eval mode ignores weights: every sample of every source once, sources in order.
            mix = (
                MixPlan.every_sample(source_sizes)
                if is_test
                else MixPlan.from_sources(source_sizes, sources, cfg.epoch_size)
            )
            num_samples = mix.epoch_size
            if not is_test:  # a source too small for one draw of k copies, by its name
                for counts in (mix.counts, *(c for _, c in mix.changes)):
                    mix_draws(counts, cfg.aug_repeats, [s.name for s in sources])
            if any(s.parser is not None for s in sources):
                own = [resolve_parser(s.parser) for s in sources]
                self._parsers = tuple(self._parser if p is None else p for p in own)
            self._source_dtype = _source_id_dtype(len(sources))
        # Sharing with DataLoader workers (see the class docstring).
        self._ctl = ControlBlock.create()
        self._word = self._ctl.words  # word 0: the control block's version
        self._owner, self._owner_pid = True, os.getpid()
        self._gen = 0  # generation of the shard served here
        self._seen = 0  # the control block version this process last acted on
        self._passes = 0  # passes started by our samplers, as last seen here
        self._pass_gen = 0  # (rank) the shard the latest of those passes started with
        self._pass_open = 0  # (rank) the pass whose sampler is running, 0: none
        self._managed = False  # (worker) passes are started by our samplers
        self._kept: dict[int, _shm.Segment] = {}  # (rank) segments of shards a pass may need
        self._indices: npt.NDArray[np.int64] | None = None
        self._source_ids: npt.NDArray[np.integer[Any]] | None = None
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

    # -- the plan ---------------------------------------------------------------------------------

    @property
    def spec(self) -> ShardSpec:
        """The ShardSpec of the shard held now."""
        if self._word[0] != self._seen:
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
        if not self._is_owner():
            raise RuntimeError(
                "set_epoch and load_state_dict must be called in the process that created the dataset, "
                "not in a DataLoader worker or a copy of the dataset"
            )
        if agreement_needed():  # under a process group, every rank must plan from the same inputs
            check_ranks_agree(self._agreement_fields(spec), spec.rank)
        shard = self._build(spec).without_ids().shared()
        assert shard.handle is not None and shard.segment is not None
        gen = self._gen + 1
        record = json.dumps({"handle": shard.handle.to_dict(), "spec": _spec_to_dict(spec)}).encode()
        self._ctl.publish(gen, record)
        self._kept[gen] = shard.segment
        # The old shard is unmapped here, once the new one exists; its segment stays reachable for
        # workers only if a pass started with it (until the next pass starts).
        self._serve(shard, spec, gen)
        self._release(keep={gen, self._pass_gen} if self._passes else {gen})
        if not self._pass_open:
            self._seen = self._word[0]
        return_freed_memory()

    def _serve(self, shard: Shard, spec: ShardSpec, gen: int) -> None:
        self._shard, self._n, self._spec, self._gen = shard, len(shard), spec, gen
        self._indices = self._source_ids = None
        self._text = shard.text  # the shard's own slicing, bound once: item access calls it directly

    def _release(self, keep: set[int]) -> None:
        for gen in [g for g in self._kept if g not in keep]:
            self._kept.pop(gen).close()

    def _is_owner(self) -> bool:
        return self._owner and os.getpid() == self._owner_pid

    # -- passes and workers -----------------------------------------------------------------------

    def _begin_pass(self) -> int:
        """Called by our samplers as a pass starts (in the rank): workers serve the current shard
        until the next pass starts, whatever set_epoch does meanwhile. Returns a token for
        :meth:`_end_pass` (0 outside the rank: nothing is recorded)."""
        if not self._is_owner():
            return 0
        self._passes = self._ctl.start_pass()
        self._pass_gen = self._gen
        self._pass_open = self._passes
        self._release(keep={self._gen})
        self._seen = self._word[0]
        return self._passes

    def _end_pass(self, token: int) -> None:
        """Called by our samplers when their iteration ends (exhausted or closed)."""
        if token and self._pass_open == token:
            self._pass_open = 0

    def _sync(self, items: bool = False) -> None:
        """The control block changed since this process last looked: act on it.

        In the rank: nothing to switch (it always serves the current shard), but an item read
        during a pass that started with another shard and that no worker serves (a DataLoader
        without workers, after a set_epoch in mid-pass) would mix shards: that raises. In a worker:
        switch to the shard this pass serves (see the class docstring).
        """
        if self._is_owner():
            snap = self._ctl.snapshot()
            mixing = self._pass_open and self._pass_gen != self._gen and snap.joined != self._pass_open
            if mixing and items:
                raise RuntimeError(
                    "set_epoch (or load_state_dict) was called while a pass over this dataset was running in "
                    "this process (a DataLoader without workers): its remaining items would come from the new "
                    "shard. Finish or drop the pass (or its iterator) before calling set_epoch."
                )
            if not mixing:
                self._seen = snap.version
            return
        for _ in range(100):
            snap = self._ctl.snapshot()
            if snap.passes != self._passes:  # a pass started by one of our samplers: serve its shard
                target = snap.pass_gen
                managed = True
            elif self._managed or snap.gen == self._gen:
                target, managed = self._gen, self._managed
            else:
                raise RuntimeError(
                    f"the shard of this dataset was replaced (set_epoch or load_state_dict) after this DataLoader "
                    f"worker started, and the pass it serves was not started by rank_dataset's RandomSampler or "
                    f"ResumableSampler, so it cannot tell which shard the pass needs (it held generation "
                    f"{self._gen}, the dataset is at {snap.gen}). Use one of those samplers with persistent "
                    f"workers, or build a new DataLoader after each set_epoch."
                )
            if target == self._gen and self._shard is not None:
                break
            record = snap.record(target)
            try:
                if record is None:
                    raise _shm.SegmentGone(f"generation {target} is no longer published")
                info = json.loads(record)
                shard = Shard.attach(_shm.Handle.from_dict(info["handle"]))
            except _shm.SegmentGone:
                if self._ctl.snapshot().version != snap.version:
                    continue  # the rank moved on meanwhile: look again
                raise RuntimeError(
                    f"the shard (generation {target}) this DataLoader worker must serve has been released by "
                    f"the rank (pid {self._owner_pid}): a pass still running when the next one started?"
                ) from None
            self._serve(shard, _spec_from_dict(info["spec"]), target)
            break
        else:  # pragma: no cover - the rank would have to publish a hundred times during one attach
            raise RuntimeError("the dataset's control block kept changing while a worker read it")
        if managed and snap.passes != self._passes:
            self._ctl.join(snap.passes)
        self._passes, self._managed = snap.passes, managed
        self._seen = snap.version

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to reach a spawn or forkserver worker: handles only, never a shard's bytes.
        state = self.__dict__.copy()
        for name in ("_ctl", "_word", "_shard", "_text", "_kept", "_indices", "_source_ids"):
            state.pop(name, None)
        state["_ctl_handle"] = self._ctl.handle
        state["_owner"] = False
        state["_pass_open"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        handle = state.pop("_ctl_handle")
        self.__dict__.update(state)
        self._ctl = ControlBlock.attach(handle)
        self._word = self._ctl.words
        self._shard = self._text = None  # type: ignore[assignment]  # mapped on first use
        self._kept, self._indices, self._source_ids = {}, None, None
        self._seen = -1  # look at the control block on first use

    def _build(self, spec: ShardSpec) -> Shard:
        raise NotImplementedError

    def _where(self, sample: int) -> str:
        return f"sample {sample}"

    def _fingerprint(self) -> str | None:
        """A hash identifying the meta files (None: unknown); resume states are checked against it."""
        return None

    def _agreement_fields(self, spec: ShardSpec) -> dict[str, object]:
        """What every rank must agree on before building ``spec``: the files, and the plan but the rank."""
        plan = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "rank"}
        fields = {"num_samples": spec.num_samples, "fingerprint": self._fingerprint(), **plan}
        return {**fields, "dataset": f"{type(self).__module__}.{type(self).__qualname__}"}

    def _source_fingerprints(self) -> tuple[str, ...]:
        """For a mix, the fingerprint of each source's files (see ``combine_fingerprints``)."""
        raise NotImplementedError

    @functools.cached_property
    def _mix_fingerprints(self) -> tuple[str, ...]:
        return self._source_fingerprints()

    # -- the mix ----------------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[SourceInfo, ...] | None:
        """For a mix, each source with its numbers in the current epoch: ``N_s`` (``num_samples``),
        the samples the epoch takes of it (``count``, by the schedules in force; in eval mode ``N_s``),
        its first global sample number (``offset``), what its rule asked for before rounding
        (``target``), its fingerprint, and the samples drawn from it from epoch 0 through this epoch
        (``taken``; ``passes_completed``, ``epochs_seen``). None for plain meta files."""
        spec, sources = self.spec, self._sources
        mix = spec.mix
        if mix is None or sources is None:
            return None
        if spec.is_test:
            counts, targets, taken = mix.sizes, list(map(float, mix.sizes)), mix.sizes
        else:
            counts = mix.counts_at(spec.epoch)
            targets = mix_targets(mix.sizes, sources, counts, spec.epoch)
            taken = mix.stream_starts(spec.epoch + 1, spec.aug_repeats)
        return tuple(
            SourceInfo(source, n, c, offset, target, fingerprint, t)
            for source, n, c, offset, target, fingerprint, t in zip(
                sources, mix.sizes, counts, mix.offsets, targets, self._mix_fingerprints, taken
            )
        )

    @property
    def source_ids(self) -> npt.NDArray[np.integer[Any]] | None:
        """For a mix, a read-only integer array: the source number of each item (``self[i]`` is a sample
        of ``sources[source_ids[i]]``). None for plain meta files. Computed from the plan on first use
        and kept until the shard changes, like ``indices``."""
        mix = self.spec.mix
        if mix is None:
            return None
        if self._source_ids is None:
            source_ids = mix.source_of(self.indices).astype(self._source_dtype)
            source_ids.flags.writeable = False
            self._source_ids = source_ids
        return self._source_ids

    def _mix_record(self) -> MixRecord | None:
        mix, sources = self._spec.mix, self._sources
        if mix is None or sources is None:
            return None
        records = zip(sources, mix.sizes, self._mix_fingerprints, mix.counts)
        return MixRecord(mix.epoch_size, tuple(SourceRecord(s.name, n, f, c) for s, n, f, c in records), mix.changes)

    def _state_fingerprint(self) -> str | None:
        """The fingerprint a resume state records: the files', or for a mix one of its sources'."""
        if self._spec.mix is not None:
            return combine_fingerprints(self._mix_fingerprints)
        return self._fingerprint()

    def set_epoch(self, epoch: int, mini_epoch_idx: int = 0) -> None:
        """Load this rank's shard of ``(epoch, mini_epoch_idx)`` in place of the current one.

        Within an epoch resumed by :meth:`load_state_dict`, the plan keeps the boundaries that epoch
        started with. Call it between passes: one DataLoader (``persistent_workers=True`` or not)
        serves every shard if its sampler is a :class:`~rank_dataset.sampler.RandomSampler` or
        :class:`~rank_dataset.sampler.ResumableSampler`; a pass that is running when it is called
        finishes on the shard it started with. With another sampler, build a new DataLoader after
        each call (its workers would raise rather than mix shards).
        """
        epoch = check_int("epoch", epoch, low=0)
        spec = self._spec
        resume = spec.resume if epoch == spec.epoch else None
        self._load(dataclasses.replace(spec, epoch=epoch, mini_epoch_idx=mini_epoch_idx, resume=resume))

    # -- resume -----------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The resume point after every rank consumed ``consumed`` samples of its current shard.

        A small JSON-serialisable dict (:class:`~rank_dataset.resume.ResumeState`), the same on
        every rank (so rank 0 alone can save it). It names positions of the epoch order, not ranks,
        so it can be loaded on any world size. Called with no argument (as torchdata's
        StatefulDataLoader calls every dataset that has a ``state_dict``), it returns ``{}``: the
        resume point then lives in ResumableSampler's state.

        Raises:
            ValueError: ``consumed`` outside ``[0, len(self)]``, or an eval shard.

        Example:
            >>> import tempfile, os
            >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
            >>> _ = open(p, "w").write("".join(f"{i}.jpg {i}\\n" for i in range(10)))
            >>> old = RankDataset(p, rank=0, world_size=2)
            >>> state = old.state_dict(consumed=2)
            >>> new = RankDataset(p, rank=0, world_size=2)
            >>> new.load_state_dict(state)
            >>> new.indices.tolist() == old.indices[2:].tolist()
            True
        """
        if consumed is None:
            return {}
        consumed = check_int("consumed", consumed, low=0)
        if consumed > len(self):
            raise ValueError(f"consumed must be in [0, {len(self)}] (this rank's shard), got {consumed}")
        spec = self._spec
        if spec.is_test:
            raise ValueError("an eval dataset (is_test=True) has no resume point: run eval from the start")
        return ResumeState(
            num_samples=spec.num_samples,
            fingerprint=self._state_fingerprint(),
            seed=spec.seed,
            epoch=spec.epoch,
            mini_epoch=spec.mini_epoch,
            mini_epoch_idx=spec.mini_epoch_idx,
            plan_world_size=spec.resume.plan_world_size if spec.resume else spec.world_size,
            consumed_positions=spec.consumed_positions(consumed),
            world_size=spec.world_size,
            consumed=consumed,
            mix=self._mix_record(),
            aug_repeats=spec.aug_repeats,
        ).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a resume point saved by :meth:`state_dict`, on this world size.

        This rank gets its share of what was left of the interrupted mini-epoch (all ranks equally
        long, padded by wrapping within it). Afterwards ``set_epoch(same_epoch, later_idx)`` keeps
        the boundaries that epoch started with, and ``set_epoch(next_epoch)`` plans afresh. The
        state's seed and mini-epoch count replace this dataset's. ``{}`` is ignored. A state that
        fails a check leaves the dataset exactly as it was.

        Raises:
            ValueError: a state for other files (number of samples or fingerprint) or another mix (the
                message names the first source that differs), of another format version, with
                missing keys or a value out of range (the message names it), or an eval dataset.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if not state:
            return
        resume = ResumeState.from_dict(state)
        if self.is_test:
            raise ValueError("an eval dataset (is_test=True) cannot be resumed: run eval from the start")
        resume.check_files(self._spec.num_samples, self._state_fingerprint(), self._mix_record())
        self._load(resume.apply(self._spec))

    # -- items ------------------------------------------------------------------------------------

    @property
    def shard(self) -> Shard:
        """The shard held now."""
        if self._word[0] != self._seen:
            self._sync()
        return self._shard

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        """Read-only int64 array of global sample numbers: ``self[i]`` is sample ``indices[i]``.

        Computed from the plan on first use and kept until the shard changes (a shard does not store
        its sample numbers).
        """
        if self._word[0] != self._seen:
            self._sync()
        if self._indices is None:
            indices = self._spec.indices()
            indices.flags.writeable = False
            self._indices = indices
        return self._indices

    def __len__(self) -> int:
        if self._word[0] != self._seen:
            self._sync()
        return self._n

    def _check_index(self, i: Any) -> int:
        n = self._n
        return check_index(i, n, label="dataset index", of=f"a shard of {n} samples")

    def _parse(self, text: str, i: int) -> Any:
        if self._parsers is not None:  # a mix with parsers of its own: item i's source chooses
            source_ids = self.source_ids
            assert source_ids is not None
            parser = self._parsers[source_ids[i]]
        else:
            parser = self._parser
        if parser is None:
            return text
        try:
            return parser(text)
        except LineError as exc:
            raise ValueError(f"{self._where(int(self.indices[i]))}: {exc}") from None

    def __getitem__(self, i: int) -> Any:
        # Once per sample: one word of the control block says whether anything changed, the inline
        # check is the fast path, the shard does the slicing.
        if self._word[0] != self._seen:
            self._sync(items=True)
        if not (type(i) is int and 0 <= i < self._n):
            i = self._check_index(i)
        text = self._text(i)
        return text if self._parser is None and self._parsers is None else self._parse(text, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once (torch's DataLoader calls this with each batch of indices)."""
        if self._word[0] != self._seen:
            self._sync(items=True)
        n = self._n
        if not all(type(i) is int and 0 <= i < n for i in indices):
            indices = [self._check_index(i) for i in indices]
        texts = self._shard.texts(indices)
        if self._parser is None and self._parsers is None:
            return texts
        return [self._parse(t, i) for t, i in zip(texts, indices)]

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
            list of :class:`~rank_dataset.mix.Source` (each a file or several, with a weight, a
            repeat or a choose, and optionally its own parser). Items of a mix are numbered over
            the sources' files in source order (sample ``k`` of source ``s`` is
            ``sum(N_0..N_{s-1}) + k``); ``source_ids`` and ``sources`` describe them.
        is_test: eval layout: no shuffle, no padding, one contiguous block per rank (a mix then
            reads every sample of every source once, sources in order, ignoring weights).
        reload_cfg: a dict or ReloadConfig with ``mini_epoch``, ``seed``, ``mini_epoch_idx``,
            ``epoch``, ``group`` and, for a mix, ``epoch_size`` (see ReloadConfig).
        rank: this rank; default: the process group, else ``RANK``, else 0.
        world_size: the number of ranks; default: the process group, else ``WORLD_SIZE``, else 1.
        parser: None (items are str), ``"json"``, ``"label"`` (``(path, int)``), or a callable;
            in a mix, for the sources that have no parser of their own.

    Raises:
        ValueError: as MetaFile; for a mix, a source with no samples or counts that cannot be met
            (see :func:`~rank_dataset.mix.mix_counts`), the message naming the source.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"img_{i}.JPEG {i % 3}\\n" for i in range(10)))
        >>> ds = RankDataset(p, reload_cfg={"seed": 1}, rank=0, world_size=2, parser="label")
        >>> len(ds), ds[0] == ("img_%d.JPEG" % ds.indices[0], ds.indices[0] % 3)
        (5, True)
    """

    def __init__(
        self,
        meta_file: MetaSource,
        is_test: bool = False,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        parser: str | Parser | None = None,
    ) -> None:
        sources = as_sources(meta_file)
        if sources is None:
            self.meta = meta_file if isinstance(meta_file, MetaFile) else MetaFile(meta_file)  # type: ignore[arg-type]
            super().__init__(len(self.meta), is_test, reload_cfg, rank, world_size, parser)
            return
        # One MetaFile of every source's files in order: reading a shard stays MetaFile.read.
        self.meta = MetaFile([path for source in sources for path in source.paths])
        first = np.cumsum([0] + [len(s.paths) for s in sources])
        self._source_files = [(int(a), int(b)) for a, b in itertools.pairwise(first)]
        bounds = self.meta.file_bounds
        sizes = [int(bounds[b] - bounds[a]) for a, b in self._source_files]
        super().__init__(len(self.meta), is_test, reload_cfg, rank, world_size, parser, sources, sizes)

    def _build(self, spec: ShardSpec) -> Shard:
        return self.meta.read(spec.indices(), ids=False)

    def _where(self, sample: int) -> str:
        return self.meta.where(sample)

    def _fingerprint(self) -> str | None:
        return self.meta.fingerprint

    def _source_fingerprints(self) -> tuple[str, ...]:
        files = self.meta.file_fingerprints
        return tuple(combine_fingerprints(files[a:b]) for a, b in self._source_files)


def _spec_to_dict(spec: ShardSpec) -> dict[str, Any]:
    # What a worker needs of the spec, as JSON for the control block.
    d = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    d["resume"] = dataclasses.asdict(spec.resume) if spec.resume else None
    d["mix"] = spec.mix.to_dict() if spec.mix else None
    return d


def _spec_from_dict(d: dict[str, Any]) -> ShardSpec:
    resume, mix = d.pop("resume"), d.pop("mix")
    return ShardSpec(**d, resume=ResumePoint(**resume) if resume else None, mix=MixPlan.from_dict(mix) if mix else None)
