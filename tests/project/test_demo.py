"""The demo end to end at a small size: real ranks under torch.distributed (gloo)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rank_dataset.demo import DemoResult, format_table

pytestmark = pytest.mark.slow  # demo runs: not in make test-quick

SMALL = ["--lines", "20000", "--world-size", "2", "--workers", "1", "--epochs", "1"]
MIB = 1 << 20
# A memory cell: a figure above the baseline's noise (never negative), or the noise it is below.
MEMORY_CELL = re.compile(r"^\| (\w+) \| (\d[\d,]*\.\d|below noise \(±\d[\d,]*\.\d MiB\)) \| ([^|]+) \|$", re.M)


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rank_dataset", "demo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_small_demo_checks_coverage_and_compares_memory() -> None:
    out = demo(*SMALL)
    assert out.returncode == 0, out.stderr
    assert "coverage (rank_dataset): OK - epoch 0: 20000 samples read, 20000 of 20000 distinct" in out.stdout
    assert "coverage (naive): OK" in out.stdout
    assert out.stdout.count("| rank_dataset | ") == 3  # two ranks, and the memory row
    cells = {m.group(1): m.group(3).strip() for m in MEMORY_CELL.finditer(out.stdout)}
    assert list(cells) == ["rank_dataset", "naive"]
    # A ratio, or none where the naive list of 20,000 lines is within the baseline's noise.
    assert re.fullmatch(r"(at least )?\d[\d,]*\.\dx less|-", cells["rank_dataset"]), out.stdout
    # Each step says it started, on stderr (stdout stays the report): minutes of silence look like a hang.
    steps = [line for line in out.stderr.splitlines() if line.startswith("  ") and line.endswith(" ...")]
    assert [s.split()[0] for s in steps] == ["writing", "2", "2"], out.stderr
    assert "20,000 lines" in steps[0] and "RankDataset" in steps[1] and "naive" in steps[2]


def test_demo_through_a_server(write_meta) -> None:
    meta = write_meta(n=3001)
    out = demo(
        "--meta-file", str(meta), "--world-size", "3", "--workers", "1", "--epochs", "1", "--server", "--no-baseline"
    )
    assert out.returncode == 0, out.stderr
    assert "coverage (server): OK - epoch 0: 3006 samples read, 3001 of 3001 distinct" in out.stdout
    assert "| naive |" not in out.stdout
    assert "  starting a meta server on a loopback port (it indexes the files) ...\n" in out.stderr
    # A few KiB of metas: the figure is a positive number above the noise, or says it is below it.
    assert [m.group(1) for m in MEMORY_CELL.finditer(out.stdout)] == ["server"]


def test_a_failing_rank_is_named_and_stops_the_job() -> None:
    out = demo(*SMALL, env={"RANK_DATASET_DEMO_FAIL_RANK": "1"})
    assert out.returncode == 1
    assert "rank 1 failed (rank_dataset loader): RuntimeError: failing on purpose" in out.stderr


def test_bad_arguments(tmp_path: Path) -> None:
    out = demo("--meta-file", str(tmp_path / "none.txt"))
    assert out.returncode == 1 and "meta file not found" in out.stderr
    out = demo("--world-size", "0")
    assert out.returncode == 2 and "world-size" in out.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    out = demo("--meta-file", str(empty), "--world-size", "2", "--workers", "0", "--no-baseline")
    assert out.returncode == 1 and "no samples in" in out.stderr and "empty.txt" in out.stderr


def test_mix_demo_prints_each_source_share_next_to_its_target(tmp_path: Path) -> None:
    out = demo("--mix", "--lines", "3001", "--world-size", "3", "--workers", "0", "--epochs", "2")
    assert out.returncode == 0, out.stderr
    assert "| web.txt | 1,801 | weight=1 | 1,951.0 | 1,951 | 1,951 | 1,951 | 65.01% | 65.01% | 65.01% |" in out.stdout
    assert "| books.txt | 900 | repeat=0.5 | 450.0 | 450 | 450 | 450 | 15.00% |" in out.stdout
    assert "| code.txt | 300 | choose=600 | 600.0 | 600 | 600 | 600 | 19.99% |" in out.stdout
    assert "coverage (rank_dataset): OK - epoch 0: web.txt 1951 of 1951, books.txt 450 of 450" in out.stdout
    assert "| naive |" not in out.stdout
    both = demo("--mix", "--meta-file", str(tmp_path / "x.txt"))
    assert both.returncode == 1 and "give --mix or --meta-file, not both" in both.stderr


def test_mix_demo_with_a_schedule_through_a_server() -> None:
    out = demo("--mix", "--schedule", "--server", "--lines", "3001", "--world-size", "2", "--workers", "0")
    assert out.returncode == 0, out.stderr
    assert "| books.txt | 900 | repeat={0: 0.5, 1: 1} | 450.0 -> 900.0 | 450 -> 900 | 450 | 900 |" in out.stdout
    assert "| web.txt | 1,801 | weight=1 | 1,951.0 -> 1,501.0 | 1,951 -> 1,501 | 1,951 | 1,501 |" in out.stdout
    assert "OK - epoch 0: web.txt 1951 of 1951, books.txt 450 of 450" in out.stdout
    assert "epoch 1: web.txt 1501 of 1501, books.txt 900 of 900, code.txt 600 of 600" in out.stdout
    alone = demo("--schedule", "--lines", "100")
    assert alone.returncode == 1 and "give it with --mix" in alone.stderr


def _result(loader: str, memory_mib: float, baselines_mib: list[list[float]]) -> DemoResult:
    """A loader's figures as the ranks report them: the memory split over the ranks, and each rank's
    baseline measurements."""
    ranks = [
        {
            "rank": r,
            "samples": 10,
            "build_seconds": 0.1,
            "samples_per_second": 100.0,
            "covered": True,
            "coverage": ["epoch 0: ok"],
            "memory": int(memory_mib * MIB / len(baselines_mib)),
            "baseline_memory": [int(b * MIB) for b in base],
        }
        for r, base in enumerate(baselines_mib)
    ]
    return DemoResult(loader, ranks)


def test_noise_is_the_spread_of_the_baseline_summed_over_ranks() -> None:
    # The ranks measure at once: the noise is the spread of the per-measurement totals, not of each rank's.
    result = _result("server", 1.0, [[100, 104, 101], [200, 196, 203]])
    assert result.noise == int(304 * MIB) - int(300 * MIB)
    assert _result("server", 1.0, [[5], [7]]).noise == 0


def test_a_figure_within_the_noise_is_reported_as_below_it_never_negative() -> None:
    base = [[700, 705, 712], [690, 691, 699]]  # totals 1390, 1396, 1411: noise 21 MiB
    for memory in (-20.6, -3.1, 0.0, 20.0):
        table = format_table([_result("server", memory, base)], world_size=2, workers=1)
        assert "| server | below noise (±21.0 MiB) | - |" in table, table
        assert not re.search(r"\| -\d", table)
    table = format_table([_result("server", 119.2, base)], world_size=2, workers=1)
    assert "| server | 119.2 | - |" in table


def test_the_ratio_to_the_naive_loader_is_bounded_by_the_noise() -> None:
    base = [[700, 710], [700, 710]]  # noise 20 MiB
    naive = _result("naive", 2000.0, base)
    table = format_table([_result("rank_dataset", -5.0, base), naive], world_size=2, workers=1)
    # The metas hold at most max(figure, 0) + noise = 20 MiB: at least 2000 / 20 = 100x less.
    assert "| rank_dataset | below noise (±20.0 MiB) | at least 100.0x less |" in table
    assert "| naive | 2,000.0 | - |" in table
    table = format_table([_result("rank_dataset", 100.0, base), naive], world_size=2, workers=1)
    assert "| rank_dataset | 100.0 | 20.0x less |" in table


def test_no_ratio_to_a_naive_figure_within_its_noise() -> None:
    base = [[700, 710], [700, 710]]  # noise 20 MiB
    naive = _result("naive", 3.0, base)  # a tiny demo's list, smaller than the noise
    table = format_table([_result("server", 45.0, base), naive], world_size=2, workers=1)
    assert "| server | 45.0 | - |" in table, table
    assert "| naive | below noise (±20.0 MiB) | - |" in table
    assert "x less" not in table
