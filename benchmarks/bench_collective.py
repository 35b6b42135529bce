"""The collective reader beside the file reader: W gloo ranks on one file of N lines, in one run.

For each W, W processes join a gloo process group on loopback (each imports torch; the file of
lines of about 34 bytes is in the page cache, as on a node that read it recently) and, released
together by barriers:
- ``cold start``: make the dataset with no index cache anywhere until every rank holds its first
  shard: the collective reader (each rank counts the lines of its 1/W slice, then the first
  exchange), then the file reader (the ranks race to build the index through its cache lock);
- ``set_epoch``: the next epoch's shard, both readers (the file reader's index cache warm);
- per rank: the bytes read (``read_chars`` of the process), the bytes the collective reader sent
  (requests, lengths and lines), and the rise of its peak RSS over the set_epoch against its shard.
Times are the slowest rank's. ``one read`` is a fresh process reading the file 16 MiB at a time and
counting newlines: the baseline of the cold start ratio.

Usage:
    python benchmarks/bench_collective.py                       # N = 10M, W in {4, 8, 16}
    python benchmarks/bench_collective.py --lines 100000000     # 3.4 GB under --data-dir, deleted after
    python benchmarks/bench_collective.py --lines 20000 --worlds 2 --out /tmp/results
    python benchmarks/bench_collective.py --worlds 8 --native-compare   # numpy and native: collective_native.md

With ``--native-compare``, each W runs twice, on numpy (``RANK_DATASET_NATIVE=0``) and on the native kernels
(``require``), and ``<name>_native.md`` sets the two side by side.

With ``--phases`` (and ``--baseline SRC`` or not), ``<name>_phases.md`` gives the collective reader's cold start
by phase instead: each rank wraps the reader's functions with ``time.process_time()`` (the process's CPU, gloo's
threads included; each phase without the phases inside it), ``--repeat`` runs of each code, alternating.

With ``--baseline SRC`` (another checkout's ``src``, its kernels built), each W runs ``--repeat`` times on that
code and on this, alternating, and ``<name>_local.md`` sets the busiest rank's CPU of the two side by side
against one read's CPU (the node-local exchange against the gloo-only one it replaced, on one host)::

    git -C . archive main src | tar -x -C /tmp/base && gcc -O2 -fPIC -shared -std=c99 \
        -o /tmp/base/src/rank_dataset/core/_kernels.so /tmp/base/src/rank_dataset/core/_kernels.c
    python benchmarks/bench_collective.py --worlds 8 --baseline /tmp/base/src --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    NATIVE_PATHS,
    PEAK_PRELUDE,
    load_note,
    machine_info,
    native_env,
    plotting,
    ratio,
    save_results,
    scratch_dir,
    start_python,
)
from bench_scale import meta_file  # noqa: E402
from rank_dataset.server.local import free_port  # noqa: E402

_ONE_READ = """
import json, os, sys, time
t, cpu = time.perf_counter(), time.process_time()
fd, count = os.open(sys.argv[1], os.O_RDONLY), 0
while chunk := os.read(fd, 16 << 20):
    count += chunk.count(b"\\n")
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - cpu, "count": count}))
"""

_RANK = (
    PEAK_PRELUDE
    + """
import psutil, torch.distributed as dist
from rank_dataset import RankDataset
# The modules a cold start would import lazily, imported before the clock: a process's imports are not its
# build (and where Python writes no bytecode, as on this machine, each run compiles them: 0.05-0.1 s).
import importlib
for name in ("rank_dataset.training.dataset", "rank_dataset.training._readers", "rank_dataset.shards.collective",
             "rank_dataset.shards.reader", "rank_dataset.files.read.metafile", "rank_dataset.core._native_lib"):
    importlib.import_module(name)
path = sys.argv[1]
# The dataset's full collection after its first build (the dataset's, not the reader's): its CPU noted apart.
import rank_dataset.training.dataset as _td
collected = [0.0]
if hasattr(_td, "settle_before_fork"):
    _settle = _td.settle_before_fork
    def _timed_settle():
        t = time.process_time()
        _settle()
        collected[0] += time.process_time() - t
    _td.settle_before_fork = _timed_settle
