"""Per-rank shard build time and peak memory, beside a whole-file scan and the original approach.

Each measurement runs in a fresh Python process, so that timings and peak memory are its own:
- ``scan``: ``open(p, 'rb').read().count(b'\\n')``, the floor for touching every byte once;
- ``cold``: RankDataset with no index cache yet (the index is built first);
- ``warm``: RankDataset with the index cached;
- ``original``: the original rank_dataset approach: every rank draws the whole permutation, scans
  every line of the file and keeps its own lines as a Python list.

Peak memory is the peak RSS of the process above its RSS just before the build (the peak is reset
through /proc/self/clear_refs first).

Then the cost of the ranks' agreement check (every build under a process group first checks, with one
all_gather, that all ranks plan from the same files and settings): ``--agree-ranks`` (default 4) gloo
ranks on loopback, launched by torchrun, each time ``set_epoch`` with the check and with it skipped
(a private switch, for this benchmark only), alternately, and the check alone (its fields, fingerprint
included, and the collective). Each timing is of the slowest rank (the ranks start each one together,
after a barrier); the median over ``--repeat`` rounds is kept.

With ``--native-compare``, the cold and warm builds instead, each on numpy (``RANK_DATASET_NATIVE=0``) and
on the native kernels (``RANK_DATASET_NATIVE=require``), alternately, beside the whole-file scan, in the same
run: ``build_native.md`` (the original approach and the agreement check are not run).

Usage:
    python benchmarks/bench_build.py                       # N = 10M lines, W = 8
    python benchmarks/bench_build.py --lines 200000 --repeat 1 --out /tmp/results
    python benchmarks/bench_build.py --native-compare --repeat 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    NATIVE_PATHS,
    cache_env,
    load_note,
    machine_info,
    md_table,
    native_env,
    plotting,
    ratio,
    run_child,
    save_results,
    write_imagenet_meta,
)

_SCAN = """
count, elapsed, peak = measured(lambda: open(META, "rb").read().count(b"\\n"))
print(json.dumps({"seconds": elapsed, "peak": peak, "count": count}))
"""

_RANK_DATASET = """
import numpy as np
from rank_dataset import RankDataset
ds, elapsed, peak = measured(lambda: RankDataset(META, reload_cfg={"seed": 0}, rank=RANK, world_size=WORLD))
shard = ds.shard
text = int(shard.ends.astype(np.int64).sum() - shard.starts.astype(np.int64).sum())
lengths = shard.ends.astype(np.int64) - shard.starts
# The layout before: each line padded to a multiple of 8 bytes, uint32 start and end, int64 sample number.
before_layout = int(((np.maximum(lengths, 1) + 7) // 8 * 8).sum()) + 16 * len(ds)
from rank_dataset.core import native
print(json.dumps({"seconds": elapsed, "peak": peak, "count": len(ds), "own": text + 4 * len(ds),
                  "kernels": native.describe().split()[0], "held": shard.nbytes, "text": text,
                  "segment": shard.handle.size, "before_layout": before_layout}))
"""

_ORIGINAL = """
import numpy as np
reset_peak(); before = rss()[0]
t = time.perf_counter()
# The original design: the whole permutation in every rank, then a scan of every line.
with open(META) as f:
    n = sum(1 for line in f if line.strip())
perm = np.random.default_rng(0).permutation(n)
per_rank = -(-n // WORLD)
mine = set(perm[RANK * per_rank:(RANK + 1) * per_rank].tolist())
metas = []
with open(META) as f:
    i = 0
    for line in f:
        line = line.strip()
        if not line:
            continue
        if i in mine:
            metas.append(line)
        i += 1
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "peak": rss()[1] - before, "count": len(metas)}))
"""


_AGREE_RANK = """
import json, statistics, sys, time
import torch.distributed as dist
import rank_dataset.training._agree as agree
from rank_dataset import RankDataset

