from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile
from rank_dataset.core.shard import Shard
from rank_dataset.files.read import _gather as gather_mod
from tests_helpers import shard_of


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
    monkeypatch.setattr(gather_mod, "_WINDOW", 64)  # many small batches
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
    s = shard_of([b"a", b"", b"ccc"])
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
    import tracemalloc

    mf = MetaFile(write_meta(n=200_000))
    s = mf.read(np.arange(len(mf)))
    # What this call allocates (numpy's buffers are traced), not the process's memory: another thread
    # of the test process (a pytest-xdist worker) may allocate meanwhile.
    tracemalloc.start()
    try:
        again = Shard(s.data, s.starts, s.ends, ids=s.ids)  # over the same buffer: no copy of the bytes
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Its offsets are made (12 bytes a line here); a copy of the lines would be 40 bytes a line more.
    assert peak < s.data.nbytes // 2
    assert np.shares_memory(again.data, s.data)
    assert again.text(7) == mf[7]


@pytest.mark.parametrize("rows, longest", [(3000, 70_000), (300, 100)])  # many bytes (by length), few (bytewise)
def test_copy_rows_copies_exactly_and_nothing_else(rows: int, longest: int) -> None:
    from rank_dataset.core._reference import _BYTEWISE_MAX
    from rank_dataset.core.native import copy_rows

    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 200_000, dtype=np.uint8)
    lengths = np.concatenate([rng.integers(0, 60, rows), [0, longest, 5]])  # empty, grouped and very long rows
    assert (lengths.sum() <= _BYTEWISE_MAX) == (rows < 1000)
    src_starts = rng.integers(0, src.size - lengths + 1)
    dst_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 7  # back to back after 7 bytes
    dst = np.full(int(lengths.sum()) + 20, 0xEE, np.uint8)
    perm = rng.permutation(lengths.size)  # rows may be copied in any order
    copy_rows(src, src_starts[perm], lengths[perm], dst, dst_starts[perm])
    for s, d, n in zip(src_starts.tolist(), dst_starts.tolist(), lengths.tolist()):
        assert dst[d : d + n].tobytes() == src[s : s + n].tobytes()
    assert (dst[:7] == 0xEE).all() and (dst[7 + int(lengths.sum()) :] == 0xEE).all()


def test_lines_not_back_to_back_are_packed() -> None:
    data = np.frombuffer(b"xxhello..world!!a", np.uint8)
    s = Shard(data, np.array([9, 2, 16, 9]), np.array([14, 7, 17, 14]), ids=np.array([4, 3, 2, 1]))
    assert s.texts(range(4)) == ["world", "hello", "a", "world"]
    assert s.bounds.tolist() == [0, 5, 10, 11, 16] and s.data.tobytes() == b"worldhelloaworld"
    assert s.text(-1) == "world" and s.texts([-4]) == ["world"]
    with pytest.raises(IndexError):
        s.text(4)
    shared = s.shared()
    assert shared.handle is not None and shared.texts(range(4)) == s.texts(range(4))
    assert shared.ids is not None and shared.ids.tolist() == [4, 3, 2, 1]
    assert Shard.attach(shared.handle).texts(range(4)) == s.texts(range(4))


@pytest.mark.parametrize("seed", range(4))
def test_shared_from_packs_straight_into_a_segment(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    data = rng.integers(97, 123, 20_000, dtype=np.uint8)
    starts = rng.integers(0, 19_000, n)
    ends = starts + rng.integers(0, 900, n)
    packed = Shard(data, starts, ends)
    shared = Shard.shared_from(data.tobytes(), starts, ends)
    assert shared.handle is not None and shared.ids is None and shared.shared() is shared
    assert shared.bounds.tolist() == packed.bounds.tolist() and shared.data.tobytes() == packed.data.tobytes()
    assert Shard.attach(shared.handle).texts(range(n)) == packed.texts(range(n))
    shared.release()
    # Lines already back to back (a frame in item order), from an offset on: copied as one slice.
    at = np.frombuffer(b"xx" + packed.data.tobytes(), np.uint8)
    whole = Shard.shared_from(at, packed.starts.astype(np.int64) + 2, packed.ends.astype(np.int64) + 2)
    assert whole.bounds.tolist() == packed.bounds.tolist() and whole.texts(range(n)) == packed.texts(range(n))
    whole.release()
    with pytest.raises(ValueError, match="offsets out of range for 20000 bytes"):
        Shard.shared_from(data, np.array([0]), np.array([20_001]))


def test_a_forked_child_does_not_keep_the_parents_segments(write_meta) -> None:
    import os

    s = MetaFile(write_meta(n=100)).read(np.arange(100))
    assert s.handle is not None
    held = f"/proc/{os.getpid()}/fd/{s.handle.fd}"
    expected, link = s.text(3), os.readlink(held)
    pid = os.fork()
    if pid == 0:  # the child: the mapping works, the descriptor is gone
        fd_path = f"/proc/self/fd/{s.handle.fd}"
        gone = not os.path.exists(fd_path) or os.readlink(fd_path) != link
        os._exit(0 if s.text(3) == expected and gone else 1)
    assert os.waitpid(pid, 0)[1] == 0
    s.release()
    with pytest.raises(FileNotFoundError):  # released by its creator: no one can attach it any more
        Shard.attach(s.handle)
    assert s.text(3)  # still mapped here


def test_rows_are_the_shard_of_those_lines_over_the_same_bytes(write_meta) -> None:
    from rank_dataset.server import protocol

    mf = MetaFile(write_meta(n=3000))
    rng = np.random.default_rng(2)
    idx = rng.integers(0, len(mf), 2500)
    whole = mf.read(idx)
    cuts = sorted({0, 2500, *rng.integers(0, 2500, 12).tolist()})
    for a, b in [*itertools.pairwise(cuts), (7, 7), (0, 2500)]:
        part = whole.rows(a, b)
        alone = mf.read(idx[a:b])
        # What a server sends of it: the same frame as the shard of those lines read alone.
        assert b"".join(protocol.encode_frame(part)) == b"".join(protocol.encode_frame(alone)), (a, b)
        assert part.texts(range(b - a)) == alone.texts(range(b - a))
        assert part.bounds.dtype == alone.bounds.dtype and part.bounds[0] == 0
        assert np.shares_memory(part.data, whole.data) or b == a
    assert shard_of([b"a", b"b"]).rows(1, 2).ids is None
    for a, b in [(-1, 2), (2, 1), (0, 2501)]:
        with pytest.raises(IndexError, match="not within a shard of 2500 lines"):
            whole.rows(a, b)
