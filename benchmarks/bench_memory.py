"""Meta memory of W ranks and their DataLoader workers: the naive loader, the original approach, RankDataset.

For each N, in one run: W = 4 ranks under torch.distributed (gloo), each with 2 DataLoader workers,
one full pass of the DataLoader; the figure is the PSS of all 12 processes at the last batch, minus
the PSS of the same processes over a one-item dataset before the metas existed (the demo's method).

Loaders:
- naive: every line in a Python list in every rank, torch's DistributedSampler;
- original: the original rank_dataset approach: each rank draws the whole permutation, scans every
  line of the file and keeps its R lines as Python lists;
- rank_dataset: RankDataset.

DataLoader workers start with ``--start-method`` (fork, spawn or forkserver; the default of
Python 3.14 on Linux is forkserver); results go to ``results/memory_<start method>.{md,json,png}``.

Usage:
    python benchmarks/bench_memory.py                    # N in 1M, 4M, fork
    python benchmarks/bench_memory.py --start-method forkserver
    python benchmarks/bench_memory.py --sizes 1000000 4000000 10000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine_info, plotting, save_results, write_imagenet_meta  # noqa: E402
from rank_dataset.demo import launch_ranks  # noqa: E402

LOADERS = ["naive", "original", "rank_dataset"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default="fork")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    mib = 1 << 20
    memory: dict[int, dict[str, float]] = {}
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
            work = Path(tmp)
            meta = write_imagenet_meta(work / "meta.txt", n)
            memory[n] = {}
            for loader in LOADERS:
                cfg = {"loader": loader, "meta": str(meta), "workers": args.workers, "epochs": 1, "mini_epochs": 1}
                cfg["start_method"] = args.start_method
                result = launch_ranks({**cfg, "batch_size": 256}, args.world_size, work)
                if not result.covered:
                    raise SystemExit(f"{loader} did not cover the epoch at N={n}")
                memory[n][loader] = result.memory / mib
                print(f"N={n:,} {loader} ({args.start_method}): {memory[n][loader]:,.1f} MiB", flush=True)

    w, k, method = args.world_size, args.workers, args.start_method
    rows = [
        f"# Meta memory, {w} ranks x (1 + {k} DataLoader workers started by {method}), after one full pass",
        "",
        "| N | naive (MiB) | original approach (MiB) | RankDataset (MiB) | naive / ours | original / ours |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, m in memory.items():
        ours = max(m["rank_dataset"], 1e-9)
        rows.append(
            f"| {n:,} | {m['naive']:,.0f} | {m['original']:,.0f} | {m['rank_dataset']:,.0f} |"
            f" {m['naive'] / ours:.1f}x | {m['original'] / ours:.1f}x |"
        )
    rows += [
        "",
        "PSS summed over every rank and worker (/proc/PID/smaps_rollup through psutil), at the last batch of the",
        "pass, minus the same processes' PSS over a one-item dataset before the metas existed.",
        "",
        f"Command: `python benchmarks/bench_memory.py --sizes {' '.join(map(str, args.sizes))}"
        f" --start-method {method}`",
        "",
        machine_info(),
    ]
    save_results(args.out, f"memory_{method}", rows, memory, lambda path: _plot(memory, path, w, k, method))
    return 0


def _plot(memory: dict[int, dict[str, float]], path: Path, w: int, k: int, method: str) -> None:
    plt = plotting()

    sizes = sorted(memory)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for loader, label in zip(LOADERS, ["naive loader", "original rank_dataset", "RankDataset"]):
        ax.plot([n / 1e6 for n in sizes], [memory[n][loader] for n in sizes], marker="o", label=label)
    ax.set_xlabel("N (million samples)")
    ax.set_ylabel("meta memory, PSS (MiB)")
    ax.set_yscale("log")
    ax.set_title(f"{w} ranks x (1 + {k} workers, {method}), one pass")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
