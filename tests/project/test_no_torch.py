"""The index tools import and run without torch."""

from __future__ import annotations

import subprocess
import sys

from tests_helpers import BLOCK_TORCH


def test_index_tools_without_torch(write_meta) -> None:
    p = write_meta(n=100)
    code = BLOCK_TORCH + (
        "import numpy as np\n"
        "from rank_dataset import MetaFile, Source, build_index\n"
        "from rank_dataset.plan import ShardSpec\n"
        f"mf = MetaFile({str(p)!r})\n"
        "s = mf.read(ShardSpec(len(mf), 4, 1, seed=2).indices())\n"
        "print(len(mf), len(s), len(build_index(mf.paths[0])))\n"
        "from rank_dataset.cli import main\n"
        f"sys.argv = ['rank-dataset', 'index', {str(p)!r}]\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["100 25 100", f"100\t{p}"]
    assert "torch" not in out.stderr


def test_torch_names_need_torch(write_meta) -> None:
    code = BLOCK_TORCH + "import rank_dataset\nrank_dataset.RankDataset\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "torch is blocked" in out.stderr
