"""Stress the exit of a collective-reader job: many short gloo jobs, each rank a fresh interpreter that
builds a shard with ``reader="collective"`` and exits, counting the ranks that die at exit.

Each run starts ``--ranks`` interpreters (as torchrun does: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), each of which runs: ``init_process_group("gloo")``, ``RankDataset(meta,
reader="collective")``, ``set_epoch(0)``, ``ds[-1]``, ``barrier()``, ``destroy_process_group()``, and exits
through the interpreter's own finalization (the exit where a C++ abort, ``terminate called without an active
exception``, was once seen). A run fails if any rank's exit status is not 0.

``--mechanism N`` also runs N two-rank jobs of torch alone that leave one gloo collective's tensor to be
freed by gloo's worker thread while the interpreter finalizes (the work dropped, its peer sending a moment
after the exit began): the abort the collective reader now prevents, shown to be real on this machine.

Usage: python benchmarks/stress_exit.py [--ranks 4] [--runs 300] [--lines 100000] [--mechanism 20]
writes benchmarks/results/stress_exit.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ABORT = "terminate called without an active exception"


def _rank_main(meta: str) -> None:
    import torch.distributed as dist

    from rank_dataset import RankDataset

    dist.init_process_group("gloo")
    ds = RankDataset(meta, reader="collective")
    ds.set_epoch(0)
    ds[-1]
    dist.barrier()
    dist.destroy_process_group()


def _mechanism_main(flag: str, delay: float) -> None:
    """torch alone: rank 0 drops an async all_to_all whose peer sends only once rank 0 has begun to exit."""
    import atexit

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = torch.empty(4, dtype=torch.int64)
    if dist.get_rank() == 0:
        dist.all_to_all_single(out, torch.arange(4), async_op=True)  # the work and its tensor dropped here
        atexit.register(lambda: Path(flag).touch())  # the interpreter is exiting: the peer may send
    else:
        while not os.path.exists(flag):
            time.sleep(0.001)
        time.sleep(delay)
        dist.all_to_all_single(out, torch.arange(4))
        time.sleep(1)
        os._exit(0)  # this rank's own exit is not the one observed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(argv: list[str], ranks: int, timeout: float) -> list[tuple[int, str]]:
    """Start ``ranks`` interpreters running ``argv``; each one's exit status and standard error."""
    port = _free_port()
    procs = []
    for rank in range(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    got = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            err += "\n(timed out)"
        got.append((p.returncode, err))
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--mechanism", type=int, default=20, help="two-rank torch-only runs showing the abort")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--minutes", type=float, default=None, help="start no run after this long (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rank-main", help=argparse.SUPPRESS)
    parser.add_argument("--mechanism-main", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        _rank_main(args.rank_main)
        return
    if args.mechanism_main:
        _mechanism_main(args.mechanism_main[0], float(args.mechanism_main[1]))
        return

    me = [sys.executable, os.path.abspath(__file__)]
    failed: list[dict[str, object]] = []
    mechanism = {"runs": 0, "aborted": 0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rank-dataset-stress-") as d:
        meta = os.path.join(d, "meta.txt")
        with open(meta, "w") as f:
            f.writelines(f"train/class_{i % 1000}/img_{i}.JPEG {i % 1000}\n" for i in range(args.lines))
        done = 0
        for run in range(args.runs):
            if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                break
            done += 1
            statuses = _job([*me, "--rank-main", meta], args.ranks, args.timeout)
            for rank, (code, err) in enumerate(statuses):
                if code != 0:
                    failed.append({"run": run, "rank": rank, "status": code, "abort": ABORT in err, "tail": err[-400:]})
            if (run + 1) % 25 == 0:
                print(f"{run + 1}/{args.runs} runs, {len(failed)} ranks failed", flush=True)
        for run in range(args.mechanism):
            flag = os.path.join(d, f"flag{run}")
            delay = 0.002 * (run % 3)  # the peer sends 0, 2 or 4 ms after rank 0's exit began
            statuses = _job([*me, "--mechanism-main", flag, str(delay)], 2, args.timeout)
            mechanism["runs"] += 1
            mechanism["aborted"] += int(statuses[0][0] != 0 and ABORT in statuses[0][1])
    seconds = time.monotonic() - started
    asked, args.runs = args.runs, done
    budget = "" if args.minutes is None else f" --minutes {args.minutes:g}"
    result = {
        "ranks": args.ranks,
        "runs": done,
        "lines": args.lines,
        "rank_exits": args.ranks * args.runs,
        "failed": failed,
        "aborts": sum(bool(f["abort"]) for f in failed),
        "mechanism": mechanism,
        "seconds": round(seconds, 1),
        "load_average": os.getloadavg(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stress_exit.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = [
        "| runs | ranks a run | rank exits | ranks failed | of them aborted (`terminate called ...`) |",
        "|---|---|---|---|---|",
        f"| {args.runs} | {args.ranks} | {args.ranks * args.runs} | {len(failed)} | {result['aborts']} |",
    ]
    text = "\n".join(
        [
            "# Exits of collective-reader jobs",
            "",
            f"Each run: {args.ranks} fresh interpreters (gloo) build a shard of a {args.lines:,}-line file with "
            '`reader="collective"`, then `set_epoch(0)`, `ds[-1]`, `barrier()`, `destroy_process_group()`, and exit '
            "through the interpreter's finalization. `nice python benchmarks/stress_exit.py "
            f"--ranks {args.ranks} --runs {asked} --lines {args.lines} --mechanism {args.mechanism}{budget}`: "
            f"{done} runs in the time given, {seconds / 60:.0f} min in all, load average "
            f"{os.getloadavg()[0]:.1f} at the end.",
            "",
            *rows,
            "",
            "The mechanism, with torch alone: a gloo collective's tensor (made in Python) freed by gloo's worker "
            "thread while the interpreter finalizes (its work dropped, the peer sending 0-4 ms after the exit "
            f"began) aborted the process in {mechanism['aborted']} of {mechanism['runs']} runs, with "
            f"`{ABORT}`. The collective reader returns from each collective only once gloo's thread has let go of "
            "its tensors (`rank_dataset.core.threads.wait_released`), so none is left to it.",
            "",
        ]
    )
    (args.out / "stress_exit.md").write_text(text)
    print(text)
    print(json.dumps({k: v for k, v in result.items() if k != "failed"}))


if __name__ == "__main__":
    main()
