"""Payloads: the files a meta file's lines name, read a batch at a time (``RankDataset(...,
payloads=Payloads(root))``) from a local S3 server (SeaweedFS) through a proxy that adds a fixed latency to every
request, beside, in the same run: a transform that reads one payload at a time with the same client (the naive
loader), and litdata's ``StreamingRawDataset`` on the same objects (its listing time reported apart); and local
files in the page cache beside a transform doing ``open().read()``.

Each configuration is a fresh process: one rank, a DataLoader of ``--workers`` workers and batches of
``--batch``, its samples counted over ``--windows`` fixed windows of ``--window`` seconds after a warm-up
(epochs run on as needed); the figure is the median window's samples/s. Over the windows: the client's CPU (the
rank and its workers) per payload, the proxy's CPU (tests/fault_proxy.py, a process of its own), SeaweedFS's
CPU, GETs per sample, and the most payload bytes a worker held at once (``Payloads``'s budget) against
``max_bytes``. Every payload's length is checked against its size in the meta file. The store, the proxy and
the loader share this machine's cores: the store's rate is the ceiling.

Usage:
    python benchmarks/bench_payloads.py --litdata-path /work/bench-deps   # 20,000 payloads, windows of 30 s
    python benchmarks/bench_payloads.py --payloads 300 --window 1 --windows 1 --workers 2 --batch 32 --out /tmp/r
    python benchmarks/bench_payloads.py --only local --out /tmp/r   # the page-cache configurations alone (no store)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _common import load_note, machine_info, md_table, plotting, save_results, scratch_dir  # noqa: E402

KiB = 1 << 10
BUCKET_PREFIX = "payloads"

# One configuration, in its own process. MODE: payloads | naive | litdata | payloads-local | open-read.
_CHILD = r"""
import json, os, statistics, sys, time, urllib.request
import psutil
import torch
from torch.utils.data import DataLoader, get_worker_info

MODE, META, ROOT, WORKERS, BATCH, WINDOW, WINDOWS, WARMUP = sys.argv[1:9]
WORKERS, BATCH, WINDOW, WINDOWS, WARMUP = int(WORKERS), int(BATCH), float(WINDOW), int(WINDOWS), float(WARMUP)
PROXY, WEED, LITDATA = os.environ.get("BENCH_PROXY"), os.environ.get("BENCH_WEED_PID"), os.environ.get("BENCH_LITDATA")
MAX_BYTES = 256 << 20
MAX_IN_FLIGHT = int(os.environ.get("BENCH_MAX_IN_FLIGHT", "0"))  # 0: Payloads' default
sizes = {}
with open(META) as f:
    for line in f:
        name, size = line.split()
        sizes[name] = int(size)


def proxy():  # the proxy's counts so far (its CPU, its requests)
    if not PROXY:
        return {"cpu_s": 0.0, "gets": 0}
    with urllib.request.urlopen(PROXY + "/__fault_proxy__/stats", timeout=30) as answer:
        return json.loads(answer.read())


def weed_cpu():
    if not WEED:
        return 0.0
    fields = open(f"/proc/{WEED}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_idle():  # the machine's idle (and iowait) CPU seconds so far, all cores
    fields = open("/proc/stat").readline().split()[1:]
    return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")


def client_cpu():  # this process and every process under it (workers, a helper)
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def held_peak():  # the most payload bytes this worker's reader has held at once
    info = get_worker_info()
    payloads = getattr(info.dataset, "payloads", None) if info is not None else None
    return payloads.reader().budget.peak if payloads is not None else -1


def collate(batch):
    # (samples, bytes, payloads whose length is not their size, the worker's peak held): no bytes sent back.
    bad = nbytes = 0
    for item in batch:
        if MODE == "litdata":
            data, name = item, None
        else:
            (line, data) = item
            name = line.split()[0] if isinstance(line, str) else line
        nbytes += len(data)
        if name is not None and len(data) != sizes[name]:
            bad += 1
    return len(batch), nbytes, bad, held_peak()


listing = None
if MODE == "litdata":
    sys.path.append(LITDATA)
    import litdata.streaming.downloader as downloader
    from litdata.raw import StreamingRawDataset

    # The local server speaks http: obstore must be told (on S3 it is https and this is not needed).
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    t = time.perf_counter()
    dataset = StreamingRawDataset(ROOT, cache_dir=os.environ["BENCH_CACHE"], recompute_index=True)
    listing = time.perf_counter() - t
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, shuffle=True, persistent_workers=True,
                        collate_fn=collate)
    sampler = None
