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

With ``--compare REF`` (a git commit, branch or tag), RankDataset is measured with the code of REF
and with this tree's, alternately, ``--rounds`` times each (the naive loader once), each run in a
process of its own whose ``rank_dataset`` (library and demo harness) is that code and whose index
cache is its own; results go to ``results/memory_compare_<start method>.{md,json,png}``.

Usage:
    python benchmarks/bench_memory.py                    # N in 1M, 4M, fork
    python benchmarks/bench_memory.py --start-method forkserver
    python benchmarks/bench_memory.py --sizes 1000000 4000000 10000000
    python benchmarks/bench_memory.py --sizes 1000000 --compare HEAD~3 --rounds 3 --start-method spawn
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rank_dataset  # noqa: E402
from _common import machine_info, plotting, save_results, write_imagenet_meta  # noqa: E402
from rank_dataset.demo import launch_ranks  # noqa: E402
from rank_dataset.demo.rank import SMAPS_ENV  # noqa: E402

LOADERS = ["naive", "original", "rank_dataset"]
SRC = HERE.parent / "src"
# One loader's run with the rank_dataset on PYTHONPATH: its memory figure (bytes) on stdout, as JSON.
_CHILD = """
import json, sys
from pathlib import Path
from rank_dataset.demo import launch_ranks
cfg, world_size, work = json.loads(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
result = launch_ranks(cfg, world_size, work)
if not result.covered:
    raise SystemExit(f"{cfg['loader']} did not cover the epoch")
print(json.dumps({"memory": result.memory, "noise": result.noise}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default="fork")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--compare", metavar="REF", help="RankDataset with the code of git REF against this tree's")
    parser.add_argument("--rounds", type=int, default=3, help="with --compare: runs of each code, alternating")
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(args)
    _bytecode(Path(rank_dataset.__file__).parent)

    mib = 1 << 20
    memory: dict[int, dict[str, float]] = {}
    parts: dict[int, dict[str, dict[str, float]]] = {}
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
            work = Path(tmp)
            meta = write_imagenet_meta(work / "meta.txt", n)
            memory[n] = {}
            for loader in LOADERS:
                cfg = {"loader": loader, "meta": str(meta), "workers": args.workers, "epochs": 1, "mini_epochs": 1}
                cfg["start_method"] = args.start_method
                smaps = work / f"smaps_{loader}"
                smaps.mkdir()
                os.environ[SMAPS_ENV] = str(smaps)  # the ranks inherit it: PSS by mapping at the last measurements
                try:
                    result = launch_ranks({**cfg, "batch_size": 256}, args.world_size, work)
                finally:
                    del os.environ[SMAPS_ENV]
                parts.setdefault(n, {})[loader] = _by_kind(smaps, loader, args.world_size)
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
        "pass, minus the same processes' PSS during passes over generated lines before the rank imported",
        "rank_dataset (or the loader's module): the control is of processes that loaded torch alone (with the",
        "harness), so a loader's figure includes what importing it costs the rank and every worker. The package's",
        "bytecode is compiled first, as an install leaves it (torch loads its own from its cache).",
        "",
        "Where RankDataset's figure goes (MiB; the same subtraction, from /proc/PID/smaps, by mapping):",
        "",
        "| N | " + " | ".join(KINDS) + " | sum |",
        "|---:|" + "---:|" * (len(KINDS) + 1),
    ]
    for n, p in parts.items():
        got = p["rank_dataset"]
        rows.append(
            f"| {n:,} | " + " | ".join(f"{got[kind]:,.1f}" for kind in KINDS) + f" | {sum(got.values()):,.1f} |"
        )
    rows += [
        "",
        "Shards: the rank's and its workers' maps of the shared-memory segments (memfd). Heap: `[heap]` and",
        "anonymous maps (Python's objects, the imported modules among them; in a fork worker, the pages of the",
        "rank it wrote to). Files: the mapped libraries' and index files' pages newly touched.",
        "",
        f"Command: `python benchmarks/bench_memory.py --sizes {' '.join(map(str, args.sizes))}"
        f" --start-method {method}`",
        "",
        machine_info(),
    ]
    data = {"memory": memory, "by_kind": parts}
    save_results(args.out, f"memory_{method}", rows, data, lambda path: _plot(memory, path, w, k, method))
    return 0


KINDS = ["ranks' shards", "workers' shards", "ranks' heap", "workers' heap", "ranks' files", "workers' files"]


def _by_kind(smaps: Path, loader: str, world_size: int) -> dict[str, float]:
    """MiB of the loader's figure by kind of mapping (KINDS), from the ranks' ``pss_by_mapping`` files: the
    last measurement of the loader's pass minus the last of the baseline, summed over the ranks."""
    totals = dict.fromkeys(KINDS, 0.0)
    for label, sign in ((loader, 1), ("baseline", -1)):
        for rank in range(world_size):
            processes = json.loads((smaps / f"{label}.{rank}.json").read_text())
            for i, sizes in enumerate(processes.values()):  # the rank first, then its descendants
                who = "ranks'" if i == 0 else "workers'"
                for name, pss in sizes.items():
                    if name.startswith("memfd:"):  # pss_by_mapping names a file by its base name
                        kind = "shards"
                    elif name.startswith("[") or not name:
                        kind = "heap"  # [heap], [anon], [stack]
                    else:
                        kind = "files"
                    totals[f"{who} {kind}"] += sign * pss / (1 << 20)
    return totals


