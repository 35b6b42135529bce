"""StepSampler: global batches the same on any world size, through DataLoaders and resumes (ranks in one process)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import RankDataset, Source, StepSampler, class_balanced, repeat_factor
from rank_dataset.plan.counts import batch_counts
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.steps import stream_samples

N = 37
CFG = {"mini_epoch": 3, "seed": 5}
SCHEDULE = {0: 4, 3: 8, 6: 16}


def as_list(batch: list[Any]) -> list[Any]:
    return list(batch)


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    path = tmp_path / "meta.txt"
    path.write_text("".join(f"img_{i}.jpg {i % 3}\n" for i in range(N)))
    return path


Make = Callable[[int, int], RankDataset]


def run(make: Make, world: int, steps: int, schedule: Any = SCHEDULE, start: int = 0, **loader: Any) -> list[list[str]]:
    """Global batches ``start .. steps-1``: each rank's batches, concatenated in rank order."""
    per_rank = []
    for r in range(world):
        ds = make(r, world)
        sampler = StepSampler(ds, schedule, start_step=start)
        dl = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, **loader)
        per_rank.append([b for _, b in zip(range(start, steps), dl)])
        del dl
    return [[x for r in range(world) for x in per_rank[r][t]] for t in range(steps - start)]


def test_stream_is_the_epochs_orders_on_any_world_size(meta: Path) -> None:
    def make(r: int, w: int) -> RankDataset:
        return RankDataset(meta, reload_cfg=CFG, rank=r, world_size=w)

    steps = 20
    reference = run(make, 1, steps)
    schedule = BatchSchedule.of(SCHEDULE)
    for t in range(steps):
        samples = stream_samples(np.arange(schedule.start(t), schedule.start(t + 1)), N, 5)
        assert reference[t] == [f"img_{i}.jpg {i % 3}" for i in samples]
    for world in (2, 4):
        assert run(make, world, steps) == reference
    # Every sample once an epoch: the first N items of the stream.
    flat = [x for b in reference for x in b]
    assert sorted(flat[:N]) == sorted(f"img_{i}.jpg {i % 3}" for i in range(N))


def make_for(kind: str, meta: Path, tmp_path: Path) -> Make:
    def make(r: int, w: int) -> RankDataset:
        if kind == "mix":
            other = tmp_path / "other.txt"
            if not other.exists():
                other.write_text("".join(f"doc_{i}.txt {i}\n" for i in range(11)))
            sources = [Source(str(meta), weight=2), Source(str(other), repeat=2)]
            return RankDataset(sources, reload_cfg={**CFG, "epoch_size": 40}, rank=r, world_size=w)
        if kind == "subsets":
            sources = [
                Source(str(meta), ids=list(range(0, N, 2)), weight=1),
                Source(str(meta), ids=[1, 3, 5], choose=7),
            ]
            return RankDataset(sources, reload_cfg=CFG, rank=r, world_size=w)
        if kind == "class_balanced":
            return RankDataset(class_balanced(str(meta)), reload_cfg=CFG, rank=r, world_size=w)
        if kind == "repeat_factor":
            factors = np.where(np.arange(N) % 5 == 0, 2.0, 1.0)
            return RankDataset(repeat_factor(str(meta), factors), reload_cfg=CFG, rank=r, world_size=w)
        if kind == "exclude":
            return RankDataset(meta, reload_cfg=CFG, rank=r, world_size=w, exclude=[0, 4, 9])
        if kind == "mix_aug":
            other = tmp_path / "other.txt"
            if not other.exists():
                other.write_text("".join(f"doc_{i}.txt {i}\n" for i in range(11)))
            sources = [Source(str(meta), weight=2), Source(str(other), repeat={0: 2, 1: 1})]
            cfg = {**CFG, "epoch_size": 40, "aug_repeats": 2}
            return RankDataset(sources, reload_cfg=cfg, rank=r, world_size=w)
        if kind == "aug":
            return RankDataset(meta, reload_cfg={**CFG, "aug_repeats": 2}, rank=r, world_size=w)
        raise AssertionError(kind)

    return make


@pytest.mark.parametrize("kind", ["mix", "subsets", "class_balanced", "repeat_factor", "exclude", "aug", "mix_aug"])
def test_world_size_independence_of_every_plan(kind: str, meta: Path, tmp_path: Path) -> None:
    make = make_for(kind, meta, tmp_path)
    reference = run(make, 1, 14)
    for world in (2, 4):
        assert run(make, world, 14) == reference, world
    if kind == "exclude":
        assert not {"img_0.jpg 0", "img_4.jpg 1", "img_9.jpg 0"} & {x for b in reference for x in b}
    if kind in ("aug", "mix_aug"):  # with 4 ranks the 2 copies of each draw in one batch sit on 2 different ranks
        for t, batch in enumerate(reference):
            half = len(batch) // 2
            assert batch[:half] == batch[half:], t


