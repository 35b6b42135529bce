"""RankDataset: a map-style torch Dataset holding only this rank's shard of the meta files."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from rank_dataset._checks import check_index, check_int
from rank_dataset._malloc import return_freed_memory
from rank_dataset.config import ReloadConfig
from rank_dataset.index import MetaFile
from rank_dataset.parsers import LineError, Parser, resolve_parser
from rank_dataset.plan import ShardSpec
from rank_dataset.shard import Shard
from rank_dataset.topology import get_rank_world_size

__all__ = ["STATE_VERSION", "RankDataset"]

#: The format version of resume states; a state of another version is refused.
STATE_VERSION = 1
_STATE_KEYS = (
    "version",
    "num_samples",
    "fingerprint",
    "seed",
    "epoch",
    "mini_epoch",
    "mini_epoch_idx",
    "plan_world_size",
    "consumed_positions",
)

MetaSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | MetaFile


class ShardedDataset(Dataset[Any]):
    """What RankDataset and RankServerDataset share: a shard, its plan, item access and parsing."""

    def __init__(
        self,
        num_samples: int,
        is_test: bool,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None,
        rank: int | None,
        world_size: int | None,
        parser: str | Parser | None,
    ) -> None:
        self.reload_cfg = ReloadConfig.coerce(reload_cfg)
        self.rank, self.world_size = get_rank_world_size(rank, world_size)
        if not isinstance(is_test, bool):
            raise TypeError(f"is_test must be a bool, got {is_test!r}")
        self.is_test = is_test
        self.num_samples = num_samples
        self._parser = resolve_parser(parser)
        self._shard: Shard | None = None
        self._resume: dict[str, int] | None = None  # the resume point of an epoch, after load_state_dict
        self._load(self.reload_cfg.epoch, self.reload_cfg.mini_epoch_idx)

    # -- the plan ---------------------------------------------------------------------------------

    @property
    def spec(self) -> ShardSpec:
        """The ShardSpec of the shard held now."""
        return self._spec

    def _spec_for(self, epoch: int, mini_epoch_idx: int) -> ShardSpec:
        cfg = self.reload_cfg
        # Within the epoch it resumed, the plan keeps the boundaries the epoch started with.
        resume: dict[str, int] = {"epoch": epoch}
        if self._resume is not None and self._resume["epoch"] == epoch:
            resume = dict(self._resume)
        return ShardSpec(
            num_samples=self.num_samples,
            world_size=self.world_size,
            rank=self.rank,
            is_test=self.is_test,
            mini_epoch=cfg.mini_epoch,
            mini_epoch_idx=mini_epoch_idx,
            seed=cfg.seed,
            **resume,
        )

    def _load(self, epoch: int, mini_epoch_idx: int) -> None:
        spec = self._spec_for(epoch, mini_epoch_idx)
        self._shard = self._build(spec)  # the old shard is freed here, once the new one exists
        self._bind_fast_path()
        return_freed_memory()
        self._spec = spec
        self.reload_cfg = self.reload_cfg.replace(epoch=epoch, mini_epoch_idx=mini_epoch_idx)

    def _build(self, spec: ShardSpec) -> Shard:
        raise NotImplementedError

    def _where(self, sample: int) -> str:
        return f"sample {sample}"

    def _fingerprint(self) -> str | None:
        """A hash identifying the meta files (None: unknown); resume states are checked against it."""
        return None

    # -- resume -----------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The resume point after every rank consumed ``consumed`` samples of its current shard.

        A small JSON-serialisable dict, the same on every rank (so rank 0 alone can save it). It
        names positions of the epoch order, not ranks, so it can be loaded on any world size.
        Called with no argument (as torchdata's StatefulDataLoader calls every dataset that has a
        ``state_dict``), it returns ``{}``: the resume point then lives in ResumableSampler's state.

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
        return {
            "version": STATE_VERSION,
            "num_samples": spec.num_samples,
            "fingerprint": self._fingerprint(),
            "seed": spec.seed,
            "epoch": spec.epoch,
            "mini_epoch": spec.mini_epoch,
            "mini_epoch_idx": spec.mini_epoch_idx,
            "plan_world_size": spec.plan_world_size or spec.world_size,
            "consumed_positions": spec.consumed_positions(consumed),
            "world_size": spec.world_size,
            "consumed": consumed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a resume point saved by :meth:`state_dict`, on this world size.

        This rank gets its share of what was left of the interrupted mini-epoch (all ranks equally
        long, padded by wrapping within it). Afterwards ``set_epoch(same_epoch, later_idx)`` keeps
        the boundaries that epoch started with, and ``set_epoch(next_epoch)`` plans afresh. The
        state's seed and mini-epoch count replace this dataset's. ``{}`` is ignored.

        Raises:
            ValueError: a state for other files (number of samples or fingerprint), of another
                format version, or with missing keys.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if not state:
            return
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"not a resume state of this library: missing {', '.join(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"resume state version {state['version']!r} is unknown; this version reads {STATE_VERSION}"
            )
        if state["num_samples"] != self.num_samples:
            raise ValueError(
                f"the resume state is for {state['num_samples']} samples, but these meta files hold {self.num_samples}"
            )
        mine = self._fingerprint()
        if state["fingerprint"] is not None and mine is not None and state["fingerprint"] != mine:
            raise ValueError(
                f"the resume state is for other meta files: fingerprint {state['fingerprint']} != {mine} "
                "(same number of samples, different contents or sizes)"
            )
        self.reload_cfg = self.reload_cfg.replace(
            seed=state["seed"], mini_epoch=state["mini_epoch"], mini_epoch_idx=state["mini_epoch_idx"]
        )
        resume = {
            "epoch": state["epoch"],
            "plan_world_size": state["plan_world_size"],
            "resume_mini_epoch_idx": state["mini_epoch_idx"],
            "resume_offset": state["consumed_positions"],
        }
        previous, self._resume = self._resume, resume
        try:
            self._load(state["epoch"], state["mini_epoch_idx"])
        except (TypeError, ValueError):
            self._resume = previous
            raise

    def set_epoch(self, epoch: int, mini_epoch_idx: int = 0) -> None:
        """Load this rank's shard of ``(epoch, mini_epoch_idx)`` in place of the current one.

        Call it before building the DataLoader of each epoch and mini-epoch (a DataLoader with
        ``persistent_workers=True`` would keep the old shard in its workers).
        """
        self._load(epoch, mini_epoch_idx)

    # -- items ------------------------------------------------------------------------------------

    @property
    def shard(self) -> Shard:
        """The shard held now."""
        assert self._shard is not None  # set in __init__
        return self._shard

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        """Read-only int64 array of global sample numbers: ``self[i]`` is sample ``indices[i]``."""
        ids = self.shard.ids
        assert ids is not None  # every shard of a dataset carries its sample numbers
        return ids

    def __len__(self) -> int:
        return len(self.shard)

    def _check_index(self, i: Any) -> int:
        n = len(self.shard)
        return check_index(i, n, label="dataset index", of=f"a shard of {n} samples")

    def _parse(self, text: str, i: int) -> Any:
        if self._parser is None:
            return text
        try:
            return self._parser(text)
        except LineError as exc:
            raise ValueError(f"{self._where(int(self.indices[i]))}: {exc}") from None

    def _bind_fast_path(self) -> None:
        # Plain references for __getitem__, which runs once per sample: every attribute lookup and
        # call saved there is worth it (memoryviews index to plain ints and slice without copying).
        shard = self.shard
        self._fast = (len(shard), shard._raw, shard._offset, shard._mv_starts, shard._mv_ends)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_fast"}  # memoryviews do not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind_fast_path()

    def __getitem__(self, i: int) -> Any:
        n, raw, offset, starts, ends = self._fast
        if type(i) is int and 0 <= i < n:
            text = raw[offset + starts[i] : offset + ends[i]].decode()
        else:
            i = self._check_index(i)
            text = self.shard.text(i)
        return text if self._parser is None else self._parse(text, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once (torch's DataLoader calls this with each batch of indices)."""
        n, raw, offset, starts, ends = self._fast
        if all(type(i) is int and 0 <= i < n for i in indices):
            checked = indices
            texts = [raw[offset + starts[i] : offset + ends[i]].decode() for i in indices]
        else:
            checked = [self._check_index(i) for i in indices]
            texts = self.shard.texts(checked)
        if self._parser is None:
            return texts
        return [self._parse(t, i) for t, i in zip(texts, checked)]

    def __repr__(self) -> str:
        s = self._spec
        mode = "eval" if s.is_test else f"epoch={s.epoch}, mini_epoch={s.mini_epoch_idx}/{s.mini_epoch}"
        return f"{type(self).__name__}(rank={s.rank}/{s.world_size}, {mode}, samples={len(self)}/{s.num_samples})"


