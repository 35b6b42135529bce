"""The gather's fused pass (``files.read._gather._gather_window``): a dense batch of rows checked and copied
from one window in one native call gives the shard the general way gives, byte for byte, whatever the
lines (empty, blank, CRLF, no final newline, a byte order mark, lines longer than what a window reads
past its last row); and a read into private memory (``shared=False``) is the same shard."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset.core import native
from rank_dataset.files.index import _entries as readers_mod
from rank_dataset.files.index import load as index_mod
from rank_dataset.files.index.load import CACHE_DIR_ENV
from rank_dataset.files.read import _gather
from rank_dataset.files.read.metafile import MetaFile


def _hostile_file(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pieces = []
    for i in range(n):
        kind = rng.integers(0, 40)
        if kind == 0:
            pieces.append(b"")  # an empty line
        elif kind == 1:
            pieces.append(b" \t ")  # a blank one
        elif kind == 2:
            pieces.append(b"crlf %d\r" % i)  # ends "\r\n"
        elif kind == 3:  # longer than a window's tail (a few), or than its default
            pieces.append(b"x" * int(rng.integers(70, 400) if rng.random() < 0.99 else 20_000) + b" %d" % i)
        elif kind == 4:
            pieces.append(b" lead\rcr %d" % i)  # a CR inside, a space first
        else:
            pieces.append(b"img_%d.JPEG %d" % (i, i % 1000))
    body = b"\n".join(pieces)  # no final newline
    path.write_bytes(b"\xef\xbb\xbf" + body)
    return path


def _read(mf: MetaFile, indices: np.ndarray, **kw: Any) -> tuple[bytes, list[int]]:
    shard = mf.read(indices, **kw)
    return shard.data.tobytes(), shard.bounds.tolist()


@pytest.mark.parametrize("tail", [16 << 10, 64, 1])
def test_fused_windows_give_the_general_ways_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: int) -> None:
    if not native.FUSED:
        pytest.skip("the fused pass is the native kernels'")
    mf = MetaFile(_hostile_file(tmp_path / "meta.txt", 60_000, seed=tail))
    rng = np.random.default_rng(tail)
    every = rng.permutation(len(mf))
    monkeypatch.setattr(_gather, "_TAIL", tail)
    outcomes: Counter[Any] = Counter()
    real = _gather._gather_window

    def spy(*args: Any) -> Any:
        got = real(*args)
        outcomes[got] += 1
        return got

    monkeypatch.setattr(_gather, "_gather_window", spy)
    # All the samples in a random order (dense batches), a repeat of each, and a sparse draw (the general way).
    cases = [every, np.concatenate([every[:20_000], every[:20_000]]), np.sort(every[:300])]
    fused = [_read(mf, idx) for idx in cases]
    assert outcomes[False] == 0
    if tail > 1:
        assert outcomes[True] > 0  # some batches went through the fused pass...
    if tail < 100:
        assert outcomes[None] > 0  # ...and some, a line at their end longer than the tail, the general way
    monkeypatch.setattr(_gather, "_gather_window", lambda *args: None)
    assert fused == [_read(mf, idx) for idx in cases]
    for i in every[:50].tolist():
        shard = mf.read(np.array([i]))
        assert shard.data.tobytes() == mf.raw(i)


def test_a_span_the_file_disagrees_with_is_found_by_the_fused_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A damaged cache whose span passes the cheap checks (inside the file, no overlap) but starts a byte
    # into its line: the fused check stops at it, the index is rebuilt, and the read is right.
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = tmp_path / "meta.txt"
    lines = [b"img_%06d.JPEG %d" % (i, i % 7) for i in range(50_000)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    MetaFile(path)
    (cache,) = (tmp_path / "cache").rglob("*.rdidx")
    entries = np.fromfile(cache, "<u8", count=len(lines), offset=readers_mod.DATA_OFFSET)
    entries[25_000] += np.uint64(1) << np.uint64(index_mod.length_bits(path.stat().st_size))  # start + 1
    entries[25_000] -= np.uint64(1)  # length - 1: the same end
    with open(cache, "r+b") as f:
        f.seek(readers_mod.DATA_OFFSET)
        f.write(entries.tobytes())
    mf = MetaFile(path)
    outcomes: list[Any] = []
    real = _gather._gather_window
    monkeypatch.setattr(_gather, "_gather_window", lambda *args: outcomes.append(real(*args)) or outcomes[-1])
    idx = np.random.default_rng(0).permutation(len(mf))
    shard = mf.read(idx)
    assert shard.texts(range(0, len(mf), 997)) == [lines[i].decode() for i in idx[::997].tolist()]
    assert shard.data.tobytes() == b"".join(lines[i] for i in idx.tolist())
    if native.FUSED:
        assert False in outcomes and outcomes[-1] is True  # found by the fused check, then read from the rebuilt index


def test_a_private_read_is_the_shared_reads_shard(tmp_path: Path) -> None:
    mf = MetaFile(_hostile_file(tmp_path / "meta.txt", 5_000, seed=1))
    idx = np.random.default_rng(1).permutation(len(mf))
    shared, private = mf.read(idx), mf.read(idx, shared=False)
    assert shared.handle is not None and private.handle is None and private.segment is None
    assert private.data.tobytes() == shared.data.tobytes()
    assert private.bounds.tolist() == shared.bounds.tolist()
    assert private.ids is not None and private.ids.tolist() == idx.tolist()
    assert private.texts([0, 1, len(mf) - 1]) == shared.texts([0, 1, len(mf) - 1])
    again = pickle.loads(pickle.dumps(private))  # moved to a segment first: sent as a handle
    assert again.handle is not None and again.data.tobytes() == shared.data.tobytes()
    assert mf.read(idx[:0], shared=False).data.size == 0
