"""Two versions of rank-dataset side by side: a rank's shard build (W = 8) and ``ds[i]`` at random i.

Each measurement runs in a fresh Python process whose ``PYTHONPATH`` puts one version's ``src/`` first:
the current tree, and ``--old`` (a git revision, exported with ``git archive``). The versions alternate,
round after round, so that a slower or busier stretch of the machine falls on both alike; the table gives
each one's median and the ratio new / old. Both read the same file with the same warm index cache (the
index format is the same in both; a version that differs rebuilds it in its warm-up).

- ``build``: ``RankDataset(META, rank=0, world_size=8)`` with the index cached: what each rank does
  at every job start and ``set_epoch``.
- ``ds[i]``: ``--items`` random items of that dataset (the parsed line, as a DataLoader worker takes
  them from a sampler's random indices), in microseconds an item.

Usage:
    python benchmarks/bench_versions.py --old 81574b3           # N = 10M lines
    python benchmarks/bench_versions.py --old HEAD~1 --lines 200000 --repeat 1 --out /tmp/results
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _common import barh, cache_env, machine_info, run_child, save_results, scratch_dir, write_imagenet_meta  # noqa: E402

_MEASURE = """
import numpy as np
import rank_dataset
assert rank_dataset.__file__.startswith(SRC), rank_dataset.__file__
from rank_dataset import RankDataset
ds, build, peak = measured(lambda: RankDataset(META, reload_cfg={"seed": 0}, rank=0, world_size=WORLD))
order = np.random.default_rng(1).integers(0, len(ds), ITEMS).tolist()
ds[order[0]]
t = time.perf_counter()
for i in order:
    ds[i]
item = (time.perf_counter() - t) / ITEMS
print(json.dumps({"build": build, "item_us": item * 1e6, "count": len(ds)}))
"""


def _export(rev: str, into: Path) -> Path:
    """The ``src/`` of revision ``rev`` of this repository, written under ``into``."""
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        # filter= came with Python 3.11.4 (and 3.10.12): Debian's 3.11.2 has none. The archive is this
        # repository's own, from git.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="git revision to compare with the current tree")
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each runs old then new")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    with scratch_dir(args.data_dir / "rank-dataset-bench-versions") as scratch:
        meta = write_imagenet_meta(scratch / "meta.txt", args.lines)
        versions = {"old": _export(args.old, scratch / "old"), "new": ROOT / "src"}
        got: dict[str, list[dict[str, float]]] = {name: [] for name in versions}

        def run(name: str) -> dict[str, float]:
            env = {**cache_env(scratch / "cache"), "PYTHONPATH": str(versions[name])}
            names = {"META": str(meta), "WORLD": args.world_size, "ITEMS": args.items, "SRC": str(versions[name])}
            return run_child(_MEASURE, env, **names)

        for name in versions:  # warm-up: the index cache, the page cache, bytecode
            run(name)
        for _ in range(args.repeat):
            for name in versions:
                got[name].append(run(name))

    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("build", "item_us")} for name, runs in got.items()}
    old_rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=ROOT, capture_output=True, text=True)
    rows = [
        f"# Old against new: N = {args.lines:,} lines, W = {args.world_size}, rank 0",
        "",
        machine_info(),
        f"Old: `{old_rev.stdout.strip()}`; new: the working tree. Medians of {args.repeat} alternating rounds, "
        "each measurement in a fresh process.",
        "",
        "| measure | old | new | new / old |",
        "|---|---:|---:|---:|",
        f"| build, W = {args.world_size} (s) | {med['old']['build']:.3f} | {med['new']['build']:.3f} | "
        f"{med['new']['build'] / med['old']['build']:.3f}x |",
        f"| ds[i], random i (µs) | {med['old']['item_us']:.2f} | {med['new']['item_us']:.2f} | "
        f"{med['new']['item_us'] / med['old']['item_us']:.3f}x |",
    ]
    ratios = {m: med["new"][m] / med["old"][m] for m in ("build", "item_us")}
    data = {"old": args.old, "lines": args.lines, "runs": got, "medians": med, "ratios": ratios}
    bars = {"build, new / old": ratios["build"], "ds[i], new / old": ratios["item_us"]}
    save_results(args.out, "versions", rows, data, lambda path: barh(path, bars, "new / old (1 = the same)", 1.6))


if __name__ == "__main__":
    main()
