"""Two versions of rank-dataset side by side: a rank's shard build (W = 8) and ``ds[i]`` at random i,
on the same lines as plain text or, with ``--formats``, compressed as ``bench_formats.py`` writes them.

Each measurement runs in a fresh Python process whose ``PYTHONPATH`` puts one version's ``src/`` first:
the current tree, and ``--old`` (a git revision, exported with ``git archive``). Each figure is the CPU time
of the measured work (``time.process_time``: every thread of the process), not its wall time, so that a
busy machine slows neither version's figure. The versions alternate,
round after round, so that a slower or busier stretch of the machine falls on both alike; the table gives
each one's median and the ratio new / old. Both read the same file with the same warm index cache (the
index format is the same in both; a version that differs rebuilds it in its warm-up).

- ``build``: ``RankDataset(META, rank=r, world_size=8)`` with the index cached: what each rank does
  at every job start and ``set_epoch``.
- ``ds[i]``: ``--items`` random items of that dataset (the parsed line, as a DataLoader worker takes
  them from a sampler's random indices), in microseconds of CPU an item.

Usage:
    python benchmarks/bench_versions.py --old 81574b3           # N = 10M lines
    python benchmarks/bench_versions.py --old HEAD~1 --lines 200000 --repeat 1 --out /tmp/results
    python benchmarks/bench_versions.py --old 0b55152 --formats txt gz zst frames.zst
"""

from __future__ import annotations

import argparse
import os
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

from _common import barh, cache_env, machine_info, md_table, run_child, save_results, scratch_dir, write_imagenet_meta  # noqa: E402
from bench_formats import compress  # noqa: E402

_MEASURE = """
import numpy as np
import rank_dataset
assert rank_dataset.__file__.startswith(SRC), rank_dataset.__file__
from rank_dataset import RankDataset
cpu = time.process_time()
ds = RankDataset(META, reload_cfg={"seed": 0}, rank=RANK, world_size=WORLD)
build = time.process_time() - cpu
order = np.random.default_rng(1).integers(0, len(ds), ITEMS).tolist()
ds[order[0]]
cpu = time.process_time()
for i in order:
    ds[i]
item = (time.process_time() - cpu) / ITEMS
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
    kernels = into / "src" / "rank_dataset" / "core" / "_kernels.c"
    if kernels.exists():  # a revision with the native kernels: built as its install builds them (hatch_build.py)
        cc = os.environ.get("CC", "cc")
        flags = ["-O2", "-fPIC", "-shared", "-std=c99"]
        subprocess.run([cc, *flags, "-o", str(kernels.with_suffix(".so")), str(kernels)], check=True)
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="git revision to compare with the current tree")
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each runs old then new")
    parser.add_argument(
        "--formats", nargs="+", default=["txt"], choices=["txt", "gz", "zst", "frames.zst"], help="the files read"
    )
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    with scratch_dir(args.data_dir / "rank-dataset-bench-versions") as scratch:
        text = write_imagenet_meta(scratch / "meta.txt", args.lines)
        files = {name: text if name == "txt" else compress(text, name, scratch) for name in args.formats}
        versions = {"old": _export(args.old, scratch / "old"), "new": ROOT / "src"}
        got: dict[str, dict[str, list[dict[str, float]]]] = {f: {name: [] for name in versions} for f in files}

        def run(name: str, meta: Path, rank: int) -> dict[str, float]:
            env = {**cache_env(scratch / "cache"), "PYTHONPATH": str(versions[name])}
            names = {"META": str(meta), "WORLD": args.world_size, "RANK": rank, "ITEMS": args.items}
            return run_child(_MEASURE, env, **names, SRC=str(versions[name]))

        for f, meta in files.items():
            for name in versions:  # warm-up: the index cache, the page cache, bytecode
                run(name, meta, 0)
            # Round k builds rank k % W in both versions: the ranks' shards differ in what they cost.
            for k in range(args.repeat):
                for name in versions:
                    got[f][name].append(run(name, meta, k % args.world_size))

    med = {
        f: {name: {k: statistics.median(r[k] for r in runs) for k in ("build", "item_us")} for name, runs in by.items()}
        for f, by in got.items()
    }
    old_rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=ROOT, capture_output=True, text=True)
    rows = [
        f"# Old against new: N = {args.lines:,} lines, W = {args.world_size}",
        "",
        machine_info(),
        f"Old: `{old_rev.stdout.strip()}`; new: the working tree. Medians of {args.repeat} alternating rounds (old, "
        f"then new; round k builds rank k mod {args.world_size}), each measurement in a fresh process; CPU "
        "times (the process's, all threads). Files as "
        "`bench_formats.py` writes them (`.gz`: gzip -6; `.zst`: one frame, level 3; frames: a frame per 4 MiB).",
        "",
    ]
    ratios, table = {}, []
    for f, m in med.items():
        ratios[f] = {k: m["new"][k] / m["old"][k] for k in ("build", "item_us")}
        table.append(
            (files[f].name, f"{m['old']['build']:.3f}", f"{m['new']['build']:.3f}", f"{ratios[f]['build']:.3f}x",
             f"{m['old']['item_us']:.2f}", f"{m['new']['item_us']:.2f}", f"{ratios[f]['item_us']:.3f}x")
        )  # fmt: skip
    header = ["file", "build, old (s)", "build, new (s)", "new / old", "ds[i], old (µs)", "ds[i], new (µs)",
              "new / old"]  # fmt: skip
    rows += md_table(header, table, "lrrrrrr")
    data = {"old": args.old, "lines": args.lines, "formats": args.formats, "runs": got, "medians": med}
    data["ratios"] = ratios
    bars = {f"build {f}, new / old": r["build"] for f, r in ratios.items()}
    bars.update({f"ds[i] {f}, new / old": r["item_us"] for f, r in ratios.items()})
    save_results(args.out, "versions", rows, data, lambda path: barh(path, bars, "new / old (1 = the same)", 1.6))


if __name__ == "__main__":
    main()