def _bytecode(package: Path) -> None:
    """Compile ``package``'s bytecode, as installing it does. The control's torch loads its own cached bytecode;
    a package compiled from source in every process (``PYTHONDONTWRITEBYTECODE``, an editable install never
    imported before) costs each about 1.3 MiB more of heap, which no installed job pays."""
    try:
        done = compileall.compile_dir(package, quiet=1)
    except OSError:
        done = False
    if not done:
        print(
            f"bench_memory: the bytecode of {package} was not all written: figures include compiling it",
            file=sys.stderr,
        )


def _source_of(ref: str, into: Path) -> Path:
    """The ``src`` directory of git ``ref`` of this repository, unpacked under ``into``."""
    repo = HERE.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref, "src"], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")
    return into / "src"


def _run_with(src: Path, cfg: dict[str, Any], world_size: int, work: Path, cache: Path) -> dict[str, int]:
    """One loader's run in a process importing ``rank_dataset`` from ``src``, its index cache in ``cache``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    env["RANK_DATASET_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-c", _CHILD, json.dumps(cfg), str(world_size), str(work)]
    done = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _compare(args: argparse.Namespace) -> int:
    """RankDataset with the code of ``args.compare`` against this tree's, alternately; the naive loader once."""
    mib = 1 << 20
    w, k, method = args.world_size, args.workers, args.start_method
    data: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        root = Path(tmp)
        codes = {"old": _source_of(args.compare, root / "old"), "new": SRC}
        for src in codes.values():
            _bytecode(src / "rank_dataset")
        for n in args.sizes:
            work = root / f"n{n}"
            work.mkdir()
            meta = write_imagenet_meta(work / "meta.txt", n)
            cfg = {"meta": str(meta), "workers": k, "epochs": 1, "mini_epochs": 1, "start_method": method}
            cfg["batch_size"] = 256
            naive = _run_with(SRC, {**cfg, "loader": "naive"}, w, work, work / "cache_naive")["memory"] / mib
            print(f"N={n:,} naive ({method}): {naive:,.1f} MiB", flush=True)
            runs: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(args.rounds):
                for code in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    got = _run_with(codes[code], {**cfg, "loader": "rank_dataset"}, w, work, work / f"cache_{code}")
                    runs[code].append(got["memory"] / mib)
                    print(f"N={n:,} rank_dataset, {code} code ({method}): {runs[code][-1]:,.1f} MiB", flush=True)
            data[n] = {"naive": naive, **runs}
    rows = [
        f"# Meta memory, {w} ranks x (1 + {k} DataLoader workers started by {method}):"
        f" {args.compare} against this tree",
        "",
        f"| N | naive (MiB) | RankDataset, {args.compare} (MiB) | RankDataset, this tree (MiB) |"
        f" naive / ours, {args.compare} | naive / ours, this tree |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, d in data.items():
        old, new = statistics.median(d["old"]), statistics.median(d["new"])
        rows.append(
            f"| {n:,} | {d['naive']:,.0f} | {old:,.1f} ({', '.join(f'{x:.1f}' for x in d['old'])}) |"
            f" {new:,.1f} ({', '.join(f'{x:.1f}' for x in d['new'])}) |"
            f" {d['naive'] / old:.1f}x | {d['naive'] / new:.1f}x |"
        )
    rows += [
        "",
        f"Medians of {args.rounds} runs of each code, alternating (each run in brackets); the naive loader run once.",
        "PSS summed over every rank and worker (/proc/PID/smaps_rollup through psutil), at the last batch of the",
        "pass, minus the same processes' PSS during passes over generated lines before the metas existed.",
        "",
        f"Command: `python benchmarks/bench_memory.py --sizes {' '.join(map(str, args.sizes))}"
        f" --start-method {method} --compare {args.compare} --rounds {args.rounds}`",
        "",
        machine_info(),
    ]
    save_results(args.out, f"memory_compare_{method}", rows, data, lambda path: _plot_compare(data, path, args.compare))
    return 0


def _plot_compare(data: dict[int, dict[str, Any]], path: Path, ref: str) -> None:
    plt = plotting()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"N = {n:,}" for n in data]
    for i, (code, label) in enumerate([("old", ref), ("new", "this tree")]):
        ax.bar(
            [x + 0.4 * i for x in range(len(data))],
            [statistics.median(d[code]) for d in data.values()],
            0.4,
            label=f"RankDataset, {label}",
        )
    ax.set_xticks([x + 0.2 for x in range(len(data))], labels)
    ax.set_ylabel("meta memory, PSS (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