else:
    from rank_dataset import Payloads, RandomSampler, RankDataset

    if MODE in ("payloads", "payloads-local"):
        more = {"max_in_flight": MAX_IN_FLIGHT} if MAX_IN_FLIGHT else {}
        dataset = RankDataset(META, payloads=Payloads(ROOT, max_bytes=MAX_BYTES, **more), reload_cfg={"seed": 0})
    else:
        import naive_read
        dataset = RankDataset(META, transform=naive_read.Reader(ROOT, MODE), reload_cfg={"seed": 0})
    dataset.set_epoch(0)
    sampler = RandomSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, persistent_workers=True,
                        collate_fn=collate)


def batches():
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


it = batches()
t0 = time.perf_counter()
bad, peak = 0, -1
for n, nbytes, b, p in it:  # warm-up: workers started, clients made, the pipeline full
    bad, peak = bad + b, max(peak, p)
    if time.perf_counter() - t0 >= WARMUP:
        break
marks = [(time.perf_counter(), client_cpu(), weed_cpu(), proxy(), machine_idle(), os.getloadavg()[0])]
windows, samples, nbytes_total = [], 0, 0
for n, nbytes, b, p in it:
    samples, nbytes_total, bad, peak = samples + n, nbytes_total + nbytes, bad + b, max(peak, p)
    now = time.perf_counter()
    if now - marks[-1][0] >= WINDOW:
        marks.append((now, client_cpu(), weed_cpu(), proxy(), machine_idle(), os.getloadavg()[0]))
        windows.append({"samples": samples, "seconds": now - marks[-2][0], "bytes": nbytes_total})
        samples = nbytes_total = 0
        if len(windows) == WINDOWS:
            break
(a, b) = marks[0], marks[-1]
total = sum(w["samples"] for w in windows)
seconds = b[0] - a[0]
rates = [w["samples"] / w["seconds"] for w in windows]
print(json.dumps({
    "rate": statistics.median(rates), "rates": rates, "samples": total, "seconds": seconds,
    "bytes_per_sample": sum(w["bytes"] for w in windows) / max(total, 1),
    "client_cpu_per_payload_us": (b[1] - a[1]) / max(total, 1) * 1e6,
    "client_cpu_share": (b[1] - a[1]) / seconds,
    "weed_cpu_share": (b[2] - a[2]) / seconds,
    "proxy_cpu_share": (b[3]["cpu_s"] - a[3]["cpu_s"]) / seconds,
    "gets_per_sample": (b[3]["gets"] - a[3]["gets"]) / max(total, 1),
    "machine_idle_share": (b[4] - a[4]) / seconds, "load": statistics.mean(m[5] for m in marks),
    "bad_lengths": bad, "peak_held": peak, "max_bytes": MAX_BYTES, "listing_s": listing,
}))
os._exit(0)  # the workers and clients end with the process
"""

# The naive loader's transform: one payload per call, with the same client as Payloads (objects) or open().read().
_NAIVE = r'''
import os


class Reader:
    """A transform reading the payload a line names, one at a time (the naive loader)."""

    def __init__(self, root, mode):
        self.root, self.mode, self.store = root, mode, None

    def __call__(self, line):
        name = line.split()[0]
        if self.mode == "open-read":
            with open(os.path.join(self.root, name), "rb") as f:
                return line, f.read()
        import obstore
        from rank_dataset.files.io._stores import object_store

        if self.store is None:
            self.store = object_store(self.root, {}, 60.0)
        return line, bytes(obstore.get(self.store, name).bytes())
'''


def make_payloads(root: Path, n: int, low: int, high: int, seed: int = 0) -> tuple[Path, list[tuple[str, int]]]:
    """``n`` files of random bytes, ``low``-``high`` bytes each, under ``root`` in 100 folders, and a meta file
    of ``name size`` lines beside it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high + 1, n)
    names = []
    for i, size in enumerate(sizes):
        name = f"{i % 100:02d}/{i:06d}.bin"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(rng.bytes(int(size)))
        names.append((name, int(size)))
    meta = root.parent / "meta.txt"
    meta.write_text("".join(f"{name} {size}\n" for name, size in names))
    return meta, names


