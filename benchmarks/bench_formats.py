"""Meta files kept compressed or columnar, read in place: the same N demo lines as text, gzip, zstd and Parquet.

The lines are the demo's (``train/n01440764/n01440764_<i>.JPEG <label>``), written as:
- ``.txt``; ``.gz`` (``gzip -6``, or Python's gzip at level 6 without the command);
- ``.zst``, one frame (level 3, what ``zstd -3`` writes) and ``frames.zst``, frames of 4 MiB of text
  (level 3, as ``split -b 4M --filter='zstd -q -3 -c'`` writes);
- ``.parquet`` (two columns, path and label, written with pyarrow; a row is the line ``path<TAB>label``).

For each (every measurement in a fresh process, one after another):
- ``decompress``: one full decompression by each decoder installed (the median of ``--repeat`` runs),
  the fastest kept as the baseline
  (``.gz``: zlib, indexed_gzip, ``gzip -dc``, ``pigz -dc``; ``.zst``: zstandard, ``zstd -dc``; ``.txt``:
  one read counting newlines; ``.parquet``: pyarrow's ``read_table``);
- ``cold index``: ``MetaFile(path)`` with no index cache (one decompression that also records the
  checkpoints; the median of ``--repeat`` runs, taken in turn with the decoders);
- ``warm build``: ``RankDataset(path, rank=r, world_size=W)`` with the index cached, for each of the W
  ranks in turn; the slowest rank's time is given, and the decompressed bytes of rank 0's build
  against the file's (from the decoder's own count);
- ``ds[i]``: items/s of a built shard, random order (the shard is in memory: no format is read).

Then the share of the file that rank 0's build decompresses at larger W (``--far-worlds``).

With ``--collective W`` (``--collective-only``: that alone), the collective reader on the text, gzip,
zstd and Parquet files: W gloo ranks on this machine, as ``bench_collective.py`` runs them (a cold start with
no index cache, rank 0 making the index of a compressed file; then a set_epoch), beside the file
reader; the bytes every rank read together (``read_chars``) against the file's size on disk. Results
in ``formats_collective.md``.

With ``--parquet-open ROWS``, that alone: a Parquet file of ROWS demo rows (two columns, row groups of
1M rows) opened with no index cache (``MetaFile(path)``: its index from the footer) and with one,
beside pyarrow reading the footer alone. Results in ``formats_parquet_open.md``.

With ``--native-compare``, that alone: the cold index and the warm builds of each file on numpy
(``RANK_DATASET_NATIVE=0``) and on the native kernels (``require``), the paths alternating, beside one full
decompression by the fastest decoder, in the same run. Results in ``formats_native.md``.

Usage:
    python benchmarks/bench_formats.py                     # N = 10M, W = 8
    python benchmarks/bench_formats.py --native-compare    # numpy and native: formats_native.md
    python benchmarks/bench_formats.py --lines 200000 --out /tmp/results
    python benchmarks/bench_formats.py --collective 8 --collective-only
    python benchmarks/bench_formats.py --parquet-open 100000000
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    NATIVE_PATHS,
    cache_env,
    load_note,
    machine_info,
    native_env,
    plotting,
    ratio,
    run_child,
    save_results,
    write_imagenet_meta,
)
from rank_dataset.demo.synthetic import label_of, wnid  # noqa: E402

_FRAME = 4 << 20  # text bytes a frame of frames.zst holds

_READ_TEXT = """
def run():
    fd, count = os.open(META, os.O_RDONLY), 0
    while chunk := os.read(fd, 16 << 20):
        count += chunk.count(b"\\n")
    return count
cpu = time.process_time()
count, elapsed, _ = measured(run)
print(json.dumps({"seconds": elapsed, "cpu": time.process_time() - cpu, "bytes": count}))
"""

_ZLIB = """
import zlib
def run():
    out, fd, d = 0, os.open(META, os.O_RDONLY), zlib.decompressobj(wbits=31)
    while chunk := os.read(fd, 1 << 20):
        while chunk:
            out += len(d.decompress(chunk))
            chunk = d.unused_data
            if d.eof and chunk:
                d = zlib.decompressobj(wbits=31)
    return out
