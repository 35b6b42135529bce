"""Per-rank shard build of a three-source mix beside one file with the same R.

The three sources hold N/2, N/4 and N/4 lines (weight=1, repeat=0.5 and choose=N/2: down-sampled,
up-sampled twice, and the weighted one filling the rest), mixed into epochs of ``T0 = N``; the one
file is their concatenation, N lines. So both plans have R = ceil(N / W) samples on a rank and the
same bytes on disk: the difference is the mix (a second permutation per source, a source lookup per
position, three files to read from instead of one).

Each build runs in a fresh Python process with the index cached, the files in the page cache; the
plan alone (``ds.spec.indices()``) is timed again in the same process after the build.

Usage:
    python benchmarks/bench_mix.py                          # N = 10M lines, W = 8
    python benchmarks/bench_mix.py --lines 200000 --repeat 1 --out /tmp/results
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import cache_env, machine_info, md_table, plotting, run_child, save_results, write_imagenet_meta  # noqa: E402

_BUILD = """
import numpy as np
from rank_dataset import RankDataset, Source
if MIX:
    a, b, c = PATHS
    source = [Source(a, weight=1), Source(b, repeat=0.5), Source(c, choose=CHOOSE)]
    cfg = {"seed": 0, "epoch_size": LINES}
else:
    source, cfg = PATHS[0], {"seed": 0}
ds, elapsed, peak = measured(lambda: RankDataset(source, reload_cfg=cfg, rank=RANK, world_size=WORLD))
_, plan, _ = measured(ds.spec.indices)
print(json.dumps({"seconds": elapsed, "plan": plan, "peak": peak, "count": len(ds)}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000, help="N, all three sources together")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="builds of each kind, alternating (the median is kept)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the meta files (default: a tmp dir)")
    args = parser.parse_args(argv)
    n, w = args.lines, args.world_size
    if n < 8:
        parser.error("--lines must be at least 8")

    with tempfile.TemporaryDirectory(prefix="bench_mix_", dir=args.workdir) as tmp:
        work = Path(tmp)
        sizes = [n // 2, n // 4, n - n // 2 - n // 4]
        parts, first = [], 0
        for name, size in zip(["a.txt", "b.txt", "c.txt"], sizes):
            parts.append(write_imagenet_meta(work / name, size, first=first))
            first += size
        whole = work / "whole.txt"
        with open(whole, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        env = cache_env(work / "cache")
        # Index every file once, outside the measurements (a warm index, as in a training job).
        subprocess.run(
            [sys.executable, "-m", "rank_dataset", "index", *map(str, [*parts, whole])],
            env=env,
            check=True,
            capture_output=True,
        )

        def run(paths: list[Path], mix: bool, rank: int) -> dict[str, Any]:
            names = {"PATHS": [str(p) for p in paths], "MIX": mix, "LINES": n, "CHOOSE": n // 2}
            return run_child(_BUILD, env, **names, RANK=rank, WORLD=w)

        rows: dict[str, list[dict[str, Any]]] = {"one": [], "mix": []}
        for i in range(args.repeat):
            rows["one"].append(run([whole], False, i % w))
            rows["mix"].append(run(parts, True, i % w))

    assert rows["one"][0]["count"] == rows["mix"][0]["count"], "the two plans must have the same R"
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
    best = {k: min(r["seconds"] for r in v) for k, v in rows.items()}
    plan = {k: statistics.median(r["plan"] for r in v) for k, v in rows.items()}
    peak = {k: statistics.median(r["peak"] for r in v) for k, v in rows.items()}
    r_ = int(rows["one"][0]["count"])
    ratio = med["mix"] / med["one"]
    mib = 1 << 20
    labels = {
        "one": "one file of N lines",
        "mix": "mix of 3 files (weight, repeat=0.5, choose=N/2), epoch_size=N",
    }
    lines = [
        f"# Shard build of a three-source mix, N = {n:,} lines, W = {w}, R = {r_:,}, one rank",
        "",
    ]
    header = ["build", "seconds (median)", "vs one file", "seconds (fastest)", "vs one file", "plan alone (s)",
              "peak memory above start (MiB)"]  # fmt: skip
    lines += md_table(
        header,
        [(labels[k], f"{med[k]:.3f}", f"{med[k] / med['one']:.2f}x", f"{best[k]:.3f}", f"{best[k] / best['one']:.2f}x",
          f"{plan[k]:.3f}", f"{peak[k] / mib:.0f}") for k in ["one", "mix"]],
        "lrrrrrr",
    )  # fmt: skip
    lines += [
        "",
        f"The mix's build takes {ratio:.2f}x the one file's, median against median ({best['mix'] / best['one']:.2f}x "
        "fastest against fastest; target: within 1.3x). Sources: N/2 lines (weight=1, "
        "3N/8 an epoch), N/4 (repeat=0.5, N/8) and N/4 (choose=N/2, two passes); the one file is their "
        "concatenation. Warm index, files in the page cache, each build in a fresh process; "
        f"median of {args.repeat} builds of each, alternating.",
        "",
        f"Command: `python benchmarks/bench_mix.py --lines {n} --world-size {w} --repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    data = {"seconds": med, "fastest": best, "plan": plan, "peak": peak, "ratio": ratio, "per_rank": r_, "runs": rows}
    save_results(args.out, "mix", lines, data, lambda path: _plot(med, plan, path, n, w))
    return 0


def _plot(med: dict[str, float], plan: dict[str, float], path: Path, n: int, w: int) -> None:
    plt = plotting()
    names = ["one file", "mix of 3"]
    keys = ["one", "mix"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(names, [med[k] for k in keys], color=["gray", "tab:blue"], label="whole build")
    ax.bar(names, [plan[k] for k in keys], color=["black", "tab:cyan"], label="of which: the plan")
    ax.set_ylabel("seconds")
    ax.set_title(f"per-rank shard build, N={n:,}, W={w}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
