"""Scale: cold indexing, per-rank builds and set_epoch at N = 10M and 100M lines (1B with --lines).

For each N, in one run and each measurement in a fresh Python process (the file, and its index
cache if any, read just before, so in the page cache; a file larger than half the memory available,
as at N = 1B here, cannot be held there: it is not read before, and every measurement reads it from disk):
- ``read``: one read of the file counting newlines, ``open(p, 'rb').read().count(b'\\n')`` (the
  baseline every ratio is taken against, as in bench_build.py); for a file larger than memory, the
  same count 16 MiB at a time into one reusable buffer;
- ``chunked``: for a file that fits, that chunked count too, beside the read: the whole-file read
  first faults in a buffer the file's size, which on some machines costs more than the copy (a
  fresh page took about 5 µs to fault in on one of ours), so the chunked read is the floor without it;
- ``cold``: ``MetaFile(p)`` with no index cache (the file scanned, the cache written and synced),
  and the cache's size; and a cold build: ``RankDataset`` at the first W, M = 1, with no index cache;
- ``build``: ``RankDataset`` with the index cached, one rank, for W in {8, 64, 512} and M in {1, 4};
  time and peak memory above the process's RSS before the build (exact, VmHWM reset through
  /proc/self/clear_refs), and separately the peaks of its anonymous and its file-backed and shared
  memory (RssAnon; RssFile + RssShmem, where the shard's segment is counted), sampled by this script
  every 2 ms from /proc/<pid>/status while the build runs;
- ``set_epoch``: then ``ds.set_epoch(1)`` in the same process (W = 8, M = 1): time and peak above
  the RSS before it, when the old shard is held;
- a build (or set_epoch) whose shard would not fit in the memory available now is left out, with a
  note in the table;
- ``original``: the original approach at W = 8 (the demo's OriginalDataset: the whole permutation
  in every rank, every line of the file read into Python, its own lines kept as a list), up to
  ``--original-max-lines`` (100M: at 1B it would need about 70 GB of memory).

Files of N lines of about 34 bytes (``train/n<wnid>/<i in hex>_<label>.JPEG <label>``) are written
once under ``--data-dir`` and reused. Results: a markdown table, JSON and a PNG plot of time and
memory against N (bars, for one N).

Usage:
    python benchmarks/bench_scale.py --data-dir /data/bench              # N = 10M and 100M
    python benchmarks/bench_scale.py --data-dir /data/bench --lines 1000000000 --repeat 1 --worlds 8 512 \\
        --mini-epochs 1 --name scale_1b                                  # about 37 GB of file, 8 GB of index
    python benchmarks/bench_scale.py --lines 20000 --repeat 1 --out /tmp/results  # files in a temporary directory
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import cache_env, child_code, machine_info, plotting, save_results  # noqa: E402

MIB = 1 << 20

_READ = """
t = time.perf_counter()
count = open(META, "rb").read().count(b"\\n")
print(json.dumps({"seconds": time.perf_counter() - t, "count": count}))
"""

# The same count for a file larger than memory can hold: 16 MiB at a time into one reusable buffer.
_READ_CHUNKED = """
t = time.perf_counter()
buf, count = bytearray(16 << 20), 0
with open(META, "rb", buffering=0) as f:
    while got := f.readinto(buf):
        count += buf.count(b"\\n", 0, got)
print(json.dumps({"seconds": time.perf_counter() - t, "count": count}))
"""

# A large cache is sealed (synced to disk: what other processes wait for) in a thread of its own
# while its builder goes on: "sealed" is when that is done.
_SEALED = """
def sealed_after(elapsed):
    import threading
    t = time.perf_counter()
    for thread in threading.enumerate():
        if thread.name == "rank-dataset-index-seal":
            thread.join()
    return elapsed + time.perf_counter() - t
"""

_COLD = (
    _SEALED
    + """