@pytest.mark.parametrize(
    "context",
    ["fork", pytest.param("spawn", marks=pytest.mark.slow), pytest.param("forkserver", marks=pytest.mark.slow)],
)
def test_persistent_workers_cross_mini_epochs_and_epochs(meta: Path, context: str) -> None:
    def make(r: int, w: int) -> RankDataset:
        return RankDataset(meta, reload_cfg=CFG, rank=r, world_size=w)

    steps = 16  # 37 samples, 3 windows an epoch, batches of 4 to 16: every window and 4 epochs crossed
    reference = run(make, 1, steps)
    # Two workers' batches interleaved (fork); spawn and forkserver workers, each an interpreter that imports torch,
    # check what their start method changes (the dataset pickled to them, the shard reopened there) with one.
    workers = 2 if context == "fork" else 1
    loader = {"num_workers": workers, "persistent_workers": True, "multiprocessing_context": context}
    assert run(make, 2, steps, **loader) == reference
    # The same DataLoader iterated again continues the stream where it stopped.
    ds = make(0, 1)
    sampler = StepSampler(ds, SCHEDULE)
    dl = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, **loader)
    got = [b for _, b in zip(range(5), dl)]
    sampler.load_state_dict(sampler.state_dict(step=5))
    got += [b for _, b in zip(range(5, steps), dl)]
    assert got == reference
    assert all(p.ok for p in ds.audit())


def test_resume_on_other_world_sizes(meta: Path) -> None:
    def make(r: int, w: int) -> RankDataset:
        return RankDataset(meta, reload_cfg={"mini_epoch": 2, "seed": 5}, rank=r, world_size=w)

    steps, schedule = 18, {0: 8, 5: 16}
    reference = run(make, 1, steps, schedule)
    for stop in (3, 7, 11):
        states = []
        for r in range(4):
            ds = make(r, 4)
            sampler = StepSampler(ds, schedule)
            dl = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)
            _ = [b for _, b in zip(range(stop), dl)]
            states.append(json.dumps(sampler.state_dict()))
        assert len(set(states)) == 1 and len(states[0]) < 1024  # the same small dict on every rank
        state = json.loads(states[0])
        assert state["step"] == stop
        for world in (2, 8):
            rest = []
            per_rank = []
            for r in range(world):
                ds = RankDataset(meta, reload_cfg={"mini_epoch": 5, "seed": 5}, rank=r, world_size=world)
                sampler = StepSampler(ds, schedule)
                sampler.load_state_dict(state)  # another mini-epoch count too: it moves shards only
                dl = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)
                per_rank.append([b for _, b in zip(range(stop, steps), dl)])
            rest = [[x for r in range(world) for x in per_rank[r][t]] for t in range(steps - stop)]
            assert rest == reference[stop:], (stop, world)


def test_stateful_dataloader(meta: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> tuple[RankDataset, StepSampler]:
        ds = RankDataset(meta, reload_cfg=CFG, rank=1, world_size=2)
        return ds, StepSampler(ds, SCHEDULE)

    ds, sampler = make()
    dl = StatefulDataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=2)
    it = iter(dl)
    before = [next(it) for _ in range(6)]
    saved = json.loads(json.dumps(dl.state_dict()))
    after = [next(it) for _ in range(8)]
    del it
    ds, sampler = make()
    dl = StatefulDataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=2)
    dl.load_state_dict(saved)
    assert [b for _, b in zip(range(8), dl)] == after
    # Another number of workers: the sampler takes the loader's state itself.
    ds, sampler = make()
    sampler.load_state_dict(saved)
    assert sampler.step == 6
    dl = StatefulDataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=0)
    assert [b for _, b in zip(range(8), dl)] == after
    assert before