dist.init_process_group("gloo")
me, out = psutil.Process(), {}
def step(name, make):
    dist.barrier()
    read, cpu, gc_cpu = me.io_counters().read_chars, time.process_time(), collected[0]
    made, seconds, peak = measured(make)
    cpu = time.process_time() - cpu  # this process's threads (gloo's included), on whatever core
    dist.barrier()
    out[name] = {"seconds": seconds, "cpu": cpu, "peak": peak, "read": me.io_counters().read_chars - read,
                 "gc": collected[0] - gc_cpu}
    return made
coll = step("collective_cold", lambda: RankDataset(path, reader="collective", reload_cfg={"seed": 1}))
out["collective_cold"]["sent"] = coll.reader.stats["sent"]
step("collective_epoch", lambda: coll.set_epoch(1))
out["collective_epoch"]["sent"] = coll.reader.stats["sent"]
out["shard"] = coll.shard.nbytes
coll.close()
del coll
f = step("file_cold", lambda: RankDataset(path, reload_cfg={"seed": 1}))
step("file_epoch", lambda: f.set_epoch(1))
print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""
)


# The cold start of a rank with the reader's functions timed: what each spent (its own CPU, the functions it
# calls that are timed too left out), printed as JSON. It wraps names of the reader's modules (private ones),
# so it runs only on code that has them; a name a version lacks is left out.
_PHASES_RANK = """
import functools, importlib, json, sys, time
import torch.distributed as dist
from rank_dataset import RankDataset
for name in ("rank_dataset.training.dataset", "rank_dataset.training._readers", "rank_dataset.shards.collective",
             "rank_dataset.shards.reader", "rank_dataset.files.read.metafile", "rank_dataset.core._native_lib"):
    importlib.import_module(name)
spent, inside = {}, []
def timed(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        t = time.process_time()
        inside.append(0.0)
        try:
            return f(*a, **k)
        finally:
            within, d = inside.pop(), time.process_time() - t
            spent[name] = spent.get(name, 0.0) + d - within
            if inside:
                inside[-1] += d
    return g
def wrap(module, owner, names, prefix=""):
    target = importlib.import_module(module) if owner is None else getattr(importlib.import_module(module), owner)
    for n in names:
        if hasattr(target, n):
            setattr(target, n, timed(prefix + n, getattr(target, n)))
from rank_dataset.core import native
for n in ("route_items", "scatter_bounds", "place_lines", "copy_lines", "pack_requests", "verify_lines",
          "permute_cells", "scan_lines"):
    setattr(native, n, timed(n, getattr(native, n)))
C = "rank_dataset.shards.collective."
wrap(C + "_reader", None, ["count_slices", "shared_fingerprints", "shared_checkpoints", "shared_objects"])
wrap(C + "_slices", None, ["_count"])
wrap(C + "_rounds", "Server", ["serve", "_read"], "Server.")
wrap(C + "_local", "Local", ["__init__", "copy_round", "lengths_of"], "Local.")
wrap(C + "_dist", "Collectives", ["all_to_all", "all_gather", "all_gather_object", "broadcast"], "Collectives.")
wrap("rank_dataset.core.shard", "ShardWriter", ["__init__", "finish"], "ShardWriter.")
Exchange = importlib.import_module(C + "_rounds").Exchange
_build = Exchange.build
Exchange.build = lambda self, plan_of, keep: _build(self, timed("plan", plan_of), keep)
dist.init_process_group("gloo")
dist.barrier()
cpu = time.process_time()
ds = RankDataset(sys.argv[1], reader="collective", reload_cfg={"seed": 1})
cpu = time.process_time() - cpu
dist.barrier()
print(json.dumps({"total": cpu, **spent}), flush=True)
ds.close()
dist.destroy_process_group()
"""

# The phases of the table: what each groups of the timed functions.
PHASES = [
    ("copying the lines into the shard (`copy_lines`)", ["copy_lines", "Local.copy_round"]),
    ("the shard's new shared pages (`ShardWriter`, populated)", ["ShardWriter.__init__", "ShardWriter.finish"]),
    ("the count: reading and scanning the slice", ["_count", "scan_lines", "count_slices"]),
    ("the shared table and round buffers (`Local`)", ["Local.__init__"]),
    ("the plan (its permutation included; the file reader's too)", ["plan", "permute_cells"]),
    ("routing (`route_items`)", ["route_items"]),
    ("the lengths and the offsets (`lengths_of`, `scatter_bounds`)", ["Local.lengths_of", "scatter_bounds"]),
    (
        "the rounds' second read of the slice and its check",
        ["Server._read", "verify_lines", "Server.serve", "pack_requests", "place_lines"],
    ),
    (
        "gloo's collectives (their threads included)",
        ["Collectives.all_to_all", "Collectives.all_gather", "Collectives.all_gather_object", "Collectives.broadcast"],
    ),
]


