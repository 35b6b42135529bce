"""A property test of stopping, resizing and resuming, through the plan alone (no DataLoader, no processes):
1,000 random stop events, each followed by a resume on a random world size of 1-64 ranks, over both layouts
(the epoch layout that ResumableSampler reads, and StepSampler's step stream), plain files, files with
samples excluded, mixes (by epoch, with schedules; by step for the step stream) and ``aug_repeats``. The
samples trained across all the runs of a job are checked against the definition, a run that never stops:

- epoch layout: each epoch trains every position of the order of the world size it started on, each once
  (apart from the wrap-around padding a mini-epoch's last round adds, at most ``W - 1`` positions), each
  holding the sample the definition puts there; the epoch's samples, hashed, are the definition's;
- step stream: every global batch is trained once, in step order, and is the definition's batch item for
  item (the ranks' blocks in rank order); the whole stream, hashed, is the definition's.

A run "trains" what each rank reads of its shard (the same count on every rank, as a sampler reads), stops
there, saves the state (as JSON), and the next run, on another world size, loads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from rank_dataset.plan.exclude import Exclusion, KeptIds
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.resume import MixRecord, ResumeState, SourceRecord
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.spec import ShardSpec, epoch_order, mini_epoch_width
from rank_dataset.plan.step_mix import StepMix
from rank_dataset.plan.step_state import StepState
from rank_dataset.plan.steps import StepLayout

EVENTS = 1000  # stop, resize and resume events in all
EPOCHS = 3  # epochs of each epoch-layout job
MAX_WORLD = 64


@dataclasses.dataclass
class Job:
    """What fixes a job's samples: the plan's inputs, and how plan numbers map to the files' samples."""

    num_samples: int  # the plan's N (a mix's epoch size)
    seed: int
    mini_epoch: int
    aug_repeats: int
    mix: MixPlan | None = None
    kept: KeptIds | None = None  # with samples excluded: plan number k is file sample kept.take(k)
    excluded: frozenset[int] = frozenset()

    def file_samples(self, samples: np.ndarray) -> np.ndarray:
        """What the plan's sample numbers are in the files (the identity but for exclusions)."""
        return samples if self.kept is None else self.kept.take(np.asarray(samples, np.int64))

    @property
    def record(self) -> MixRecord | None:
        if self.mix is None:
            return None
        sources = tuple(
            SourceRecord(f"s{i}", n, None, c) for i, (n, c) in enumerate(zip(self.mix.sizes, self.mix.counts))
        )
        return MixRecord(self.mix.epoch_size, sources, self.mix.changes)