def test_refusals(meta: Path, tmp_path: Path) -> None:
    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=4)
    with pytest.raises(ValueError, match="global_batch_size 6 at step 10 is not a multiple of the world size 4"):
        StepSampler(ds, {0: 8, 10: 6})
    with pytest.raises(TypeError, match="must be a RankDataset"):
        StepSampler(list(range(4)), 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eval"):
        StepSampler(RankDataset(meta, is_test=True, rank=0, world_size=1), 8)
    with pytest.raises(ValueError, match="audit"):
        StepSampler(RankDataset(meta, rank=0, world_size=1, audit="off"), 8)
    failing = RankDataset(meta, rank=0, world_size=1, on_error="replace", exclude_failures=True)
    with pytest.raises(ValueError, match=r"exclude_failures=True .* depends on the world size .* exclude="):
        StepSampler(failing, 8)
    state = StepSampler(ds, 8).state_dict()
    for other, what in [
        (RankDataset(meta, reload_cfg={"seed": 6}, rank=0, world_size=4), "seed"),
        (RankDataset(meta, reload_cfg=CFG, rank=0, world_size=4, exclude=[1]), "number of samples"),
    ]:
        with pytest.raises(ValueError, match=what):
            StepSampler(other, 8).load_state_dict(state)
    with pytest.raises(ValueError, match="schedule"):
        StepSampler(ds, {0: 8, 4: 16}).load_state_dict(state)
    copy = tmp_path / "copy.txt"
    copy.write_text(meta.read_text().replace("img_3", "img_x"))
    with pytest.raises(ValueError, match="files"):
        StepSampler(RankDataset(copy, reload_cfg=CFG, rank=0, world_size=4), 8).load_state_dict(state)
    with pytest.raises(ValueError, match="no StepSampler state"):
        StepSampler(ds, 8).load_state_dict({"a": 1})


def test_weights_by_step(tmp_path: Path) -> None:
    for name, n in [("a", 50), ("b", 30), ("c", 7)]:
        (tmp_path / f"{name}.txt").write_text("".join(f"{name}{i}\n" for i in range(n)))

    def sources(late: float = 3) -> list[Source]:
        return [
            Source(str(tmp_path / "a.txt"), weight={0: 1, 5: late}, by="step"),
            Source(str(tmp_path / "b.txt"), weight=1),
            Source(str(tmp_path / "c.txt"), weight={0: 1, 8: 0.5}, by="step"),
        ]

    def make(r: int, w: int) -> RankDataset:
        return RankDataset(sources(), reload_cfg=CFG, rank=r, world_size=w)

    schedule = {0: 8, 6: 16}
    reference = run(make, 1, 14, schedule)
    counts = [[sum(x.startswith(s) for x in batch) for s in "abc"] for batch in reference]
    assert counts[4] == [3, 3, 2] and counts[5] == [5, 2, 1]  # weight 3 for a.txt from step 5 exactly
    assert counts[7] == [10, 3, 3] and counts[8] == [11, 3, 2]  # c.txt down to 0.5 from step 8
    for world in (2, 4):
        assert run(make, world, 14, schedule) == reference
    # Resumed on 2 ranks from a state taken on 4.
    state = StepSampler(make(0, 4), schedule).state_dict(step=9)
    per_rank = []
    for r in range(2):
        ds = make(r, 2)
        sampler = StepSampler(ds, schedule)
        sampler.load_state_dict(state)
        per_rank.append([b for _, b in zip(range(9, 14), DataLoader(ds, batch_sampler=sampler, collate_fn=as_list))])
    assert [per_rank[0][t] + per_rank[1][t] for t in range(5)] == reference[9:]
    other = RankDataset(sources(late=4), reload_cfg=CFG, rank=0, world_size=2)
    with pytest.raises(ValueError, match="mix"):
        StepSampler(other, schedule).load_state_dict(state)
    by_epoch = [*sources()[:2], Source(str(tmp_path / "c.txt"), repeat={0: 1, 3: 2})]
    with pytest.raises(ValueError, match=r"'c\.txt' has a schedule by epoch in a mix whose rules change by step"):
        StepSampler(RankDataset(by_epoch, reload_cfg=CFG, rank=0, world_size=1), 8)
    with pytest.raises(ValueError, match=r"by='step' schedules one rule: .* got none"):
        Source(str(tmp_path / "c.txt"), by="step")
    with pytest.raises(ValueError, match=r"by='step' schedules one rule: .* got weight and choose"):
        Source(str(tmp_path / "c.txt"), weight=1, choose={0: 3}, by="step")
    with pytest.raises(ValueError, match="must hold step 0"):
        Source(str(tmp_path / "c.txt"), weight={3: 2}, by="step")
    with pytest.raises(ValueError, match=r"choose\[4\] must be >= 1"):
        Source(str(tmp_path / "c.txt"), choose={0: 3, 4: 0}, by="step")
    with pytest.raises(ValueError, match="by must be 'epoch' or 'step'"):
        Source(str(tmp_path / "c.txt"), weight=1, by="steps")


def test_replaced_failures_differ_only_at_the_failing_item(meta: Path) -> None:
    """As the guide says: with on_error='replace' a failing sample's substitute comes from the rank's shard, so
    global batches on 1, 2 and 4 ranks differ only where the stream holds a failing sample."""
    bad = {"img_3.jpg 0", "img_17.jpg 2"}

    def transform(line: str) -> str:
        if line in bad:
            raise ValueError("a corrupt sample")
        return line

    def make(r: int, w: int) -> RankDataset:
        return RankDataset(
            meta, reload_cfg=CFG, rank=r, world_size=w, transform=transform, on_error="replace", max_failures=10
        )

    def plain(r: int, w: int) -> RankDataset:
        return RankDataset(meta, reload_cfg=CFG, rank=r, world_size=w)

    steps = 12
    stream = run(plain, 1, steps)  # what the stream holds, failing samples included
    assert any(x in bad for b in stream for x in b)
    for world in (1, 2, 4):
        got = run(make, world, steps)
        for t in range(steps):
            assert len(got[t]) == len(stream[t])
            assert not bad & set(got[t])
            assert all(g == s for g, s in zip(got[t], stream[t]) if s not in bad), (world, t)


@pytest.mark.parametrize("k", [1, 2])
def test_repeat_and_choose_by_step(tmp_path: Path, k: int) -> None:
    """A repeat and a choose by step beside a fixed weight, with and without aug_repeats: each global batch's
    counts are the apportionment of its draws by the rules in force at that step, the same on 1, 2 and 4 ranks
    (with 2 workers), resumed on 2 ranks from a state taken on 4."""
    for name, n in [("a", 50), ("b", 30), ("c", 7)]:
        (tmp_path / f"{name}.txt").write_text("".join(f"{name}{i}\n" for i in range(n)))

    def sources(late: int = 5) -> list[Source]:
        return [
            Source(str(tmp_path / "a.txt"), repeat={0: 1, late: 2}, by="step"),
            Source(str(tmp_path / "b.txt"), weight=1),
            Source(str(tmp_path / "c.txt"), choose={0: 5, 8: 20}, by="step"),
        ]

    cfg = {**CFG, "epoch_size": 150, "aug_repeats": k}

    def make(r: int, w: int) -> RankDataset:
        return RankDataset(sources(), reload_cfg=cfg, rank=r, world_size=w)

    schedule = {0: 12 * k, 6: 24 * k}
    steps = 20  # 150 items an epoch cut in 3 windows: windows, epochs and every change crossed
    reference = run(make, 1, steps, schedule)
    for t, batch in enumerate(reference):
        size = len(batch) // k
        assert all(batch[i] == batch[i % size] for i in range(len(batch)))  # the k copies of each draw, copy-major
        shares = [100 if t >= 5 else 50, 30 if t >= 8 else 45 if t >= 5 else 95, 20 if t >= 8 else 5]
        assert [sum(x.startswith(s) for x in batch[:size]) for s in "abc"] == batch_counts(size, shares), t
    # 12 draws a batch: 4, 8, 0 at step 4; a's repeat 2 from step 5 exactly; 24 from step 6; c's choose from 8.
    for t, want in [(4, (4, 8, 0)), (5, (8, 4, 0)), (7, (16, 7, 1)), (8, (16, 5, 3))]:
        assert [sum(x.startswith(s) for x in reference[t]) for s in "abc"] == [k * c for c in want], t
    for world in (2, 4):
        assert run(make, world, steps, schedule, num_workers=2, persistent_workers=True) == reference, world
    state = StepSampler(make(0, 4), schedule).state_dict(step=7)
    per_rank = []
    for r in range(2):
        ds = make(r, 2)
        sampler = StepSampler(ds, schedule)
        sampler.load_state_dict(json.loads(json.dumps(state)))
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list)
        per_rank.append([b for _, b in zip(range(7, steps), loader)])
    assert [per_rank[0][t] + per_rank[1][t] for t in range(steps - 7)] == reference[7:]
    # A state saved under another schedule by step is refused, naming the mix.
    other = RankDataset(sources(late=6), reload_cfg=cfg, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"this step state is for another mix \(its sources, counts or schedules\)"):
        StepSampler(other, schedule).load_state_dict(state)
    with pytest.raises(ValueError, match="this step state is for another global batch size schedule"):
        StepSampler(make(0, 2), {0: 12 * k, 7: 24 * k}).load_state_dict(state)
    too_much = [Source(str(tmp_path / "a.txt"), repeat={0: 1, 9: 3}, by="step"), *sources()[1:]]
    with pytest.raises(ValueError, match=r"from step 9 the fixed per-epoch counts .* add up to 170"):
        StepSampler(RankDataset(too_much, reload_cfg=cfg, rank=0, world_size=1), schedule)


