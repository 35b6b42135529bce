"""Many nodes on the multi-host bed (tests/multihost/bed.py, as root): the time from launch to the first batch and
the store's requests at 2, 4 and 8 hosts, for the file reader and the collective reader, from the shared directory
and from the bucket; and a model fitted to those figures that predicts a job of 64 nodes x 8 ranks at N = 1B.

Each job is ``torchrun --nnodes K --nproc-per-node L`` on every host of a fresh bed (each host a network namespace
whose link is shaped by ``tbf``; the store SeaweedFS behind the bed's counting proxy, reached through a delay line
on the store host). A job starts cold on every host: its cache directory emptied (the file reader builds the index,
one builder a host), its ranks importing torch. Each rank builds its dataset (``set_epoch(0)``) and takes the first
batch of a DataLoader (``num_workers=0``), noting the wall clock and its CPU time at each step; the first local rank
also notes its torchrun agent's CPU. The bench notes the store's requests and bytes (the proxy's counts), the bytes
on each host's link (its veth's counters) and the store's processes' CPU.

The model (fitted by least squares with non-negative coefficients, over every job):

    T_first = a + b * CPU / cores + c * bytes on the busiest link / link rate + d * the busiest rank's requests

CPU is every process's CPU up to the first batch (ranks, agents, store) on the bed's ``cores``: 2 cores shared by
every host (and by whatever else runs on the machine), so the bed's times are mostly CPU contention. On a cluster
every process has cores of its own, and the CPU term is the critical path instead: the busiest host's agent and
slowest rank. Each process's CPU is modelled per reader as ``e + N * (p + q / W) + r * N * [builds the index]``
(fitted by least squares on the ranks of every job, at two N), and each job's bytes and requests by the readers'
mechanisms (:func:`traffic`: for the collective reader each rank's slice in GETs of 32 MiB, twice in a cold start;
for the file reader an index stream a host and each rank's lines a window at a time), checked against the bed's
counts. :func:`predict` puts them together for 64 nodes x 8 ranks at N = 1B from S3.

Usage (as root, from the repository's root; one bed at a time, never beside the bed's tests):
    python benchmarks/bench_multinode.py                                  # 2x2, 4x2, 8x1 at 2M lines, 2x2 at 500k
    python benchmarks/bench_multinode.py --sizes 2x1 --small-sizes 2x1 --lines 20000 --small-lines 5000 --out /tmp/r
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

READERS = ("file", "collective", "object-file", "object-collective")
SEED, BATCH = 5, 256
#: The predicted job: 64 nodes x 8 ranks, N = 1B lines from a bucket, S3's GET rate a prefix.
PREDICT_HOSTS, PREDICT_RANKS, PREDICT_LINES, S3_GETS_PER_S = 64, 8, 1_000_000_000, 5_500
# The object reader's GET for a stream (an index build, a collective slice), the gap a coalesced read reads through,
# and the bytes of the file the gather's window spans (one coalesced GET a window, for a rank's dense rows).
REQUEST, COALESCE, WINDOW = 32 << 20, 1 << 20, 2 << 20


# -- on each host, under torchrun ----------------------------------------------------------------------


def worker(out: str, reader: str, meta: str, url: str) -> None:
    """One rank: the wall clock and this process's CPU at each step from its start to its first batch."""
    marks: list[tuple[str, float, float]] = [("start", time.time(), _cpu())]
    import psutil
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from rank_dataset import RandomSampler, RankDataset
    from rank_dataset.files.io.object import COUNTS

    marks.append(("import", time.time(), _cpu()))
    builds: list[str] = []  # the index builds of this process, as the library records each
    index_log = logging.getLogger("rank_dataset.index")
    index_log.setLevel(logging.INFO)
    index_log.addHandler(_Recorder(builds))
    dist.init_process_group("gloo")
    marks.append(("group", time.time(), _cpu()))
    source = url if reader.startswith("object-") else meta
    ds = RankDataset(source, reload_cfg={"seed": SEED}, reader=reader.removeprefix("object-"))
    marks.append(("dataset", time.time(), _cpu()))
    ds.set_epoch(0)
    marks.append(("set_epoch", time.time(), _cpu()))
    loader = DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds), num_workers=0, collate_fn=list)
    first = next(iter(loader))
    marks.append(("first_batch", time.time(), _cpu()))
    agent = None
    if int(os.environ["LOCAL_RANK"]) == 0:  # the torchrun agent that started this host's ranks
        times = psutil.Process(os.getppid()).cpu_times()
        agent = times.user + times.system
    result = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "host": os.uname().nodename,
        "marks": marks,
        "agent_cpu": agent,
        "store": dict(COUNTS),
        "batch": len(first),
        "builds": builds,
        # The shard's bytes of lines, and what its build moved (the collective reader's): for the link check.
        "shard_line_bytes": int(ds.shard.bounds[-1]),
        "exchange": dict(getattr(ds.reader, "stats", {})),
    }
    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


