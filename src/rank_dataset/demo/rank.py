"""One rank of the demo: ``python -m rank_dataset.demo.rank CONFIG.json`` under torch.distributed.

It iterates its loader (``rank_dataset``, ``server`` or ``naive``) through a DataLoader for every
epoch and mini-epoch, gathers what every rank read, and writes its figures to ``<out>.<rank>.json``
(rank 0 adds the coverage verdict). A failure is written to ``<out>.<rank>.error`` for the launcher.

With ``mix`` in the config (a list of sources: ``path``, ``name`` and one rule), the dataset is that
mix, and the check is the mix's: each epoch reads exactly each source's per-epoch count (padding
left out), and after each epoch every sample of a source has been read floor or ceil of
``epochs * count / samples`` times.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from rank_dataset.core.residency import return_freed_memory
from rank_dataset.demo.baselines import NaiveDataset, OriginalDataset
from rank_dataset.demo.memory import pss_by_mapping, pss_with_children
from rank_dataset.demo.synthetic import imagenet_line

if TYPE_CHECKING:
    from rank_dataset.plan.sources import Source
    from rank_dataset.training.dataset import ShardedDataset

#: A test hook: the rank named here raises, to show how the demo reports a failing rank.
FAIL_RANK_ENV = "RANK_DATASET_DEMO_FAIL_RANK"
#: A benchmark's hook: a directory for each rank's PSS by mapping (see _measure).
SMAPS_ENV = "RANK_DATASET_DEMO_SMAPS"
_BASELINE_SAMPLES = 100_000
_BASELINE_PASSES = 2  # each with new workers, as every measured pass has
_BASELINE_POINTS = 4  # PSS measurements in the second half of each baseline pass


class _Numbered(Dataset[tuple[int, str]]):
    """Items with a number, so the coverage check sees what the loader read: the global sample
    number from ``numbers``, or with ``numbers=None`` the item's position (which the rank maps to
    sample numbers itself, so that no worker holds a copy of them)."""

    def __init__(self, source: Any, numbers: Any) -> None:
        self.source, self.numbers = source, numbers

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[int, str]:
        return (i if self.numbers is None else int(self.numbers[i])), self.source[i]


def _measure(label: str = "") -> tuple[int, int]:
    """PSS of this rank and of its DataLoader workers, all ranks measuring at once. With
    ``RANK_DATASET_DEMO_SMAPS=DIR``, each rank also writes them by mapping to ``DIR/<label>.<rank>.json``
    (the last measurement of the baseline and of the loader's pass: where the figure goes)."""
    dist.barrier()
    where = os.environ.get(SMAPS_ENV)
    if where and label:
        Path(where, f"{label}.{dist.get_rank()}.json").write_text(json.dumps(pss_by_mapping()))
    return pss_with_children()


def _measure_points(batches: int, points: int) -> set[int]:
    """The batches at which a pass measures PSS: ``points`` spread over its second half, ending at its
    last batch (fewer for a short pass). Every rank computes the same set: each measurement is a barrier.

    Examples:
        >>> sorted(_measure_points(100, 4))
        [50, 67, 83, 99]
        >>> sorted(_measure_points(100, 1)), sorted(_measure_points(2, 4)), _measure_points(0, 4)
        ([99], [1], set())
    """
    if batches < 1 or points < 1:
        return set()
    first = batches // 2 if points > 1 else batches - 1
    last = batches - 1
    return {last - (last - first) * j // max(points - 1, 1) for j in range(points)}


def _pass(
    dataset: Dataset[Any], sampler: Any, cfg: dict[str, Any], points: int, label: str = ""
) -> tuple[np.ndarray, float, list[tuple[int, int]]]:
    """One pass of a DataLoader: the sample numbers read, samples/s, and PSS measured at ``points``
    batches of its second half (see _measure_points; 0: not measured), the last at its last batch."""
    context = cfg.get("start_method") if cfg["workers"] else None
    loader = DataLoader(
        dataset,
        batch_size=cfg["batch_size"],
        sampler=sampler,
        num_workers=cfg["workers"],
        multiprocessing_context=context,
    )
    number_type = np.uint32 if len(dataset) < 1 << 32 else np.int64  # type: ignore[arg-type]
    at = _measure_points(len(loader), points)
    memory: list[tuple[int, int]] = []
    start = time.perf_counter()
    # The numbers read go to an unlinked file, not the rank's memory: the coverage check's record is the
    # demo's, not any loader's (in the page cache, unmapped, it is in no process's PSS).
    with tempfile.TemporaryFile() as seen:
        for k, (numbers, _) in enumerate(loader):
            # A copy of the numbers, not the tensor: it and its shared-memory block go with the batch.
            seen.write(numbers.numpy().astype(number_type).tobytes())
            if k in at:
                # at the last batch, the workers are alive and have touched the whole shard
                memory.append(_measure(label if k == max(at) else ""))
        elapsed = time.perf_counter() - start
        seen.seek(0)
        read = np.frombuffer(seen.read(), number_type)
    return read, read.size / max(elapsed, 1e-9), memory


class _Generated(Dataset[str]):
    """Lines made on the fly: the loader's own work (batches, collation) with no metas held."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        return imagenet_line(i)


def _baseline_memory(cfg: dict[str, Any], samples: int) -> list[tuple[int, int]]:
    """The same processes' PSS with no metas: a rank and its workers during passes over generated lines.

    Passes, not an idle loader, so that what workers allocate for batches anyway (heap arenas,
    collation) is not charged to the metas. The demo subtracts the last measurement; all of them
    together are the baseline's noise: how far the PSS of these processes moves with no metas at all
    (within a pass, and between two passes, each with its own workers, as the measured pass has).
    """
    n = max(1, min(samples, _BASELINE_SAMPLES))
    memory = []
    for _ in range(_BASELINE_PASSES):
        memory += _pass(_Numbered(_Generated(n), range(n)), None, cfg, points=_BASELINE_POINTS, label="baseline")[2]
    return memory


def _sources(cfg: dict[str, Any], served: bool) -> list[Source]:
    """The mix's Sources: by path, or for a meta server by the served file's name. A schedule's
    epochs come back from the JSON config as strings."""

    from rank_dataset.plan.sources import Source

    def rule(value: Any) -> Any:
        return {int(e): v for e, v in value.items()} if isinstance(value, dict) else value

    return [
        Source(s["name"] if served else s["path"], **{k: rule(v) for k, v in s.items() if k not in ("path", "name")})
        for s in cfg["mix"]
    ]


def _rule(source: Source) -> str:
    """The source's rule as the table shows it: ``weight=1``, ``choose=600``, ``repeat={0: 0.5, 1: 1}``."""
    value = getattr(source, source.kind)

    def shown(v: float) -> str:
        return f"{int(v):,}" if source.kind == "choose" else f"{v:g}"

    if isinstance(value, dict):
        return f"{source.kind}={{" + ", ".join(f"{e}: {shown(v)}" for e, v in value.items()) + "}"
    return f"{source.kind}={shown(value)}"


class _MixCheck:
    """Rank 0's check of a mix: exact per-source counts each epoch (by the schedules in force), and
    each sample read floor or ceil of its source's samples taken so far over its size."""

    def __init__(self, dataset: ShardedDataset) -> None:
        mix, infos = dataset.spec.mix, dataset.sources
        assert mix is not None and infos is not None
        self.mix, self.names = mix, [s.name for s in infos]
        self.rules = [_rule(s.source) for s in infos]
        self.taken = np.zeros(mix.num_samples, np.uint16)  # times each sample was read so far
        self.read: list[list[int]] = []
        self.planned: list[list[int]] = []
        self.targets: list[list[float]] = []

    def epoch(self, samples: np.ndarray, dataset: ShardedDataset) -> tuple[bool, str]:
        infos = dataset.sources
        assert infos is not None
        counts = np.bincount(self.mix.source_of(samples), minlength=len(self.names)).tolist()
        self.read.append(counts)
        self.planned.append([s.count for s in infos])
        self.targets.append([s.target for s in infos])
        np.add.at(self.taken, samples, 1)
        ok, parts = True, []
        for s, info in enumerate(infos):
            taken = self.taken[info.offset : info.offset + info.num_samples]
            low = info.taken // info.num_samples  # the stream continues across schedule changes
            even = int(taken.min()) >= low and int(taken.max()) <= low + (info.taken % info.num_samples > 0)
            ok &= counts[s] == info.count and even
            parts.append(f"{info.name} {counts[s]} of {info.count}{'' if even else ' (UNEVEN over the epochs)'}")
        return ok, ", ".join(parts)

    def report(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "rules": self.rules,
            "sizes": list(self.mix.sizes),
            "planned": self.planned,
            "targets": self.targets,
            "epoch_size": self.mix.epoch_size,
            "read": self.read,
        }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get(FAIL_RANK_ENV) == str(rank):
        raise RuntimeError(f"failing on purpose ({FAIL_RANK_ENV}={rank})")
    kind = cfg["loader"]
    base_memory = _baseline_memory(cfg, _BASELINE_SAMPLES)
    # The library is imported after the baseline: the baseline is of processes that loaded torch (and this
    # harness) alone, so each loader's figure counts its imports, in the rank and in every spawned worker.
    from rank_dataset.training.dataset import RankDataset, ShardedDataset
    from rank_dataset.training.sampler import RandomSampler

    start = time.perf_counter()
    dataset: ShardedDataset | NaiveDataset | OriginalDataset
    reload = {"mini_epoch": cfg["mini_epochs"], "seed": 0}
    if cfg.get("mix"):
        reload["epoch_size"] = cfg["epoch_size"]
    if kind == "naive":
        dataset = NaiveDataset(cfg["meta"])
    elif kind == "original":
        dataset = OriginalDataset(cfg["meta"], rank, world, cfg["mini_epochs"], seed=0)
    elif kind == "server":
        from rank_dataset.training.server_datasets import RankServerDataset

        sources = _sources(cfg, served=True) if cfg.get("mix") else None
        dataset = RankServerDataset(cfg["url"], reload_cfg=reload, sources=sources)
    else:
        dataset = RankDataset(_sources(cfg, served=False) if cfg.get("mix") else cfg["meta"], reload_cfg=reload)
    build = time.perf_counter() - start
    num_samples = len(dataset) if isinstance(dataset, NaiveDataset) else dataset.num_samples
    mix_check = _MixCheck(dataset) if rank == 0 and isinstance(dataset, ShardedDataset) and dataset.sources else None

    rates, lengths, covered = [], [], True
    memory = (0, 0)
    messages: list[str] = []
    for epoch in range(cfg["epochs"]):
        seen: list[np.ndarray] = []
        if isinstance(dataset, NaiveDataset):
            sampler: DistributedSampler[str] = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
            sampler.set_epoch(epoch)
            last = epoch == cfg["epochs"] - 1
            got, rate, mem = _pass(_Numbered(dataset, range(len(dataset))), sampler, cfg, int(last), label=kind)
            seen.append(got)
            rates.append(rate)
            lengths.append(len(got))
            memory = mem[-1] if mem else memory
        else:
            for mini in range(cfg["mini_epochs"]):
                if epoch or mini:
                    dataset.set_epoch(epoch, mini)
                last = epoch == cfg["epochs"] - 1 and mini == cfg["mini_epochs"] - 1
                order = RandomSampler(dataset, seed=rank)
                order.set_epoch(epoch * cfg["mini_epochs"] + mini)
                got, rate, mem = _pass(_Numbered(dataset, None), order, cfg, int(last), label=kind)
                if not isinstance(dataset, ShardedDataset) or dataset.spec.mix is None:
                    seen.append(dataset.indices[got].astype(got.dtype))  # positions -> sample numbers
                else:  # leave the padding out of the mix's counts
                    seen.append(dataset.indices[got[dataset.spec.positions()[got] < dataset.spec.num_samples]])
                rates.append(rate)
                lengths.append(len(got))
                memory = mem[-1] if mem else memory
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"seen": np.concatenate(seen), "lengths": lengths[-1:]})
        if rank == 0 and mix_check is not None:
            everything = np.concatenate([g["seen"] for g in gathered])
            equal = len({tuple(g["lengths"]) for g in gathered}) == 1
            assert isinstance(dataset, ShardedDataset)  # a mix check exists only for one
            ok, message = mix_check.epoch(everything, dataset)
            covered &= ok and equal
            messages.append(f"epoch {epoch}: {message}{'' if equal else ', UNEQUAL per-rank lengths'}")
        elif rank == 0:
            everything = np.concatenate([g["seen"] for g in gathered])
            missing = num_samples - int(np.unique(everything).size)
            equal = len({tuple(g["lengths"]) for g in gathered}) == 1
            ok = missing == 0 and equal and int(everything.min()) >= 0 and int(everything.max()) < num_samples
            covered &= ok
            messages.append(
                f"epoch {epoch}: {everything.size} samples read, {num_samples - missing} of {num_samples} distinct"
                f"{'' if equal else ', UNEQUAL per-rank lengths'}"
            )
            del everything
        del gathered, seen
        return_freed_memory()  # the check's temporaries are not the next epoch's meta memory
    return {
        "rank": rank,
        "loader": kind,
        "samples": int(np.mean(lengths)) if lengths else 0,
        "build_seconds": build,
        "samples_per_second": float(np.mean(rates)) if rates else 0.0,
        "memory": sum(memory) - sum(base_memory[-1]),
        "rank_memory": memory[0] - base_memory[-1][0],
        "worker_memory": memory[1] - base_memory[-1][1],
        "baseline_memory": [sum(m) for m in base_memory],  # this rank's baseline measurements, in order
        "covered": covered,
        "coverage": messages,
        "mix": mix_check.report() if mix_check is not None else None,
    }


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    out = Path(cfg["out"])
    rank = int(os.environ.get("RANK", "0"))
    try:
        dist.init_process_group("gloo")
        result = run(cfg)
        (out.with_name(f"{out.name}.{rank}.json")).write_text(json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # report every failure, Ctrl-C included, to the launcher
        message = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        out.with_name(f"{out.name}.{rank}.error").write_text(message)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
