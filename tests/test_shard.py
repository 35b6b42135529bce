from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile
from rank_dataset import metafile as metafile_mod
from rank_dataset.shard import Shard


def test_from_meta_matches_the_file_in_any_order(write_meta) -> None:
    mf = MetaFile(write_meta(n=5000))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(mf), 3000)  # with repeats, as padding has
    s = mf.read(idx)
    assert len(s) == 3000
    assert s.texts(range(3000)) == [mf[int(i)] for i in idx]
    assert np.array_equal(s.ids, idx)
    assert not s.data.flags.writeable and not s.ids.flags.writeable


def test_lines_of_every_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metafile_mod, "_WINDOW", 64)  # many small batches
    rng = np.random.default_rng(1)
    lines = ["x" * int(n) for n in rng.integers(1, 9000, 300)] + ["é" * 5, "a"]
    p = tmp_path / "m.txt"
    p.write_text("\n".join(lines), encoding="utf-8")  # the last line ends the file with no newline
    mf = MetaFile(p)
    idx = rng.permutation(len(mf))
    s = mf.read(idx)
    assert s.texts(range(len(s))) == [lines[i] for i in idx]


def test_many_files(write_meta) -> None:
    paths = [write_meta([f"f{f}_{i}" for i in range(n)]) for f, n in enumerate([3, 1, 5])]
    mf = MetaFile(paths)
    idx = np.array([8, 0, 3, 4, 2, 8, 5])
    assert mf.read(idx).texts(range(7)) == [mf[int(i)] for i in idx]


def test_invalid_utf8_found_at_build_with_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.txt"
    p.write_bytes("é ok\n".encode() * 100 + b"\xc3 cut\n" + b"plain\n" * 10)
    mf = MetaFile(p)
    mf.read(np.arange(100))  # the valid part builds
    with pytest.raises(ValueError, match=r"bad\.txt:101: line is not valid UTF-8"):
        mf.read(np.arange(len(mf))[::-1])
    p2 = tmp_path / "bad2.txt"
    p2.write_bytes("é\n".encode() * 5 + b"\x80x\n")  # a line that starts with a continuation byte
    with pytest.raises(ValueError, match=r"bad2\.txt:6"):
        MetaFile(p2).read(np.arange(6))


def test_from_lines_and_validation() -> None:
    s = Shard.from_lines([b"a", b"", b"ccc"])
    assert [s.text(i).encode() for i in range(3)] == [b"a", b"", b"ccc"]
    with pytest.raises(ValueError, match="offsets out of range"):
        Shard(np.zeros(3, np.uint8), np.array([0]), np.array([4]))
    with pytest.raises(ValueError, match="one length"):
        Shard(np.zeros(3, np.uint8), np.array([0, 1]), np.array([1]))
    with pytest.raises(TypeError, match="uint8"):
        Shard(np.zeros(3, np.int32), np.array([0]), np.array([1]))


def test_pickle_is_a_shared_memory_handle(write_meta) -> None:
    mf = MetaFile(write_meta(n=20_000))
    s = mf.read(np.arange(0, 20_000, 2))
    blob = pickle.dumps(s)
    assert len(blob) < 1000 < s.nbytes  # a handle, not a copy
    again = pickle.loads(blob)
    assert again.texts(range(0, 10_000, 999)) == s.texts(range(0, 10_000, 999))
    # A fresh interpreter (as a spawn worker is) maps the same memory.
    code = "import pickle,sys; s = pickle.loads(sys.stdin.buffer.read()); print(len(s), s.text(len(s) - 1))"
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True)
    assert out.stdout.decode().split(" ", 1) == [str(len(s)), s.text(len(s) - 1) + "\n"]


def test_build_reads_only_the_shard(write_meta) -> None:
    # The build's resident memory must not grow with the file: file pages are dropped after use.
    import psutil

    mf = MetaFile(write_meta(n=400_000))
    proc = psutil.Process()
    before = proc.memory_info().rss
    s = mf.read(np.arange(0, len(mf), 16))
    grown = proc.memory_info().rss - before
    assert grown < 2 * s.nbytes + (1 << 20)


def test_empty_shard(write_meta) -> None:
    s = MetaFile(write_meta(n=3)).read(np.empty(0, np.int64))
    assert len(s) == 0 and s.texts([]) == []


def test_a_shard_does_not_copy_its_lines(write_meta) -> None:
    import psutil

    mf = MetaFile(write_meta(n=200_000))
    s = mf.read(np.arange(len(mf)))
    proc = psutil.Process()
    before = proc.memory_full_info().uss
    again = Shard(s.data, s.starts, s.ends, ids=s.ids)  # over the same buffer: no copy of the bytes
    assert proc.memory_full_info().uss - before < s.data.nbytes // 4
    assert again.text(7) == mf[7]
