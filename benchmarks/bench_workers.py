"""Time from set_epoch to the first batch: a new DataLoader per mini-epoch vs one with persistent workers.

One rank (rank 0 of W) iterates its mini-epochs through a DataLoader with K workers started by
fork or forkserver, in two ways:

- ``new DataLoader``: after each ``set_epoch`` a new DataLoader (as the README asked before this
  change): every worker starts again;
- ``persistent workers``: one DataLoader with ``persistent_workers=True`` for the whole run: after
  ``set_epoch`` its workers map the new shard on their first item.

The time is from just before ``ds.set_epoch(...)`` (the shard build included) to the first batch in
hand, for every mini-epoch after the first (the first starts the persistent workers too); the rest
of each pass is read outside the timed window. torch is imported inside ``main()``, so a fork server
(which preloads this script) starts without it, as when a job is launched with ``python -m``: each of
its workers imports torch.

Usage:
    python benchmarks/bench_workers.py                       # N = 2M, W = 4, 4 workers, fork and forkserver
    python benchmarks/bench_workers.py --lines 20000 --passes 2 --workers 2 --out /tmp/results
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

MODES = ["new DataLoader", "persistent workers"]


def measure(meta: Path, method: str, persistent: bool, args: argparse.Namespace) -> list[float]:
    """Seconds from set_epoch to the first batch, for mini-epochs 1..passes."""
    from torch.utils.data import DataLoader

    from rank_dataset import RandomSampler, RankDataset

    ds = RankDataset(meta, reload_cfg={"seed": 0, "mini_epoch": args.passes + 1}, rank=0, world_size=args.world_size)
    sampler = RandomSampler(ds, seed=0)

    def new_loader() -> DataLoader[Any]:
        return DataLoader(
            ds,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            persistent_workers=persistent,
            multiprocessing_context=method,
        )

    loader = new_loader()
    for _ in loader:  # mini-epoch 0: starts the workers (of both modes), not timed
        pass
    times = []
    for mini in range(1, args.passes + 1):
        start = time.perf_counter()
        ds.set_epoch(0, mini)
        sampler.set_epoch(mini)
        if not persistent:
            loader = new_loader()
        it = iter(loader)
        next(it)
        times.append(time.perf_counter() - start)
        for _ in it:  # the rest of the pass, untimed
            pass
        del it
    del loader
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--passes", type=int, default=3, help="timed mini-epochs (after the first)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver"], choices=["fork", "spawn", "forkserver"])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_workers_") as tmp:
        meta = write_imagenet_meta(Path(tmp) / "meta.txt", args.lines)
        from rank_dataset import MetaFile

        MetaFile(meta)  # index once, outside the measurements
        for method in args.methods:
            results[method] = {}
            for mode in MODES:
                times = measure(meta, method, mode == "persistent workers", args)
                results[method][mode] = times
                print(f"{method}, {mode}: {', '.join(f'{t:.3f}' for t in times)} s", flush=True)

    per_rank = -(-args.lines // (args.world_size * (args.passes + 1)))
    rows = [
        f"# From set_epoch to the first batch, N = {args.lines:,}, W = {args.world_size}, "
        f"{args.workers} DataLoader workers",
        "",
    ]
    table = []
    for method, by_mode in results.items():
        new, kept = (statistics.median(by_mode[m]) for m in MODES)
        table.append((method, f"{new:.3f}", f"{kept:.3f}", f"{new / kept:.1f}x"))
    header = ["start method", "new DataLoader per mini-epoch (s)", "one DataLoader, persistent workers (s)", "speed-up"]
    rows += md_table(header, table, "lrrr")
    rows += [
        "",
        f"Median over {args.passes} mini-epochs of {per_rank:,} samples each (the first mini-epoch, which starts the",
        "persistent workers, is not counted); the time includes set_epoch's shard build. torch is imported inside",
        "main(), so forkserver workers each import it (as with `python -m`).",
        "",
        f"Command: `python benchmarks/bench_workers.py --lines {args.lines} --world-size {args.world_size} "
        f"--workers {args.workers} --passes {args.passes} --methods {' '.join(args.methods)}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "workers", rows, results, lambda path: _plot(results, path))
    return 0


def _plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    plt = plotting()

    methods = list(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for k, mode in enumerate(MODES):
        values = [statistics.median(results[m][mode]) for m in methods]
        ax.bar([i + (k - 0.5) * width for i in range(len(methods))], values, width, label=mode)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_yscale("log")
    ax.set_ylabel("set_epoch to first batch (s, log)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