def random_job(rng: np.random.Generator, *, steps: bool) -> Job:
    """A random job: plain files, files with exclusions, or a mix (sometimes with a schedule by epoch)."""
    k = int(rng.choice([1, 1, 2, 3]))
    seed, mini = int(rng.integers(0, 1 << 30)), int(rng.integers(1, 5))
    kind = rng.choice(["plain", "exclude", "mix"])
    if kind == "mix":
        sizes = tuple(int(s) for s in rng.integers(5 * k, 120, size=int(rng.integers(2, 4))))
        counts = tuple(int(c) for c in rng.integers(3 * k, 150, size=len(sizes)))
        total = sum(counts)
        changes: tuple[tuple[int, tuple[int, ...]], ...] = ()
        if not steps and rng.random() < 0.5:  # a schedule by epoch, of the same epoch size
            moved = list(counts)
            shift = int(rng.integers(1, min(counts) - k + 1))
            moved[0] -= shift
            moved[-1] += shift
            changes = ((int(rng.integers(1, EPOCHS)), tuple(moved)),)
        mix = MixPlan(sizes, counts, total, changes)
        return Job(total, seed, mini, k, mix=mix)
    n_files = int(rng.integers(1, 400))
    if kind == "exclude" and n_files > 2:
        out = rng.choice(n_files, size=int(rng.integers(1, n_files // 2 + 1)), replace=False)
        exclusion = Exclusion(np.sort(out).astype(np.int64))
        kept = KeptIds(None, exclusion)
        kept.check(n_files, "the files")
        return Job(n_files - out.size, seed, mini, k, kept=kept, excluded=frozenset(int(i) for i in out))
    return Job(n_files, seed, mini, k)


def digest(values: Any) -> str:
    return hashlib.sha256(np.asarray(values, np.int64).tobytes()).hexdigest()


# -- the epoch layout (ResumableSampler) ---------------------------------------------------------------------


def epoch_job(rng: np.random.Generator, budget: int) -> int:
    """Run one epoch-layout job through stops and resumes; the stop events it used."""
    job = random_job(rng, steps=False)
    n, k = job.num_samples, job.aug_repeats
    world = int(rng.integers(1, MAX_WORLD + 1))
    spec = ShardSpec(n, world, 0, mini_epoch=job.mini_epoch, seed=job.seed, mix=job.mix, aug_repeats=k)
    events = 0
    trained: list[tuple[np.ndarray, np.ndarray]] = []  # (positions, samples) trained this epoch
    started_on = world  # the world size the current epoch started on (its plan)
    pads_allowed = 0
    while spec.epoch < EPOCHS:
        ranks = [dataclasses.replace(spec, rank=r) for r in range(spec.world_size)]
        positions = [s.positions() for s in ranks]
        samples = [s.indices() for s in ranks]
        length = positions[0].size
        assert all(p.size == length for p in positions)
        stop = events < budget and rng.random() < 0.6
        consumed = int(rng.integers(0, length + 1)) if stop else length
        for p, s in zip(positions, samples):
            trained.append((p[:consumed], s[:consumed]))
        lo, hi = spec.mini_epoch_span  # past its end, the ranks read the range again from its start: padding
        pads_allowed += max(0, consumed * spec.world_size - (hi - lo))
        if stop:
            events += 1
            states = {json.dumps(ResumeState.at(s, consumed, None, job.record).to_dict()) for s in ranks[:3]}
            assert len(states) == 1  # every rank saves the same state
            state = ResumeState.from_dict(json.loads(states.pop()))
            state.check_files(n, None, job.record)
            world = int(rng.integers(1, MAX_WORLD + 1))
            fresh = ShardSpec(n, world, 0, mini_epoch=job.mini_epoch, seed=job.seed, mix=job.mix, aug_repeats=k)
            spec = state.apply(fresh)
            continue
        # the mini-epoch read to its end: the next one (the same plan boundaries within the epoch)
        epoch, idx = spec.epoch, spec.mini_epoch_idx + 1
        if idx == spec.mini_epoch:
            check_epoch(job, spec.epoch, started_on, trained, pads_allowed)
            trained, pads_allowed, epoch, idx = [], 0, epoch + 1, 0
            started_on = spec.world_size
        resume = spec.resume if epoch == spec.epoch else None
        spec = dataclasses.replace(spec, epoch=epoch, mini_epoch_idx=idx, resume=resume)
    return events


def check_epoch(job: Job, epoch: int, world: int, trained: list[tuple[np.ndarray, np.ndarray]], pads: int) -> None:
    """Epoch ``epoch``'s trained positions and samples against the run that never stops on ``world`` ranks."""
    n, k = job.num_samples, job.aug_repeats
    total = mini_epoch_width(n, world, job.mini_epoch) * job.mini_epoch
    everywhere = np.arange(total, dtype=np.int64)
    if job.mix is not None:
        definition = job.mix.epoch_order(job.seed, epoch, everywhere, k)
    else:
        definition = epoch_order(n, job.seed, epoch, everywhere, k)
    positions = np.concatenate([p for p, _ in trained]) if trained else np.empty(0, np.int64)
    samples = np.concatenate([s for _, s in trained]) if trained else np.empty(0, np.int64)
    counts = np.bincount(positions, minlength=total)
    assert counts.size == total, "a position past the epoch's plan"
    assert counts.min() == 1, f"epoch {epoch}: positions skipped: {np.flatnonzero(counts == 0)[:10].tolist()}"
    repeats = int((counts - 1).sum())
    assert repeats <= pads, f"epoch {epoch}: {repeats} positions trained twice, {pads} of padding at most"
    assert np.array_equal(samples, definition[positions]), f"epoch {epoch}: a position holds another sample"
    files = job.file_samples(definition)
    assert not set(files.tolist()) & job.excluded
    once = np.unique(positions)  # each position once: the definition's epoch, hashed
    assert digest(np.sort(job.file_samples(samples[np.unique(positions, return_index=True)[1]]))) == digest(
        np.sort(files[once])
    )


# -- the step stream (StepSampler) ---------------------------------------------------------------------------


def step_job(rng: np.random.Generator, budget: int) -> int:
    """Run one StepSampler job through stops and resumes; the stop events it used."""
    job = random_job(rng, steps=True)
    n, k, mini = job.num_samples, job.aug_repeats, job.mini_epoch
    unit = int(rng.choice([8, 16, 32, 64])) * k  # every size a multiple: many world sizes divide them
    sizes = {0: unit * int(rng.integers(1, 3))}
    if rng.random() < 0.5:
        sizes[int(rng.integers(1, 12))] = unit * int(rng.integers(1, 4))
    schedule = BatchSchedule.of(sizes)
    step_mix = None
    if job.mix is not None and rng.random() < 0.5:  # rules by step
        count = len(job.mix.sizes)
        values: list[Any] = [{0: 1, int(rng.integers(1, 10)): 3}, *([1] * (count - 1))]
        step_mix = StepMix.of(job.mix.sizes, job.mix.epoch_size, ["weight"] * count, values)
    layout = StepLayout(schedule, step_mix)
    worlds = [w for w in range(1, MAX_WORLD + 1) if fits(schedule, w, k)]
    last = int(rng.integers(20, 60))  # the steps the job trains
    definition = stream(job, layout, 1, last)
    got: dict[int, np.ndarray] = {}
    step, world, events = 0, int(rng.choice(worlds)), 0
    while step < last:
        epoch, m = layout.window_of(step, n, mini, k)
        _, stop = layout.steps_of(n, mini, epoch, m, k)
        stop = min(stop, last)
        blocks = shards(job, layout, world, epoch, m)
        resize = events < budget and rng.random() < 0.6
        until = int(rng.integers(step, stop + 1)) if resize else stop
        for u in range(step, until):
            assert u not in got, f"global batch {u} trained twice"
            got[u] = blocks[u]
        step = until
        if resize:
            events += 1
            state = StepState(
                step=step, num_samples=n, fingerprint=None, seed=job.seed, aug_repeats=k, schedule=schedule
            )
            loaded = StepState.from_dict(json.loads(json.dumps(state.to_dict())))
            loaded.check_same_stream(state)
            step, world = loaded.step, int(rng.choice(worlds))
    assert sorted(got) == list(range(last)), "a global batch skipped"
    for u in range(last):
        assert np.array_equal(got[u], definition[u]), f"global batch {u} differs from the definition's"
    everything = job.file_samples(np.concatenate([got[u] for u in range(last)]))
    assert digest(everything) == digest(job.file_samples(np.concatenate([definition[u] for u in range(last)])))
    assert not set(everything.tolist()) & job.excluded
    return events


def fits(schedule: BatchSchedule, world: int, k: int) -> bool:
    try:
        schedule.check(world, k)
    except ValueError:
        return False
    return True


def shards(job: Job, layout: StepLayout, world: int, epoch: int, m: int) -> dict[int, np.ndarray]:
    """Global batch ``u``'s items for each step ``u`` of window ``(epoch, m)``: the ranks' blocks of it, in rank
    order, each cut from the rank's shard at its step's offset (as StepSampler reads its shard)."""
    n, k, mini = job.num_samples, job.aug_repeats, job.mini_epoch
    first, stop = layout.steps_of(n, mini, epoch, m, k)
    positions = np.stack([layout.positions(n, world, rank, mini, epoch, m, k) for rank in range(world)])
    samples = layout.indices(positions.reshape(-1), n, job.seed, epoch, k, job.mix).reshape(world, -1)
    blocks, at = {}, 0
    for u in range(first, stop):
        size = layout.schedule.size(u) // world
        blocks[u] = samples[:, at : at + size].reshape(-1)
        at += size
    assert at == samples.shape[1]
    return blocks


def stream(job: Job, layout: StepLayout, world: int, last: int) -> dict[int, np.ndarray]:
    """The run that never stops, on ``world`` ranks: global batches ``[0, last)``, the ranks' blocks in rank order."""
    n, k, mini = job.num_samples, job.aug_repeats, job.mini_epoch
    out: dict[int, np.ndarray] = {}
    step = 0
    while step < last:
        epoch, m = layout.window_of(step, n, mini, k)
        _, stop = layout.steps_of(n, mini, epoch, m, k)
        blocks = shards(job, layout, world, epoch, m)
        for u in range(step, min(stop, last)):
            out[u] = blocks[u]
        step = stop
    return out


# -- the test ------------------------------------------------------------------------------------------------


def test_random_stops_resizes_and_resumes_train_what_a_run_that_never_stops_trains() -> None:
    rng = np.random.default_rng(56)
    events, jobs = 0, Counter[str]()
    while events < EVENTS:
        budget = min(int(rng.integers(1, 12)), EVENTS - events)
        layout = "steps" if jobs["steps"] < jobs["epochs"] else "epochs"
        events += (step_job if layout == "steps" else epoch_job)(rng, budget)
        jobs[layout] += 1
    assert events == EVENTS and jobs["steps"] >= 20 and jobs["epochs"] >= 20


@pytest.mark.parametrize("world", [1, 7, 64])
def test_the_definition_is_the_same_on_any_world_size_that_divides_the_batches(world: int) -> None:
    """The step stream's definition does not depend on the world size it is computed on."""
    job = Job(150, 4, 3, 1)
    layout = StepLayout(BatchSchedule.of({0: 448, 3: 896}))  # 7 x 64, twice that
    assert fits(layout.schedule, world, 1)
    on_world, on_one = stream(job, layout, world, 9), stream(job, layout, 1, 9)
    assert all(np.array_equal(on_world[u], on_one[u]) for u in range(9))
