"""A design study, not the library's order: what a bucketed stream's window would cost a rank if each epoch's order
were drawn as a bucket arrangement by a keyed split tree, beside a plain StepSampler and today's bucketed layout.

A uniformly random permutation of N samples is equivalently (a) a uniformly random arrangement ``L`` of the
multiset of bucket labels and (b) an independent uniform permutation inside each bucket: position ``i`` holds
bucket ``L[i]``'s member number ``count(L[i] in L[:i])``. With ``L`` drawn by a split tree over the positions (the
count of each bucket in a node's left half drawn from a multivariate hypergeometric keyed by ``(seed, epoch,
node, bucket)``), global batch contents are slices of the per-bucket permutations, and a rank orders its window's
batches (the run ends of every bucket in it) by descending only the nodes that hold two or more run ends.

The prototype (C, compiled here with ``cc``; it is not in the library) draws each node's split bucket after bucket
(``K - 1`` conditional hypergeometric draws) by one of two samplers:

- ``walk``: exact inversion over the pmf's ratio recurrence, from the mode outward until the weights fall below
  ``2**-64`` of the mode's, summed and inverted low to high; IEEE basic operations only (the same on every
  platform: the determinism the library asks for), ``O(sd)`` steps a draw with a large constant;
- ``mode``: inversion outward from the mode with the mode's probability from ``lgamma`` and ``exp``
  (the C library's, so not the same on every platform; a deterministic version needs a log-factorial of basic
  operations, a table and Stirling's series): about one ``sd`` of steps a draw.

Measured per window of rank 0 of W (every window of epochs 0 and 1, CPU time): the ordering of the window's run
ends (the C traversal, called through ctypes), the rank's share of those batches (its block of each run: a keyed
permutation inside the bucket and a gather of the bucket's members, numpy) and their sum, against a plain
``StepLayout``'s positions and samples of a window and today's ``ShapeLayout`` (one pass over N an epoch). Before
measuring, the prototype's run ends are checked against a sample-by-sample walk of the same tree's full
arrangement (small N, both samplers, two epochs, every window), and each sampler's mean and variance at one node
against the hypergeometric's.

Usage:
    python benchmarks/bench_bucket_tree.py                 # N = 10M, B = 16 a rank, W = 8, 8 windows
    python benchmarks/bench_bucket_tree.py --lines 100000 --out /tmp/results
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import barh, load_note, machine_info, ratio, save_results  # noqa: E402
from bench_shapes import coco_like_sizes  # noqa: E402

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#define KMAX 64
#define HALF (1 << 20)
static double weights[2 * HALF + 1];
static int64_t stats[3]; /* split nodes, draws, sampler steps */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double uniform(uint64_t key) { return (double)(mix(key) >> 11) * (1.0 / 9007199254740992.0); }
static double up(int64_t T, int64_t G, int64_t n, int64_t x) { /* P(x + 1) / P(x) */
    return ((double)(G - x) * (double)(n - x)) / ((double)(x + 1) * (double)(T - G - n + x + 1));
}
static double down(int64_t T, int64_t G, int64_t n, int64_t x) { /* P(x - 1) / P(x) */
    return ((double)x * (double)(T - G - n + x)) / ((double)(G - x + 1) * (double)(n - x + 1));
}
static double lf(int64_t x) { return lgamma((double)x + 1.0); }

/* The good count among n drawn of T holding G good: mode 0 the walk, 1 from the mode (see the module). */
int64_t hyper(uint64_t key, int64_t T, int64_t G, int64_t n, int mode) {
    int64_t lo = n - (T - G) > 0 ? n - (T - G) : 0, hi = G < n ? G : n;
    if (lo == hi) return lo;
    stats[1]++;
    int64_t m = (int64_t)(((double)(n + 1) * (double)(G + 1)) / (double)(T + 2));
    if (m < lo) m = lo;
    if (m > hi) m = hi;
    double u = uniform(key);
    if (mode == 0) {
        int64_t a = m, b = m;
        double w = 1.0, s = 0.0, c = 0.0;
        weights[HALF] = 1.0;
        while (b < hi && b - m < HALF) {
            w *= up(T, G, n, b);
            if (w < 5.421010862427522e-20) break;
            weights[HALF + (++b) - m] = w;
            stats[2]++;
        }
        w = 1.0;
        while (a > lo && m - a < HALF) {
            w *= down(T, G, n, a);
            if (w < 5.421010862427522e-20) break;
            weights[HALF + (--a) - m] = w;
            stats[2]++;
        }
        for (int64_t x = a; x <= b; x++) s += weights[HALF + x - m];
        u *= s;
        for (int64_t x = a; x < b; x++) {
            c += weights[HALF + x - m];
            if (u < c) return x;
        }
        return b;
    }
    double pm = exp(lf(G) - lf(m) - lf(G - m) + lf(T - G) - lf(n - m) - lf(T - G - n + m) - lf(T) + lf(n) + lf(T - n));
    if (u < pm) return m;
    u -= pm;
    double pu = pm, pd = pm;
    int64_t a = m, b = m;
    for (;;) {
        stats[2]++;
        if (b < hi) {
            pu *= up(T, G, n, b);
            b++;
            if (u < pu) return b;
            u -= pu;
        }
        if (a > lo) {
            pd *= down(T, G, n, a);
            a--;
            if (u < pd) return a;
            u -= pd;
        }
        if (a <= lo && b >= hi) return m;
    }
}

typedef struct {
    int K, mode;
    int64_t B, x0, x1, cap, found;
    uint64_t key;
    const int64_t *off; /* each bucket's samples of the stream before the epoch, mod B */
    int64_t *out_b, *out_r;
    int32_t *labels; /* expand: the full arrangement */
} walk;

static int64_t ends_of(const walk *w, int b, int64_t c0, int64_t c) {
    return (w->off[b] + c0 + c) / w->B - (w->off[b] + c0) / w->B;
}

static void split(walk *w, int64_t lo, int64_t size, const int64_t *c0, const int64_t *c) {
    if (lo >= w->x1 || lo + size <= w->x0) return;
    int64_t ends = 0;
    int only = -1;
    for (int b = 0; b < w->K; b++) {
        int64_t e = ends_of(w, b, c0[b], c[b]);
        if (e) only = b;
        ends += e;
    }
    if (w->labels && size == 1) {
        for (int b = 0; b < w->K; b++) if (c[b]) w->labels[lo] = b;
        return;
    }
    if (!w->labels) {
        if (ends == 0) return;
        if (ends == 1 && (size == 1 || (lo >= w->x0 && lo + size <= w->x1))) {
            if (w->found < w->cap) {
                w->out_b[w->found] = only;
                w->out_r[w->found] = ((w->off[only] + c0[only]) / w->B + 1) * w->B - 1 - w->off[only];
            }
            w->found++;
            return;
        }
    }
    stats[0]++;
    int64_t mid = size / 2, left[KMAX], right[KMAX], c1[KMAX], rest = size, need = mid;
    uint64_t node = mix(w->key ^ mix((uint64_t)lo * 0x100000001b3ULL ^ (uint64_t)size));
    for (int b = 0; b < w->K; b++) {
        if (b == w->K - 1) left[b] = need;
        else if (need == 0 || c[b] == 0) left[b] = 0;
        else left[b] = hyper(mix(node + (uint64_t)b), rest, c[b], need, w->mode);
        need -= left[b];
        rest -= c[b];
        right[b] = c[b] - left[b];
        c1[b] = c0[b] + left[b];
    }
    split(w, lo, mid, c0, left);
    split(w, lo + mid, size - mid, c1, right);
}

/* The run ends (bucket, its sample number in the epoch) at positions [x0, x1) of the epoch, in position order;
   with labels, the whole arrangement instead. Returns how many (at most cap written). */
int64_t tree(int64_t N, int K, const int64_t *n, const int64_t *off, int64_t B, uint64_t key, int mode,
             int64_t x0, int64_t x1, int64_t *out_b, int64_t *out_r, int64_t cap, int32_t *labels, int64_t *out_stats) {
    int64_t zero[KMAX] = {0};
    walk w = {K, mode, B, x0, x1, cap, 0, key, off, out_b, out_r, labels};
    if (K < 1 || K > KMAX) return -1;
    stats[0] = stats[1] = stats[2] = 0;
    split(&w, 0, N, zero, n);
    for (int i = 0; i < 3; i++) out_stats[i] = stats[i];
    return w.found;
}
"""