meta, repeat, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
ds = RankDataset(meta, reload_cfg={"seed": 0})  # warm index; rank and world size from the group
times = {"off": [], "on": [], "check": []}
for i in range(repeat):
    for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
        agree._ENABLED = mode == "on"
        dist.barrier()
        t = time.perf_counter()
        ds.set_epoch(i + 1)
        times[mode].append(time.perf_counter() - t)
    agree._ENABLED = True
    dist.barrier()
    t = time.perf_counter()
    agree.check_ranks_agree(ds._agreement_fields(ds.spec))
    times["check"].append(time.perf_counter() - t)
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, times)
if dist.get_rank() == 0:
    slowest = {k: [max(g[k][i] for g in gathered) for i in range(repeat)] for k in times}
    result = {k: statistics.median(v) for k, v in slowest.items()}
    result["added"] = sorted(on - off for on, off in zip(slowest["on"], slowest["off"]))
    result["samples"] = len(ds)
    with open(out, "w") as f:
        json.dump(result, f)
dist.destroy_process_group()
"""


def run_agree(meta: Path, ranks: int, repeat: int, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Median seconds (of the slowest rank) of set_epoch with and without the agreement check, and of the
    check alone, over ``ranks`` gloo ranks launched by torchrun on loopback; ``added``: what the check
    added to set_epoch in each round (sorted)."""
    script, out = work / "agree_rank.py", work / "agree.json"
    script.write_text(_AGREE_RANK)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd += ["--log-dir", str(work / "logs")]  # else torchrun leaves a /tmp/torchelastic_* directory
    cmd += [str(script), str(meta), str(repeat), str(out)]
    proc = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"agreement measurement failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the median is kept)")
    parser.add_argument("--original-repeat", type=int, default=1, help="runs of the (slow) original approach")
    parser.add_argument("--agree-ranks", type=int, default=4, help="gloo ranks timing the agreement check (0: skip)")
    parser.add_argument("--agree-repeat", type=int, default=9, help="rounds of the agreement check's timings")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the meta file (default: a tmp dir)")
    parser.add_argument("--native-compare", action="store_true", help="cold and warm builds on numpy and native")
    args = parser.parse_args(argv)
    if args.native_compare:
        return compare_native(args)

    with tempfile.TemporaryDirectory(prefix="bench_build_", dir=args.workdir) as tmp:
        work = Path(tmp)
        meta = work / "meta.txt"
        write_imagenet_meta(meta, args.lines)
        cache = work / "cache"
        env = cache_env(cache)
        w = args.world_size

        def run(body: str, rank: int) -> dict[str, Any]:
            return run_child(body, env, META=str(meta), RANK=rank, WORLD=w)

        rows: dict[str, list[dict[str, Any]]] = {"scan": [], "cold": [], "warm": [], "original": []}
        for i in range(args.repeat):
            rows["scan"].append(run(_SCAN, 0))
            shutil.rmtree(cache, ignore_errors=True)
            rows["cold"].append(run(_RANK_DATASET, i % w))
            rows["warm"].append(run(_RANK_DATASET, (i + 1) % w))
        for _ in range(args.original_repeat):
            rows["original"].append(run(_ORIGINAL, 0))
        agree = run_agree(meta, args.agree_ranks, args.agree_repeat, work, env) if args.agree_ranks else None

    med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
    peak = {k: statistics.median(r["peak"] for r in v) for k, v in rows.items()}
    own = statistics.median(r["own"] for r in rows["warm"])
    held = statistics.median(r["held"] for r in rows["warm"])
    warm = rows["warm"][0]
    per_sample = {
        "text": warm["text"] / warm["count"],
        "held": warm["held"] / warm["count"],
        "segment": warm["segment"] / warm["count"],
        "before_layout": warm["before_layout"] / warm["count"],
    }
    mib = 1 << 20
    labels = {
        "scan": "whole-file read + count newlines (floor)",
        "cold": "RankDataset, cold (indexing included)",
        "warm": "RankDataset, warm index",
        "original": "original approach (whole permutation + full scan, Python lists)",
    }
    lines = [
        f"# Shard build, N = {args.lines:,} lines, W = {w}, one rank",
        "",
    ]
    table = []
    for k in ["scan", "cold", "warm", "original"]:
        ratio = med["scan"] / med[k]
        speed = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
        table.append((labels[k], f"{med[k]:.3f}", speed, f"{peak[k] / mib:.0f}", f"{peak[k] / own:.2f}"))
    header = ["build", "seconds", "vs whole-file scan", "peak memory above start (MiB)", "peak / rank's own bytes"]
    lines += md_table(header, table, "lrrrr")
    lines += [
        "",
        f"The rank's own lines plus one 4-byte offset each: {own / mib:.1f} MiB; its shard holds {held / mib:.1f} MiB.",
        "",
        f"| bytes per sample, one rank's shard ({warm['count']:,} samples) | bytes | vs the lines |",
        "|---|---:|---:|",
        f"| the lines themselves | {per_sample['text']:.1f} | 1.00 |",
        f"| shard: lines back to back + one uint32 offset each | {per_sample['held']:.1f} |"
        f" {per_sample['held'] / per_sample['text']:.2f} |",
        f"| shard's shared-memory segment (header and alignment included) | {per_sample['segment']:.1f} |"
        f" {per_sample['segment'] / per_sample['text']:.2f} |",
        f"| layout before (lines padded to 8 B, uint32 start and end, int64 sample number) |"
        f" {per_sample['before_layout']:.1f} | {per_sample['before_layout'] / per_sample['text']:.2f} |",
        "",
        f"Median of {args.repeat} runs ({args.original_repeat} of the original approach), each in a fresh process;",
        "the meta file is in the page cache for every run.",
        "",
        f"Warm build: {med['scan'] / med['warm']:.1f}x faster than the whole-file scan, "
        f"{med['original'] / med['warm']:.0f}x faster than the original approach. "
        f"Cold build: {med['cold'] / med['scan']:.2f}x the whole-file scan.",
        "",
    ]
    if agree is not None:
        a, ms = args.agree_ranks, 1000
        lines += [
            f"## The ranks' agreement check, {a} gloo ranks on loopback (N = {args.lines:,}, W = {a})",
            "",
            "| build under a process group | ms (slowest rank) | vs without the check |",
            "|---|---:|---:|",
            f"| set_epoch, check skipped | {agree['off'] * ms:.1f} | 1.00x |",
            f"| set_epoch, with the check | {agree['on'] * ms:.1f} | {agree['on'] / agree['off']:.2f}x |",
            f"| the check alone (fields + one all_gather of 256 bytes) | {agree['check'] * ms:.2f} | "
            f"{agree['check'] / agree['off']:.2%} of a build |",
            "",
            f"Each rank holds {int(agree['samples']):,} samples. Median of {args.agree_repeat} rounds; in each, the",
            "two set_epoch timings alternate in order, each after a barrier. Paired by round, the check added a",
            f"median {statistics.median(agree['added']) * ms:.1f} ms to set_epoch (from {agree['added'][0] * ms:.1f}"
            f" to {agree['added'][-1] * ms:.1f} ms). Where that spread is wider than the check alone, it is the",
            "builds' own variation (a shared machine) and the check alone is the figure to go by.",
            "",
        ]
    lines += [
        f"Command: `python benchmarks/bench_build.py --lines {args.lines} --world-size {w} --repeat {args.repeat}"
        f"{'' if args.agree_ranks == 4 else f' --agree-ranks {args.agree_ranks}'}"
        f"{'' if args.agree_repeat == 9 else f' --agree-repeat {args.agree_repeat}'}`",
        "",
        machine_info(),
    ]
    save_results(
        args.out,
        "build",
        lines,
        {"seconds": med, "peak": peak, "own": own, "agree": agree, "bytes_per_sample": per_sample},
        lambda path: _plot(med, peak, own, path, args.lines, w),
    )
    return 0


