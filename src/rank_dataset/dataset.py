"""RankDataset: a map-style torch Dataset holding only this rank's shard of the meta files."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from rank_dataset._agree import agreement_needed, check_ranks_agree
from rank_dataset._checks import check_index, check_int
from rank_dataset._residency import return_freed_memory
from rank_dataset.config import ReloadConfig
from rank_dataset.metafile import MetaFile
from rank_dataset.mix import MixPlan, Source, SourceInfo, combine_fingerprints, mix_targets
from rank_dataset.parsers import LineError, Parser, resolve_parser
from rank_dataset.plan import ShardSpec
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
            if any(s.parser is not None for s in sources):
                own = [resolve_parser(s.parser) for s in sources]
                self._parsers = tuple(self._parser if p is None else p for p in own)
            self._source_dtype = _source_id_dtype(len(sources))
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
        )
        self._load(spec)

    # -- the plan ---------------------------------------------------------------------------------

    @property
    def spec(self) -> ShardSpec:
        """The ShardSpec of the shard held now."""
        return self._spec

    @property
    def reload_cfg(self) -> ReloadConfig:
        """The ``reload_cfg`` of the shard held now (read-only: change it with ``set_epoch`` or
        ``load_state_dict``)."""
        s = self._spec
        return ReloadConfig(s.mini_epoch, s.seed, s.mini_epoch_idx, s.epoch, self._group, self._epoch_size)

    @property
    def rank(self) -> int:
        return self._spec.rank

    @property
    def world_size(self) -> int:
        return self._spec.world_size

    @property
    def is_test(self) -> bool:
        return self._spec.is_test

    def _load(self, spec: ShardSpec) -> None:
        """Build the shard of ``spec`` and hold it; on any error the dataset stays as it was."""
        if agreement_needed():  # under a process group, every rank must plan from the same inputs
            check_ranks_agree(self._agreement_fields(spec), spec.rank)
        shard = self._build(spec)
        source_ids = None
        if spec.mix is not None:
            assert shard.ids is not None
            source_ids = spec.mix.source_of(shard.ids).astype(self._source_dtype)
            source_ids.flags.writeable = False
        # The old shard is freed here, once the new one exists.
        self._shard, self._n, self._spec, self._source_ids = shard, len(shard), spec, source_ids
        return_freed_memory()

    def _agreement_fields(self, spec: ShardSpec) -> dict[str, object]:
        """What every rank must agree on before building ``spec``: the files, and the plan but the rank."""
        plan = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "rank"}
        fields = {"num_samples": spec.num_samples, "fingerprint": self._fingerprint(), **plan}
        return {**fields, "dataset": f"{type(self).__module__}.{type(self).__qualname__}"}

    def _build(self, spec: ShardSpec) -> Shard:
        raise NotImplementedError

    def _where(self, sample: int) -> str:
        return f"sample {sample}"

    def _fingerprint(self) -> str | None:
        """A hash identifying the meta files (None: unknown); resume states are checked against it."""
        return None

    def _source_fingerprints(self) -> tuple[str, ...]:
        """For a mix, the fingerprint of each source's files (see ``combine_fingerprints``)."""
        raise NotImplementedError

    @functools.cached_property
    def _mix_fingerprints(self) -> tuple[str, ...]:
        return self._source_fingerprints()

    # -- the mix ----------------------------------------------------------------------------------

    @property
    def sources(self) -> tuple[SourceInfo, ...] | None:
        """For a mix, each source with its numbers: ``N_s`` (``num_samples``), the samples an epoch
        takes of it (``count``; in eval mode ``N_s``), its first global sample number (``offset``),
        what its rule asked for before rounding (``target``) and its fingerprint. None for plain
        meta files."""
        mix, sources = self._spec.mix, self._sources
        if mix is None or sources is None:
            return None
        targets = list(map(float, mix.sizes)) if self.is_test else mix_targets(mix.sizes, sources, mix.counts)
        return tuple(
            SourceInfo(source, n, c, offset, target, fingerprint)
            for source, n, c, offset, target, fingerprint in zip(
                sources, mix.sizes, mix.counts, mix.offsets, targets, self._mix_fingerprints
            )
        )

    @property
    def source_ids(self) -> npt.NDArray[np.integer[Any]] | None:
        """For a mix, a read-only integer array: the source number of each item (``self[i]`` is a sample
        of ``sources[source_ids[i]]``). None for plain meta files."""
        return self._source_ids

    def _mix_record(self) -> MixRecord | None:
        mix, sources = self._spec.mix, self._sources
        if mix is None or sources is None:
            return None
        records = zip(sources, mix.sizes, self._mix_fingerprints, mix.counts)
        return MixRecord(mix.epoch_size, tuple(SourceRecord(s.name, n, f, c) for s, n, f, c in records))

    def _state_fingerprint(self) -> str | None:
        """The fingerprint a resume state records: the files', or for a mix one of its sources'."""
        if self._spec.mix is not None:
            return combine_fingerprints(self._mix_fingerprints)
        return self._fingerprint()

    def set_epoch(self, epoch: int, mini_epoch_idx: int = 0) -> None:
        """Load this rank's shard of ``(epoch, mini_epoch_idx)`` in place of the current one.

        Within an epoch resumed by :meth:`load_state_dict`, the plan keeps the boundaries that epoch
        started with. Call it before building the DataLoader of each epoch and mini-epoch (a
        DataLoader with ``persistent_workers=True`` would keep the old shard in its workers).
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
        return self._shard

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        """Read-only int64 array of global sample numbers: ``self[i]`` is sample ``indices[i]``."""
        ids = self._shard.ids
        if ids is None:  # pragma: no cover - every shard of a dataset carries its sample numbers
            raise RuntimeError("this shard carries no sample numbers")
        return ids

    def __len__(self) -> int:
        return self._n

    def _check_index(self, i: Any) -> int:
        n = self._n
        return check_index(i, n, label="dataset index", of=f"a shard of {n} samples")

    def _parse(self, text: str, i: int) -> Any:
        if self._parsers is not None:  # a mix with parsers of its own: item i's source chooses
            assert self._source_ids is not None
            parser = self._parsers[self._source_ids[i]]
        else:
            parser = self._parser
        if parser is None:
            return text
        try:
            return parser(text)
        except LineError as exc:
            raise ValueError(f"{self._where(int(self.indices[i]))}: {exc}") from None

    def __getitem__(self, i: int) -> Any:
        # Once per sample: the inline check is the fast path, the shard does the slicing.
        if not (type(i) is int and 0 <= i < self._n):
            i = self._check_index(i)
        text = self._shard.text(i)
        return text if self._parser is None and self._parsers is None else self._parse(text, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once (torch's DataLoader calls this with each batch of indices)."""
        n = self._n
        if not all(type(i) is int and 0 <= i < n for i in indices):
            indices = [self._check_index(i) for i in indices]
        texts = self._shard.texts(indices)
        if self._parser is None and self._parsers is None:
            return texts
        return [self._parse(t, i) for t, i in zip(texts, indices)]

    def __repr__(self) -> str:
        s = self._spec
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
        return self.meta.read(spec.indices())

    def _where(self, sample: int) -> str:
        return self.meta.where(sample)

    def _fingerprint(self) -> str | None:
        return self.meta.fingerprint

    def _source_fingerprints(self) -> tuple[str, ...]:
        files = self.meta.file_fingerprints
        return tuple(combine_fingerprints(files[a:b]) for a, b in self._source_files)