def build(tmp: Path) -> Any:
    """The prototype, compiled (ISO C: no contraction of a * b + c) and loaded."""
    src, lib = tmp / "tree.c", tmp / "tree.so"
    src.write_text(SOURCE)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-fPIC", "-shared", "-std=c99", "-o", str(lib), str(src), "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    so.tree.argtypes = [i64, ctypes.c_int, p, p, i64, ctypes.c_uint64, ctypes.c_int, i64, i64, p, p, i64, p, p]
    so.tree.restype = i64
    so.hyper.argtypes = [ctypes.c_uint64, i64, i64, i64, ctypes.c_int]
    so.hyper.restype = i64
    return so


class Tree:
    """One stream's arrangement trees (one an epoch) through the prototype."""

    def __init__(self, so: Any, sizes: np.ndarray, batch: int, seed: int, mode: int) -> None:
        self.so, self.sizes, self.batch, self.seed, self.mode = so, sizes.astype(np.int64), batch, seed, mode
        self.n = int(self.sizes.sum())
        self.stats = np.zeros(3, np.int64)

    def _call(self, epoch: int, x0: int, x1: int, cap: int, labels: np.ndarray | None) -> tuple[Any, ...]:
        off = epoch * self.sizes % self.batch
        out_b, out_r = np.empty(cap, np.int64), np.empty(cap, np.int64)
        key = (self.seed * 1_000_003 + epoch) % (1 << 64)
        found = self.so.tree(
            self.n, self.sizes.size, self.sizes.ctypes.data, off.ctypes.data, self.batch, key, self.mode, x0, x1,
            out_b.ctypes.data, out_r.ctypes.data, cap, None if labels is None else labels.ctypes.data,
            self.stats.ctypes.data,
        )  # fmt: skip
        if found < 0 or found > cap:
            raise RuntimeError(f"prototype: {found} ends, room for {cap}")
        return out_b[:found], out_r[:found]

    def ends(self, epoch: int, x0: int, x1: int) -> tuple[np.ndarray, np.ndarray]:
        """The run ends at positions [x0, x1) of ``epoch``: their buckets and sample numbers (in the epoch)."""
        cap = int(np.sum((x1 - x0) // self.batch + 2) * self.sizes.size) + 16
        b, r = self._call(epoch, x0, x1, cap, None)
        return b, r

    def arrangement(self, epoch: int) -> np.ndarray:
        labels = np.full(self.n, -1, np.int32)
        self._call(epoch, 0, self.n, 1, labels)
        return labels


def reference_ends(labels: np.ndarray, sizes: np.ndarray, batch: int, epoch: int) -> list[tuple[int, int, int]]:
    """(position, bucket, sample number in the epoch) of each run end, by walking the arrangement sample by sample:
    a bucket's stream index counts every epoch, and its run ends where that index + 1 is a multiple of ``batch``."""
    seen = [0] * sizes.size
    out = []
    for i, b in enumerate(labels.tolist()):
        if (epoch * int(sizes[b]) + seen[b] + 1) % batch == 0:
            out.append((i, b, seen[b]))
        seen[b] += 1
    return out


def check(so: Any) -> None:
    """The prototype's window ends equal a sample-by-sample walk of its own tree's arrangement (both samplers, two
    epochs, every window); each sampler's moments at one node equal the hypergeometric's."""
    rng = np.random.default_rng(7)
    for mode in (0, 1):
        for k, n, batch, windows in ((1, 97, 5, 3), (2, 5000, 8, 7), (5, 20000, 16, 8), (40, 20000, 4, 5)):
            sizes = np.bincount(rng.integers(0, k, n), minlength=k)
            sizes = sizes[sizes > 0]
            tree = Tree(so, sizes, batch, 11, mode)
            width = -(-n // windows)
            for epoch in (0, 1):
                labels = tree.arrangement(epoch)
                assert (np.bincount(labels, minlength=sizes.size) == sizes).all(), "the arrangement's counts"
                ref = reference_ends(labels, sizes, batch, epoch)
                for m in range(windows):
                    x0, x1 = min(m * width, n), min((m + 1) * width, n)
                    b, r = tree.ends(epoch, x0, x1)
                    want = [(bb, rr) for i, bb, rr in ref if x0 <= i < x1]
                    assert list(zip(b.tolist(), r.tolist())) == want, (mode, k, n, epoch, m)
        t, g, d, draws = 100_000, 30_000, 40_000, 20_000
        x = np.array([so.hyper(i * 7919 + 1, t, g, d, mode) for i in range(draws)], np.float64)
        mean, var = d * g / t, d * g / t * (t - g) / t * (t - d) / (t - 1)
        assert abs(x.mean() - mean) < 5 * np.sqrt(var / draws), (mode, x.mean(), mean)
        assert abs(x.var() / var - 1) < 0.05, (mode, x.var(), var)


def share(tree: Tree, members: list[np.ndarray], b: np.ndarray, r: np.ndarray, epoch: int, block: int) -> np.ndarray:
    """Rank 0's samples of the runs ending at (b, r), in step order: its block of each run's stream indices, a keyed
    permutation inside the bucket (of the epoch each index falls in) and the bucket's members."""
    from rank_dataset.plan.permutation import permute

    sizes, size = tree.sizes, tree.batch
    k = (epoch * sizes[b] + r + 1) // size - 1  # the run's number in its bucket's stream
    out = np.empty((b.size, block), np.int64)
    for bucket in np.unique(b).tolist():
        rows = np.flatnonzero(b == bucket)
        n_b, key = int(sizes[bucket]), tree.seed * 65_537 + bucket
        j = ((k[rows] * size)[:, None] + np.arange(block)[None, :]).reshape(-1)
        if epoch * n_b <= j[0] and j[-1] < (epoch + 1) * n_b:  # every block in this epoch (no carried run)
            got = members[bucket][permute(n_b, key, epoch, j - epoch * n_b)]
        else:
            ep, at = np.divmod(j, n_b)
            got = np.empty(j.size, np.int64)
            for e in np.unique(ep).tolist():
                where = ep == e
                got[where] = members[bucket][permute(n_b, key, e, at[where])]
        out[rows] = got.reshape(rows.size, block)
    return out.reshape(-1)


def measure(so: Any, buckets: np.ndarray, world: int, size: int, windows: int) -> dict[str, float]:
    """CPU seconds per window of rank 0 (epochs 0 and 1): the prototype's ends (each sampler), the rank's share,
    a plain StepLayout and today's ShapeLayout."""
    from rank_dataset.plan.schedule import BatchSchedule
    from rank_dataset.plan.shapes import ShapeLayout, ShapeStream
    from rank_dataset.plan.steps import StepLayout

    n = buckets.size
    sizes = np.bincount(buckets)
    order = np.argsort(buckets, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    members = [order[bounds[i] : bounds[i + 1]].astype(np.uint32) for i in range(sizes.size)]
    width = -(-n // windows)
    for m in members:  # built once a run (as a layout's tables are): their pages touched before timing
        m.sum()
    out: dict[str, float] = {}
    for name, mode in (("walk", 0), ("mode", 1)):
        tree = Tree(so, sizes, size, 1, mode)
        share(tree, members, *tree.ends(0, 0, width), 0, size // world)  # warm: not timed
        ends_cpu = share_cpu = 0.0
        for epoch in (0, 1):
            for m in range(windows):
                t = time.process_time()
                b, r = tree.ends(epoch, min(m * width, n), min((m + 1) * width, n))
                ends_cpu += time.process_time() - t
                t = time.process_time()
                share(tree, members, b, r, epoch, size // world)
                share_cpu += time.process_time() - t
                out[f"{name}_nodes"] = out.get(f"{name}_nodes", 0) + int(tree.stats[0]) / (2 * windows)
                out[f"{name}_draws"] = out.get(f"{name}_draws", 0) + int(tree.stats[1]) / (2 * windows)
                out[f"{name}_steps"] = out.get(f"{name}_steps", 0) + int(tree.stats[2]) / (2 * windows)
        out[f"{name}_ends"], out["share"] = ends_cpu / (2 * windows), share_cpu / (2 * windows)

    def per_window(layout: Any) -> float:
        t = time.process_time()
        for epoch in (0, 1):
            for m in range(windows):
                layout.indices(layout.positions(n, world, 0, windows, epoch, m), n, 1, epoch)
        return (time.process_time() - t) / (2 * windows)

    out["plain"] = per_window(StepLayout(BatchSchedule.of(size)))
    out["today"] = per_window(ShapeLayout(ShapeStream(n, 1, buckets, batch_size=size)))
    return out


def rows_of(results: dict[str, dict[str, float]], n: int, world: int, size: int, windows: int) -> list[str]:
    rows = [
        f"# A bucketed window by a keyed split tree (design study): N = {n:,}, W = {world}, global batch {size}, "
        f"{windows} windows an epoch",
        "",
        "CPU ms a window of rank 0 (every window of epochs 0 and 1). Ends: ordering the window's run ends by the "
        "prototype's split tree (C); share: rank 0's block of each of those batches (numpy); projected: their sum. "
        "Beside them, in the same run, a plain StepSampler's window and today's bucketed layout (one pass over N "
        "an epoch).",
        "",
        "| buckets | sampler | split nodes | draws | sampler steps | ends ms | share ms | projected ms | vs plain "
        "| plain ms | today's bucketed ms | today vs plain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in results.items():
        for name, what in (("walk", "walk (basic ops)"), ("mode", "from the mode (libm)")):
            total = r[f"{name}_ends"] + r["share"]
            rows.append(
                f"| {label} | {what} | {r[f'{name}_nodes']:,.0f} | {r[f'{name}_draws']:,.0f} | "
                f"{r[f'{name}_steps']:,.0f} | {r[f'{name}_ends'] * 1e3:.2f} | {r['share'] * 1e3:.2f} | "
                f"{total * 1e3:.2f} | {ratio(total, r['plain'])} | {r['plain'] * 1e3:.2f} | {r['today'] * 1e3:.1f} | "
                f"{ratio(r['today'], r['plain'])} |"
            )
    rows += [
        "",
        "What the projection leaves out: building the buckets' member lists (an argsort of N, once a run, as "
        "today's layout builds its keys), the glue of a real layout (its positions would be bucket-grouped "
        "numbers, not draws: a sample's draw is a select in the arrangement, a descent of its own), and for "
        "the sampler from the mode a log-factorial of basic operations in place of the C library's lgamma and "
        "exp (which are not the same on every platform). Both samplers are checked before measuring (run ends "
        "against a sample-by-sample walk of the same tree's arrangement; moments at one node).",
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=16, help="images a rank's batch")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    from rank_dataset import SDXL_RESOLUTIONS, aspect_ratio_groups, nearest_resolution

    n, world, size = args.lines, args.world, args.world * args.batch
    with tempfile.TemporaryDirectory() as tmp:
        so = build(Path(tmp))
        check(so)
        w, h = coco_like_sizes(n)
        kinds = {
            "aspect-ratio groups": aspect_ratio_groups(w, h),
            "aspect-ratio ranges": aspect_ratio_groups(w, h, bounds=[0.6, 0.85, 1.2, 1.6]),
            "SDXL resolutions": nearest_resolution(w, h, SDXL_RESOLUTIONS),
        }
        results = {}
        for label, ids in kinds.items():
            compact = np.unique(ids, return_inverse=True)[1].reshape(-1)
            k = int(compact.max()) + 1
            results[f"{label} ({k})"] = measure(so, compact, world, size, args.windows)
    rows = rows_of(results, n, world, size, args.windows)
    command = f"python benchmarks/bench_bucket_tree.py --lines {n} --batch {args.batch} --world {world}"
    command += f" --windows {args.windows}"
    rows += ["", f"Command: `{command}`. Load average at the end: {load_note()}.", "", machine_info()]

    def plot(path: Path) -> None:
        first = next(iter(results.values()))
        bars = {"plain StepSampler": first["plain"] * 1e3, "today's bucketed": first["today"] * 1e3}
        bars["split tree, walk"] = (first["walk_ends"] + first["share"]) * 1e3
        bars["split tree, from the mode"] = (first["mode_ends"] + first["share"]) * 1e3
        barh(path, bars, "CPU ms a window, rank 0 (aspect-ratio groups)", 2.4)

    save_results(args.out, "bucket_tree", rows, results, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
