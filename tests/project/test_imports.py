"""What ``import rank_dataset`` costs every process (each rank and each spawn or forkserver DataLoader
worker): the format libraries and the tools of an index build are imported on first use (issue 44, item 6)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

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


_RECOGNISE = """
import sys
from rank_dataset.files.formats import detect_path
print(detect_path({path!r}).value)
print(" ".join(sys.modules))
"""


@pytest.mark.parametrize("packing", ["text", "gzip"])
def test_recognising_a_file_imports_no_codec_and_no_parquet_reader(tmp_path: Path, packing: str) -> None:
    path = tmp_path / "meta"
    data = b"".join(b"img/%d.jpg %d\n" % (i, i) for i in range(50))
    path.write_bytes(gzip.compress(data) if packing == "gzip" else data)
    out = subprocess.run(
        [sys.executable, "-c", _RECOGNISE.format(path=str(path))], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    told, modules = out.stdout.splitlines()
    assert told == packing
    codecs = ("indexed_gzip", "zstandard", "pyarrow")
    assert [m for m in modules.split() if m.split(".", 1)[0] in codecs] == []


def test_the_lazy_names_are_those_of_their_modules() -> None:
    from rank_dataset.files import formats
    from rank_dataset.files import io as sources
    from rank_dataset.files.formats import parquet
    from rank_dataset.files.io import object as objects

    assert formats.ParquetRows is parquet.ParquetRows
    assert formats.ParquetLayout is parquet.ParquetLayout
    assert (sources.ObjectFile, sources.ObjectKey) == (objects.ObjectFile, objects.ObjectKey)
    with pytest.raises(AttributeError, match="Nothing"):
        sources.Nothing  # noqa: B018


#: What a job over a plain text file whose index is built never needs, in the rank or in its spawned
#: DataLoader workers: the format libraries, the index build's tools, decimal (fractions: mixes by step),
#: the grouping and recipes, the collective reader, object storage, the meta server. What torch imports
#: itself (importlib.metadata, email, zipfile, tqdm with torch 2.x) is the control's and not counted.
_NOT_FOR_TEXT = (
    *_ON_FIRST_USE,
    "obstore",
    "decimal",
    "fractions",
    "importlib.metadata",
    "email",
    "zipfile",
    "rank_dataset.files.group.grouping",
    "rank_dataset.files.group.recipes",
    "rank_dataset.shards.collective",
    "rank_dataset.server",
    *(
        # The codecs and the Parquet reader (imported by the format's methods), object storage, and the machinery
        # of mixes, subsets and exclusions (imported where one is given): a rank's share of a job's memory is
        # mostly the modules it imports (issue 44, item 6).
        "rank_dataset.files.read._parquet_gather",
        "rank_dataset.files.io.object",
        "rank_dataset.files.io._stores",
        "rank_dataset.plan.mix",
        "rank_dataset.plan.subsets",
        "rank_dataset.plan.exclude",
        "rank_dataset.plan.sources",
        "rank_dataset.plan.counts",
        # The other formats (a text file starts with none of their magics), the index build (the index is
        # cached) and the user cache directory (the cache is at its first place): a fork worker shares these pages.
        "rank_dataset.files.formats.gzip",
        "rank_dataset.files.formats.zstd",
        "rank_dataset.files.formats.parquet",
        "rank_dataset.files.formats.spans",
        "rank_dataset.files.formats.checkpoints",
        "rank_dataset.files.index._build",
        "platformdirs",
    ),
)
#: A worker looks for no index either; it unpickles a shard's handle, its channel and the item code, not the readers
#: of meta files (their formats, index and byte sources) nor what the rank plans with (issue 44, item 6).
_NOT_IN_A_WORKER = (
    *_NOT_FOR_TEXT,
    "rank_dataset.files",
    "rank_dataset.shards.reader",
    "rank_dataset.plan.mix",
    "rank_dataset.plan.sources",
    "rank_dataset.plan.exclude",
    "rank_dataset.plan.steps",
    "rank_dataset.plan.resume",
)

_JOB = """
import multiprocessing
import sys


def report(dataset, queue):
    item, modules = dataset[1], sorted(sys.modules)
    # What the rank built with is still there, unpickled on first use: the meta file, the reader, the book (which
    # shares the dataset's channel, as it does in the rank).
    touched = (dataset.meta[int(dataset.indices[1])], dataset.reader.where(0), dataset._book.channel is dataset.channel)
    queue.put((item, modules, touched))


if __name__ == "__main__":
    import torch

    control = sorted(sys.modules)
    from rank_dataset import RankDataset

    dataset = RankDataset(sys.argv[1], rank=0, world_size=1)
    assert dataset[0] is not None
    rank = sorted(sys.modules)
    context = multiprocessing.get_context("spawn")  # a spawn DataLoader worker starts as this one does
    queue = context.Queue()
    worker = context.Process(target=report, args=(dataset, queue))
    worker.start()
    item, in_worker, touched = queue.get(timeout=120)
    worker.join(60)
    assert item == dataset[1], (item, dataset[1])
    assert touched == (dataset[1], dataset.reader.where(0), True), touched
    for modules in (control, rank, in_worker):
        print(" ".join(modules))
"""


@pytest.mark.slow
def test_a_job_over_a_text_file_imports_only_what_it_needs(tmp_path: Path) -> None:
    from rank_dataset import MetaFile

    text = tmp_path / "meta.txt"
    text.write_text("".join(f"img/{i}.jpg {i}\n" for i in range(50)))
    MetaFile(text)  # its index, into this test's cache, which the job's processes share (the environment)
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    out = subprocess.run([sys.executable, str(script), str(text)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    control, rank, worker = (set(line.split()) for line in out.stdout.splitlines()[-3:])

    def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
        ours = modules - control
        return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in ours))

    assert "rank_dataset.training.dataset" in worker  # the worker did unpickle the dataset
    assert loaded(rank, _NOT_FOR_TEXT) == []
    assert loaded(worker, _NOT_IN_A_WORKER) == []
