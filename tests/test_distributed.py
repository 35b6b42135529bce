"""Three real processes under torch.distributed (gloo), launched by torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from rank_dataset.permutation import permute


def test_three_ranks_get_the_exact_layout(write_meta, tmp_path: Path) -> None:
    n, w, m = 1001, 3, 2
    meta = write_meta(n=n)
    out = tmp_path / "result"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={w}"]
    cmd += [str(Path(__file__).with_name("dist_worker.py")), str(meta), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(w)]
    assert [r["world_size"] for r in results] == [w] * w

    r_ = -(-n // (w * m))
    order = permute(n, 11, 3, np.arange(r_ * w * m) % n)
    for mini in range(m):
        gathered = results[0][f"indices_{mini}"]
        assert all(res[f"indices_{mini}"] == gathered for res in results)  # every rank saw the same
        for rank, got in enumerate(gathered):
            assert got == order[mini * r_ * w + rank + np.arange(r_) * w].tolist()
        # rank 1 through a DataLoader with two workers: each of its samples exactly once
        assert sorted(results[1][f"loader_{mini}"]) == sorted(results[1][f"expected_{mini}"])
        assert len(results[1][f"loader_{mini}"]) == r_