class _Recorder(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.INFO)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


# -- the bench ------------------------------------------------------------------------------------------


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None or min(int(m.group(1)), int(m.group(2))) < 1:
        raise argparse.ArgumentTypeError(f"a size is HOSTSxRANKS (e.g. 4x2), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _store_cpu(bed: Any) -> float:
    import psutil

    total = 0.0
    for proc in bed.store_procs:
        try:
            t = psutil.Process(proc.pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_job(bed: Any, hosts: int, ranks: int, reader: str, meta: Path, url: str, name: str) -> dict[str, Any]:
    """One cold job of ``reader`` on the bed: every host's cache emptied, the counts taken around it."""
    for host in bed.hosts:
        shutil.rmtree(host.cache_dir, ignore_errors=True)
        host.cache_dir.mkdir()
    out = bed.scratch / name
    bed.proxy_call("reset")
    links_before, cpu_before = _per_direction(bed), _store_cpu(bed)
    launch = time.time()
    done = bed.torchrun(Path(__file__), "worker", out, reader, meta, url, ranks=ranks, timeout=900)
    wall = time.time() - launch
    logs = "\n".join(f"--- host {i}: {d.returncode}\n{d.stderr[-3000:]}" for i, d in enumerate(done))
    if any(d.returncode != 0 for d in done):
        raise RuntimeError(f"the job {name} failed:\n{logs}")
    links_after, store_cpu = _per_direction(bed), _store_cpu(bed) - cpu_before
    stats = bed.proxy_call("stats")
    results = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(hosts * ranks)]
    first = max(r["marks"][-1][1] for r in results) - launch
    links = {k: [links_after[k][j] - links_before[k][j] for j in range(2)] for k in links_after}
    rank_cpu = [r["marks"][-1][2] for r in results]
    agent_cpu = [r["agent_cpu"] for r in results if r["agent_cpu"] is not None]
    requests = sum(v["requests"] for k, v in stats.items() if k != "failed")
    return {
        "reader": reader,
        "hosts": hosts,
        "ranks": ranks,
        "world": hosts * ranks,
        "first_batch_s": first,
        "job_s": wall,
        "ranks_cpu": rank_cpu,
        "agents_cpu": agent_cpu,
        "store_cpu": store_cpu,
        "cpu_total": sum(rank_cpu) + sum(agent_cpu) + store_cpu,
        "links": links,
        "store": stats,
        "store_requests": requests,
        "store_bytes": sum(v["bytes"] for k, v in stats.items() if k != "failed"),
        "rank_results": results,
        "load": os.getloadavg(),
    }


def _per_direction(bed: Any) -> dict[str, list[int]]:
    """Each link's bytes delivered to its host and sent by it so far (the outer veth sends what the host gets)."""
    out = {}
    for i, host in [*enumerate(bed.hosts), ("s", bed.store_host)]:
        stats = Path(f"/sys/class/net/{bed.tag}v{i}/statistics")
        out[host.name] = [int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())]
    return out


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from _common import write_imagenet_meta
    from multihost.bed import Bed

    jobs = []
    plan = [(size, args.lines) for size in args.sizes] + [(size, args.small_lines) for size in args.small_sizes]
    for (hosts, ranks), lines in plan:
        with Bed(hosts, rate=args.rate, store_delay_ms=args.store_delay_ms) as bed:
            meta = write_imagenet_meta(bed.shared / "meta.txt", lines)
            # The bucket's copy only for the object readers (the store is slow to take it on a loaded machine).
            needed = any(r.startswith("object-") for r in args.readers)
            url = bed.put("meta.txt", meta.read_bytes()) if needed else ""
            for reader in args.readers:
                name = f"{reader}-{hosts}x{ranks}-{lines}"
                job = run_job(bed, hosts, ranks, reader, meta, url, name)
                job.update(lines=lines, size=meta.stat().st_size, rate=args.rate, delay_ms=args.store_delay_ms)
                jobs.append(job)
                print(
                    f"{name}: first batch {job['first_batch_s']:.1f} s, CPU {job['cpu_total']:.1f} s, "
                    f"{job['store_requests']} requests, {job['store_bytes'] / 1e6:.1f} MB from the store",
                    flush=True,
                )
    return jobs