def upload(server: Any, root: Path, names: list[tuple[str, int]], concurrency: int = 16) -> float:
    """Put every file as ``payloads/<name>``; the seconds it took."""
    import obstore

    store = server.store()

    async def put_all() -> None:
        gate = asyncio.Semaphore(concurrency)

        async def one(name: str) -> None:
            async with gate:
                await obstore.put_async(store, f"{BUCKET_PREFIX}/{name}", (root / name).read_bytes())

        await asyncio.gather(*[one(name) for name, _ in names])

    t = time.perf_counter()
    asyncio.run(put_all())
    return time.perf_counter() - t


def run(mode: str, meta: Path, root: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _CHILD, mode, str(meta), root]
    cmd += [str(args.workers), str(args.batch), str(args.window), str(args.windows), str(args.warmup)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.window * args.windows * 20 + 600)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{out.stderr[-4000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--payloads", type=int, default=20_000)
    parser.add_argument("--min-kib", type=int, default=64)
    parser.add_argument("--max-kib", type=int, default=128)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 10, 50], help="ms added per request")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--window", type=float, default=30.0, help="seconds a window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the first window")
    parser.add_argument("--max-in-flight", type=int, default=0, help="Payloads' max_in_flight (0: its default)")
    parser.add_argument("--litdata-path", default=None, help="a directory holding litdata (pip install --target)")
    parser.add_argument(
        "--only", choices=("objects", "local"), default=None, help="run only the store's or the local configurations"
    )
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/rank-dataset-bench-payloads"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import s3_helpers

    litdata_note = _litdata_status(args.litdata_path)
    results: dict[str, Any] = {"rows": [], "args": {k: str(v) for k, v in vars(args).items()}}
    # Volumes of 4 GiB (the tests' server makes them of 512 MiB): the payloads fit in the volumes made with the
    # bucket, with none to grow under load (a loaded server answered PUTs with 500 once its first were full).
    store_flags = ["-master.volumeSizeLimitMB=4096"]
    objects, local = args.only in (None, "objects"), args.only in (None, "local")
    with contextlib.ExitStack() as stack:
        data = stack.enter_context(scratch_dir(args.data_dir))
        server = stack.enter_context(s3_helpers.s3_server(store_flags)) if objects else None
        (data / "naive_read.py").write_text(_NAIVE)
        root = data / "root"
        t = time.perf_counter()
        meta, names = make_payloads(root, args.payloads, args.min_kib * KiB, args.max_kib * KiB)
        results["write_s"] = time.perf_counter() - t
        results["total_bytes"] = sum(size for _, size in names)
        base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(data), os.environ.get("PYTHONPATH", "")])}
        base["BENCH_MAX_IN_FLIGHT"] = str(args.max_in_flight)
        if server is not None:
            results["upload_s"] = upload(server, root, names)
            base["BENCH_WEED_PID"] = str(server.proc.pid)
            run_objects(args, server, meta, base, litdata_note, results)
        if local:
            for path in root.rglob("*.bin"):  # into the page cache
                path.read_bytes()
            for mode in ("payloads-local", "open-read"):
                got = run(mode, meta, str(root), args, base)
                results["rows"].append({"mode": mode, "latency_ms": None, **got})
                print(f"{mode:>9}: {got['rate']:8.0f} samples/s", flush=True)
    results["litdata"] = litdata_note
    write_page(args, results)


