"""Every benchmark script runs end to end at a tiny size (smoke tests, not measurements): the fewest lines,
ranks and rounds that still fill every row the table is checked for, since they run in every `make test`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # benchmark smoke runs: not in make test-quick

ROOT = Path(__file__).resolve().parents[2]
# A script's child processes are forks of it (benchmarks/_common.run_python): each runs its code whole, with
# rank_dataset imported afresh under its own environment, without importing torch again. What runs fresh
# interpreters on purpose (torchrun, servers, gloo ranks, the memory bench's loaders) still does.


def smoke_env() -> dict[str, str]:
    """This test's environment (its own index cache) with the scripts' children forked."""
    return {**os.environ, "BENCH_FORK_CHILDREN": "1"}


# script, its arguments at a tiny size, the table it writes, what the table holds, the plot it draws
# (None: none checked) and whether the plot must be non-empty.
CASES = [
    (
        "monitor",
        ["--lines", "2000", "--rounds", "1", "--workers", "1", "--world-size", "2", "--calls", "5", "--work", "10"],
        "monitor.md",
        ["| monitored, every=100 |", "| **the whole a batch**", "gloo's ring all_gather"],
        ("monitor.png", True),
    ),
    (
        "server",
        ["--lines", "3000", "--seconds", "0.2", "--batched-samples", "1024"],
        "server.md",
        ["| whole-shard fetch (W = 1) |"],
        ("server.png", True),
    ),
    (
        "jobstart",
        ["--lines", "3000", "--worlds", "4", "--repeat", "1"],
        "jobstart.md",
        ["| 4 |", "One read of the file counting newlines"],
        ("jobstart.png", True),
    ),
    (
        "server",
        ["--native-compare", "--lines", "3000", "--seconds", "0.2", "--batched-samples", "1024"],
        "server_native.md",
        ["| whole-shard fetch (W = 1) |", "| native speed-up |", "load average"],
        None,
    ),
    (
        "jobstart",
        ["--native-compare", "--lines", "3000", "--worlds", "4", "--repeat", "1"],
        "jobstart_native.md",
        ["| 4 | job start, shared passes (s) |", "| native speed-up |", "load average"],
        None,
    ),
    (
        "build",
        ["--lines", "5000", "--repeat", "1", "--agree-repeat", "2"],
        "build.md",
        [
            "RankDataset, warm index",
            "| set_epoch, with the check |",
            "| shard: lines back to back + one uint32 offset each |",
        ],
        None,
    ),
    (
        "build",
        ["--native-compare", "--lines", "5000", "--repeat", "1"],
        "build_native.md",
        ["| RankDataset, warm index | median |", "| native speed-up |", "Load average"],
        None,
    ),
    (
        "memory",
        ["--sizes", "3000", "--world-size", "1", "--workers", "1", "--start-method", "forkserver"],
        "memory_forkserver.md",
        ["| 3,000 |", "forkserver", "Where RankDataset's figure goes", "| ranks' shards | workers' shards |"],
        ("memory_forkserver.png", False),
    ),
    ("getitem", ["--lines", "3000"], "getitem.md", ['parser="json"', "| MetaFile.read of 256 random indices |"], None),
    (
        "steps",
        ["--lines", "4000", "--epochs", "1", "--global-batch", "256", "--workers", "1"],
        "steps.md",
        ["| step loop |", "| epoch loop |"],
        ("steps.png", True),
    ),
    (
        "audit",
        ["--lines", "3000", "--rounds", "1"],
        "audit.md",
        ["| ds.__getitems__(batch of 256) |"],
        ("audit.png", True),
    ),
    (
        "mix",
        ["--lines", "4000", "--repeat", "1", "--world-size", "4"],
        "mix.md",
        ["| mix of 3 files", "R = 1,000"],
        ("mix.png", True),
    ),
    (
        "scale",
        ["--lines", "5000", "--repeat", "1", "--worlds", "8", "--mini-epochs", "1"],
        "scale.md",
        ["| index, cold (", "| set_epoch, W = 8, M = 1", "| original approach, W = 8 |", "cold (no index cache"],
        ("scale.png", True),
    ),
    (
        "collective",
        ["--lines", "3000", "--worlds", "2"],
        "collective.md",
        ["| 2 |", "read per build, all ranks, collective"],
        ("collective.png", True),
    ),
    (
        "collective",
        ["--native-compare", "--lines", "3000", "--worlds", "2"],
        "collective_native.md",
        ["| 2 | cold start, busiest rank's CPU (s) |", "| native speed-up |", "Load average"],
        None,
    ),
    (
        "collective",
        ["--baseline", str(ROOT / "src"), "--repeat", "1", "--lines", "3000", "--worlds", "2"],
        "collective_local.md",
        ["| 2 | 1 | baseline |", "| 2 | 1 | this |", "Load average"],
        None,
    ),
    (
        "collective",
        ["--phases", "--baseline", str(ROOT / "src"), "--repeat", "1", "--lines", "3000", "--worlds", "2"],
        "collective_phases.md",
        ["| routing (`route_items`) |", "| the busiest rank, all |", "W = 2, baseline, run 1"],
        None,
    ),
    (
        "formats",
        ["--lines", "3000", "--world-size", "1", "--far-worlds", "16", "--items", "200", "--repeat", "1"],
        "formats.md",
        ["| .gz |", "| .zst |", "| .frames.zst |", "| W = 16 |", "zstandard", "median of 1 runs"],
        ("formats.png", True),
    ),
    (
        "formats",
        ["--lines", "3000", "--collective", "2", "--collective-only"],
        "formats_collective.md",
        ["| .gz |", "| .frames.zst |", "read per build, all ranks"],
        ("formats_collective.png", True),
    ),
    (
        "formats",
        ["--native-compare", "--lines", "3000", "--world-size", "1", "--repeat", "1"],
        "formats_native.md",
        ["| .zst | cold index", "| .parquet | warm build, W = 1, median rank |", "| native speed-up |"],
        None,
    ),
    (
        "formats",
        ["--parquet-open", "5000"],
        "formats_parquet_open.md",
        ["| 5,000 |", "`MetaFile(path)`, no index cache"],
        None,
    ),
    (
        "failures",
        ["--lines", "4000", "--rounds", "1", "--workers", "1"],
        "failures.md",
        ['| transform, on_error="replace", no failures |', '| transform, on_error="replace", 1 failure in 1,000 |'],
        ("failures.png", True),
    ),
    (
        "versions",
        [
            *("--old", "HEAD", "--lines", "2000", "--repeat", "1", "--items", "200"),
            *("--formats", "frames.zst", "--data-dir", "{tmp}"),
        ],
        "versions.md",
        ["| frames.zst |", "| build, old (s) |"],
        ("versions.png", True),
    ),
    (
        "kernels",
        ["--lines", "5000", "--rows", "2000", "--repeat", "1"],
        "kernels.md",
        [
            "| row gather, one call (2,000 random rows, back to back) |",
            "| newline scan (the index build's chunk scan) |",
        ],
        ("kernels.png", True),
    ),
    (
        "consumed",
        ["--samples", "200000", "--batch", "512"],
        "consumed.md",
        ["| first consumed() at the state's step |", "| a state's counts 100 steps later |"],
        ("consumed.png", True),
    ),
    (
        "workers",
        ["--lines", "4000", "--passes", "1", "--workers", "1"],
        "workers.md",
        ["| fork |", "| forkserver |"],
        ("workers.png", False),
    ),
]


@pytest.mark.parametrize(
    ("name", "args", "table", "holds", "plot"),
    CASES,
    ids=[c[0] + ("-" + c[2][:-3] if c[2][:-3] != c[0] else "") for c in CASES],
)
def test_bench_smoke(
    tmp_path: Path, name: str, args: list[str], table: str, holds: list[str], plot: tuple[str, bool] | None
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]  # a scratch directory of the test's own
    cmd = [sys.executable, str(ROOT / "benchmarks" / f"bench_{name}.py"), *args, "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / table).read_text()
    for expected in holds:
        assert expected in text, expected
    if plot is not None:
        image, non_empty = plot
        assert (tmp_path / image).exists()
        if non_empty:
            assert (tmp_path / image).stat().st_size > 0


def test_bench_group_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_group.py"), "--lines", "5000"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "group.md").read_text()
    assert "| group_by again (cached, memory-mapped) |" in table and "N = 5,000 lines" in table
    assert not list((tmp_path / "data").iterdir())  # the meta file is removed


def test_bench_balanced_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_balanced.py"), "--lines", "4000", "--repeat", "1"]
    cmd += ["--world-size", "4", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "balanced.md").read_text()
    assert "| balanced mix of 1,000 classes" in table and "R = 1,000" in table
    assert not list((tmp_path / "data").iterdir())  # the meta file is removed


def test_bench_object_smoke(tmp_path: Path) -> None:
    pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_object.py"), "--lines", "3000", "--worlds", "2"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "object.md").read_text()
    assert "| 2 | local file |" in text and "| 2 | object |" in text and "| yes |" in text
    assert (tmp_path / "object.png").exists()


def test_bench_shapes_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_shapes.py"), "--lines", "6000", "--balance-steps", "50"]
    cmd += ["--python-lines", "2000", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "shapes.md").read_text()
    for expected in ("| random batches |", "| 64 |", "| bucketed (aspect-ratio groups) |", "not cached", "detectron2:"):
        assert expected in table, expected
    assert (tmp_path / "shapes.png").stat().st_size > 0
    assert not list((tmp_path / "data").iterdir())  # the meta file is removed


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="the study compiles its prototype with cc")
def test_bench_bucket_tree_smoke(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "bench_bucket_tree.py")
    cmd = [sys.executable, script, "--lines", "20000", "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "bucket_tree.md").read_text()
    for expected in ("| aspect-ratio groups (2) | walk (basic ops) |", "| from the mode (libm) |", "today's bucketed"):
        assert expected in table, expected
    assert (tmp_path / "bucket_tree.png").stat().st_size > 0


def test_bench_shapes_only_sizes_replaces_its_table_alone(tmp_path: Path) -> None:
    kept = "# Batches by shape\n\n## Padding waste\n\nkept\n\n"
    before = kept + "## sizes_of beside one read of the file (old)\n\nold\n\n"
    after = "## Rank 0 of 8 from nothing to its first batch\n\nkept too\n"
    (tmp_path / "shapes.md").write_text(before + after)
    (tmp_path / "shapes.json").write_text('{"waste": {"random batches": 0.5}}')
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_shapes.py"), "--only", "sizes", "--lines", "3000"]
    cmd += ["--python-lines", "1000", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "shapes.md").read_text()
    assert table.startswith(kept) and table.endswith(after)
    assert "\nold\n" not in table and "| sizes_of(meta, 1, 2), not cached |" in table and "--only sizes" in table
    data = json.loads((tmp_path / "shapes.json").read_text())
    assert data["waste"] == {"random batches": 0.5} and data["sizes"]["sizes"]["count"] == 3000
    assert not list((tmp_path / "data").iterdir())


def test_bench_payloads_smoke(tmp_path: Path) -> None:
    pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_payloads.py"), "--payloads", "100", "--window", "0.2"]
    cmd += ["--windows", "1", "--warmup", "0.2", "--workers", "1", "--batch", "16", "--latencies", "0", "10"]
    cmd += ["--min-kib", "4", "--max-kib", "8"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "payloads.md").read_text()
    naive = "| naive loader (one payload per transform call) | 10 ms |"
    for row in ("| Payloads | 0 ms |", "| Payloads | 10 ms |", naive):
        assert row in text, row
    assert "| Payloads, local files (page cache) | local |" in text and "all equal." in text
    assert "litdata's StreamingRawDataset was not measured" in text  # not a dependency: no --litdata-path
    assert (tmp_path / "payloads.png").stat().st_size > 0
    assert not (tmp_path / "data").exists()  # the payloads are removed


def test_bench_multinode_page_from_its_figures(tmp_path: Path) -> None:
    # The bed's run needs root and the machine to itself: here its model and page, from the committed figures.
    figures = ROOT / "benchmarks" / "results" / "multinode.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_multinode.py"), "--from-json", str(figures)]
    out = subprocess.run([*cmd, "--out", str(tmp_path)], env=smoke_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "multinode.md").read_text()
    for expected in ("| object-collective | 8 x 1 | 2,000,000 |", "T_first = ", "| object-file | 100gbit |"):
        assert expected in text, expected
    assert (tmp_path / "multinode.png").stat().st_size > 0
