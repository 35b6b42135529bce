"""PyTorch Lightning: a LightningDataModule that keeps rank_dataset's sharding, epochs and exact resume.

Left alone, Lightning wraps the loader's sampler in a ``DistributedSampler``, never calls the dataset's
``set_epoch`` and checkpoints nothing of where the data stood; :class:`RankDataModule` answers each. Import it
explicitly (``from rank_dataset.training.lightning import RankDataModule``): ``import rank_dataset`` does not
import Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from rank_dataset.core.checks import check_int
from rank_dataset.plan.resume import ResumeState
from rank_dataset.training.dataset import ShardedDataset
from rank_dataset.training.sampler import ResumableSampler

__all__ = ["RankDataModule"]

_STATE_VERSION = 1
# DataLoader arguments the module sets itself: the sampler is what keeps the sharding and the epochs.
_OWN_ARGS = frozenset({"sampler", "batch_sampler", "shuffle", "batch_size", "dataset"})


class _EpochSampler(ResumableSampler):
    """The shard in order (the shard is already a shuffled slice), with Lightning's epochs.

    Lightning calls ``set_epoch(e)`` on a loader's sampler before each epoch (``e`` counts every
    epoch run so far); here that loads mini-epoch ``e % M`` of epoch ``e // M`` into the dataset.
    ``skipped`` items are counted in the length but never drawn: in an epoch resumed mid-way, they
    stand for the batches Lightning already counts as done, so that its count of the epoch's batches
    comes out right (a StatefulDataLoader keeps its length the same way).
    """

    def __init__(self, data_source: ShardedDataset) -> None:
        super().__init__(data_source)
        self.skipped = 0

    @property
    def lightning_epoch(self) -> int:
        """The Lightning epoch whose shard the dataset holds."""
        spec = self.data_source.spec
        return spec.epoch * spec.mini_epoch + spec.mini_epoch_idx

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, low=0)
        if epoch != self.lightning_epoch:
            self.data_source.set_epoch(*divmod(epoch, self.data_source.spec.mini_epoch))
            self.skipped = 0

    def __len__(self) -> int:
        return self.skipped + len(self.data_source)


class _ResumableLoader(DataLoader[Any]):
    """A DataLoader that tells Lightning it is resumable: the resume point itself is in the
    RankDataModule's state, restored before the loader is built, so the loader's own is empty."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class RankDataModule(pl.LightningDataModule):
    """Train on a RankDataset (or RankServerDataset) under ``lightning.Trainer``, any strategy.

    One Lightning epoch is one mini-epoch: with ``M`` mini-epochs (``reload_cfg["mini_epoch"]``),
    Lightning epoch ``e`` reads mini-epoch ``e % M`` of epoch ``e // M``, so ``max_epochs=epochs * M``.
    The loader reads the shard in order (it is already a shuffled slice of the data, a fresh one each
    mini-epoch), so that a checkpoint taken mid-epoch resumes exactly after the last trained batch,
    on the same or another number of processes. Every rank reads the same number of batches.

    Args:
        train: the training dataset, or a function that builds it. Pass a function when the
            processes are started by Lightning (``strategy="ddp"`` run as ``python train.py``, or
            ``"ddp_spawn"``): it is called in ``setup``, once the process group exists, so that each
            process finds its rank. A dataset built before ``Trainer.fit`` is fine under torchrun
            or SLURM, where each process knows its rank from the start.
        batch_size: items per batch on each rank.
        **loader_kwargs: further DataLoader arguments (``num_workers``, ``persistent_workers``,
            ``collate_fn``, ``pin_memory``, ``drop_last``...); not ``sampler``, ``batch_sampler``,
            ``shuffle`` or ``batch_size``.

    The Trainer must have ``use_distributed_sampler=False`` (else Lightning would shard each rank's
    shard again): ``setup`` raises a ValueError otherwise. Validation loaders are the model's own
    (``val_dataloader``); a ``RankDataset(..., is_test=True)`` with a plain DataLoader gives each rank
    its block.

    Example::

        dm = RankDataModule(lambda: RankDataset("meta.txt", reload_cfg={"mini_epoch": 2}, parser="label"),
                            batch_size=32, num_workers=2, persistent_workers=True)
        trainer = lightning.Trainer(max_epochs=10 * 2, strategy="ddp", use_distributed_sampler=False)
        trainer.fit(model, datamodule=dm)                    # and to resume: ckpt_path="last.ckpt"
    """

    def __init__(
        self, train: ShardedDataset | Callable[[], ShardedDataset], *, batch_size: int, **loader_kwargs: Any
    ) -> None:
        super().__init__()
        if not (isinstance(train, ShardedDataset) or callable(train)):
            raise TypeError(
                f"train must be a RankDataset or RankServerDataset, or a function returning one; got {train!r}"
            )
        own = sorted(_OWN_ARGS & set(loader_kwargs))
        if own:
            raise TypeError(f"RankDataModule sets {', '.join(own)} itself (the sampler keeps the sharding and epochs)")
        self.batch_size = check_int("batch_size", batch_size, low=1)
        self.loader_kwargs = loader_kwargs
        self._factory = None if isinstance(train, ShardedDataset) else train
        self._dataset = train if isinstance(train, ShardedDataset) else None
        self._sampler: _EpochSampler | None = None if self._dataset is None else self._make_sampler(self._dataset)

    @staticmethod
    def _make_sampler(dataset: object) -> _EpochSampler:
        if not isinstance(dataset, ShardedDataset):
            raise TypeError(f"the train function must return a RankDataset or RankServerDataset, got {dataset!r}")
        if dataset.is_test:
            raise ValueError("the train dataset is an eval dataset (is_test=True): it has no epochs to train on")
        return _EpochSampler(dataset)

    @property
    def dataset(self) -> ShardedDataset:
        """The training dataset (built by ``setup`` when given as a function)."""
        if self._sampler is None:
            raise RuntimeError("the training dataset is built in setup(): call trainer.fit(model, datamodule=...)")
        return self._sampler.data_source

    def setup(self, stage: str) -> None:
        if stage != "fit":
            return
        trainer = self.trainer
        # On one device too: a script tried on one must not fail only once it runs on eight.
        if trainer is not None:
            connector = getattr(trainer, "_accelerator_connector", None)
            if getattr(connector, "use_distributed_sampler", False):
                raise ValueError(
                    "RankDataModule needs lightning.Trainer(..., use_distributed_sampler=False): each rank already "
                    "holds only its own shard, and Lightning's DistributedSampler would give each rank 1/world_size "
                    "of it (and never call the dataset's set_epoch)"
                )
        if self._sampler is None:
            assert self._factory is not None
            self._sampler = self._make_sampler(self._factory())
        # A fresh run starts at Lightning's epoch 0; a resumed one is moved by load_state_dict, after this.
        self._sampler.set_epoch(trainer.current_epoch if trainer is not None else 0)

    def train_dataloader(self) -> DataLoader[Any]:
        return _ResumableLoader(self.dataset, batch_size=self.batch_size, sampler=self._sampler, **self.loader_kwargs)

    def _batches(self, items: int) -> int:
        drop_last = bool(self.loader_kwargs.get("drop_last", False))
        return items // self.batch_size if drop_last else -(-items // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """Where the data stands: the Lightning epoch the dataset holds, the batches of it trained,
        and the dataset's resume point after them (None when the epoch is complete: the next
        starts)."""
        sampler = self._sampler
        if sampler is None or self.trainer is None:
            return {}
        epoch = sampler.lightning_epoch
        # Lightning counts a batch processed once its training step ran: what a checkpoint holds.
        done = int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)  # type: ignore[attr-defined]
        skipped_batches = sampler.skipped // self.batch_size
        this_run = max(0, done - skipped_batches)  # batches read from the shard held now
        if this_run >= self._batches(len(self.dataset)):
            return {"version": _STATE_VERSION, "epoch": epoch + 1, "batches": 0, "resume": None}
        consumed = min(this_run * self.batch_size, len(self.dataset))
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches": done,
            "resume": self.dataset.state_dict(consumed=consumed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move the dataset to where ``state`` stands (called by Lightning when a run resumes from a
        checkpoint, before the loader is built)."""
        if not state:
            return
        if state.get("version") != _STATE_VERSION:
            version = state.get("version")
            raise ValueError(f"a RankDataModule state of version {version!r}; this one reads {_STATE_VERSION}")
        if self._sampler is None:
            raise RuntimeError("load_state_dict before setup(): the training dataset does not exist yet")
        epoch = check_int("epoch", state["epoch"], low=0)
        batches = check_int("batches", state["batches"], low=0)
        if state["resume"] is None:
            self._sampler.set_epoch(epoch)
            return
        resume = ResumeState.from_dict(state["resume"])
        if resume.epoch * resume.mini_epoch + resume.mini_epoch_idx != epoch:
            raise ValueError(
                f"this RankDataModule state says Lightning epoch {epoch}, but its resume point is for "
                f"epoch {resume.epoch}, mini-epoch {resume.mini_epoch_idx} of {resume.mini_epoch}"
            )
        self.dataset.load_state_dict(state["resume"])
        self._sampler.skipped = batches * self.batch_size