def run_objects(
    args: argparse.Namespace, server: Any, meta: Path, base: dict[str, str], litdata_note: str | None,
    results: dict[str, Any],
) -> None:  # fmt: skip
    """The store's configurations: every latency, Payloads beside the naive loader and litdata."""
    import s3_helpers
    from fault_proxy import running_proxy

    with running_proxy(("127.0.0.1", server.port)) as proxy:
        env = {**base, **server.env(proxy.endpoint), "BENCH_PROXY": proxy.endpoint}
        env["BENCH_CACHE"] = str(meta.parent / "litdata-cache")
        if args.litdata_path:
            env["BENCH_LITDATA"] = args.litdata_path
        url = f"s3://{s3_helpers.BUCKET}/{BUCKET_PREFIX}"
        for latency in args.latencies:
            proxy.set(latency=latency / 1000)
            modes = ["payloads", "naive"] + (["litdata"] if litdata_note is None else [])
            for mode in modes:
                where = url + "/" if mode == "litdata" else url
                got = run(mode, meta, where, args, env)
                results["rows"].append({"mode": mode, "latency_ms": latency, **got})
                print(f"{mode:>9} {latency:>4g} ms: {got['rate']:8.0f} samples/s", flush=True)


def _litdata_status(path: str | None) -> str | None:
    """None if litdata imports (from ``path``, appended to the path); else why not, in words."""
    code = "import sys; sys.path.append(sys.argv[1]); import litdata; from litdata.raw import StreamingRawDataset"
    if path is None:
        return "not measured: no --litdata-path given (litdata is not a dependency of rank-dataset)"
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    if out.returncode != 0:
        return f"not measured: litdata does not import from {path}: {out.stderr.strip().splitlines()[-1]}"
    return None


def _all_cpu(row: dict[str, Any]) -> float:
    """The CPU time a sample cost the client, the proxy and the store together, in µs (on a machine whose
    cores are all busy, samples/s is the CPU share it got over this)."""
    share = row["client_cpu_share"] + row["proxy_cpu_share"] + row["weed_cpu_share"]
    return float(share * row["seconds"] / max(row["samples"], 1) * 1e6)


def _row(rows: list[dict[str, Any]], mode: str, latency: float | None) -> dict[str, Any] | None:
    return next((r for r in rows if r["mode"] == mode and r["latency_ms"] == latency), None)


