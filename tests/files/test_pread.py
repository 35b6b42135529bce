"""Positional reads of byte ranges into one buffer: every range's bytes exactly, however the ranges lie."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rank_dataset.files.io import pread as _pread
from rank_dataset.files.io.pread import ShortRead, Window


def check(buf: np.ndarray, shift: int | np.ndarray, starts: np.ndarray, stops: np.ndarray, data: bytes) -> None:
    shifts = np.broadcast_to(np.asarray(shift), starts.shape)
    for s, e, k in zip(starts.tolist(), stops.tolist(), shifts.tolist()):
        e = min(e, len(data))
        if e > s:
            assert buf[s - k : e - k].tobytes() == data[s:e]


@pytest.mark.parametrize("seed", range(12))
def test_each_range_is_read_exactly(tmp_path: Path, seed: int) -> None:
    # Sparse, dense, overlapping, repeated, unordered and empty ranges, some running past the end;
    # few bytes (joined reads) and many (read into the window's buffer).
    rng = np.random.default_rng(seed)
    size = int(rng.choice([5_000, 300_000, 6_000_000]))
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    n = int(rng.choice([1, 3, 64, 700]))
    starts = rng.integers(0, size, n)
    if seed % 3 == 0:
        starts = np.sort(starts)[: max(1, n // 2)].repeat(2)  # every range twice
    widths = rng.choice([0, 1, 8, 40, 9000, 300_000], starts.size)
    stops = starts + widths
    pad = int(rng.integers(0, 9))
    fd = os.open(path, os.O_RDONLY)
    try:
        window = Window()
        for end in (size, size - 1):  # what the caller believes the size is; ranges are cut there
            buf, shift = window.load(fd, starts, stops, end, pad=pad)
            cut = np.minimum(stops, end)
            check(buf, shift, starts, cut, data)
            # pad bytes after every range (fixed-width records starting in one never run past buf)
            ends_in_buf = (cut - shift)[cut > starts]
            assert buf.size >= pad and (buf.size >= ends_in_buf + pad).all()
    finally:
        os.close(fd)


def test_sparse_ranges_read_what_they_need_not_their_pages(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40_000  # 10 MB
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    starts = np.arange(100, len(data) - 100, 100_000)  # 100 ranges of 40 bytes, 100 kB apart
    fd = os.open(path, os.O_RDONLY)
    try:
        buf, shift = Window().load(fd, starts, starts + 40, len(data), pad=8)
    finally:
        os.close(fd)
    check(buf, shift, starts, starts + 40, data)
    assert buf.size == 40 * starts.size + 8


@pytest.mark.parametrize("total", [4_000, 3 << 20])
def test_a_file_shorter_than_expected_is_a_short_read(tmp_path: Path, total: int) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10_000_000)
    starts = np.array([0, 5_000_000, 9_999_000 - total // 3])
    stops = starts + total // 3
    fd = os.open(path, os.O_RDONLY)
    try:
        os.truncate(path, 9_000_000)
        with pytest.raises(ShortRead):
            Window().load(fd, starts, stops, 10_000_000)
    finally:
        os.close(fd)


def test_runs_close_together_are_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    calls: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, at: int) -> bytes:
        calls.append(n)
        return real(fd, n, at)

    monkeypatch.setattr(os, "pread", pread)
    # Three ranges within the gap of each other, then one far away: two reads.
    starts = np.array([10_000, 10_100, 10_100 + _pread.GAP, 900_000])
    fd = os.open(path, os.O_RDONLY)
    try:
        buf, shift = Window().load(fd, starts, starts + 50, 1 << 20)
    finally:
        os.close(fd)
    check(buf, shift, starts, starts + 50, path.read_bytes())
    assert len(calls) == 2


def test_a_windows_map_has_room_for_the_next_batches_a_little_larger(tmp_path: Path) -> None:
    # A build's windows differ by a few percent from batch to batch: a map for each new largest one
    # was faulted in afresh (17 maps, 35 MiB, for one rank's build of 10M lines at W = 8; now 4).
    size = 6 << 20
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    window = Window()
    try:
        buffers = []
        for span in (2_000_000, 2_050_000, 2_120_000, 2_200_000):  # each the largest yet
            starts = np.array([0, span // 2], np.int64)
            buf, shift = window.load(fd, starts, starts + span // 2, size)
            check(buf, shift, starts, starts + span // 2, data)
            buffers.append(buf)
    finally:
        os.close(fd)
    assert all(np.shares_memory(buffers[0], b) for b in buffers[1:])  # one map, filled each time
