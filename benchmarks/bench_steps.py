"""Training by steps beside the epoch loop: steps/s, and the wait at each shard change.

One rank (rank 0 of ``--world-size``, in one process) reads the same number of items two ways, through one
DataLoader with persistent workers each: the epoch loop (``set_epoch`` per mini-epoch, a ResumableSampler,
a new pass of the loader each time) and the step loop (one endless ``StepSampler``, which loads the next
shard itself). The wait at a shard change is, for the epoch loop, the time from ``set_epoch`` to the first
batch of the new pass; for the step loop, the longest gap between two batches around the change, less the
median gap.

Usage:
    python benchmarks/bench_steps.py                    # 200k lines, 4 ranks (rank 0 measured), 4 mini-epochs
    python benchmarks/bench_steps.py --lines 20000 --epochs 1 --out /tmp/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine_info, md_table, plotting, save_results, write_imagenet_meta  # noqa: E402


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--mini-epochs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from torch.utils.data import DataLoader

    from rank_dataset import RankDataset, ResumableSampler, StepSampler

    w, m, big_b = args.world_size, args.mini_epochs, args.global_batch
    b = big_b // w
    cfg = {"mini_epoch": m, "seed": 0}
    loader_kw: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True, "collate_fn": as_list}
    with tempfile.TemporaryDirectory(prefix="bench_steps_") as tmp:
        meta = write_imagenet_meta(Path(tmp) / "meta.txt", args.lines)

        # The epoch loop.
        ds = RankDataset(meta, reload_cfg=cfg, rank=0, world_size=w)
        loader = DataLoader(ds, batch_size=b, sampler=ResumableSampler(ds), **loader_kw)
        epoch_waits, epoch_items = [], 0
        start = time.perf_counter()
        for epoch in range(args.epochs):
            for mini in range(m):
                t0 = time.perf_counter()
                ds.set_epoch(epoch, mini)
                first = True
                for batch in loader:
                    if first:
                        epoch_waits.append(time.perf_counter() - t0)
                        first = False
                    epoch_items += len(batch)
        epoch_seconds = time.perf_counter() - start
        epoch_batches = epoch_items / b
        del loader, ds

        # The step loop: as many items, by steps of the global batch.
        ds = RankDataset(meta, reload_cfg=cfg, rank=0, world_size=w)
        sampler = StepSampler(ds, big_b)
        loader = DataLoader(ds, batch_sampler=sampler, **loader_kw)
        steps = int(epoch_items // b)
        gaps, windows = [], []
        start = last = time.perf_counter()
        for step, _batch in zip(range(steps), loader):
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            windows.append(sampler.layout.window_of(step, ds.spec.num_samples, m))
        step_seconds = time.perf_counter() - start
        del loader, ds
    median_gap = statistics.median(gaps[1:]) if len(gaps) > 1 else 0.0
    changes = [t for t in range(1, len(windows)) if windows[t] != windows[t - 1]]
    reach = 2 * args.workers + 2  # the loader's prefetch, and one batch more each side
    step_waits = [max(gaps[max(1, t - reach) : t + reach]) - median_gap for t in changes]
    results = {
        "epoch loop": {
            "batches_per_s": epoch_batches / epoch_seconds,
            "seconds": epoch_seconds,
            "wait_median_s": statistics.median(epoch_waits),
            "wait_max_s": max(epoch_waits),
            "changes": len(epoch_waits),
        },
        "step loop": {
            "batches_per_s": steps / step_seconds,
            "seconds": step_seconds,
            "wait_median_s": statistics.median(step_waits) if step_waits else 0.0,
            "wait_max_s": max(step_waits) if step_waits else 0.0,
            "changes": len(changes),
        },
    }
    rows = [
        f"# Training by steps beside the epoch loop: N = {args.lines:,}, rank 0 of {w}, {m} mini-epochs, "
        f"global batch {big_b} ({b} a rank), {args.workers} persistent workers",
        "",
        *md_table(
            ["loop", "batches (steps) / s", "seconds", "shard changes", "wait at a change, median (s)", "max (s)"],
            [
                (
                    name,
                    f"{r['batches_per_s']:,.1f}",
                    f"{r['seconds']:.2f}",
                    r["changes"],
                    f"{r['wait_median_s']:.3f}",
                    f"{r['wait_max_s']:.3f}",
                )
                for name, r in results.items()
            ],
            "lrrrrr",
        ),
        "",
        "Both loops read the same number of items. The epoch loop's wait is `set_epoch` plus the new pass's first "
        "batch (its first change is the first shard's load); the step loop's is the longest gap between batches "
        "around a change less the median gap: the StepSampler loads the next shard while the workers still read "
        "the batches in flight from the old one, and starts the new pass once they are read.",
        "",
        f"Command: `python benchmarks/bench_steps.py --lines {args.lines} --world-size {w} --mini-epochs {m} "
        f"--epochs {args.epochs} --global-batch {big_b} --workers {args.workers}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "steps", rows, results, lambda path: _plot(results, path))
    return 0


def _plot(results: dict[str, dict[str, float]], path: Path) -> None:
    plt = plotting()
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
    names = list(results)
    axes[0].barh(names, [results[k]["batches_per_s"] for k in names])
    axes[0].set_xlabel("batches / s")
    axes[1].barh(names, [results[k]["wait_median_s"] for k in names])
    axes[1].set_xlabel("median wait at a shard change (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
