"""Job start through the meta server: W ranks asking for their shards at once, with and without shared passes.

In one run, on one file of N lines (N = 10M by default, lines of about 34 bytes, in the page cache):
- ``read``: one read of the file counting newlines, ``open(p, 'rb').read().count(b'\\n')``, in a
  fresh process: the baseline the ratios are taken against (as in bench_scale.py);
- ``shared``: a real server process (``rank-dataset serve``, default limits) and W clients on
  loopback, each a ``RankServerDataset`` for its rank in a thread of one of at most 8 client
  processes (forked from this one, torch imported: 256 processes would not fit in memory), released
  together by a barrier; timed from the release until the last client has its shard received,
  decoded and checked against its plan. Concurrent requests of one plan share
  their passes over the file (``--max-pass-samples``, default);
- ``receive``: the shared job start with clients that only receive their frames (each asks as a
  ``RankServerDataset`` does, for a plan made before the release, and decodes nothing): the
  server's own time to start a job whose ranks cost nothing on its cores, as on a cluster;
- ``alone``: the same with ``--max-pass-samples 1``, so each request reads its shard alone (the
  server before shared passes: at most ``--max-builds`` 4 at once, 503 and a retry beyond);
- ``pass``: what the server's shared work costs by itself: the shared pass of all W ranks'
  requests (``rank_dataset.server._passes``: each rank's samples in file order, one read), in a fresh
  process (no HTTP, no clients);
- ``server CPU``: the server process's CPU seconds over each job start (user and system): what
  its own node spends, the figure that carries to a job whose clients run on other nodes.

W = 1 is a lone request: sharing must not slow it down.

With ``--native-compare``, the shared job start, the one with clients that only receive, the pass alone
and the server's CPU, each on numpy (``RANK_DATASET_NATIVE=0``: server, clients and pass) and on the
native kernels (``require``), beside one read, in the same run: ``jobstart_native.md``.

Usage:
    python benchmarks/bench_jobstart.py --data-dir /work/bench-data/serve      # N = 10M, W in {1, 8, 64, 256}
    python benchmarks/bench_jobstart.py --lines 20000 --worlds 1 4 --repeat 1 --out /tmp/results
    python benchmarks/bench_jobstart.py --native-compare --worlds 1 8 64     # numpy and native: jobstart_native.md
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

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
    run_python,
    save_results,
)
from bench_scale import meta_file  # noqa: E402

_READ = """
import json, sys, time
t = time.perf_counter()
count = open(sys.argv[1], "rb").read().count(b"\\n")
print(json.dumps({"seconds": time.perf_counter() - t, "count": count}))
"""

_PASS = """
import json, sys, time
from rank_dataset import MetaFile
from rank_dataset.server._passes import _read
from rank_dataset.plan.spec import ShardSpec
mf = MetaFile(sys.argv[1])
world = int(sys.argv[2])
t = time.perf_counter()
parts = _read(mf, [ShardSpec(len(mf), world, r, seed=0).indices() for r in range(world)])
from rank_dataset.core.native import describe
count = sum(len(p.shard) for p in parts)
print(json.dumps({"seconds": time.perf_counter() - t, "count": count, "kernels": describe().split()[0]}))
"""


def _fresh(code: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    out = run_python(code, *args, env=env)
    out.check_returncode()
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


_PROCESSES = 8  # client processes at most (torch imported in each); a process runs several ranks in threads


def _clients(
    url: str, world: int, ranks: list[int], barrier: Any, results: Any, cpu: Any, receive: bool, native: str | None
) -> None:
    """Ranks ``ranks`` of ``world``, each a RankServerDataset in a thread, started by ``barrier``;
    the CPU seconds this process spent on them and the kernels' path it took, into ``cpu``. With
    ``receive``, each only receives its frame (asked for as a RankServerDataset asks, planned before
    the start): what the server does for clients that cost nothing on its cores. ``native``: the
    kernels' path to take (``RANK_DATASET_NATIVE``; the parent has not picked one, so this process
    picks it at its first call)."""
    from urllib.parse import urlencode

    if native is not None:
        os.environ["RANK_DATASET_NATIVE"] = native

    from rank_dataset import RankServerDataset
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.server import protocol
    from rank_dataset.server.transport import MetaServer

    go = threading.Event()
    server = MetaServer(url, timeout=900)
    n = server.num_samples()[0]
    paths = {r: f"{protocol.SHARD}?{urlencode(protocol.spec_to_query(ShardSpec(n, world, r, seed=0)))}" for r in ranks}

    def client(rank: int) -> None:
        go.wait()
        try:
            if receive:
                count = protocol._HEADER.unpack_from(server.get(paths[rank]))[2]  # the frame's samples
            else:
                count = len(RankServerDataset(url, reload_cfg={"seed": 0}, rank=rank, world_size=world, timeout=900))
            results.put((rank, time.perf_counter(), count, None))
        except Exception as exc:  # reported by the parent
            results.put((rank, time.perf_counter(), 0, repr(exc)))

    threads = [threading.Thread(target=client, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    barrier.wait()
    before = time.process_time()
    go.set()
    for t in threads:
        t.join()
    from rank_dataset.core import native as kernels

    cpu.put((time.process_time() - before, kernels.describe().split()[0]))


def job_start(
    url: str, world: int, server_pid: int | None = None, receive: bool = False, native: str | None = None
) -> dict[str, Any]:
    """Seconds from releasing ``world`` clients at once until the last has its shard (and until the
    first has): at most _PROCESSES processes, forked from this one, each with its share of the ranks
    in threads (with ``receive``, clients that only receive their frames). With ``server_pid``, also
    the CPU seconds that process spent meanwhile. ``native``: the clients' kernels (``RANK_DATASET_NATIVE``)."""
    server = psutil.Process(server_pid) if server_pid is not None else None
    ctx = mp.get_context("fork")  # torch and rank_dataset are imported once, here
    k = min(world, _PROCESSES)
    barrier, results, client_cpu = ctx.Barrier(k + 1), ctx.SimpleQueue(), ctx.SimpleQueue()
    gc.freeze()  # fewer pages copied into each child
    procs = [
        ctx.Process(
            target=_clients,
            args=(url, world, list(range(p, world, k)), barrier, results, client_cpu, receive, native),
        )
        for p in range(k)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    cpu = sum(server.cpu_times()[:2]) if server is not None else 0.0
    done = [results.get() for _ in range(world)]
    if server is not None:
        cpu = sum(server.cpu_times()[:2]) - cpu
    spent = [client_cpu.get() for _ in procs]
    clients = sum(seconds for seconds, _ in spent)
    for p in procs:
        p.join()
    gc.unfreeze()
    errors = [f"rank {rank}: {error}" for rank, _, _, error in done if error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {world} clients failed, e.g. {errors[0]}")
    ends = [end - start for _, end, _, _ in done]
    return {
        "seconds": max(ends),
        "first": min(ends),
        "samples": sum(count for _, _, count, _ in done),
        "server_cpu": cpu,
        "client_cpu": clients,
        "client_kernels": sorted({path for _, path in spent}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--repeat", type=int, default=3, help="job starts of each kind (the median is shown)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the file is kept (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--native-compare", action="store_true", help="numpy and native kernels, side by side")
    args = parser.parse_args(argv)

    import rank_dataset  # noqa: F401 - imported before the clients are forked
    from rank_dataset.server.local import LocalServer

    if args.native_compare:
        return compare_native(args)

    with tempfile.TemporaryDirectory(prefix="bench_jobstart_") as tmp:
        data = args.data_dir or Path(tmp)
        meta = meta_file(data, args.lines)
        size = meta.stat().st_size
        env = cache_env(data / "cache")
        os.environ["RANK_DATASET_CACHE_DIR"] = env["RANK_DATASET_CACHE_DIR"]
        _fresh(_READ, str(meta), env=env)  # the file into the page cache
        reads = [_fresh(_READ, str(meta), env=env)["seconds"] for _ in range(args.repeat)]
        passes = {
            w: [_fresh(_PASS, str(meta), str(w), env=env)["seconds"] for _ in range(args.repeat)] for w in args.worlds
        }
        times: dict[str, dict[int, list[dict[str, float]]]] = {"shared": {}, "receive": {}, "alone": {}}
        for kind, flags in (("shared", []), ("receive", []), ("alone", ["--max-pass-samples", "1"])):
            with LocalServer([meta], *flags, env=env, stdout=subprocess.DEVNULL, timeout=600) as server:
                for world in args.worlds:
                    runs = [
                        job_start(server.url, world, server.proc.pid, receive=kind == "receive")
                        for _ in range(args.repeat)
                    ]
                    times[kind][world] = runs
                    print(kind, world, [(round(t["seconds"], 2), round(t["server_cpu"], 2)) for t in runs], flush=True)
        if args.data_dir is None:
            shutil.rmtree(data / "cache", ignore_errors=True)

    read = statistics.median(reads)
    med = {k: {w: statistics.median(t["seconds"] for t in v[w]) for w in args.worlds} for k, v in times.items()}
    first = {w: statistics.median(t["first"] for t in times["shared"][w]) for w in args.worlds}
    cpu = {k: {w: statistics.median(t["server_cpu"] for t in v[w]) for w in args.worlds} for k, v in times.items()}
    clients = {w: statistics.median(t["client_cpu"] for t in times["shared"][w]) for w in args.worlds}
    pass_s = {w: statistics.median(passes[w]) for w in args.worlds}
    cores = len(os.sched_getaffinity(0))
    rows = [
        f"# Job start through the meta server, N = {args.lines:,} lines",
        "",
        f"One read of the file counting newlines: {read:.2f} s (the 1.00x of every ratio).",
        "",
        "| W clients at once | shared passes (s) | ratio to one read | each request alone (s) | ratio to one read "
        "| alone / shared | first shard, shared (s) | one pass of all W ranks' samples, no HTTP (s) "
        "| server CPU, shared (s) | server CPU, alone (s) | clients' CPU, shared (s) "
        "| shared, clients that only receive (s) | ratio to one read | server CPU, only receive (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in args.worlds:
        s, a = med["shared"][w], med["alone"][w]
        rows.append(
            f"| {w} | {s:.2f} | {s / read:.2f}x | {a:.2f} | {a / read:.2f}x | {a / s:.1f}x | {first[w]:.2f} "
            f"| {pass_s[w]:.2f} ({pass_s[w] / read:.2f}x) | {cpu['shared'][w]:.2f} | {cpu['alone'][w]:.2f} "
            f"| {clients[w]:.2f} | {med['receive'][w]:.2f} | {med['receive'][w] / read:.2f}x "
            f"| {cpu['receive'][w]:.2f} |"
        )
    rows += [
        "",
        "Each client is a `RankServerDataset` in a thread of one of at most 8 client processes (forked, torch",
        "imported), all released by a barrier; the time is until the last has its shard received, decoded and checked.",
        "Server CPU: the server process's user and system seconds over the same span (what its own node spends);",
        "clients' CPU: the client processes' together (receiving, decoding, checking and keeping their shards: on a",
        f"cluster, the ranks' own nodes). Within 4x one read, this machine's {cores} cores have"
        f" {4 * read * cores:.2f} CPU seconds",
        "for both.",
        "Only receive: the same job start with clients that only receive their frames (planned before the release,",
        "nothing decoded or kept): what the server takes when its clients cost nothing on its cores.",
        "Shared: the server's default limits (`--max-builds 4`, `--max-pass-samples 16777216`); alone:",
        "`--max-pass-samples 1` (every request reads its shard alone, 4 at once, 503 and a retry beyond).",
        "Server, clients and the transfer over loopback share this machine's cores; the median of "
        f"{args.repeat} job starts.",
        "",
        f"Command: `python benchmarks/bench_jobstart.py --lines {args.lines} --worlds "
        f"{' '.join(map(str, args.worlds))} --repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    data_out = {"lines": args.lines, "read": reads, "pass": passes, "times": times, "file_bytes": size}
    save_results(args.out, "jobstart", rows, data_out, lambda path: _plot(args.worlds, read, med, path))
    return 0


def compare_native(args: argparse.Namespace) -> int:
    """The shared job start (and with clients that only receive), the pass alone and the server's CPU on
    numpy and on the native kernels, beside one read, in one run (jobstart_native.md)."""
    from rank_dataset.server.local import LocalServer

    load_before = load_note()
    found: dict[str, dict[int, dict[str, list[float]]]] = {mode: {} for mode in NATIVE_PATHS}
    with tempfile.TemporaryDirectory(prefix="bench_jobstart_") as tmp:
        data = args.data_dir or Path(tmp)
        meta = meta_file(data, args.lines)
        env = cache_env(data / "cache")
        os.environ["RANK_DATASET_CACHE_DIR"] = env["RANK_DATASET_CACHE_DIR"]
        _fresh(_READ, str(meta), env=env)  # the file into the page cache
        reads = [_fresh(_READ, str(meta), env=env)["seconds"] for _ in range(args.repeat)]
        want = {"0": "numpy", "require": "native"}
        for w in args.worlds:  # the pass alone, the paths alternating
            for i in range(args.repeat):
                for mode in NATIVE_PATHS if i % 2 == 0 else NATIVE_PATHS[::-1]:
                    one = _fresh(_PASS, str(meta), str(w), env=native_env(env, mode))
                    assert one["kernels"] == want[mode], one
                    found[mode].setdefault(w, {}).setdefault("pass", []).append(one["seconds"])
        for kind in ("shared", "receive"):  # a server on each path in turn
            for mode in NATIVE_PATHS:
                with LocalServer([meta], env=native_env(env, mode), stdout=subprocess.DEVNULL, timeout=600) as server:
                    for w in args.worlds:
                        for _ in range(args.repeat):
                            run = job_start(server.url, w, server.proc.pid, receive=kind == "receive", native=mode)
                            assert run["client_kernels"] == [want[mode]], run
                            found[mode][w].setdefault(kind, []).append(run["seconds"])
                            found[mode][w].setdefault(f"{kind} server CPU", []).append(run["server_cpu"])
                        print(mode, kind, w, found[mode][w][kind], flush=True)
        if args.data_dir is None:
            shutil.rmtree(data / "cache", ignore_errors=True)
    read = statistics.median(reads)
    med = {m: {w: {k: statistics.median(v) for k, v in by.items()} for w, by in ws.items()} for m, ws in found.items()}
    labels = {
        "shared": "job start, shared passes (s)",
        "receive": "job start, clients that only receive (s)",
        "pass": "one pass of all W ranks' samples, no HTTP (s)",
        "shared server CPU": "server CPU, shared (s)",
        "receive server CPU": "server CPU, only receive (s)",
    }
    rows = [
        f"# Job start through the meta server on numpy and on the native kernels, N = {args.lines:,} lines",
        "",
        f"One read of the file counting newlines: {read:.2f} s (the 1.00x of every ratio).",
        "",
    ]
    table = []
    for w in args.worlds:
        for key, label in labels.items():
            a, b = med["0"][w][key], med["require"][w][key]
            table.append((w, label, f"{a:.2f}", f"{b:.2f}", ratio(a, b), ratio(a, read), ratio(b, read)))
    header = ["W", "figure", "numpy", "native", "native speed-up", "numpy / one read", "native / one read"]
    rows += md_table(header, table, "rlrrrrr")
    rows += [
        "",
        "As `bench_jobstart.py` measures them (its notes apply), the server, its clients and the pass each on numpy",
        "(`RANK_DATASET_NATIVE=0`) and on the native kernels (`require`): the pass alone alternating, a server on",
        f"each path in turn for each kind of job start; the median of {args.repeat} runs.",
        "Server, clients and the transfer over loopback share this machine's cores, with whatever else runs on it:",
        f"load average (1, 5, 15 min) before: {load_before}; after: {load_note()}.",
        "",
        f"Command: `python benchmarks/bench_jobstart.py --native-compare --lines {args.lines} --worlds "
        f"{' '.join(map(str, args.worlds))} --repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    data_out = {"lines": args.lines, "read": reads, "runs": found, "median": med}
    save_results(args.out, "jobstart_native", rows, data_out, lambda path: None)
    return 0


def _plot(worlds: list[int], read: float, med: dict[str, dict[int, float]], path: Path) -> None:
    plt = plotting()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(worlds, [med["shared"][w] for w in worlds], "o-", label="shared passes")
    ax.plot(worlds, [med["alone"][w] for w in worlds], "s-", label="each request alone")
    ax.axhline(read, color="k", ls="--", label="one read of the file")
    ax.axhline(4 * read, color="gray", ls=":", label="4x one read")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("W ranks asking at once")
    ax.set_ylabel("seconds until the last shard")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
