"""The native kernels alone beside their numpy reference, in one process, as ratios.

Kernels only: the file is read into memory first (not timed), then each path runs over the same bytes,
alternately, ``--repeat`` times (a kernel that runs on bytes a build has just read, the scan's chunk
or the gather's window, is timed on them copied into one buffer first, as the build reads them); the
fastest run of each is kept (on a shared machine a run that lost
its core to another process says nothing about the code), timed by the calling thread's CPU time (both paths
run in it; ``--clock wall`` for wall time). One read of the file counting newlines (what
``bench_build.py`` calls a scan) is timed too, from the page cache, as the yardstick.

- newline scan: the chunk scan of the index build (``files.index.scan``'s numpy passes, with their reused
  temporaries, against ``rd_scan_lines``) over 4 MiB chunks cut at newlines, as ``scan_map`` cuts them;
- newline count: ``count_nonzero(buf == 10)`` against ``rd_count_byte``, over the same chunks;
- row gather: ``--rows`` random lines of the file (a sampler's order) copied back to back
  (``core.native.copy_rows``' numpy reference against ``rd_copy_rows``, uint32 destinations as a shard's):
  in one call from the whole file, and as a build copies them (file order, a 2 MiB window at a time,
  each row to its random place in item order);
- UTF-8 check of the gathered rows (``files.read._gather.check_utf8``'s decoding against ``rd_utf8_first_invalid``);
- the line checks a build makes of each window's rows (``files.read.lines``' ``bounds_ok``, ``rows_ok`` and
  newline search against ``rd_check_lines``);
- stray bytes of the gathered rows (no newline, not blank: ``rd_lines_bad``);
- the keyed permutation (its numpy rounds, ``core._reference.permute_cells``, against ``rd_permute``) at
  ``--rows`` positions.

Usage:
    python benchmarks/bench_kernels.py                                   # 10M lines, 1.25M rows
    python benchmarks/bench_kernels.py --lines 2000000 --repeat 3 --out /tmp/results
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import barh, machine_info, md_table, save_results, write_imagenet_meta  # noqa: E402
from rank_dataset.core import _reference as ref  # noqa: E402
from rank_dataset.core._native_lib import load  # noqa: E402
from rank_dataset.files.index.scan import CHUNK, chunk_bounds  # noqa: E402
from rank_dataset.files.read.lines import bounds_ok as _bounds_ok  # noqa: E402
from rank_dataset.files.read.lines import rows_ok as _rows_ok  # noqa: E402

# The clock every timing reads: the calling thread's CPU time by default (both paths run in the calling
# thread; on a machine whose cores other processes share, wall time mostly measures the scheduler), or
# wall time (--clock wall).
_CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = _CLOCKS["cpu"]
_CLOCK_NAMES = {"cpu": "the thread's CPU time", "wall": "wall time"}


def _best_pair(numpy_fn: Callable[[], float], native_fn: Callable[[], float], repeat: int) -> tuple[float, float]:
    """The fastest of each, run alternately ``repeat`` times (a first, unkept run each warms up); each
    function returns the seconds it measured."""
    numpy_fn(), native_fn()
    a, b = [], []
    for _ in range(repeat):
        a.append(numpy_fn())
        b.append(native_fn())
    return min(a), min(b)


def _timed(fn: Callable[[], Any]) -> Callable[[], float]:
    """``fn`` timed whole."""

    def run() -> float:
        t = _clock()
        fn()
        return _clock() - t

    return run


def _one_read(path: Path, repeat: int) -> float:
    def read() -> int:
        with open(path, "rb") as f:
            return f.read().count(b"\n")

    read()
    return min(_timed(read)() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--rows", type=int, default=1_250_000, help="rows the gather copies (at most --lines)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--clock", choices=sorted(_CLOCKS), default="cpu", help="the calling thread's CPU time (default) or wall time"
    )
    args = parser.parse_args()
    global _clock
    _clock = _CLOCKS[args.clock]
    kernels = load()  # this benchmark compares both paths: the library must be built
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="rank-dataset-bench-kernels-") as tmp:
        path = write_imagenet_meta(Path(tmp) / "meta.txt", args.lines)
        size = os.path.getsize(path)
        read_s = _one_read(path, args.repeat)
        data = np.fromfile(path, np.uint8)
        with open(path, "rb") as f:
            bounds = chunk_bounds(f, size, CHUNK)
    chunks = [(data[lo:hi], lo, hi == size) for lo, hi in itertools.pairwise(bounds)]
    window = np.empty(max((c.size for c, _, _ in chunks), default=0), np.uint8)

    def over_chunks(scan: Callable[[np.ndarray, int, bool], Any]) -> Callable[[], float]:
        """Each chunk read into one buffer (not timed: a scan reads it so), then scanned (timed)."""

        def run() -> float:
            total = 0.0
            for chunk, lo, last in chunks:
                buf = window[: chunk.size]
                buf[:] = chunk
                t = _clock()
                scan(buf, lo, last)
                total += _clock() - t
            return total

        return run

    assert sum(ref.scan_lines(c, lo, last).starts.size for c, lo, last in chunks) == args.lines
    assert sum(kernels.scan_lines(c, lo, last).starts.size for c, lo, last in chunks) == args.lines
    rows: list[tuple[str, float, float, int, str]] = []  # what, numpy s, native s, items, unit
    scan_np, scan_nat = _best_pair(
        over_chunks(ref.scan_lines),
        over_chunks(kernels.scan_lines),
        args.repeat,
    )
    rows.append(("newline scan (the index build's chunk scan)", scan_np, scan_nat, args.lines, "line"))
    count_np, count_nat = _best_pair(
        over_chunks(lambda b, lo, last: ref.count_byte(b)),
        over_chunks(lambda b, lo, last: kernels.count_byte(b)),
        args.repeat,
    )
    rows.append(("newline count", count_np, count_nat, args.lines, "line"))

    spans = kernels.scan_lines(data, 0, True)
    rng = np.random.default_rng(0)
    n = min(args.rows, args.lines)
    picked = rng.choice(args.lines, n, replace=False)  # a sampler's random order
    starts, lengths = spans.starts[picked], spans.lengths[picked]
    offsets = np.zeros(n + 1, np.uint32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.uint32)
    dst_np, dst_nat = np.empty(int(offsets[-1]), np.uint8), np.empty(int(offsets[-1]), np.uint8)
    gather_np, gather_nat = _best_pair(
        _timed(lambda: ref.copy_rows(data, starts, lengths, dst_np, offsets[:-1])),
        _timed(lambda: kernels.copy_rows(data, starts, lengths, dst_nat, offsets[:-1])),
        args.repeat,
    )
    assert dst_np.tobytes() == dst_nat.tobytes()
    rows.append((f"row gather, one call ({n:,} random rows, back to back)", gather_np, gather_nat, n, "row"))
    # As a build copies them: in file order, a 2 MiB window of the file at a time (read into one buffer,
    # not timed), each row to its place in item order (random).
    order = np.argsort(starts, kind="stable")
    cuts = [0, *(np.flatnonzero(np.diff(starts[order] >> 21)) + 1).tolist(), n]
    batches = [order[a:b] for a, b in itertools.pairwise(cuts)]
    win = np.empty((2 << 20) + int(lengths.max()) + 16, np.uint8)

    spans_of = [(starts[r] - int(starts[r[0]]), lengths[r], offsets[r], int(starts[r[0]])) for r in batches]

    def build(copy: Callable[..., None], dst: np.ndarray) -> Callable[[], float]:
        def run() -> float:
            total = 0.0
            for at, took, to, lo in spans_of:
                win[: int((at + took).max())] = data[lo : lo + int((at + took).max())]
                t = _clock()
                copy(win, at, took, dst, to)
                total += _clock() - t
            return total

        return run

    build_np, build_nat = _best_pair(build(ref.copy_rows, dst_np), build(kernels.copy_rows, dst_nat), args.repeat)
    assert dst_np.tobytes() == dst_nat.tobytes()
    rows.append((f"row gather as a build does ({len(batches):,} windows of 2 MiB)", build_np, build_nat, n, "row"))
    # The checks a build makes of the rows of each window before it copies them: numpy's bounds and blank
    # rows (its newline search, one memchr over the shard after the copy, is left out) against
    # rd_check_lines, which looks for newlines in the rows too.
    framed = []  # (window bytes from the byte before the first row, places, starts, lengths)
    for r in batches:
        s0 = starts[r]
        lo, hi = max(int(s0.min()) - 1, 0), min(int((s0 + lengths[r]).max()) + 2, size)
        framed.append((data[lo:hi], s0 - lo, s0, lengths[r]))

    def numpy_checks() -> float:
        total = 0.0
        for piece, at, s0, took in framed:
            win[: piece.size] = piece
            buf = win[: piece.size + 8]
            t = _clock()
            ok = _bounds_ok(buf, s0 - at, s0, s0 + took, size) and _rows_ok(buf, at, at + took)
            total += _clock() - t
            assert ok
        return total

    def native_checks() -> float:
        total = 0.0
        for piece, at, s0, took in framed:
            win[: piece.size] = piece
            t = _clock()
            bad = kernels.check_lines(win[: piece.size], at, s0, took, size, False)
            total += _clock() - t
            assert bad == -1
        return total

    check_np, check_nat = _best_pair(numpy_checks, native_checks, args.repeat)
    rows.append(("line checks as a build does (bounds, blank; native: newlines too)", check_np, check_nat, n, "row"))
    utf8_np, utf8_nat = _best_pair(
        _timed(lambda: ref.utf8_first_invalid(dst_np, offsets)),
        _timed(lambda: kernels.utf8_first_invalid(dst_nat, offsets)),
        args.repeat,
    )
    rows.append(("UTF-8 check of the rows", utf8_np, utf8_nat, n, "row"))
    row_starts, row_ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    stray_np, stray_nat = _best_pair(
        _timed(lambda: ref.lines_bad(dst_np, row_starts, row_ends)),
        _timed(lambda: kernels.lines_bad(dst_nat, row_starts, row_ends)),
        args.repeat,
    )
    rows.append(("stray bytes of the rows (newline, blank)", stray_np, stray_nat, n, "row"))

    from rank_dataset.plan.permutation import _grid, _round_keys

    grid, keys = _grid(args.lines), [int(k) for k in _round_keys(0, 1)]
    positions = np.arange(n, dtype=np.int64)
    perm_np, perm_nat = _best_pair(
        _timed(lambda: ref.permute_cells(args.lines, *grid, keys, positions)),
        _timed(lambda: kernels.permute_cells(args.lines, *grid, keys, positions)),
        args.repeat,
    )
    rows.append((f"permutation of {n:,} positions (6 Feistel rounds)", perm_np, perm_nat, n, "row"))

    load_after = os.getloadavg()[0]
    mean = size / args.lines
    table = [
        f"# Native kernels beside numpy: N = {args.lines:,} lines ({size / 1e6:,.0f} MB, {mean:.1f} bytes a line)",
        "",
        machine_info(),
        f"Kernels alone, one thread, the file in memory; the fastest of {args.repeat} alternating runs, "
        f"timed by {_CLOCK_NAMES[args.clock]}. Library: `{kernels.path.name}`. One read of the file counting "
        f"newlines (page cache): {read_s:.3f} s. Load average "
        f"(1 min) before and after: {load_before:.1f}, {load_after:.1f} (other processes share the cores).",
        "",
        *md_table(
            ["kernel", "numpy (s)", "native (s)", "numpy (ns/item)", "native (ns/item)", "native speed-up",
             "native / one read"],
            [(what, f"{a:.4f}", f"{b:.4f}", f"{a / items * 1e9:.1f} / {unit}", f"{b / items * 1e9:.1f} / {unit}",
              f"{a / b:.1f}x", f"{b / read_s:.2f}x") for what, a, b, items, unit in rows],
            "lrrrrrr",
        ),
    ]  # fmt: skip
    data_json = {
        "lines": args.lines,
        "bytes": size,
        "rows": n,
        "one_read_s": read_s,
        "clock": args.clock,
        "load_average": [load_before, load_after],
        "kernels": [{"what": w, "numpy_s": a, "native_s": b, "items": i} for w, a, b, i, _ in rows],
    }
    save_results(
        args.out,
        "kernels",
        table,
        data_json,
        lambda p: barh(p, {w: a / b for w, a, b, _, _ in rows}, "native speed-up over numpy (x)", 2.5),
    )


if __name__ == "__main__":
    main()