def compare_native(args: argparse.Namespace) -> int:
    """The cold and warm builds of one rank on each path, alternately, beside the whole-file scan, in one run."""
    w, load_before = args.world_size, load_note()
    with tempfile.TemporaryDirectory(prefix="bench_build_", dir=args.workdir) as tmp:
        work = Path(tmp)
        meta = work / "meta.txt"
        write_imagenet_meta(meta, args.lines)
        cache = work / "cache"
        rows: dict[str, list[float]] = {"scan": []}
        for i in range(args.repeat):
            rows["scan"].append(run_child(_SCAN, cache_env(cache), META=str(meta), RANK=0, WORLD=w)["seconds"])
            for mode in NATIVE_PATHS if i % 2 == 0 else NATIVE_PATHS[::-1]:
                env = native_env(cache_env(cache), mode)
                for kind in ("cold", "warm"):
                    if kind == "cold":
                        shutil.rmtree(cache, ignore_errors=True)
                    got = run_child(_RANK_DATASET, env, META=str(meta), RANK=(i + (kind == "warm")) % w, WORLD=w)
                    assert got["kernels"] == ("numpy" if mode == "0" else "native"), got["kernels"]
                    rows.setdefault(f"{kind} {mode}", []).append(got["seconds"])
    med = {k: statistics.median(v) for k, v in rows.items()}
    best = {k: min(v) for k, v in rows.items()}
    lines = [
        f"# Shard build on numpy and on the native kernels, N = {args.lines:,} lines, W = {w}, one rank",
        "",
        "| build | of the runs | numpy (s) | native (s) | native speed-up | numpy / one read | native / one read |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for stat, got in (("median", med), ("fastest", best)):
        scan = got["scan"]
        lines.append(
            f"| whole-file read + count newlines (one read) | {stat} | {scan:.3f} | {scan:.3f} | | 1.00x | 1.00x |"
        )
        for kind, label in (("cold", "RankDataset, cold (indexing included)"), ("warm", "RankDataset, warm index")):
            a, b = got[f"{kind} 0"], got[f"{kind} require"]
            cells = f"{ratio(a, b)} | {ratio(a, scan)} | {ratio(b, scan)}"
            lines.append(f"| {label} | {stat} | {a:.3f} | {b:.3f} | {cells} |")
    lines += [
        "",
        f"{args.repeat} runs of each, each in a fresh process, the paths alternating (`RANK_DATASET_NATIVE=0` and",
        "`require`); the meta file is in the page cache for every run. On a machine shared with other work the",
        "fastest run is the one least disturbed. Load average (1, 5, 15 min) before: "
        f"{load_before}; after: {load_note()}.",
        "",
        f"Command: `python benchmarks/bench_build.py --native-compare --lines {args.lines} --world-size {w}"
        f" --repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "build_native", lines, {"seconds": med, "fastest": best, "runs": rows}, lambda path: None)
    return 0


def _plot(med: dict[str, float], peak: dict[str, float], own: float, path: Path, n: int, w: int) -> None:
    plt = plotting()

    keys = ["scan", "cold", "warm", "original"]
    names = ["whole-file\nscan", "cold\nbuild", "warm\nbuild", "original\napproach"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [med[k] for k in keys], color=["gray", "tab:orange", "tab:green", "tab:red"])
    a.set_yscale("log")
    a.set_ylabel("seconds (log)")
    a.set_title(f"build time, N={n:,}, W={w}")
    b.bar(names, [peak[k] / (1 << 20) for k in keys], color=["gray", "tab:orange", "tab:green", "tab:red"])
    b.axhline(2 * own / (1 << 20), ls="--", color="k", label="2x the rank's own bytes")
    b.set_ylabel("peak RSS above start (MiB)")
    b.set_title("peak memory")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