def one_read(path: Path, field: str = "seconds") -> float:
    """One read of ``path`` in a fresh process: its wall seconds, or (``field="cpu"``) its CPU seconds."""
    out = subprocess.run([sys.executable, "-c", _ONE_READ, str(path)], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[field])


def run_world(
    path: Path, w: int, cache: Path, native: str | None = None, src: Path | None = None, code: str = _RANK
) -> list[dict[str, Any]]:
    """W ranks on ``path``, the index cache under ``cache`` (empty: the file reader starts cold); ``native``:
    the kernels' path (``RANK_DATASET_NATIVE``), or the environment's; ``src``: the package's code from
    there (first on ``PYTHONPATH``); ``code``: what each rank runs."""
    env = {**os.environ, "RANK_DATASET_CACHE_DIR": str(cache), "MASTER_ADDR": "127.0.0.1"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    if native is not None:
        env = native_env(env, native)
    env["MASTER_PORT"], env["WORLD_SIZE"] = str(free_port()), str(w)
    procs = [start_python(code, str(path), env={**env, "RANK": str(r)}) for r in range(w)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def summary(results: list[dict[str, Any]], size: int) -> dict[str, float]:
    def slowest(k: str) -> float:
        return max(r[k]["seconds"] for r in results)

    def per_rank(k: str, field: str) -> float:
        return sum(r[k][field] for r in results) / len(results)

    return {
        "collective_epoch": slowest("collective_epoch"),
        "file_epoch": slowest("file_epoch"),
        "collective_cold": slowest("collective_cold"),
        "collective_cold_cpu": max(r["collective_cold"]["cpu"] for r in results),
        "collective_epoch_cpu": max(r["collective_epoch"]["cpu"] for r in results),
        # the busiest rank's share of its cold start CPU in the dataset's full collection
        "collective_cold_gc": max(results, key=lambda r: r["collective_cold"]["cpu"])["collective_cold"].get("gc", 0.0),
        "file_cold": slowest("file_cold"),
        "collective_read_x": sum(r["collective_epoch"]["read"] for r in results) / size,
        "collective_cold_read_x": sum(r["collective_cold"]["read"] for r in results) / size,
        "file_read_x": sum(r["file_epoch"]["read"] for r in results) / size,
        "collective_read_mb": per_rank("collective_epoch", "read") / 1e6,
        "file_read_mb": per_rank("file_epoch", "read") / 1e6,
        "sent_mb": per_rank("collective_epoch", "sent") / 1e6,
        "shard_mib": sum(r["shard"] for r in results) / len(results) / (1 << 20),
        "collective_peak_mib": max(r["collective_epoch"]["peak"] for r in results) / (1 << 20),
        "file_peak_mib": max(r["file_epoch"]["peak"] for r in results) / (1 << 20),
    }


def plot_readers(
    png: Path, labels: list[str], collective: list[float], file: list[float], ylabel: str, *, line: float | None = None
) -> None:
    """Bars of the two readers' figures side by side for each of ``labels`` (``line``: a reference level)."""
    plt = plotting()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], collective, 0.4, label="collective")
    ax.bar([i + 0.2 for i in x], file, 0.4, label="file")
    if line is not None:
        ax.axhline(line, color="grey", lw=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--data-dir", type=Path, default=None, help="where the file is written (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the file (with --data-dir)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="collective", help="results file name (e.g. collective_100m)")
    parser.add_argument("--native-compare", action="store_true", help="each W on numpy and on native")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's src: each W on it and on this")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each code with --baseline")
    parser.add_argument("--phases", action="store_true", help="the cold start's CPU by phase: <name>_phases.md")
    args = parser.parse_args()
    if args.phases:
        compare_phases(args)
        return
    if args.native_compare:
        compare_native(args)
        return
    if args.baseline is not None:
        compare_baseline(args)
        return
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rank-dataset-collective-"))
    rows_data: dict[int, dict[str, float]] = {}
    with scratch_dir(data_dir, keep=args.keep and args.data_dir is not None) as d:
        path = meta_file(d, args.lines)
        size = path.stat().st_size
        one_read(path)  # into the page cache
        base = min(one_read(path) for _ in range(3))
        for w in args.worlds:
            with scratch_dir(d / f"cache_{w}") as cache:
                rows_data[w] = summary(run_world(path, w, cache), size)
            print(w, rows_data[w], flush=True)
    rows = [
        f"# The collective reader beside the file reader, N = {args.lines:,} lines ({size / 1e6:,.0f} MB)",
        "",
        f"One read of the file counting newlines 16 MiB at a time: {base:.2f} s (the 1.00x of the cold start ratios).",
        "",
        "| W | set_epoch, collective (s) | set_epoch, file (s) | collective / file | cold start, collective (s) "
        "| ratio to one read | cold start, busiest rank's CPU (s) | its ratio to one read | cold start, file (s) "
        "| read per build, all ranks, collective | read, first build | "
        "read per build, all ranks, file | read per rank, collective (MB) | sent per rank, collective (MB) | "
        "shard per rank (MiB) | peak rise over set_epoch, collective (MiB) | the same, file (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w, s in rows_data.items():
        rows.append(
            f"| {w} | {s['collective_epoch']:.2f} | {s['file_epoch']:.2f} "
            f"| {s['collective_epoch'] / s['file_epoch']:.2f}x "
            f"| {s['collective_cold']:.2f} | {s['collective_cold'] / base:.2f}x "
            f"| {s['collective_cold_cpu']:.2f} | {s['collective_cold_cpu'] / base:.2f}x | {s['file_cold']:.2f} "
            f"| {s['collective_read_x']:.2f}x | {s['collective_cold_read_x']:.2f}x | {s['file_read_x']:.2f}x "
            f"| {s['collective_read_mb']:,.1f} | {s['sent_mb']:,.1f} | {s['shard_mib']:,.1f} "
            f"| {s['collective_peak_mib']:,.1f} | {s['file_peak_mib']:,.1f} |"
        )
    rows += [
        "",
        "Times are the slowest rank's, from a barrier to a barrier; all W processes and gloo's loopback "
        "traffic share this machine's cores. CPU: the CPU seconds of the busiest rank's process over the cold "
        "start (its gloo threads included): about what the cold start would take with a core per rank, as on "
        "a node of 8 GPUs and 8+ cores, where no rank waits for another's core (a model: cores shared 4 to 1 "
        "also slow each other's caches, and loopback is not a network). Read: `read_chars` of every rank "
        "together, as a multiple of "
        "the file's size (the first build of the collective reader counts its slice's lines, then reads it "
        "again to serve the exchange). Peak rise: the most any rank's peak RSS rose over the set_epoch "
        "(the old shard is held until the new one is whole).",
        "",
        f"Command: `python benchmarks/bench_collective.py --lines {args.lines} --worlds "
        f"{' '.join(map(str, args.worlds))}" + (f" --name {args.name}`" if args.name != "collective" else "`"),
        "",
        machine_info(),
    ]

    def plot(png: Path) -> None:
        worlds = list(rows_data)
        collective = [rows_data[w]["collective_epoch"] for w in worlds]
        file = [rows_data[w]["file_epoch"] for w in worlds]
        plot_readers(png, [f"W = {w}" for w in worlds], collective, file, "set_epoch, slowest rank (s)")

    save_results(args.out, args.name, rows, {"lines": args.lines, "one_read": base, "worlds": rows_data}, plot)


def compare_native(args: argparse.Namespace) -> None:
    """Each W on numpy and on the native kernels, one after the other, beside one read of the file."""
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rank-dataset-collective-"))
    got: dict[int, dict[str, dict[str, float]]] = {}
    load_before = load_note()
    with scratch_dir(data_dir, keep=args.keep and args.data_dir is not None) as d:
        path = meta_file(d, args.lines)
        size = path.stat().st_size
        one_read(path)  # into the page cache
        base = min(one_read(path) for _ in range(3))
        # Its CPU too: what the busiest rank's CPU compares with whatever the load (wall time carries it).
        base_cpu = min(one_read(path, "cpu") for _ in range(3))
        for w in args.worlds:
            for mode in NATIVE_PATHS:
                with scratch_dir(d / f"cache_{w}_{mode}") as cache:
                    got.setdefault(w, {})[mode] = summary(run_world(path, w, cache, mode), size)
                print(w, mode, got[w][mode], flush=True)
    figures = [
        ("collective_cold", "cold start, collective (s)"),
        ("collective_cold_cpu", "cold start, busiest rank's CPU (s)"),
        ("collective_epoch", "set_epoch, collective (s)"),
        ("file_cold", "cold start, file (s)"),
        ("file_epoch", "set_epoch, file (s)"),
    ]
    rows = [
        f"# The collective reader on numpy and on the native kernels, N = {args.lines:,} lines ({size / 1e6:,.0f} MB)",
        "",
        f"One read of the file counting newlines 16 MiB at a time: {base:.2f} s (the 1.00x of the ratios; "
        f"its CPU: {base_cpu:.2f} s, the 1.00x of the last row's).",
        "",
        "| W | figure | numpy | native | native speed-up | numpy / one read | native / one read |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for w, by_mode in got.items():
        for key, label in figures:
            a, b = by_mode["0"][key], by_mode["require"][key]
            rows.append(f"| {w} | {label} | {a:.2f} | {b:.2f} | {ratio(a, b)} | {ratio(a, base)} | {ratio(b, base)} |")
        a, b = by_mode["0"]["collective_cold_cpu"], by_mode["require"]["collective_cold_cpu"]
        label = "cold start, busiest rank's CPU / one read's CPU"
        rows.append(f"| {w} | {label} | {a:.2f} | {b:.2f} | | {ratio(a, base_cpu)} | {ratio(b, base_cpu)} |")
    rows += [
        "",
        "Each W runs on numpy (`RANK_DATASET_NATIVE=0`), then on the native kernels (`require`), one run each; times",
        "are the slowest rank's, CPU the busiest rank's process (see collective.md). Load average (1, 5, 15 min)",
        f"before: {load_before}; after: {load_note()} (the machine's 2 cores are shared with other work).",
        "",
        f"Command: `python benchmarks/bench_collective.py --native-compare --lines {args.lines} --worlds "
        f"{' '.join(map(str, args.worlds))}`",
        "",
        machine_info(),
    ]
    data = {"lines": args.lines, "one_read": base, "one_read_cpu": base_cpu, "worlds": got}
    save_results(args.out, f"{args.name}_native", rows, data, lambda png: None)


def compare_baseline(args: argparse.Namespace) -> None:
    """Each W on the code under ``args.baseline`` and on this, alternating, beside one read's CPU."""
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rank-dataset-collective-"))
    got: dict[int, dict[str, list[dict[str, float]]]] = {}
    load_before = load_note()
    this = HERE.parent / "src"
    with scratch_dir(data_dir, keep=args.keep and args.data_dir is not None) as d:
        path = meta_file(d, args.lines)
        size = path.stat().st_size
        one_read(path)  # into the page cache
        base_cpu = min(one_read(path, "cpu") for _ in range(3))
        for w in args.worlds:
            for i in range(args.repeat):
                for label, src in (("baseline", args.baseline), ("this", this)):
                    with scratch_dir(d / f"cache_{w}_{label}_{i}") as cache:
                        s = summary(run_world(path, w, cache, src=src), size)
                    got.setdefault(w, {}).setdefault(label, []).append(s)
                    print(w, label, s, flush=True)
    rows = [
        f"# The collective reader's node-local exchange beside the gloo-only one, N = {args.lines:,} lines "
        f"({size / 1e6:,.0f} MB)",
        "",
        f"One read of the file counting newlines 16 MiB at a time: {base_cpu:.2f} s of CPU (the 1.00x of the ratios).",
        "",
        "| W | run | code | cold start, busiest rank's CPU (s) | its ratio to one read's CPU | of which the "
        "dataset's full collection (s) | without it, ratio | set_epoch, busiest rank's CPU (s) | sent per rank over "
        "gloo, set_epoch (MB) | cold start, slowest rank (s) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w, by_code in got.items():
        for i in range(args.repeat):
            for label in ("baseline", "this"):
                s = by_code[label][i]
                rows.append(
                    f"| {w} | {i + 1} | {label} | {s['collective_cold_cpu']:.2f} | "
                    f"{ratio(s['collective_cold_cpu'], base_cpu)} | {s['collective_cold_gc']:.3f} | "
                    f"{ratio(s['collective_cold_cpu'] - s['collective_cold_gc'], base_cpu)} | "
                    f"{s['collective_epoch_cpu']:.2f} | "
                    f"{s['sent_mb']:,.2f} | {s['collective_cold']:.2f} |"
                )
    rows += [
        "",
        f"`baseline`: the code under `{args.baseline}`; `this`: this checkout's. Runs alternate, each a fresh "
        "W-rank gloo job on loopback (CPU: the busiest rank's process over the cold start, its threads "
        f"included; see collective.md). Load average (1, 5, 15 min) before: {load_before}; after: {load_note()} "
        "(the machine's 2 cores are shared with other work).",
        "",
        f"Command: `python benchmarks/bench_collective.py --lines {args.lines} --worlds "
        f"{' '.join(map(str, args.worlds))} --baseline {args.baseline} --repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    data = {"lines": args.lines, "one_read_cpu": base_cpu, "worlds": got}
    save_results(args.out, f"{args.name}_local", rows, data, lambda png: None)


def compare_phases(args: argparse.Namespace) -> None:
    """Each W's cold start by phase: ``--repeat`` runs of the code under ``args.baseline`` (if given) and of
    this, alternating; per phase the mean over the ranks of their CPU, then the busiest rank's in all."""
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rank-dataset-collective-"))
    codes = ([("baseline", args.baseline)] if args.baseline is not None else []) + [("this", HERE.parent / "src")]
    runs: list[tuple[int, str, int, list[dict[str, float]]]] = []
    load_before = load_note()
    with scratch_dir(data_dir, keep=args.keep and args.data_dir is not None) as d:
        path = meta_file(d, args.lines)
        one_read(path)  # into the page cache
        base_cpu = min(one_read(path, "cpu") for _ in range(3))
        for w in args.worlds:
            for i in range(args.repeat):
                for label, src in codes:
                    with scratch_dir(d / f"cache_{w}_{label}_{i}") as cache:
                        got = run_world(path, w, cache, src=src, code=_PHASES_RANK)
                    runs.append((w, label, i + 1, got))
                    print(w, label, max(r["total"] for r in got), flush=True)
    heads = [f"W = {w}, {label}, run {i}" for w, label, i, _ in runs]
    rows = [
        f"# The collective reader's cold start by phase, N = {args.lines:,} lines",
        "",
        f"One read of the file counting newlines 16 MiB at a time: {base_cpu:.2f} s of CPU.",
        "",
        "| phase (CPU s, the mean of the ranks) | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    done = [0.0] * len(runs)
    for name, keys in PHASES:
        cells = []
        for j, (*_, got) in enumerate(runs):
            v = sum(r.get(k, 0.0) for r in got for k in keys) / len(got)
            done[j] += v
            cells.append(f"{v:.3f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    means = [sum(r["total"] for r in got) / len(got) for *_, got in runs]
    rows.append(
        "| the rest (Python, small arrays, the reader's checks) | "
        + " | ".join(f"{m - x:.3f}" for m, x in zip(means, done))
        + " |"
    )
    rows.append("| **all, the mean rank** | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    busiest = [max(r["total"] for r in got) for *_, got in runs]
    rows.append("| the busiest rank, all | " + " | ".join(f"{b:.3f}" for b in busiest) + " |")
    rows.append("| its ratio to one read's CPU | " + " | ".join(ratio(b, base_cpu) for b in busiest) + " |")
    rows += [
        "",
        f"`baseline`: the code under `{args.baseline}`; `this`: this checkout's. Each run a fresh W-rank gloo job "
        f"on loopback. Load average (1, 5, 15 min) before: {load_before}; after: {load_note()}.",
        "",
        machine_info(),
    ]
    data = {"lines": args.lines, "one_read_cpu": base_cpu, "runs": [[w, label, i, got] for w, label, i, got in runs]}
    save_results(args.out, f"{args.name}_phases", rows, data, lambda png: None)


if __name__ == "__main__":
    main()
