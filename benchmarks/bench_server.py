"""Meta server throughput beside the original design, in one run.

The baseline is the original rank_dataset server: Flask, one sample per request as JSON
(``/get/<idx>``, ``/get_len``), and a bulk endpoint answering a rank's lines as a JSON list. Both
servers run as separate processes on 127.0.0.1 and serve the same file. Measured, in samples/s:

- single gets: one sample per call (``ServerDataset[i]`` against ``requests.get('/get/i')``);
- batches of 256 through a DataLoader with 4 workers (``ServerDataset.__getitems__``, one request
  a batch, against the original one request a sample), with the indices in order and with random
  ones (what ``DistributedSampler`` and ``RandomSampler`` give: the server reads scattered lines);
- one whole-shard fetch (``RankServerDataset`` against the JSON bulk endpoint).

With ``--native-compare``, rank-dataset's server and clients on numpy (``RANK_DATASET_NATIVE=0``) and on
the native kernels (``require``), beside the original design, in the same run: ``server_native.md``.

Usage:
    python benchmarks/bench_server.py                  # N = 1M lines
    python benchmarks/bench_server.py --lines 20000 --seconds 0.5 --out /tmp/results
    python benchmarks/bench_server.py --native-compare      # numpy and native: server_native.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

from rank_dataset.server.local import LocalServer, free_port, wait_until_up

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    NATIVE_PATHS,
    cache_env,
    load_note,
    machine_info,
    native_env,
    plotting,
    save_results,
    write_imagenet_meta,
)

_FLASK_SERVER = """
import json, sys
import numpy as np
from flask import Flask, Response, request
metas = [line.strip() for line in open(sys.argv[1]) if line.strip()]
app = Flask("baseline")

@app.route("/get_len")
def get_len():
    return json.dumps(len(metas))

@app.route("/get/<int:idx>")
def get(idx):
    return json.dumps(metas[idx])

@app.route("/get_shard")
def get_shard():
    # The original bulk design: the server draws the whole permutation and answers a JSON list.
    world, rank, seed = (int(request.args[k]) for k in ("world_size", "rank", "seed"))
    perm = np.random.default_rng(seed).permutation(len(metas))
    per_rank = -(-len(metas) // world)
    return Response(json.dumps([metas[i] for i in perm[rank * per_rank:(rank + 1) * per_rank]]),
                    mimetype="application/json")

app.run(host="127.0.0.1", port=int(sys.argv[2]), threaded=True)
"""


class _OriginalDataset:
    """The original ServerDataset: a fresh HTTP request (and connection) for every sample."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.n = int(requests.get(f"{url}/get_len").json())

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> str:
        return str(requests.get(f"{self.url}/get/{idx}").json())


def _timed(fn: Any, seconds: float) -> float:
    """Samples/s of ``fn(k) -> samples done`` called with k = 0, 1, ... for about ``seconds``."""
    done, k = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += fn(k)
        k += 1
    return done / (time.perf_counter() - start)


def _loader_rate(dataset: Any, samples: int, batch_size: int, workers: int, *, shuffle: bool = False) -> float:
    from torch.utils.data import DataLoader

    n = len(dataset)
    order = np.random.default_rng(0).permutation(n)[:samples].tolist() if shuffle else range(samples)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=order, num_workers=workers)
    start = time.perf_counter()
    done = sum(len(batch) for batch in loader)
    return done / (time.perf_counter() - start)


_KINDS = (
    "single get",
    "batches of 256, DataLoader with 4 workers, indices in order",
    "batches of 256, DataLoader with 4 workers, random indices",
    "whole-shard fetch (W = 1)",
)