# -- the model ------------------------------------------------------------------------------------------


def _rate_bytes(rate: str) -> float:
    """A tc rate (``1gbit``, ``100mbit``) in bytes a second."""
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", rate.lower())
    if m is None:
        raise ValueError(f"a link rate is like 1gbit or 100mbit, got {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def nnls(x: Any, y: Any) -> Any:
    """The least-squares solution of ``x @ c = y`` with every coefficient 0 or more (the best of the unconstrained
    fits over every subset of the columns whose solution has none negative: few columns, so exact)."""
    import numpy as np

    best, best_err = np.zeros(x.shape[1]), float(np.sum(y**2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (c >= 0).all():
                err = float(np.sum((x[:, cols] @ c - y) ** 2))
                if err < best_err:
                    best, best_err = np.zeros(x.shape[1]), err
                    best[list(cols)] = c
    return best


def cpu_model(jobs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per reader: a rank's CPU from its start to the first batch, ``base + e + N * (p + q / W) + r * N * builder``
    where ``base`` is its CPU to the group's start (imports, rendezvous: measured, its median) and ``builder`` whether
    the rank built an index (the library's record of each build), fitted on every rank of every job (N in millions of
    lines); and an agent's CPU to its ranks' first batch (its median)."""
    import numpy as np

    model = {}
    for reader in sorted({j["reader"] for j in jobs}):
        mine = [j for j in jobs if j["reader"] == reader]
        rows, ys, bases = [], [], []
        for j in mine:
            for r in j["rank_results"]:
                marks = {m[0]: m[2] for m in r["marks"]}
                bases.append(marks["group"])
                n, w = j["lines"] / 1e6, j["world"]
                rows.append([1.0, n, n / w, n * bool(r["builds"])])
                ys.append(marks["first_batch"] - marks["group"])
        x, y = np.array(rows), np.array(ys)
        c = nnls(x, y)
        model[reader] = {
            "base": float(np.median(bases)),
            "e": float(c[0]),
            "p": float(c[1]),
            "q": float(c[2]),
            "r": float(c[3]),
            "agent": float(np.median([a for j in mine for a in j["agents_cpu"]])),
            "rms": float(np.sqrt(np.mean((x @ c - y) ** 2))),
            "ranks": len(ys),
        }
    return model


def rank_cpu(m: dict[str, float], lines: int, world: int, builder: bool) -> float:
    """A rank's CPU to its first batch by the model ``m`` of :func:`cpu_model`."""
    n = lines / 1e6
    return m["base"] + m["e"] + n * (m["p"] + m["q"] / world) + m["r"] * n * builder


def traffic(reader: str, hosts: int, ranks: int, lines: int, size: int) -> dict[str, float]:
    """A job's data GETs to the store (all, and the busiest rank's, which makes them one after another) and bytes,
    and the bytes on the store's link and on a host's, by the reader's mechanism:

    - the collective reader of an object: each rank's slice (``size / W``) in GETs of 32 MiB, twice in a cold start
      (its lines counted, then read); a host's link carries its ranks' slices (twice) and the lines its ranks get
      from other hosts (``size / K``);
    - the file reader of an object: a host streams the whole object to build its index (GETs of 32 MiB), then each
      rank reads its lines window by window (2 MiB of the object each): where its lines lie less than 1 MiB apart
      (the gap a read goes through), the whole object again, a GET a window, else a GET a line;
    - from the shared directory: no store; the collective reader's exchange crosses the links (``size / K``).

    The small requests beside these (HEADs, the ends' hashes, the format's sniff) are counted on the bed and added
    per rank (:func:`small_requests`).
    """
    world, whole = hosts * ranks, max(1, math.ceil(size / REQUEST))
    if reader == "object-collective":
        each = 2 * max(1, math.ceil(size / world / REQUEST))
        return {
            "gets": world * each,
            "rank_gets": each,
            "bytes": 2 * size,
            "store_link": 2 * size,
            "host_link": 3 * size / hosts,
        }
    if reader == "object-file":
        share = lines / world
        dense = size / max(1.0, share) < COALESCE
        rank_gets, rank_bytes = (math.ceil(size / WINDOW), size) if dense else (share, share * size / lines)
        moved = hosts * size + world * rank_bytes
        return {
            "gets": hosts * whole + world * rank_gets,
            "rank_gets": whole + rank_gets,  # the host's builder
            "bytes": moved,
            "store_link": moved,
            "host_link": moved / hosts,
        }
    host_link = size / hosts if reader == "collective" and hosts > 1 else 0
    return {"gets": 0, "rank_gets": 0, "bytes": 0, "store_link": 0, "host_link": host_link}


def small_requests(jobs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per reader: the requests a rank makes beyond its data GETs (on average, and on the busiest rank), counted on
    the bed: the store's count less the mechanism's GETs, over the ranks."""
    import numpy as np

    out = {}
    for reader in sorted({j["reader"] for j in jobs}):
        mine = [j for j in jobs if j["reader"] == reader]
        per_rank, busiest = [], []
        for j in mine:
            t = traffic(reader, j["hosts"], j["ranks"], j["lines"], j["size"])
            per_rank.append((j["store_requests"] - t["gets"]) / j["world"])
            busiest.append(_busiest_requests(j) - t["rank_gets"])
        out[reader] = (float(np.median(per_rank)), float(np.median(busiest)))
    return out


def _busiest_requests(job: dict[str, Any]) -> int:
    """The most requests one rank of ``job`` made (its HEADs and GETs, one after another)."""
    return max(r["store"]["heads"] + r["store"]["gets"] for r in job["rank_results"])


def _busiest_link(job: dict[str, Any]) -> int:
    """The most bytes one link of ``job`` carried in one direction."""
    return max(max(v) for v in job["links"].values())


def time_model(jobs: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """``T_first = a + b * CPU / cores + c * busiest link bytes / link rate + d * busiest rank's requests``,
    coefficients 0 or more, fitted on every job; each job's fitted time and its terms."""
    import numpy as np

    rows = []
    for j in jobs:
        rows.append([1.0, j["cpu_total"] / cores, _busiest_link(j) / _rate_bytes(j["rate"]), _busiest_requests(j)])
    x, y = np.array(rows, dtype=float), np.array([j["first_batch_s"] for j in jobs])
    c = nnls(x, y)
    return {
        "a": float(c[0]),
        "b": float(c[1]),
        "c": float(c[2]),
        "d": float(c[3]),
        "fitted": [float(v) for v in x @ c],
        "terms": [[float(v) for v in row * c] for row in x],
        "rms": float(np.sqrt(np.mean((x @ c - y) ** 2))),
    }


def predict(
    cpu: dict[str, dict[str, float]],
    fit: dict[str, Any],
    small: dict[str, tuple[float, float]],
    reader: str,
    line_bytes: float,
    link: float,
    round_trip: float,
) -> dict[str, float]:
    """The model at 64 nodes x 8 ranks, N = 1B from a bucket, each node's link ``link`` bytes a second. Each process
    has a core of its own, so the CPU term is the critical path (the agent, then the slowest rank: for the file
    reader the one that builds the index); the network's, a node's link (S3 is no one link); the requests', the
    busiest rank's one after another at the bed's cost each (``d``, or ``round_trip`` where the fit found less: a
    request takes its round trip at least), or S3's 5,500 GETs a second a prefix for all of the job's, whichever is
    longer."""
    n, w = PREDICT_LINES, PREDICT_HOSTS * PREDICT_RANKS
    size = int(n * line_bytes)
    critical = cpu[reader]["agent"] + rank_cpu(cpu[reader], n, w, reader.endswith("file"))
    moved = traffic(reader, PREDICT_HOSTS, PREDICT_RANKS, n, size)
    network = moved["host_link"] / link
    requests = moved["gets"] + small[reader][0] * w
    sequential = max(fit["d"], round_trip) * (moved["rank_gets"] + small[reader][1])
    floor = requests / S3_GETS_PER_S
    first = fit["a"] + critical + network + max(sequential, floor)
    return {
        "first_batch_s": first,
        "cpu_critical_s": critical,
        "network_s": network,
        "requests": requests,
        "store_bytes": moved["bytes"],
        "requests_sequential_s": sequential,
        "requests_floor_s": floor,
        "requests_per_s": requests / first,  # over the whole start
        "requests_per_s_reading": requests / max(network, sequential, floor, 1e-9),  # while the lines are read
    }


# -- the page -------------------------------------------------------------------------------------------


def summary(
    jobs: list[dict[str, Any]],
    cpu: dict[str, dict[str, float]],
    fit: dict[str, Any],
    small: dict[str, tuple[float, float]],
    line_bytes: float,
    rate: float,
    args: argparse.Namespace,
) -> list[str]:
    """The page's opening: what the bed showed and what the model predicts, from the figures."""
    big = [j for j in jobs if j["lines"] == max(k["lines"] for k in jobs)]
    out = []
    for reader in ("object-collective", "object-file"):
        mine = sorted((j for j in big if j["reader"] == reader), key=lambda j: j["hosts"])
        if not mine:
            continue
        ends = f"{mine[0]['hosts']} to {mine[-1]['hosts']} hosts"
        contention = [t[1] / j["first_batch_s"] for j, t in zip(jobs, fit["terms"]) if j in mine]
        out.append(
            f"- `{reader}` on the bed, {ends}: the first batch after "
            + ", ".join(f"{j['first_batch_s']:.0f} s" for j in mine)
            + f", {min(contention):.0%}-{max(contention):.0%} of it the fit's CPU term; the store sent "
            + ", ".join(f"{j['store_bytes'] / j['size']:.2f}x" for j in mine)
            + " the object in "
            + ", ".join(str(j["store_requests"]) for j in mine)
            + " requests."
        )
        if reader in cpu:
            near = predict(cpu, fit, small, reader, line_bytes, rate, 2 * args.store_delay_ms / 1000)
            fast = predict(cpu, fit, small, reader, line_bytes, _rate_bytes("100gbit"), 2 * args.store_delay_ms / 1000)
            out.append(
                "  Predicted at 64 nodes x 8 ranks, N = 1B from S3: the first batch after "
                f"{fast['first_batch_s']:,.0f} s with 100 Gbit/s a node ({near['first_batch_s']:,.0f} s at "
                f"{args.rate}), "
                f"{fast['requests']:,.0f} requests and {fast['store_bytes'] / 1e9:,.0f} GB from the store; "
                f"S3's 5,500 GETs/s a prefix alone takes {fast['requests_floor_s']:,.1f} s of it."
            )
    return out


def report(jobs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from _common import load_note, machine_info, md_table, plotting, save_results

    cores = os.cpu_count() or 1
    cpu, fit, small = cpu_model(jobs), time_model(jobs, cores), small_requests(jobs)
    line_bytes = jobs[0]["size"] / jobs[0]["lines"]
    rate = _rate_bytes(args.rate)
    loads = [j["load"][0] for j in jobs]
    rows = [
        "# Many nodes: time to the first batch on the multi-host bed, and a model of 64 nodes",
        "",
        machine_info(),
        f"Load average (1 min) during the jobs {min(loads):.1f}-{max(loads):.1f}; when this page was written "
        f"{load_note()}.",
        "",
        f"Command: `python benchmarks/bench_multinode.py {' '.join(args.argv)}` (as root). Each job is a cold start "
        f"of `torchrun --nnodes K --nproc-per-node L` on every host of a fresh bed (`tests/multihost/bed.py`: each "
        f"host a network namespace, its link shaped to {args.rate} each way by `tbf`; the store SeaweedFS behind the "
        f"bed's counting proxy, reached through a delay line of {args.store_delay_ms:g} ms each way, so a request's "
        f"round trip gains {2 * args.store_delay_ms:g} ms). A job starts with every host's cache directory empty; "
        "each rank imports torch, joins the gloo group, builds its dataset (`set_epoch(0)`) and takes the first batch "
        f"of {BATCH} of a DataLoader (`num_workers=0`). One run each. The shared directory is this machine's file "
        "system, read through one page cache: it stands for a shared file system of no cost, so the readers of it "
        "cross no link but the collective reader's exchange."
        + (
            f" This page was written again from that run's figures (`--from-json {args.from_json.name}`), by the "
            "script's model as it stands."
            if args.from_json is not None
            else ""
        ),
        "",
        "## In short",
        "",
        *summary(jobs, cpu, fit, small, line_bytes, rate, args),
        "",
        "## Measured, and the fit",
        "",
        "Time to the first batch is from the launch of the torchruns to the last rank's first batch. CPU is every "
        "process's CPU to then (the ranks', the torchrun agents', the store's: SeaweedFS, the proxy, the delay "
        "line). The busiest link is the most bytes one link (a host's or the store's) carried one way. Requests are "
        "the store's (the proxy's count); the mechanism's are those of `traffic()` in the script plus the small "
        "requests a rank makes beside its data (HEADs, the ends' hashes, the format's sniff: "
        + ", ".join(f"{r} {small[r][0]:.1f}" for r in sorted(small) if r.startswith("object-"))
        + " a rank, counted here).",
        "",
    ]
    measured = []
    for j, fitted, terms in zip(jobs, fit["fitted"], fit["terms"]):
        t = traffic(j["reader"], j["hosts"], j["ranks"], j["lines"], j["size"])
        mech = t["gets"] + small[j["reader"]][0] * j["world"]
        measured.append(
            (j["reader"], f"{j['hosts']} x {j['ranks']}", f"{j['lines']:,}", f"{j['first_batch_s']:.1f}",
             f"{fitted:.1f}", *(f"{x:.1f}" for x in (*terms[1:4], j["cpu_total"], max(j["ranks_cpu"]),
             max(j["agents_cpu"]), j["store_cpu"], _busiest_link(j) / 1e6)), j["store_requests"], f"{mech:.0f}",
             f"{j['store_bytes'] / 1e6:.1f}", f"{t['bytes'] / 1e6:.1f}")
        )  # fmt: skip
    rows += md_table(
        ["reader", "hosts x ranks", "N", "first batch (s)", "fitted (s)", "of which CPU / cores", "network",
         "requests", "CPU, all (s)", "slowest rank's CPU (s)", "agent's CPU (s)", "store's CPU (s)",
         "busiest link (MB)", "store requests", "by mechanism", "store MB", "by mechanism"],
        measured,
    )  # fmt: skip
    rows += [
        "",
        f"The fit, over the {len(jobs)} jobs (least squares, coefficients 0 or more; rms {fit['rms']:.1f} s):",
        "",
        f"    T_first = {fit['a']:.2f} s + {fit['b']:.2f} x CPU / {cores} cores + {fit['c']:.2f} x busiest link "
        f"bytes / link rate + {fit['d'] * 1e3:.1f} ms x the busiest rank's requests",
        "",
        f"What the terms say. `b` = {fit['b']:.2f}: a CPU second of the bed's processes cost {fit['b']:.1f} s of wall "
        f"time on {cores} cores, so they had about {cores / max(fit['b'], 1e-9):.2f} cores between them (the rest went "
        f"to the machine's other work: load {min(loads):.0f}-{max(loads):.0f}); that term is most of every job's "
        f"time: the bed's start is CPU contention, not its links. `c` = {fit['c']:.2f}: the busiest link's bytes "
        f"moved at about 1/{max(fit['c'], 1e-9):.0f} of its rate; that link is the store's, whose bytes the bed's "
        "proxy (one Python process on the same loaded cores) passes on, so this is the proxy's pace more than the "
        f"link's. `d` = {fit['d'] * 1e3:.1f} ms: the requests' latency (a round trip of {2 * args.store_delay_ms:g} "
        f"ms each through the delay line, at most {max(_busiest_requests(j) for j in jobs)} of them on one rank, in "
        "turn) is too small beside the CPU's share to be told apart here, so the "
        "prediction takes a request's round trip as its least cost.",
        "",
        "A rank's CPU from its start to its first batch, per reader: `base` to the process group's start (imports, "
        "rendezvous; the median), then `e + N x (p + q / W)`, and `r x N` more on the rank that builds the index "
        "(each build counted by the library's record, logger `rank_dataset.index`; N in millions of lines), fitted on "
        "every rank of every job (two N, so that the part that grows with N is told from the part that does not):",
        "",
    ]
    rows += md_table(
        ["reader", "ranks", "base (s)", "e (s)", "p (s / M lines)", "q (s / M lines, / W)", "r, index (s / M lines)",
         "agent (s)", "rms (s)"],
        [(reader, m["ranks"], *(f"{m[k]:.2f}" for k in ("base", "e")), *(f"{m[k]:.4f}" for k in "pqr"),
          f"{m['agent']:.2f}", f"{m['rms']:.2f}") for reader, m in cpu.items()],
    )  # fmt: skip
    rows += ["", "## Predicted: 64 nodes x 8 ranks, N = 1B lines from a bucket", ""]
    predictions, predicted = {}, []
    for reader in ("object-collective", "object-file"):
        if reader not in cpu:
            continue
        for name, link in ((args.rate, rate), ("100gbit", _rate_bytes("100gbit"))):
            p = predict(cpu, fit, small, reader, line_bytes, link, 2 * args.store_delay_ms / 1000)
            predictions[f"{reader}/{name}"] = p
            predicted.append(
                (reader, name, f"{p['first_batch_s']:,.0f}", *(f"{p[k]:,.1f}" for k in ("cpu_critical_s",
                 "network_s", "requests_sequential_s", "requests_floor_s")), f"{p['requests']:,.0f}",
                 f"{p['store_bytes'] / 1e9:,.0f}", f"{p['requests_per_s_reading']:,.0f}", f"{p['requests_per_s']:,.1f}")
            )  # fmt: skip
    rows += md_table(
        ["reader", "node link", "first batch (s)", "CPU, critical path (s)", "network (s)",
         "requests, the busiest rank's in turn (s)", "S3's floor, 5,500 GETs/s (s)", "requests", "store GB",
         "requests / s while reading", "requests / s over the start"],
        predicted,
    )  # fmt: skip
    rows += [
        "",
        "How: T_first = a + the critical path's CPU + a node link's bytes / its rate + the longer of the busiest "
        f"rank's requests in turn (each the longer of `d` and the bed's round trip, {2 * args.store_delay_ms:g} ms) "
        "and the job's requests at S3's rate; the CPU of the agent and of the slowest rank by the table above at "
        "N = 1B, W = 512; bytes and requests by the readers' mechanisms (`traffic()`), with the small requests a "
        "rank counted on the bed. Requests / s while reading: the job's requests over the longest of the network's, "
        "the requests' and S3's time (5,500 where S3's rate is what paces them).",
        "",
        "Assumptions: lines of the bed's length "
        f"({line_bytes:.1f} bytes: {PREDICT_LINES * line_bytes / 1e9:.0f} GB for 1B); a rank's CPU linear in N and "
        "N / W as fitted (a rank plans and reads only its share, O(N / W), but the file reader of an object receives "
        "the whole object on every rank, O(N)), from two N a factor 4 apart and 500 to 2,000 times smaller than 1B, "
        "so the extrapolation is long; each process on a core of its own (a node has "
        "more cores than its 8 ranks and agent), so the CPU term is the critical path, not the bed's sum over "
        f"{cores} cores; the bed's fixed start `a` (rendezvous, the job's launch) and cost a request `d` the same; "
        "one prefix of S3 at 5,500 GETs a second, no 503s; the object on one prefix; nothing in the page cache; "
        "every node's link free for the job; gloo's mesh of 511 peers a rank (its connections, an all-to-all bound by "
        "the slowest link) costs what the bed's 3 to 7 peers did, which the bed cannot check.",
    ]
    data = {
        "jobs": jobs,
        "cpu_model": cpu,
        "time_model": fit,
        "small_requests": small,
        "predictions": predictions,
        "argv": args.argv,
    }

    def plot(path: Path) -> None:
        plt = plotting()
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
        for reader, marker in zip(READERS, "osD^"):
            mine = [(j, f) for j, f in zip(jobs, fit["fitted"]) if j["reader"] == reader]
            if mine:
                ax.scatter([f for _, f in mine], [j["first_batch_s"] for j, _ in mine], marker=marker, label=reader)
        top = max(max(fit["fitted"]), max(j["first_batch_s"] for j in jobs)) * 1.1
        ax.plot([0, top], [0, top], color="grey", lw=0.8)
        ax.set_xlabel("fitted time to the first batch (s)")
        ax.set_ylabel("measured (s)")
        ax.legend(fontsize=8)
        names = [f"{j['reader']} {j['hosts']}x{j['ranks']} {j['lines'] / 1e6:g}M" for j in jobs]
        left = [0.0] * len(jobs)
        for k, label in enumerate(("fixed", "CPU / cores", "network", "requests")):
            widths = [t[k] for t in fit["terms"]]
            bx.barh(names, widths, left=left, label=label)
            left = [a + b for a, b in zip(left, widths)]
        bx.scatter([j["first_batch_s"] for j in jobs], names, color="black", marker="|", s=80, label="measured")
        bx.invert_yaxis()
        bx.tick_params(axis="y", labelsize=7)
        bx.set_xlabel("time to the first batch, the fit's terms (s)")
        bx.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    save_results(args.out, "multinode", rows, data, plot)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker(*argv[1:5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_size, nargs="+", default=[(2, 2), (4, 2), (8, 1)], help="HOSTSxRANKS")
    parser.add_argument("--lines", type=int, default=2_000_000, help="N of the sizes (default 2M)")
    parser.add_argument("--small-sizes", type=_size, nargs="*", default=[(2, 2)], help="sizes measured at N small")
    parser.add_argument("--small-lines", type=int, default=500_000, help="the second N (default 500k)")
    parser.add_argument("--readers", nargs="+", choices=READERS, default=list(READERS))
    parser.add_argument("--rate", default="1gbit", help="each host link's rate, tc's syntax (default 1gbit)")
    parser.add_argument("--store-delay-ms", type=float, default=10.0, help="the store's delay line, each way")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--from-json", type=Path, help="write the page from a run's multinode.json, measuring nothing")
    parser.add_argument("--links", action="store_true", help="the collective reader's link bytes only (--sizes)")
    args = parser.parse_args(argv)
    args.argv = argv
    _rate_bytes(args.rate)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        args.argv = saved["argv"]
        report(saved["jobs"], args)
        return 0
    from multihost.bed import Unavailable, check_available

    try:
        check_available()
    except Unavailable as exc:
        print(f"bench_multinode: {exc}", file=sys.stderr)
        return 2
    if args.links:
        args.readers, args.small_sizes = ["collective"], []
        link_report(measure(args), args)
        return 0
    report(measure(args), args)
    return 0


def host_links(job: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """Each host of a collective job: ``(host, bytes its link delivered to it, bytes of lines its ranks had to receive
    from other hosts, bytes its ranks received over gloo)``. A rank's far lines are its shard's lines less those it
    copied from its host's ranks (``stats["shared"]``; a permutation's shard repeats no line)."""
    out = []
    for name, (delivered, _) in sorted(job["links"].items()):
        ranks = [r for r in job["rank_results"] if r["host"] == name and r["exchange"]]
        if not ranks:
            continue
        must = sum(r["shard_line_bytes"] - r["exchange"]["shared"] for r in ranks)
        out.append((name, delivered, must, sum(r["exchange"]["received"] for r in ranks)))
    return out


def link_report(jobs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """``multinode_links.md``: each host's link bytes against the lines its ranks had to receive."""
    from _common import load_note, machine_info, save_results

    rows = [
        "# The collective reader across hosts: each host's link against the lines it must receive",
        "",
        machine_info(),
        f"When this page was written {load_note()}.",
        "",
        "Each job is a cold start of the collective reader from the shared directory on a fresh bed (the dataset, "
        "`set_epoch(0)`, a first batch): one count of the lines, one exchange. `delivered`: the bytes the host's veth "
        "delivered to it over the whole job (the rendezvous, gloo's connections and collectives, TCP/IP's headers and "
        "ACKs included); `lines`: the bytes of the lines its ranks' shards hold from other hosts' slices; `gloo`: "
        "what its ranks received over gloo (those lines, the requests other hosts' ranks made of them, the lengths, "
        "the status bytes), as `reader.stats` counts it.",
        "",
        "| job | host | delivered (MB) | lines (MB) | delivered / lines | gloo (MB) | gloo / lines |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for j in jobs:
        for host, delivered, must, gloo in host_links(j):
            rows.append(
                f"| {j['hosts']}x{j['ranks']}, N = {j['lines']:,} | {host} | {delivered / 1e6:.2f} | {must / 1e6:.2f} "
                f"| {delivered / max(must, 1):.3f}x | {gloo / 1e6:.2f} | {gloo / max(must, 1):.3f}x |"
            )
    rows += ["", f"Command: `python benchmarks/bench_multinode.py {' '.join(args.argv)}`", ""]
    save_results(args.out, "multinode_links", rows, {"argv": args.argv, "jobs": jobs}, lambda png: None)


if __name__ == "__main__":
    sys.exit(main())