@pytest.mark.slow  # two Lightning Trainer runs
def test_lightning_max_steps_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning.pytorch as pl
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "meta.txt").write_text("".join(f"img_{i}.jpg\n" for i in range(N)))

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[list[str]] = []

        def training_step(self, batch: list[str], i: int) -> torch.Tensor:
            self.seen.append(list(batch))
            return (self.w**2).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Steps(pl.LightningDataModule):
        """The recipe of docs/guides/steps.md: the step state saved with the checkpoint, at trainer.global_step."""

        def __init__(self) -> None:
            super().__init__()
            self.sampler: StepSampler | None = None
            self.saved: dict[str, Any] | None = None

        def train_dataloader(self) -> DataLoader[Any]:
            ds = RankDataset("meta.txt", reload_cfg=CFG)
            self.sampler = StepSampler(ds, SCHEDULE)
            if self.saved is not None:
                self.sampler.load_state_dict(self.saved)
            return DataLoader(
                ds, batch_sampler=self.sampler, collate_fn=as_list, num_workers=1, persistent_workers=True
            )

        def state_dict(self) -> dict[str, Any]:
            assert self.sampler is not None
            return self.sampler.state_dict(step=self.trainer.global_step)

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.saved = state

    def fit(ckpt: str | None) -> list[list[str]]:
        model = Model()
        trainer = pl.Trainer(
            max_steps=12,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
            callbacks=[pl.callbacks.ModelCheckpoint(dirpath="ck", every_n_train_steps=5, save_top_k=-1)],
        )
        trainer.fit(model, datamodule=Steps(), ckpt_path=ckpt)
        return model.seen

    full = fit(None)
    assert full == run(lambda r, w: RankDataset("meta.txt", reload_cfg=CFG, rank=r, world_size=w), 1, 12)
    assert fit("ck/epoch=0-step=5.ckpt") == full[5:]