def _ours(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Samples/s of rank-dataset's clients against the server at ``url``, for each of _KINDS."""
    from rank_dataset import RankServerDataset, ServerDataset

    ds, n, step = ServerDataset(url), args.lines, 7919
    rates = {_KINDS[0]: _timed(lambda k: len(ds[(k * step) % n]) and 1, args.seconds)}
    for kind, shuffle in zip(_KINDS[1:3], (False, True)):
        rates[kind] = _loader_rate(ds, min(args.batched_samples, n), 256, 4, shuffle=shuffle)

    def fetch() -> float:
        start = time.perf_counter()
        shard = RankServerDataset(url, reload_cfg={"seed": 0}, rank=0, world_size=1)
        return len(shard) / (time.perf_counter() - start)

    rates[_KINDS[3]] = max(fetch() for _ in range(3))
    return rates


def _original(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Samples/s of the original design's clients against its server at ``url``, for each of _KINDS."""
    original, n, step = _OriginalDataset(url), args.lines, 7919
    rates = {_KINDS[0]: _timed(lambda k: len(original[(k * step) % n]) and 1, args.seconds)}
    samples = max(256, min(args.batched_samples, int(rates[_KINDS[0]] * args.seconds * 2)))
    for kind, shuffle in zip(_KINDS[1:3], (False, True)):
        rates[kind] = _loader_rate(original, min(samples, n), 256, 4, shuffle=shuffle)

    def fetch() -> float:
        start = time.perf_counter()
        lines = requests.get(f"{url}/get_shard", params={"world_size": 1, "rank": 0, "seed": 0}).json()
        return len(lines) / (time.perf_counter() - start)

    rates[_KINDS[3]] = max(fetch() for _ in range(2))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each single-get measurement")
    parser.add_argument("--batched-samples", type=int, default=500_000, help="samples through the DataLoader")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--native-compare", action="store_true", help="rank-dataset on numpy and on native kernels")
    parser.add_argument("--client-of", metavar="URL", help=argparse.SUPPRESS)  # --native-compare's clients
    args = parser.parse_args(argv)
    if args.client_of:
        from rank_dataset.core.native import describe

        print(json.dumps({"rates": _ours(args.client_of, args), "kernels": describe().split()[0]}))
        return 0

    work = Path(tempfile.mkdtemp(prefix="bench_server_"))
    meta = write_imagenet_meta(work / "meta.txt", args.lines)
    env = cache_env(work / "cache")
    base_port = free_port()
    script = work / "baseline_server.py"
    script.write_text(_FLASK_SERVER)
    base = subprocess.Popen(
        [sys.executable, str(script), str(meta), str(base_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base_url = f"http://127.0.0.1:{base_port}"
    try:
        wait_until_up(f"{base_url}/get_len", base, timeout=300)
        if args.native_compare:
            return compare_native(args, meta, env, _original(base_url, args))
        with LocalServer([meta], env=env, stdout=subprocess.DEVNULL, timeout=300) as ours:
            mine = _ours(ours.url, args)
        theirs = _original(base_url, args)
        rates = {kind: (mine[kind], theirs[kind]) for kind in _KINDS}
    finally:
        base.terminate()
        base.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)  # the generated meta file, its index and the baseline's script

    rows = [
        f"# Meta server throughput, N = {args.lines:,} lines",
        "",
        "| access | rank-dataset (samples/s) | original design (samples/s) | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, (a, b) in rates.items():
        rows.append(f"| {name} | {a:,.0f} | {b:,.0f} | {a / b:,.1f}x |")
    rows += [
        "",
        "rank-dataset: Starlette + uvicorn, one keep-alive session per process, binary frames;",
        "original: Flask (threaded), one request per sample (a new connection each), JSON.",
        "Both servers run on this machine's 2 cores beside the clients (and the DataLoader's 4 workers).",
        "",
        f"Command: `python benchmarks/bench_server.py --lines {args.lines} --seconds {args.seconds}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "server", rows, rates, lambda path: _plot(rates, path))
    return 0


def compare_native(args: argparse.Namespace, meta: Path, env: dict[str, str], theirs: dict[str, float]) -> int:
    """rank-dataset's server and clients on numpy and on the native kernels, beside the original design's
    rates (``theirs``), in one run (server_native.md). Each path's clients run in a fresh process."""
    load_before = load_note()
    mine: dict[str, dict[str, float]] = {}
    for mode in NATIVE_PATHS:
        menv = native_env(env, mode)
        with LocalServer([meta], env=menv, stdout=subprocess.DEVNULL, timeout=300) as ours:
            cmd = [sys.executable, __file__, "--client-of", ours.url, "--lines", str(args.lines)]
            cmd += ["--seconds", str(args.seconds), "--batched-samples", str(args.batched_samples)]
            out = subprocess.run(cmd, env=menv, capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["kernels"] == ("numpy" if mode == "0" else "native"), got
        mine[mode] = got["rates"]
    rows = [
        f"# Meta server throughput on numpy and on the native kernels, N = {args.lines:,} lines",
        "",
        "| access | numpy (samples/s) | native (samples/s) | native speed-up | original design (samples/s) "
        "| numpy / original | native / original |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in _KINDS:
        a, b, o = mine["0"][kind], mine["require"][kind], theirs[kind]
        rows.append(f"| {kind} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x | {o:,.0f} | {a / o:,.1f}x | {b / o:,.1f}x |")
    rows += [
        "",
        "As `bench_server.py` measures them (its notes apply): rank-dataset's server and its clients both on numpy",
        "(`RANK_DATASET_NATIVE=0`), then both on the native kernels (`require`), a server and a client process each;",
        "the original design's figures from the same run. Servers, clients and the DataLoader's workers share this",
        f"machine's cores with whatever else runs on it: load average (1, 5, 15 min) before: {load_before}; after: "
        f"{load_note()}.",
        "",
        f"Command: `python benchmarks/bench_server.py --native-compare --lines {args.lines} --seconds {args.seconds}"
        f" --batched-samples {args.batched_samples}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "server_native", rows, {"rates": mine, "original": theirs}, lambda path: None)
    return 0


def _plot(rates: dict[str, tuple[float, float]], path: Path) -> None:
    plt = plotting()
    import numpy as np

    names = list(rates)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(x - 0.2, [rates[k][0] for k in names], 0.4, label="rank-dataset")
    ax.bar(x + 0.2, [rates[k][1] for k in names], 0.4, label="original design")
    ax.set_xticks(x, [k.replace(", ", ",\n") for k in names])
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (log)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