from rank_dataset import MetaFile
mf, elapsed, _ = measured(lambda: MetaFile(META), marks=True)
print(json.dumps({"seconds": elapsed, "sealed": sealed_after(elapsed), "count": len(mf)}))
"""
)

_BUILD = """
from rank_dataset import RankDataset
ds, elapsed, peak = measured(
    lambda: RankDataset(META, reload_cfg={"seed": 0, "mini_epoch": MINI}, rank=RANK, world_size=WORLD), marks=True
)
out = {"seconds": elapsed, "peak": peak, "shard": ds.shard.nbytes, "count": len(ds)}
if SET_EPOCH:
    reset_peak(); before = rss()[0]
    t = time.perf_counter()
    ds.set_epoch(1)
    out["set_epoch"] = time.perf_counter() - t
    out["set_epoch_peak"] = rss()[1] - before
print(json.dumps(out))
"""

_COLD_BUILD = (
    _SEALED
    + """
from rank_dataset import RankDataset
ds, elapsed, _ = measured(
    lambda: RankDataset(META, reload_cfg={"seed": 0, "mini_epoch": 1}, rank=RANK, world_size=WORLD), marks=True
)
print(json.dumps({"seconds": elapsed, "sealed": sealed_after(elapsed), "count": len(ds)}))
"""
)

_ORIGINAL = """
from rank_dataset.demo.baselines import OriginalDataset
ds, elapsed, peak = measured(
    lambda: OriginalDataset(META, rank=RANK, world=WORLD, mini_epoch=1, seed=0), marks=True
)
print(json.dumps({"seconds": elapsed, "peak": peak, "count": len(ds)}))
"""

# -- the files ---------------------------------------------------------------------------------------

_ALPHABET = np.frombuffer(b"0123456789abcdef", np.uint8)


def _digits(values: np.ndarray, base: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, width)`` ASCII digits of ``values`` in ``base``, right-aligned, and which of them to keep
    (no leading zeros; one digit for 0)."""
    digits = np.empty((values.size, width), np.uint8)
    rest = values.copy()
    for col in range(width - 1, -1, -1):
        digits[:, col] = _ALPHABET[rest % base]
        rest //= base
    count = np.ones(values.size, np.int64)
    for k in range(1, width):
        count += values >= base**k
    return digits, np.arange(width)[None, :] >= (width - count)[:, None]