class StepCheckpoint:
    """The Accelerate recipe of docs/guides/steps.md: the sampler's state at the next step the loop reads."""

    def __init__(self, sampler: StepSampler) -> None:
        self.sampler, self.next_step = sampler, sampler.step

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict(step=self.next_step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self.next_step = self.sampler.step


def test_accelerate_save_state_resume(meta: Path, tmp_path: Path) -> None:
    import torch
    from accelerate import Accelerator

    def train(resume: Path | None) -> list[list[str]]:
        accelerator = Accelerator(cpu=True)
        ds = RankDataset(meta, reload_cfg=CFG, rank=accelerator.process_index, world_size=accelerator.num_processes)
        sampler = StepSampler(ds, SCHEDULE)
        data = StepCheckpoint(sampler)
        accelerator.register_for_checkpointing(data)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: it is sharded already
        if resume is not None:
            accelerator.load_state(str(resume))
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=as_list, num_workers=1)
        seen = []
        for step, batch in zip(range(data.next_step, 10), loader):
            seen.append(batch)
            data.next_step = step + 1
            if step == 4 and resume is None:
                accelerator.save_state(str(tmp_path / "ckpt"))
        return seen

    full = train(None)
    assert full == run(lambda r, w: RankDataset(meta, reload_cfg=CFG, rank=r, world_size=w), 1, 10)
    assert train(tmp_path / "ckpt") == full[5:]


def test_unread_batches_hold_the_shard_change(meta: Path) -> None:
    import itertools

    ds = RankDataset(meta, reload_cfg=CFG, rank=0, world_size=1)
    sampler = StepSampler(ds, 8)
    sampler._timeout = 0.2
    # Read: the shard changes (37 samples in windows of 13: the second batch starts the second window).
    batches = [ds.__getitems__(b) for b in itertools.islice(sampler, 6)]
    assert len(batches) == 6 and ds.spec.steps is not None
    # Not read: the sampler will not start the next shard's pass under batches no one read.
    unread = StepSampler(ds, 8, start_step=10)
    unread._timeout = 0.2
    with pytest.raises(RuntimeError, match="were not read"):
        list(itertools.islice(unread, 6))
