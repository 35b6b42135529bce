"""What ``import rank_dataset`` costs every process (each rank and each spawn or forkserver DataLoader
worker): the format libraries and the tools of an index build are imported on first use (issue 44, item 6)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

#: Imported only by a process that needs them: a gzip or zstd file, a Parquet file, a progress bar, an
#: index build's lock, a build left behind by another process.
_ON_FIRST_USE = ("indexed_gzip", "zstandard", "pyarrow", "tqdm", "filelock", "psutil")


def _modules_after(code: str) -> set[str]:
    probe = code + f"\nimport sys\nprint(' '.join(m for m in {_ON_FIRST_USE!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_import_leaves_the_format_libraries_out() -> None:
    assert _modules_after("import rank_dataset\nrank_dataset.MetaFile") == set()


def test_reading_a_text_file_leaves_them_out_and_a_gzip_file_imports_its_own(tmp_path: Path) -> None:
    text = tmp_path / "meta.txt"
    text.write_text("".join(f"img/{i}.jpg {i}\n" for i in range(50)))
    read = "from rank_dataset import MetaFile\nmf = MetaFile({!r})\nassert mf[3] == 'img/3.jpg 3', mf[3]\n"
    # Indexing a file takes its lock and may draw a bar: a process that reads an index built before does without.
    assert _modules_after(read.format(str(text))) <= {"filelock", "tqdm"}
    assert _modules_after(read.format(str(text))) == set()  # the index is cached now
    packed = tmp_path / "meta.txt.gz"
    packed.write_bytes(gzip.compress(text.read_bytes()))
    assert "indexed_gzip" in _modules_after(read.format(str(packed)))