class RankDataset(ShardedDataset):
    """This rank's shard of one or more meta files, as a map-style torch Dataset.

    Each rank holds only its own ``ceil(N / (world_size * mini_epoch))`` samples (or its contiguous
    block in eval mode), read from the files through a cached line-offset index and kept in compact
    numpy buffers that DataLoader workers share.

    Args:
        meta_file: a path, a list of paths (taken as one file, in order), or a MetaFile.
        is_test: eval layout: no shuffle, no padding, one contiguous block per rank.
        reload_cfg: a dict or ReloadConfig with ``mini_epoch``, ``seed``, ``mini_epoch_idx``,
            ``epoch`` and ``group`` (see ReloadConfig).
        rank: this rank; default: the process group, else ``RANK``, else 0.
        world_size: the number of ranks; default: the process group, else ``WORLD_SIZE``, else 1.
        parser: None (items are str), ``"json"``, ``"label"`` (``(path, int)``), or a callable.

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
        self.meta = meta_file if isinstance(meta_file, MetaFile) else MetaFile(meta_file)
        super().__init__(len(self.meta), is_test, reload_cfg, rank, world_size, parser)

    def _build(self, spec: ShardSpec) -> Shard:
        return Shard.from_meta(self.meta, spec.indices())

    def _where(self, sample: int) -> str:
        return self.meta.where(sample)

    def _fingerprint(self) -> str | None:
        return self.meta.fingerprint
