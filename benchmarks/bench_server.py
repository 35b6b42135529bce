"""Meta server throughput beside the original design, in one run.

The baseline is the original rank_dataset server: Flask, one sample per request as JSON
(``/get/<idx>``, ``/get_len``), and a bulk endpoint answering a rank's lines as a JSON list. Both
servers run as separate processes on 127.0.0.1 and serve the same file. Measured, in samples/s:

- single gets: one sample per call (``ServerDataset[i]`` against ``requests.get('/get/i')``);
- batches of 256 through a DataLoader with 4 workers (``ServerDataset.__getitems__``, one request
  a batch, against the original one request a sample), with the indices in order and with random
  ones (what ``DistributedSampler`` and ``RandomSampler`` give: the server reads scattered lines);
- one whole-shard fetch (``RankServerDataset`` against the JSON bulk endpoint).

Usage:
    python benchmarks/bench_server.py                  # N = 1M lines
    python benchmarks/bench_server.py --lines 20000 --seconds 0.5 --out /tmp/results
"""

from __future__ import annotations

import argparse
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

from _common import cache_env, machine_info, plotting, save_results, write_imagenet_meta  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each single-get measurement")
    parser.add_argument("--batched-samples", type=int, default=500_000, help="samples through the DataLoader")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from rank_dataset import RankServerDataset, ServerDataset

    work = Path(tempfile.mkdtemp(prefix="bench_server_"))
    meta = write_imagenet_meta(work / "meta.txt", args.lines)
    env = cache_env(work / "cache")
    base_port = free_port()
    ours = LocalServer([meta], env=env, stdout=subprocess.DEVNULL, timeout=300)
    script = work / "baseline_server.py"
    script.write_text(_FLASK_SERVER)
    base = subprocess.Popen(
        [sys.executable, str(script), str(meta), str(base_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ours_url, base_url = ours.url, f"http://127.0.0.1:{base_port}"
    try:
        wait_until_up(f"{base_url}/get_len", base, timeout=300)
        n = args.lines
        rates: dict[str, tuple[float, float]] = {}

        ds = ServerDataset(ours_url)
        original = _OriginalDataset(base_url)
        step = 7919
        rates["single get"] = (
            _timed(lambda k: len(ds[(k * step) % n]) and 1, args.seconds),
            _timed(lambda k: len(original[(k * step) % n]) and 1, args.seconds),
        )
        base_samples = max(256, min(args.batched_samples, int(rates["single get"][1] * args.seconds * 2)))
        for label, shuffle in (("indices in order", False), ("random indices", True)):
            rates[f"batches of 256, DataLoader with 4 workers, {label}"] = (
                _loader_rate(ds, min(args.batched_samples, n), 256, 4, shuffle=shuffle),
                _loader_rate(original, min(base_samples, n), 256, 4, shuffle=shuffle),
            )

        def fetch_ours() -> float:
            start = time.perf_counter()
            shard = RankServerDataset(ours_url, reload_cfg={"seed": 0}, rank=0, world_size=1)
            return len(shard) / (time.perf_counter() - start)

        def fetch_base() -> float:
            start = time.perf_counter()
            response = requests.get(f"{base_url}/get_shard", params={"world_size": 1, "rank": 0, "seed": 0})
            lines = response.json()
            return len(lines) / (time.perf_counter() - start)

        rates["whole-shard fetch (W = 1)"] = (max(fetch_ours() for _ in range(3)), max(fetch_base() for _ in range(2)))
    finally:
        for proc in (ours.proc, base):
            proc.terminate()
            proc.wait(timeout=30)
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
