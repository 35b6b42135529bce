"""The collective reader leaves nothing in flight after a build: no tensor it handed to gloo is held by
gloo's worker threads (freed by one as the interpreter exits, it aborts the process: `terminate called
without an active exception`), no thread of its own left running, and its own gloo group's threads
joined at its close. The exit itself is stressed by benchmarks/stress_exit.py (hundreds of fresh jobs)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests_helpers import rank_results, run_ranks, worker_env

pytestmark = pytest.mark.slow  # gloo jobs: not in make test-quick

WORLD = 3


def test_a_build_leaves_no_tensor_with_gloo_and_no_thread(tmp_path: Path) -> None:
    meta, packed = tmp_path / "meta.txt", tmp_path / "more.txt.gz"
    meta.write_text("".join(f"img_{i}.jpg {i % 9}\n" for i in range(3000)))
    packed.write_bytes(gzip.compress("".join(f"doc_{i}.txt {i}\n" for i in range(600)).encode()))
    out = tmp_path / "out"
    proc = run_ranks("collective_exit_worker.py", WORLD, meta, packed, out, env=worker_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, WORLD)
    assert sum(r["shared_group"]["samples"] for r in results) == 3600
    for r in results:
        shared, own = r["shared_group"], r["own_group"]
        assert shared["pending"] == 0 and own["pending"] == 0  # gloo let go of every tensor before returning
        assert shared["threads_added"] == 0  # the build's helper threads joined; no thread of the reader's
        assert shared["python_threads"] == r["python_threads"]
        assert own["threads_added"] > 0  # its own gloo group's threads (workers, the transport's loop)...
        assert own["threads_after_close"] == 0  # ...joined by its close