def _lines(first: int, count: int, hex_width: int) -> bytes:
    """Lines ``first .. first + count - 1``: ``train/n<wnid>/<i in hex>_<label>.JPEG <label>``."""
    i = np.arange(first, first + count, dtype=np.int64)
    label = (i * 7919) % 1000
    wnid, _ = _digits(1_440_764 + label, 10, 8)
    name, name_keep = _digits(i, 16, hex_width)
    lab, lab_keep = _digits(label, 10, 3)

    def text(s: bytes) -> tuple[np.ndarray, np.ndarray]:
        row = np.frombuffer(s, np.uint8)
        return np.broadcast_to(row, (count, row.size)), np.ones((count, row.size), bool)

    def whole(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return a, np.ones(a.shape, bool)

    parts = [text(b"train/n"), whole(wnid), text(b"/"), (name, name_keep), text(b"_"), (lab, lab_keep)]
    parts += [text(b".JPEG "), (lab, lab_keep), text(b"\n")]
    matrix = np.concatenate([p for p, _ in parts], axis=1)
    keep = np.concatenate([k for _, k in parts], axis=1)
    return matrix[keep].tobytes()


def meta_file(directory: Path, n: int) -> Path:
    """The file of ``n`` lines under ``directory``, written once (through a temporary name)."""
    path = directory / f"scale_{n}.txt"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    hex_width = max(1, ((n - 1).bit_length() + 3) // 4)
    with open(tmp, "wb") as f:
        for lo in range(0, n, 1_000_000):
            f.write(_lines(lo, min(n, lo + 1_000_000) - lo, hex_width))
    tmp.rename(path)
    return path


# -- measuring ---------------------------------------------------------------------------------------


def _status(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed and shared) resident bytes of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    kib = {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile", "RssShmem")}
    return kib["RssAnon"], kib["RssFile"] + kib["RssShmem"]


def warm(*paths: Path) -> None:
    """Read ``paths`` once (16 MiB at a time), so that a measurement finds them in the page cache: a
    machine that pages out cold memory (DAMON reclaim) otherwise has part of a large file on disk,
    and the one read or a build would time the disk, not the work."""
    buf = bytearray(16 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def fits_in_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` of file can stay in the page cache: at most half the memory available now."""
    return nbytes <= psutil.virtual_memory().available // 2


def run(body: str, meta: Path, env: dict[str, str], *, cached: bool = True, **values: Any) -> dict[str, Any]:
    """Run ``body`` in a fresh process, the meta file and its index cache read just before (unless not
    ``cached``: a file larger than memory is read from disk whatever is done before); while it is
    between its "start" and "stop" marks, sample its anonymous and shared memory every 2 ms (peaks
    above their values at "start")."""
    cache = Path(env["RANK_DATASET_CACHE_DIR"])
    if cached:
        warm(meta, *(sorted(cache.glob("*.rdidx")) if cache.is_dir() else []))
    code = child_code(body, META=str(meta), **values)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    state = {"running": False}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line == "start":
                state["running"] = True
            elif line == "stop":
                state["running"] = False
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    base = peak = None
    while reader.is_alive():
        if state["running"]:
            try:
                now = _status(proc.pid)
            except (OSError, KeyError):
                break
            if base is None:
                base = peak = now
            peak = (max(peak[0], now[0]), max(peak[1], now[1]))  # type: ignore[index]
        time.sleep(0.002)
    reader.join()
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{err[-4000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    if base is not None and peak is not None:
        out["anon"], out["shared"] = peak[0] - base[0], peak[1] - base[1]
    return out


_SPARE_DISK = 6 << 30


def _too_big(meta: Path, world: int, mini: int, shards: float) -> str | None:
    """Why a build holding ``shards`` times its shard (about the file's bytes / (W * M)), plus 2 GiB
    to spare, does not fit in the memory available now; None if it fits."""
    need = shards * meta.stat().st_size / (world * mini) + (2 << 30)
    available = psutil.virtual_memory().available
    if need <= available:
        return None
    return f"W = {world}, M = {mini} needs about {need / MIB:,.0f} MiB, {available / MIB:,.0f} MiB available"


def measure(n: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    meta = meta_file(args.data_dir, n)
    cache = Path(env["RANK_DATASET_CACHE_DIR"])
    size = meta.stat().st_size
    free = shutil.disk_usage(args.data_dir).free
    if free < 8 * n + _SPARE_DISK:  # the index cache takes 8 bytes a line; a full disk stops every other user
        raise RuntimeError(
            f"N = {n:,}: its index cache needs {8 * n / MIB:,.0f} MiB and 6 GiB to spare on "
            f"{args.data_dir}, which has {free / MIB:,.0f} MiB free"
        )
    # A file larger than memory cannot be put in the page cache: read it in chunks, and every
    # measurement reads it from disk.
    cached = fits_in_memory(size)
    read = _READ if cached else _READ_CHUNKED
    result: dict[str, Any] = {"lines": n, "bytes": size, "cached": cached, "read": [], "cold": [], "builds": {}}
    builds: dict[str, list[dict[str, Any]]] = {}
    dropped: list[str] = []
    for i in range(args.repeat):
        result["read"].append(run(read, meta, env, cached=cached))
        if cached:
            result.setdefault("chunked", []).append(run(_READ_CHUNKED, meta, env))
        shutil.rmtree(cache, ignore_errors=True)
        result.setdefault("cold_build", []).append(
            run(_COLD_BUILD, meta, env, cached=cached, RANK=1, WORLD=args.worlds[0])
        )
        shutil.rmtree(cache, ignore_errors=True)
        cold = run(_COLD, meta, env, cached=cached)
        cold["index_bytes"] = sum(p.stat().st_size for p in cache.iterdir())
        result["cold"].append(cold)
        for w in args.worlds:
            for m in args.mini_epochs:
                first = w == args.worlds[0] and m == 1
                # A build's peak is about 1.5 shards; set_epoch holds the old shard, the new one and half a shard.
                why = _too_big(meta, w, m, 1.5)
                if why is None and first and (why := _too_big(meta, w, m, 3.0)) is not None:
                    dropped.append(f"set_epoch ({why})")
                    first, why = False, None
                if why is not None:
                    dropped.append(f"build ({why})")
                    continue
                one = run(_BUILD, meta, env, cached=cached, RANK=(i * 7 + 1) % w, WORLD=w, MINI=m, SET_EPOCH=first)
                builds.setdefault(f"{w},{m}", []).append(one)
        result["read"].append(run(read, meta, env, cached=cached))
    result["builds"] = builds
    result["dropped"] = dropped
    if n <= args.original_max_lines:
        result["original"] = [run(_ORIGINAL, meta, env, RANK=1, WORLD=8) for _ in range(args.original_repeat)]
    return result


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


# -- reporting ---------------------------------------------------------------------------------------


_CHUNKED_ROW = "one read counting newlines, 16 MiB at a time (the file exceeds memory)"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = ["# Scale: indexing, per-rank builds and set_epoch against N", ""]
    for res in results:
        n, read = res["lines"], _median(res["read"], "seconds")
        cold, index_bytes = _median(res["cold"], "seconds"), res["cold"][0]["index_bytes"]
        lines += [
            f"## N = {n:,} lines ({res['bytes'] / MIB:,.0f} MiB, {res['bytes'] / n:.1f} bytes a line)",
            "",
            "| what | seconds | vs one read | peak above start (MiB) | anon / shared (MiB, sampled) | shard (MiB) |"
            " peak / shard |",
            "|---|---:|---:|---:|---:|---:|---:|",
            f"| {'one read counting newlines' if res['cached'] else _CHUNKED_ROW} | {read:.2f} | 1.00x | | | | |",
            f"| index, cold ({index_bytes / MIB:,.0f} MiB, {index_bytes / n:.2f} B a line) | {cold:.2f} |"
            f" {cold / read:.2f}x | | | | |",
        ]
        if "chunked" in res:
            chunked = _median(res["chunked"], "seconds")
            lines.insert(
                -1, f"| one read counting newlines, 16 MiB at a time | {chunked:.2f} | {chunked / read:.2f}x | | | | |"
            )
        if "cold_build" in res:
            sec = _median(res["cold_build"], "seconds")
            lines.append(
                f"| build, W = {args.worlds[0]}, M = 1, cold (no index cache: indexing included) | {sec:.2f} |"
                f" {sec / read:.2f}x | | | | |"
            )
        for key, rows in res["builds"].items():
            w, m = key.split(",")
            sec, peak, shard = _median(rows, "seconds"), _median(rows, "peak"), _median(rows, "shard")
            # A build shorter than the sampling period leaves no sample (tiny files): say so, not a KeyError.
            sampled = all("anon" in r for r in rows)
            split = (
                f"{_median(rows, 'anon') / MIB:,.0f} / {_median(rows, 'shared') / MIB:,.0f}" if sampled else "too short"
            )
            lines.append(
                f"| build, W = {w}, M = {m} (warm index) | {sec:.3f} | {sec / read:.2f}x | {peak / MIB:,.0f} |"
                f" {split} | {shard / MIB:,.1f} | {peak / shard:.2f} |"
            )
            if "set_epoch" in rows[0]:
                sec, peak = _median(rows, "set_epoch"), _median(rows, "set_epoch_peak")
                lines.append(
                    f"| set_epoch, W = {w}, M = {m} (peak above the old shard) | {sec:.3f} | {sec / read:.2f}x |"
                    f" {peak / MIB:,.0f} | | {shard / MIB:,.1f} | {peak / shard:.2f} |"
                )
        if "original" in res:
            sec, peak = _median(res["original"], "seconds"), _median(res["original"], "peak")
            lines.append(f"| original approach, W = 8 | {sec:.2f} | {sec / read:.2f}x | {peak / MIB:,.0f} | | | |")
            if f"{args.worlds[0]},1" in res["builds"]:
                ours = _median(res["builds"][f"{args.worlds[0]},1"], "seconds")
                lines += ["", f"Warm build at W = 8 against the original approach: {sec / ours:.1f}x faster."]
        else:
            limit = f"{args.original_max_lines:,}"
            lines += ["", f"The original approach was not run at this N (above --original-max-lines, {limit} lines)."]
        if all("sealed" in r for r in res["cold"] + res.get("cold_build", [])):
            sealed = _median(res["cold"], "sealed")
            lines += [
                "",
                f"The index cache is sealed (synced to disk, what other processes wait for) in the background: "
                f"{sealed:.2f} s ({sealed / read:.2f}x) after a cold index began"
                + (
                    f", {_median(res['cold_build'], 'sealed'):.2f} s after a cold build began."
                    if "cold_build" in res
                    else "."
                ),
            ]
        if "chunked" in res and f"{args.worlds[0]},1" in res["builds"]:
            chunked = _median(res["chunked"], "seconds")
            ours = _median(res["builds"][f"{args.worlds[0]},1"], "seconds")
            cold_build = _median(res["cold_build"], "seconds")
            lines += [
                "",
                f"Against the read 16 MiB at a time ({chunked:.2f} s): index, cold {cold / chunked:.2f}x; build, W ="
                f" {args.worlds[0]}, M = 1 {ours / chunked:.2f}x warm, {cold_build / chunked:.2f}x cold.",
            ]
        if not res["cached"]:
            lines += [
                "",
                f"The file ({res['bytes'] / MIB:,.0f} MiB) exceeds half the memory available, so it cannot be held in"
                " the page cache: nothing was read before a measurement, and every measurement reads the file from disk"
                " (the index cache may be partly in the page cache from the measurement before).",
            ]
        for note in dict.fromkeys(res.get("dropped", [])):
            lines += ["", f"Not measured, as it would not fit in memory: {note}."]
        lines.append("")
    lines += [
        f"Medians of {args.repeat} runs of each measurement ({args.repeat * 2} of the read), each in a fresh process,"
        " the file (and its index cache) read just before, so in the page cache where it fits; the original approach"
        f" run {args.original_repeat} time(s). Peaks above start are exact (VmHWM); anon / shared are peaks sampled"
        " every 2 ms (RssAnon; RssFile + RssShmem, where the shard's shared-memory segment is counted).",
        "",
        f"Command: `python benchmarks/bench_scale.py --lines {' '.join(map(str, args.lines))} --repeat {args.repeat}"
        f" --worlds {' '.join(map(str, args.worlds))} --mini-epochs {' '.join(map(str, args.mini_epochs))}"
        f"{'' if args.name == 'scale' else f' --name {args.name}'}`",
        "",
        machine_info(),
    ]
    return lines


def _plot_one(res: dict[str, Any], args: argparse.Namespace, path: Path) -> None:
    """One N: bars of each measurement's seconds, and of each build's peak beside its shard."""
    plt = plotting()
    seconds = {"one read" if res["cached"] else "one read (16 MiB chunks)": _median(res["read"], "seconds")}
    if "chunked" in res:
        seconds["one read (16 MiB chunks)"] = _median(res["chunked"], "seconds")
    seconds["index, cold"] = _median(res["cold"], "seconds")
    seconds[f"build, W={args.worlds[0]}, cold"] = _median(res["cold_build"], "seconds")
    memory: dict[str, float] = {}
    for key, rows in res["builds"].items():
        w, m = key.split(",")
        seconds[f"build, W={w}, M={m}"] = _median(rows, "seconds")
        memory[f"W={w}, M={m}: peak"] = _median(rows, "peak") / MIB
        memory[f"W={w}, M={m}: shard"] = _median(rows, "shard") / MIB
        if "set_epoch" in rows[0]:
            seconds[f"set_epoch, W={w}, M={m}"] = _median(rows, "set_epoch")
            memory[f"set_epoch, W={w}, M={m}: peak"] = _median(rows, "set_epoch_peak") / MIB
    if "original" in res:
        seconds["original, W=8"] = _median(res["original"], "seconds")
        memory["original, W=8: peak"] = _median(res["original"], "peak") / MIB
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.32 * max(len(seconds), len(memory))))
    for ax, bars, title, unit in ((a, seconds, "time", "seconds"), (b, memory, "peak memory above start", "MiB")):
        drawn = ax.barh(list(bars), list(bars.values()))
        ax.bar_label(drawn, fmt="{:,.1f}", fontsize=7, padding=2)
        ax.set_xscale("log" if ax is b else "linear")  # memory spans a 75 MiB shard to a 5 GiB one
        ax.margins(x=0.15)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.set_title(f"{title}, N = {res['lines']:,}")
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    """Time and memory against N (lines through each N), or bars when there is one N."""
    if len(results) == 1:
        _plot_one(results[0], args, path)
        return
    plt = plotting()
    ns = [r["lines"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.plot(ns, [_median(r["read"], "seconds") for r in results], "k--o", label="one read counting newlines")
    chunked = [r for r in results if "chunked" in r]
    if chunked:
        xs = [r["lines"] for r in chunked]
        a.plot(xs, [_median(r["chunked"], "seconds") for r in chunked], "k:s", label="the same, 16 MiB at a time")
    a.plot(ns, [_median(r["cold"], "seconds") for r in results], "o-", color="C0", label="index, cold")
    for j, w in enumerate(args.worlds):
        key, color = f"{w},1", f"C{j + 1}"
        rows = [r for r in results if key in r["builds"]]  # a build that did not fit is missing
        xs = [r["lines"] for r in rows]
        a.plot(xs, [_median(r["builds"][key], "seconds") for r in rows], "o-", color=color, label=f"build, W={w}")
        b.plot(xs, [_median(r["builds"][key], "peak") / MIB for r in rows], "o-", color=color, label=f"peak, W={w}")
        b.plot(xs, [_median(r["builds"][key], "shard") / MIB for r in rows], ":", color=color, label=f"shard, W={w}")
    with_original = [r for r in results if "original" in r]
    if with_original:
        xs = [r["lines"] for r in with_original]
        a.plot(xs, [_median(r["original"], "seconds") for r in with_original], "rx-", label="original, W=8")
        b.plot(xs, [_median(r["original"], "peak") / MIB for r in with_original], "rx-", label="original, W=8")
    for ax, title, unit in ((a, "time", "seconds"), (b, "peak memory above start", "MiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (lines)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--mini-epochs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the median is kept)")
    parser.add_argument("--original-repeat", type=int, default=1, help="runs of the (slow) original approach")
    parser.add_argument("--original-max-lines", type=int, default=100_000_000, help="largest N to run it at")
    parser.add_argument("--data-dir", type=Path, default=None, help="where files are kept (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="scale", help="results are written to NAME.md, NAME.json, NAME.png")
    args = parser.parse_args(argv)
    if 1 not in args.mini_epochs:
        parser.error("--mini-epochs must include 1")
    temporary = args.data_dir is None
    if temporary:
        args.data_dir = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    cache = args.data_dir / "cache"
    env = cache_env(cache)
    try:
        results = [measure(n, args, env) for n in args.lines]
    finally:
        shutil.rmtree(args.data_dir if temporary else cache, ignore_errors=True)
    save_results(args.out, args.name, table(results, args), results, lambda p: plot(results, args, p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
