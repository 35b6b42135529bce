"""Every benchmark script runs end to end at a tiny size (smoke tests, not measurements)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_server_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_server.py"), "--lines", "3000", "--seconds", "0.2"]
    cmd += ["--batched-samples", "1024", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "server.md").read_text()
    assert "| whole-shard fetch (W = 1) |" in table and (tmp_path / "server.png").stat().st_size > 0


def test_bench_build_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_build.py"), "--lines", "5000", "--repeat", "1"]
    cmd += ["--agree-repeat", "2"]
    cmd += ["--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "build.md").read_text()
    assert "RankDataset, warm index" in table and "| set_epoch, with the check |" in table
    assert "| shard: lines back to back + one uint32 offset each |" in table


def test_bench_memory_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--sizes", "3000", "--world-size", "2"]
    cmd += ["--workers", "1", "--start-method", "forkserver", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "memory_forkserver.md").read_text()
    assert "| 3,000 |" in table and "forkserver" in table and (tmp_path / "memory_forkserver.png").exists()


def test_bench_getitem_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_getitem.py"), "--lines", "3000", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'parser="json"' in (tmp_path / "getitem.md").read_text()


def test_bench_mix_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_mix.py"), "--lines", "4000", "--repeat", "1"]
    cmd += ["--world-size", "4", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "mix.md").read_text()
    assert "| mix of 3 files" in table and "R = 1,000" in table and (tmp_path / "mix.png").stat().st_size > 0


def test_bench_workers_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_workers.py"), "--lines", "4000", "--passes", "1"]
    cmd += ["--workers", "1", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "workers.md").read_text()
    assert "| fork |" in table and "| forkserver |" in table and (tmp_path / "workers.png").exists()


def test_bench_group_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_group.py"), "--lines", "5000"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "group.md").read_text()
    assert "| group_by again (cached, memory-mapped) |" in table and "N = 5,000 lines" in table
    assert not list((tmp_path / "data").iterdir())  # the meta file is removed
