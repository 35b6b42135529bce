"""The demo end to end at a small size: real ranks under torch.distributed (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SMALL = ["--lines", "20000", "--world-size", "2", "--workers", "1", "--epochs", "1"]


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rank_dataset", "demo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_small_demo_checks_coverage_and_compares_memory() -> None:
    out = demo(*SMALL)
    assert out.returncode == 0, out.stderr
    assert "coverage (rank_dataset): OK - epoch 0: 20000 samples read, 20000 of 20000 distinct" in out.stdout
    assert "coverage (naive): OK" in out.stdout
    assert out.stdout.count("| rank_dataset | ") == 3  # two ranks, and the memory row
    assert "x less |" in out.stdout


def test_demo_through_a_server(write_meta) -> None:
    meta = write_meta(n=3001)
    out = demo(
        "--meta-file", str(meta), "--world-size", "3", "--workers", "1", "--epochs", "1", "--server", "--no-baseline"
    )
    assert out.returncode == 0, out.stderr
    assert "coverage (server): OK - epoch 0: 3006 samples read, 3001 of 3001 distinct" in out.stdout
    assert "| naive |" not in out.stdout


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
