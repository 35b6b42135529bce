"""group_by(meta_file, key="label") on N lines: seconds and peak memory, beside the index build of the
same file and the label parser in a Python loop.

Each step runs in a fresh Python process, the file in the page cache: building the line-offset index
(what any first use of the file costs, and what grouping reads through), grouping with no cached
grouping (one pass over the file), grouping again (the cache, memory-mapped), and ``parse_label`` over
the first million lines in a Python loop (what grouping by a function of the line costs a line).
Peak memory is the rise of the process's peak RSS during the step.

Usage:
    python benchmarks/bench_group.py                       # N = 100M lines, file under /work/bench-data
    python benchmarks/bench_group.py --lines 200000 --out /tmp/results --data-dir /tmp/data --keep
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import barh, cache_env, machine_info, run_child, save_results, scratch_dir  # noqa: E402

_STEP = """
from pathlib import Path
from rank_dataset.files.index.load import load_index
from rank_dataset import group_by
from rank_dataset.core.parsers import parse_label
reset_peak()
before = rss()[0]
cpu, t = time.process_time(), time.perf_counter()
if STEP == "index":
    count = load_index(Path(PATH)).count
elif STEP in ("group", "cached"):
    groups = group_by(PATH)
    count = sum(len(v) for v in groups.values())
else:
    count = 0
    with open(PATH) as f:
        for line in f:
            parse_label(line)
            count += 1
            if count == 1_000_000:
                break
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - cpu,
                  "peak": rss()[1] - before, "count": count}))
"""


def write_lines(path: Path, n: int, chunk: int = 1 << 20) -> None:
    """Write ``rank_dataset.demo.synthetic.imagenet_line(i)`` for ``i < n``, vectorised (the same bytes)."""
    fixed = np.frombuffer(b"train/n01440764/n01440764_", np.uint8)
    with open(path, "wb") as f:
        for lo in range(0, n, chunk):
            i = np.arange(lo, min(n, lo + chunk), dtype=np.int64)
            label = (i * 7919) % 1000
            wnid = 1_440_764 + label
            cols: list[np.ndarray] = []
            keep: list[np.ndarray] = []

            def put(part: np.ndarray, mask: np.ndarray | None = None, cols=cols, keep=keep, i=i) -> None:
                part = np.broadcast_to(part, (i.size, part.shape[-1]))
                cols.append(part)
                keep.append(np.ones(part.shape, bool) if mask is None else mask)

            def digits(x: np.ndarray, width: int) -> np.ndarray:
                return ((x[:, None] // 10 ** np.arange(width - 1, -1, -1)) % 10 + 48).astype(np.uint8)

            def significant(x: np.ndarray, width: int) -> np.ndarray:
                shown = np.maximum(1, np.floor(np.log10(np.maximum(x, 1))).astype(np.int64) + 1)
                return np.arange(width)[None, :] >= width - shown[:, None]

            put(fixed[:7][None, :])  # "train/n"
            put(digits(wnid, 8))
            put(fixed[15:17][None, :])  # "/n"
            put(digits(wnid, 8))
            put(fixed[25:26][None, :])  # "_"
            put(digits(i, 10), significant(i, 10))
            put(np.frombuffer(b".JPEG ", np.uint8)[None, :])
            put(digits(label, 3), significant(label, 3))
            put(np.full((1, 1), 10, np.uint8))
            f.write(np.concatenate(cols, axis=1)[np.concatenate(keep, axis=1)].tobytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=100_000_000)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the meta file goes (removed after, unless --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the meta file and its caches")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    n = args.lines
    with scratch_dir(args.data_dir / f"group_{n}", keep=args.keep) as work:
        path = work / "meta.txt"
        env = cache_env(work / "cache")
        if not path.exists() or path.stat().st_size == 0:
            write_lines(path, n)
        shutil.rmtree(work / "cache", ignore_errors=True)
        with open(path, "rb") as f:  # into the page cache: what is measured is the work, not the disk
            while f.read(64 << 20):
                pass
        size = path.stat().st_size
        results = {
            step: run_child(_STEP, env, STEP=step, PATH=str(path)) for step in ("index", "group", "cached", "python")
        }
    assert results["index"]["count"] == results["group"]["count"] == results["cached"]["count"] == n
    python_rate = results["python"]["count"] / results["python"]["seconds"]
    group = results["group"]
    rows = [
        f'group_by(meta_file, key="label") on N = {n:,} lines ({size / 1e9:.1f} GB)'
        ", the file in the page cache; each step a fresh process.",
        "",
        machine_info(),
        "",
        "| step | seconds | lines/s | CPU seconds | peak memory | bytes/line | vs group_by |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "index": "index build (the baseline: any first use)",
        "group": 'group_by(key="label"), no cached grouping',
        "cached": "group_by again (cached, memory-mapped)",
    }
    for step, text in labels.items():
        r = results[step]
        rows.append(
            f"| {text} | {r['seconds']:.2f} | {n / r['seconds'] / 1e6:.1f}M | {r['cpu']:.2f} | "
            f"{r['peak'] / 2**20:,.0f} MiB | {r['peak'] / n:.1f} | {r['seconds'] / group['seconds']:.2f}x |"
        )
    rows.append(
        f"| parse_label in a Python loop (first 1M lines) | {n / python_rate:.2f} (projected) | "
        f"{python_rate / 1e6:.2f}M | | | | {n / python_rate / group['seconds']:.1f}x |"
    )
    rows += [
        "",
        f"group_by: {n / group['seconds'] / 1e6:.1f}M lines/s and {group['peak'] / n:.1f} bytes a line at its peak",
        "(targets: at least 10M lines/s, at most about 16 bytes a line). It reads the file in 8 MiB blocks, parsed",
        "and sorted by label in two threads (the CPU column counts both), and places the sample numbers straight",
        "into a map of its cache file. Wall-clock figures were taken on a machine shared with other jobs.",
        "",
        f"Command: `python benchmarks/bench_group.py --lines {n}`",
    ]

    bars = {
        "index build": results["index"]["seconds"],
        "group_by": group["seconds"],
        "group_by cached": results["cached"]["seconds"],
        "Python loop (proj.)": n / python_rate,
    }
    save_results(
        args.out,
        "group",
        rows,
        {"lines": n, "results": results},
        lambda png: barh(png, bars, f"seconds for {n:,} lines", 3),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