cpu = time.process_time()
size, elapsed, _ = measured(run)
print(json.dumps({"seconds": elapsed, "cpu": time.process_time() - cpu, "bytes": size}))
"""

_INDEXED_GZIP = """
import indexed_gzip
def run():
    out = 0
    with indexed_gzip.IndexedGzipFile(META) as f:
        while chunk := f.read(16 << 20):
            out += len(chunk)
    return out
cpu = time.process_time()
size, elapsed, _ = measured(run)
print(json.dumps({"seconds": elapsed, "cpu": time.process_time() - cpu, "bytes": size}))
"""

_ZSTANDARD = """
import zstandard
def run():
    out = 0
    with open(META, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as r:
        while chunk := r.read(16 << 20):
            out += len(chunk)
    return out
cpu = time.process_time()
size, elapsed, _ = measured(run)
print(json.dumps({"seconds": elapsed, "cpu": time.process_time() - cpu, "bytes": size}))
"""

_PYARROW = """
import pyarrow.parquet as pq
cpu = time.process_time()
table, elapsed, _ = measured(lambda: pq.read_table(META))
print(json.dumps({"seconds": elapsed, "cpu": time.process_time() - cpu, "rows": table.num_rows}))
"""

_COMMAND = """
import resource, subprocess
def run():
    with open(os.devnull, "wb") as null:
        subprocess.run(COMMAND + [META], stdout=null, check=True)
_, elapsed, _ = measured(run)
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": elapsed, "cpu": used.ru_utime + used.ru_stime}))
"""

_COLD = """
from rank_dataset import MetaFile
from rank_dataset.core.native import describe
cpu = time.process_time()
mf, elapsed, peak = measured(lambda: MetaFile(META))
cpu = time.process_time() - cpu
print(json.dumps({"seconds": elapsed, "cpu": cpu, "peak": peak, "count": len(mf), "kernels": describe().split()[0]}))
"""

_FOOTER = """
import pyarrow.parquet as pq
meta, elapsed, _ = measured(lambda: pq.ParquetFile(META).metadata)
print(json.dumps({"seconds": elapsed, "rows": meta.num_rows, "groups": meta.num_row_groups}))
"""

# One rank's warm build; for rank 0, the decompressed bytes too (each SpanSource's own count, summed
# as it closes: the build's spans and what was skipped to reach them).
_BUILD = """
from rank_dataset.files import formats
counted = []
close = formats.SpanSource.close
def counting_close(self):
    counted.append(self.decompressed)
    close(self)
formats.SpanSource.close = counting_close
from rank_dataset import RankDataset
cpu = time.process_time()
ds, elapsed, peak = measured(lambda: RankDataset(META, reload_cfg={"seed": 0}, rank=RANK, world_size=WORLD))
cpu = time.process_time() - cpu
from rank_dataset.core.native import describe
out = {"seconds": elapsed, "cpu": cpu, "peak": peak, "count": len(ds), "decompressed": sum(counted),
       "kernels": describe().split()[0]}
if ITEMS:
    import random, time
    order = random.Random(0).sample(range(len(ds)), min(len(ds), ITEMS))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for i in order:
            ds[i]
        best = min(best, time.perf_counter() - t)
    out["items_per_s"] = len(order) / best
print(json.dumps(out))
"""

# The share of the decompressed file that rank 0 of W decompresses (MetaFile.read of its shard).
_SHARE = """
from rank_dataset.files import formats
counted = []
close = formats.SpanSource.close
def counting_close(self):
    counted.append(self.decompressed)
    close(self)
formats.SpanSource.close = counting_close
from rank_dataset import MetaFile
from rank_dataset.plan.spec import ShardSpec
mf = MetaFile(META)
shares = {}
for w in WORLDS:
    counted.clear()
    mf.read(ShardSpec(len(mf), w, 0, seed=0).indices())
    shares[w] = sum(counted)
print(json.dumps(shares))
"""


def compress(text: Path, name: str, work: Path) -> Path:
    """``text`` written as ``name`` (``gz``, ``zst`` or ``frames.zst``, as the module says) under ``work``."""
    import zstandard

    path = work / {"gz": "meta.txt.gz", "zst": "meta.txt.zst", "frames.zst": "frames.zst"}[name]
    if name == "gz" and shutil.which("gzip"):
        with open(path, "wb") as out:
            subprocess.run(["gzip", "-6", "-c", str(text)], stdout=out, check=True)
    elif name == "gz":
        with open(text, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
    elif name == "zst":
        with open(text, "rb") as src, open(path, "wb") as dst:
            zstandard.ZstdCompressor(level=3).copy_stream(src, dst)
    else:
        compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
        with open(text, "rb") as src, open(path, "wb") as dst:
            while piece := src.read(_FRAME):
                dst.write(compressor.compress(piece))
    return path


def write_files(work: Path, n: int) -> dict[str, Path]:
    """The same ``n`` demo lines in each format (Parquet only where pyarrow is installed)."""
    text = write_imagenet_meta(work / "meta.txt", n)
    files = {"txt": text, **{name: compress(text, name, work) for name in ("gz", "zst", "frames.zst")}}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return files
    paths, labels = [], []
    with open(text) as src:
        for line in src:
            path, label = line.split()
            paths.append(path)
            labels.append(int(label))
    files["parquet"] = work / "meta.parquet"
    pq.write_table(pa.table({"path": paths, "label": labels}), files["parquet"])
    return files


def decoders(name: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The full decompressions to time for the file ``name``: label -> (child body, its names)."""
    if name == "txt":
        return {"read, counting newlines": (_READ_TEXT, {})}
    if name == "parquet":
        return {"pyarrow read_table": (_PYARROW, {})}
    if name == "gz":
        found: dict[str, tuple[str, dict[str, Any]]] = {"zlib": (_ZLIB, {}), "indexed_gzip": (_INDEXED_GZIP, {})}
        for tool in ("gzip", "pigz"):
            if shutil.which(tool):
                found[f"{tool} -dc"] = (_COMMAND, {"COMMAND": [tool, "-dc"]})
        return found
    found = {"zstandard": (_ZSTANDARD, {})}
    if shutil.which("zstd"):
        found["zstd -dc"] = (_COMMAND, {"COMMAND": ["zstd", "-q", "-dc"]})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--far-worlds", type=int, nargs="*", default=[64, 512])
    parser.add_argument("--items", type=int, default=200_000, help="ds[i] calls timed (random i)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each decoder and cold index (the median)")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the files go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--collective", type=int, default=0, metavar="W", help="the collective reader at W ranks too")
    parser.add_argument("--collective-only", action="store_true", help="with --collective: that alone")
    parser.add_argument("--parquet-open", type=int, default=0, metavar="ROWS", help="a Parquet open at ROWS alone")
    parser.add_argument("--native-compare", action="store_true", help="cold index and warm builds, numpy and native")
    args = parser.parse_args(argv)
    n, w = args.lines, args.world_size
    if args.collective_only and not args.collective:
        parser.error("--collective-only needs --collective W")

    if args.parquet_open:
        with tempfile.TemporaryDirectory(prefix="bench_formats_", dir=args.data_dir) as tmp:
            parquet_open(args.parquet_open, Path(tmp), args.out)
        return 0
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_formats_", dir=args.data_dir) as tmp:
        work = Path(tmp)
        files = write_files(work, n)
        if args.native_compare:
            compare_native(files, args, work)
            return 0
        if args.collective:
            collective(files, n, args.collective, work, args.out)
        if args.collective_only:
            return 0
        for name, path in files.items():
            results[name] = {"size": path.stat().st_size}
        for name, path in files.items():
            row = results[name]
            # Each decoder and the cold index run --repeat times, in turn, each in a fresh process
            # (the cold index with a cache of its own; the last one stays for the warm builds): the
            # median of each, as the two cores are shared and one run moves by up to 1.5x.
            times: dict[str, list[float]] = {label: [] for label in decoders(name)}
            colds = []
            for k in range(args.repeat):
                env = cache_env(work / f"cache-{name}-{k}")
                for label, (body, names) in decoders(name).items():
                    times[label].append(run_child(body, env, META=str(path), **names)["seconds"])
                colds.append(run_child(_COLD, env, META=str(path)))
            row["decoders"] = {label: statistics.median(t) for label, t in times.items()}
            row["decoder_runs"] = times
            row["cold"] = {**colds[-1], "seconds": statistics.median(c["seconds"] for c in colds)}
            row["cold_runs"] = [c["seconds"] for c in colds]
            builds = [
                run_child(_BUILD, env, META=str(path), RANK=r, WORLD=w, ITEMS=args.items if r == 0 else 0)
                for r in range(w)
            ]
            row["warm"] = statistics.median(b["seconds"] for b in builds)
            row["warm_slowest"] = max(b["seconds"] for b in builds)
            row["warm_ranks"] = [b["seconds"] for b in builds]
            row["decompressed_rank0"] = builds[0]["decompressed"]
            row["items_per_s"] = builds[0]["items_per_s"]
            row["count"] = builds[0]["count"]
            if name != "txt" and name != "parquet":
                shares = run_child(_SHARE, env, META=str(path), WORLDS=[w, *args.far_worlds])
                row["shares"] = {int(k): v for k, v in shares.items()}
    text_size = results["txt"]["size"]
    for row in results.values():
        if row.get("decoders"):
            row["fastest"] = min(row["decoders"].values())
    rows = _table(results, n, w, args.far_worlds, text_size, args.repeat)
    save_results(args.out, "formats", rows, results, lambda path: _plot(results, w, path))
    return 0


def compare_native(files: dict[str, Path], args: argparse.Namespace, work: Path) -> None:
    """The cold index and the warm builds of each file on numpy and on the native kernels, the paths
    alternating, beside one full decompression by the fastest decoder (formats_native.md)."""
    n, w, load_before = args.lines, args.world_size, load_note()
    want = {"0": "numpy", "require": "native"}
    found: dict[str, dict[str, Any]] = {}
    for name, path in files.items():
        decoded: dict[str, list[float]] = {label: [] for label in decoders(name)}
        decoded_cpu: dict[str, list[float]] = {label: [] for label in decoders(name)}
        runs: dict[str, list[float]] = {}
        for k in range(args.repeat):
            for label, (body, names) in decoders(name).items():
                one = run_child(body, cache_env(work / "no-cache"), META=str(path), **names)
                decoded[label].append(one["seconds"])
                decoded_cpu[label].append(one["cpu"])
            for mode in NATIVE_PATHS if k % 2 == 0 else NATIVE_PATHS[::-1]:
                env = native_env(cache_env(work / f"cache-native-{name}-{mode}-{k}"), mode)
                cold = run_child(_COLD, env, META=str(path))
                builds = [run_child(_BUILD, env, META=str(path), RANK=r, WORLD=w, ITEMS=0) for r in range(w)]
                if {cold["kernels"], *(b["kernels"] for b in builds)} != {want[mode]}:
                    raise RuntimeError(f"RANK_DATASET_NATIVE={mode} ran on {cold['kernels']}")
                runs.setdefault(f"cold {mode}", []).append(cold["seconds"])
                runs.setdefault(f"warm {mode}", []).append(statistics.median(b["seconds"] for b in builds))
                runs.setdefault(f"slowest {mode}", []).append(max(b["seconds"] for b in builds))
                runs.setdefault(f"cold_cpu {mode}", []).append(cold["cpu"])
                runs.setdefault(f"warm_cpu {mode}", []).append(statistics.median(b["cpu"] for b in builds))
                runs.setdefault(f"all_cpu {mode}", []).append(sum(b["cpu"] for b in builds))
        fastest = {label: statistics.median(t) for label, t in decoded.items()}
        best = min(fastest, key=fastest.__getitem__)
        found[name] = {
            "decoder": best,
            "decompression": fastest[best],
            "decompression_cpu": statistics.median(decoded_cpu[best]),
            "runs": runs,
            **{k: statistics.median(v) for k, v in runs.items()},
        }
        print(name, found[name], flush=True)
    rows = [
        f"# Meta files read in place on numpy and on the native kernels: {n:,} demo lines, W = {w}",
        "",
        "| file | figure | numpy (s) | native (s) | native speed-up | numpy / one decompression "
        "| native / one decompression |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, f in found.items():
        rows.append(f"| .{name} | one full decompression ({f['decoder']}) | {f['decompression']:.2f} | | | 1.00x | |")
        for key, label in (
            ("cold", "cold index (`MetaFile(path)`, no cache)"),
            ("warm", f"warm build, W = {w}, median rank"),
            ("slowest", f"warm build, W = {w}, slowest rank"),
        ):
            a, b, d = f[f"{key} 0"], f[f"{key} require"], f["decompression"]
            rows.append(f"| .{name} | {label} | {a:.2f} | {b:.2f} | {ratio(a, b)} | {ratio(a, d)} | {ratio(b, d)} |")
        d = f["decompression_cpu"]
        rows.append(f"| .{name} | one full decompression, CPU | {d:.2f} | | | 1.00x | |")
        for key, label in (
            ("cold_cpu", "cold index, CPU"),
            ("warm_cpu", f"warm build, W = {w}, median rank, CPU"),
            ("all_cpu", f"warm builds, W = {w}, all ranks' CPU together"),
        ):
            a, b = f[f"{key} 0"], f[f"{key} require"]
            rows.append(f"| .{name} | {label} | {a:.2f} | {b:.2f} | {ratio(a, b)} | {ratio(a, d)} | {ratio(b, d)} |")
    rows += [
        "",
        "As the default run measures them (its notes apply), each in a fresh process, the files in the page cache:",
        "the cold index and the W warm builds on numpy (`RANK_DATASET_NATIVE=0`) and on the native kernels",
        "(`require`), the paths alternating, each with an index cache of its own; decoders, cold index and builds:",
        f"the median of {args.repeat} runs. .txt's decompression is one read counting newlines. CPU: the",
        "process's (every thread's; a command's: its own) over the same call, beside the fastest decoder's. Load",
        f"average (1, 5, 15 min) before: {load_before}; after: {load_note()} (other processes share the cores).",
        "",
        f"Command: `python benchmarks/bench_formats.py --native-compare --lines {n} --world-size {w} "
        f"--repeat {args.repeat}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "formats_native", rows, {"lines": n, "world": w, "files": found}, lambda png: None)


def write_parquet(path: Path, rows: int, group: int = 1 << 20) -> Path:
    """A Parquet file of the demo's ``rows`` (path, label), a row group per ``group`` rows, written a
    group at a time (the rows of a whole file would not fit in memory as Python objects)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wnids = pa.array([wnid(k) for k in range(1000)])
    schema = pa.schema([("path", pa.string()), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for lo in range(0, rows, group):
            i = np.arange(lo, min(rows, lo + group), dtype=np.int64)
            label = label_of(i)
            names = wnids.take(pa.array(label))
            name = pc.cast(pa.array(i), pa.string())
            line = pc.binary_join_element_wise("train/", names, "/", names, "_", name, ".JPEG", "")
            writer.write_table(pa.table({"path": line, "label": pa.array(label)}, schema=schema), row_group_size=group)
    return path


def parquet_open(rows: int, work: Path, out: Path) -> None:
    """Open a Parquet file of ``rows`` rows cold and warm beside pyarrow's footer read (formats_parquet_open)."""
    path = write_parquet(work / "meta.parquet", rows)
    env = cache_env(work / "cache")
    footer = run_child(_FOOTER, env, META=str(path))
    cold = run_child(_COLD, env, META=str(path))
    warm = run_child(_COLD, env, META=str(path))
    if not cold["count"] == warm["count"] == rows:
        raise RuntimeError(f"MetaFile counted {cold['count']:,} and {warm['count']:,} rows, not {rows:,}")
    size = path.stat().st_size
    data = {"rows": rows, "size": size, "groups": footer["groups"], "footer": footer, "cold": cold, "warm": warm}
    table = [
        f"# A Parquet meta file of {rows:,} rows opened in place",
        "",
        "| rows | size on disk | row groups | pyarrow footer read (s) | `MetaFile(path)`, no index cache (s) "
        "| `MetaFile(path)`, index cached (s) | cold / footer |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {rows:,} | {size / 2**20:,.1f} MiB | {footer['groups']:,} | {footer['seconds']:.3f} | "
        f"{cold['seconds']:.3f} | {warm['seconds']:.3f} | {cold['seconds'] / footer['seconds']:.1f}x |",
        "",
        "Each in a fresh process, the file in the page cache; two columns (the demo's path and label), a row "
        "group per 1,048,576 rows. The index of a Parquet file comes from its footer (the row groups' row "
        "counts, its schema); no row is read. A cold file system would add the footer's read (a few "
        "hundred KiB at the file's end).",
        "",
        f"Command: `python benchmarks/bench_formats.py --parquet-open {rows}`",
        "",
        machine_info(),
    ]
    save_results(out, "formats_parquet_open", table, data, lambda png: None)


def collective(files: dict[str, Path], n: int, w: int, work: Path, out: Path) -> None:
    """The collective reader beside the file reader at ``w`` ranks on each text file (formats_collective)."""
    from bench_collective import plot_readers, run_world, summary

    found: dict[str, dict[str, float]] = {}
    for name in [k for k in ("txt", "gz", "zst", "frames.zst", "parquet") if k in files]:
        path = files[name]
        cache = work / f"cache-collective-{name}"
        cache.mkdir()
        found[name] = {**summary(run_world(path, w, cache), path.stat().st_size), "size": path.stat().st_size}
        shutil.rmtree(cache)
        print(name, found[name], flush=True)
    rows = [
        f"# The collective reader on compressed meta files: {n:,} demo lines, W = {w}",
        "",
        "| file | size on disk | read per build, all ranks (x the file) | first build, with rank 0's index "
        "| read per build, file reader | set_epoch, collective (s) | set_epoch, file (s) | collective / file "
        "| cold start, collective (s) | cold start, file (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in found.items():
        rows.append(
            f"| .{name} | {s['size'] / 2**20:,.1f} MiB | {s['collective_read_x']:.3f}x | "
            f"{s['collective_cold_read_x']:.2f}x | {s['file_read_x']:.2f}x | {s['collective_epoch']:.2f} | "
            f"{s['file_epoch']:.2f} | {s['collective_epoch'] / s['file_epoch']:.2f}x | {s['collective_cold']:.2f} | "
            f"{s['file_cold']:.2f} |"
        )
    rows += [
        "",
        f"{w} gloo ranks on this machine, run as `bench_collective.py` runs them (its notes apply: times are the "
        "slowest rank's, every rank shares 2 cores). Read: `read_chars` of every rank together against the file's "
        "size on disk (compressed bytes, for a compressed file). A compressed file's slices start at its "
        "checkpoints (every 4 MiB of text: gzip's from its index, zstd's frame starts), so each rank "
        "decompresses its own slice; a file of one zstd frame has one checkpoint, and one rank decompresses "
        "all of it for every build. The first build: rank 0 makes the index of a compressed file (one "
        "decompression) while the others wait, then every rank counts its slice's lines and serves the "
        "exchange. The file reader's ranks each decompress the spans that hold their lines.",
        "",
        f"Command: `python benchmarks/bench_formats.py --lines {n} --collective {w} --collective-only`",
        "",
        machine_info(),
    ]

    def plot(png: Path) -> None:
        names = list(found)
        collective = [found[k]["collective_read_x"] for k in names]
        file = [found[k]["file_read_x"] for k in names]
        ylabel = f"bytes read per build, {w} ranks / file size"
        plot_readers(png, [f".{k}" for k in names], collective, file, ylabel, line=1.0)

    save_results(out, "formats_collective", rows, {"lines": n, "world": w, "files": found}, plot)


def _table(
    results: dict[str, dict[str, Any]], n: int, w: int, far: list[int], text_size: int, repeat: int
) -> list[str]:
    txt = results["txt"]
    rows = [
        f"# Meta files read in place: {n:,} demo lines in each format",
        "",
        f"| file | size on disk | vs .txt | one full decompression (fastest decoder) | cold index | "
        f"vs decompression | vs .txt | warm build, W = {w} (median rank; slowest) | vs decompression | vs .txt "
        "| decompressed by rank 0 | ds[i] items/s | vs .txt |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in results.items():
        size = f"{row['size'] / 2**20:,.1f} MiB | {row['size'] / text_size:.3f}"
        best = min(row["decoders"], key=row["decoders"].get)
        fastest = row["fastest"]
        share = "" if name in ("txt", "parquet") else f"{row['decompressed_rank0'] / text_size:.2f}x the text"
        cold = row["cold"]["seconds"]
        rows.append(
            f"| .{name} | {size} | {fastest:.2f} s ({best}) | {cold:.2f} s | {cold / fastest:.2f}x | "
            f"{cold / txt['cold']['seconds']:.2f}x | {row['warm']:.2f} s; {row['warm_slowest']:.2f} s | "
            f"{row['warm'] / fastest:.2f}x | {row['warm'] / txt['warm']:.2f}x | {share} | "
            f"{row['items_per_s']:,.0f} | {row['items_per_s'] / txt['items_per_s']:.2f} |"
        )
    rows += ["", "Every decoder timed, one full decompression each (s):", ""]
    for name, row in results.items():
        if row.get("decoders"):
            listed = ", ".join(f"{label} {s:.2f}" for label, s in sorted(row["decoders"].items(), key=lambda x: x[1]))
            rows.append(f"- .{name}: {listed}")
    rows += [
        "",
        "Decompressed bytes of rank 0's shard read by the file reader, against the file's decompressed size, "
        "as W grows (every rank draws its lines from all over the file, so it needs nearly every span "
        "between checkpoints):",
        "",
        "| file | " + " | ".join(f"W = {x}" for x in [w, *far]) + " |",
        "|---|" + "---:|" * (1 + len(far)),
    ]
    for name, row in results.items():
        if "shares" in row:
            rows.append(f"| .{name} | " + " | ".join(f"{row['shares'][x] / text_size:.2f}x" for x in [w, *far]) + " |")
    rows += [
        "",
        "Each measurement in a fresh process, one after another, the files in the page cache. Decoders "
        f"and cold index: the median of {repeat} runs each, taken in turn. Cold index: "
        "`MetaFile(path)` with no cache (one decompression, checked, recording checkpoints every 4 MiB of "
        f"text). Warm build: `RankDataset(path, rank=r, world_size={w})` with the index cached, ranks in "
        "turn; the median rank (the ratios) and the slowest. ds[i]: best of 3 passes over random items of "
        "rank 0's shard. .gz: `gzip -6`; "
        ".zst: one frame at level 3; .frames.zst: a frame per 4 MiB of text, level 3.",
        "",
        f"Command: `python benchmarks/bench_formats.py --lines {n} --world-size {w} --repeat {repeat}`",
        "",
        machine_info(),
    ]
    return rows


def _plot(results: dict[str, dict[str, Any]], w: int, path: Path) -> None:
    plt = plotting()
    names = [k for k, row in results.items() if k != "txt"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    y = list(range(len(names)))
    cold = [results[k]["cold"]["seconds"] / results[k]["fastest"] for k in names]
    warm = [results[k]["warm"] / results[k]["fastest"] for k in names]
    ax.barh([v - 0.2 for v in y], cold, height=0.4, label="cold index")
    ax.barh([v + 0.2 for v in y], warm, height=0.4, label=f"warm build, W = {w} (median rank)")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(y, [f".{k}" for k in names])
    ax.invert_yaxis()
    ax.set_xlabel("time / one full decompression by the fastest decoder")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