def write_page(args: argparse.Namespace, results: dict[str, Any]) -> None:
    rows = results["rows"]
    names = {
        "payloads": "Payloads",
        "naive": "naive loader (one payload per transform call)",
        "litdata": "litdata StreamingRawDataset",
        "payloads-local": "Payloads, local files (page cache)",
        "open-read": "open().read() per item, local files (page cache)",
    }
    zero = _row(rows, "payloads", args.latencies[0])
    lines = [
        "# Payloads: a batch's files in flight together",
        "",
        f"{args.payloads:,} payloads of {args.min_kib}-{args.max_kib} KiB ({results['total_bytes'] / 2**30:.2f} GiB) "
        f"in a local S3 server (SeaweedFS), read by one rank with {args.workers} DataLoader workers and batches of "
        f"{args.batch}, through a proxy on loopback that adds a fixed latency to every request. Each figure is the "
        f"median of {args.windows} windows of {args.window:g} s (after {args.warmup:g} s of warm-up), each "
        "configuration a fresh process, all in one run; CPU shares are of one core over the windows, the machine's "
        "idle share of its cores (2 = all idle) and the load average over the windows beside them.",
        "",
        f"Command: `python benchmarks/bench_payloads.py {' '.join(sys.argv[1:])}`",
        "",
        machine_info(),
        f"Load average at the end: {load_note()} (2 cores shared with other work: the figures are noisy).",
        "",
    ]
    table = []
    for r in rows:
        latency = "local" if r["latency_ms"] is None else f"{r['latency_ms']:g} ms"
        held = f"{r['peak_held'] / 2**20:.1f} / {r['max_bytes'] / 2**20:.0f} MiB" if r["peak_held"] >= 0 else "-"
        versus = f"{r['rate'] / zero['rate']:.2f}x" if zero and r["latency_ms"] is not None else "-"
        table.append(
            (names[r["mode"]], latency, f"{r['rate']:,.0f}", versus, f"{r['client_cpu_per_payload_us']:,.0f} µs",
             *(f"{r[k]:.2f}" for k in ("client_cpu_share", "proxy_cpu_share", "weed_cpu_share")),
             f"{_all_cpu(r):,.0f} µs", f"{r['machine_idle_share']:.2f}", f"{r['load']:.0f}",
             f"{r['gets_per_sample']:.2f}", held)
        )  # fmt: skip
    lines += md_table(
        ["loader", "latency", "samples/s", "/ Payloads at 0 ms", "client CPU a payload", "client CPU", "proxy CPU",
         "SeaweedFS CPU", "all three's CPU a sample", "machine idle", "load", "GETs a sample",
         "peak held / max_bytes"],
        table,
    )  # fmt: skip
    lines += ["", "Every payload's length was checked against its size in the meta file: "]
    bad = sum(r["bad_lengths"] for r in rows)
    lines[-1] += "all equal." if bad == 0 else f"**{bad} differed**."
    lines += ["", "## Targets", ""]
    lines += md_table(
        ["target", "measured", "met"],
        [
            (what, "n/a", "n/a") if value is None else (what, f"{value:.2f}x", "yes" if value >= goal else "**no**")
            for what, value, goal in _targets(args, rows)
        ],
    )
    held = [r for r in rows if r["peak_held"] >= 0]
    if held:
        ok = all(r["peak_held"] <= r["max_bytes"] for r in held)
        top = max(r["peak_held"] for r in held)
        lines.append(
            f"| bytes held per process under max_bytes | peak {top / 2**20:.1f} MiB | {'yes' if ok else '**no**'} |"
        )
    listing = [r for r in rows if r["mode"] == "litdata"]
    lines += ["", "## litdata", ""]
    if args.only == "local":
        lines.append("Not measured: this run measured the local configurations alone (`--only local`).")
    elif results["litdata"] is not None:
        lines.append(f"litdata's StreamingRawDataset was {results['litdata']}.")
    else:
        lines.append(
            "litdata 0.2.76 (installed apart, `pip install --target`, on this run's torch), `StreamingRawDataset` "
            "with its defaults (`max_concurrent_downloads` adaptive, `max_prefetch=16`), `shuffle=True`, through "
            "the same proxy; its obstore client is told `allow_http` (the local server speaks http). Its listing "
            "(fsspec's s3fs, and the index it writes back to the bucket), at the start of each run, apart from "
            "the windows: " + ", ".join(f"{r['listing_s']:.2f} s at {r['latency_ms']:g} ms" for r in listing) + "."
        )
    upload = f", {results['upload_s']:.1f} s to upload them" if "upload_s" in results else ""
    lines += ["", f"Setup: {results['write_s']:.1f} s to write the files{upload}."]
    data = results

    def plot(path: Path) -> None:
        plt = plotting()
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for mode in ("payloads", "litdata", "naive"):
            got = [(r["latency_ms"], r["rate"]) for r in rows if r["mode"] == mode]
            if got:
                ax.plot([x for x, _ in got], [y for _, y in got], marker="o", label=names[mode])
        ax.set_xlabel("latency added per request (ms)")
        ax.set_ylabel("samples/s, one rank")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    save_results(args.out, "payloads", lines, data, plot)


def _targets(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[tuple[str, float | None, float]]:
    def rate(mode: str, latency: float | None) -> float | None:
        r = _row(rows, mode, latency)
        return None if r is None else float(r["rate"])

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    lat = args.latencies
    out: list[tuple[str, float | None, float]] = []
    for later in lat[1:]:
        goal = 0.8 if later <= 10 else 0.6
        out.append(
            (
                f"Payloads at {later:g} ms / at {lat[0]:g} ms >= {goal}",
                ratio(rate("payloads", later), rate("payloads", lat[0])),
                goal,
            )
        )
    out.append(
        (
            f"Payloads / naive loader at {lat[-1]:g} ms >= 10",
            ratio(rate("payloads", lat[-1]), rate("naive", lat[-1])),
            10.0,
        )
    )
    out.append(
        (
            f"Payloads / naive loader at {lat[0]:g} ms >= 0.95",
            ratio(rate("payloads", lat[0]), rate("naive", lat[0])),
            0.95,
        )
    )
    for latency in lat:
        out.append(
            (
                f"Payloads / litdata at {latency:g} ms >= 0.95",
                ratio(rate("payloads", latency), rate("litdata", latency)),
                0.95,
            )
        )
    out.append(
        (
            "Payloads / open().read(), local files >= 0.95",
            ratio(rate("payloads-local", None), rate("open-read", None)),
            0.95,
        )
    )
    return out


if __name__ == "__main__":
    main()
