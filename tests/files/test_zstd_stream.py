"""The cold index's pass over a zstd file (rank_dataset.files.formats.zstd.stream): each frame decoded
into reused blocks, its end found by walking its block headers, on real zstd files of every kind of
frame and block, read in pieces that cut the headers anywhere."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard

from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats import zstd as _zstd

SPACING = 20_000


def _lines(n: int, seed: int = 0) -> bytes:
    tags = np.random.default_rng(seed).integers(0, 1 << 30, n).tolist()
    return b"".join(b"img/%07d.jpg %d\n" % (i, t) for i, t in enumerate(tags))


def _skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A53, len(payload)) + payload


def _frames() -> list[tuple[bytes, bytes]]:
    """(compressed, decompressed) frames of every kind: with and without a checksum or a content size
    (a streamed frame), of compressed, raw (random bytes) and RLE (one byte repeated) blocks, empty,
    and skippable (no output)."""
    plain, checked = zstandard.ZstdCompressor(level=3), zstandard.ZstdCompressor(level=1, write_checksum=True)
    text, noise = _lines(3_000), np.random.default_rng(1).bytes(300_000) + b"\n"
    streamed = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    runs = b"\n" * 200_000 + b"x" * 300_000 + b"\n"
    return [
        (plain.compress(text), text),
        (_skippable(b"between frames"), b""),
        (checked.compress(noise), noise),  # raw blocks
        (plain.compress(runs), runs),  # RLE blocks
        (plain.compress(b""), b""),
        (streamed.compress(text) + streamed.flush(), text),
        (checked.compress(text[:50_000]), text[:50_000]),
        (_skippable(b"a seek table"), b""),
    ]


def _stream(path: Path, block: int) -> tuple[list[bytes], int, np.ndarray]:
    fd = os.open(path, os.O_RDONLY)
    try:
        gen = _zstd.stream(path, fd, SPACING, block)
        out = []
        while True:
            try:
                out.append(bytes(next(gen)))
            except StopIteration as stop:
                size, points, state = stop.value
                assert state == b""
                return out, size, points
    finally:
        os.close(fd)


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 64, 4099, 128 << 10])
def test_every_frame_is_found_however_the_reads_cut_its_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    monkeypatch.setattr(_zstd, "_PIECE", piece)
    frames = _frames()
    path = tmp_path / "kinds.zst"
    path.write_bytes(b"".join(c for c, _ in frames))
    want, out, at = [(0, 0)], 0, 0  # checkpoints: frame starts at least SPACING output bytes apart
    for compressed, text in frames:
        if out - want[-1][0] >= SPACING:
            want.append((out, at))
        out, at = out + len(text), at + len(compressed)
    blocks, size, points = _stream(path, 30_000)
    assert b"".join(blocks) == b"".join(t for _, t in frames) and size == out
    assert all(len(b) == 30_000 for b in blocks[:-1]) and 0 < len(blocks[-1]) <= 30_000
    assert points.tolist() == [list(p) for p in want] and len(want) > 3


def test_a_block_is_written_again_only_once_its_reader_let_go_of_it(tmp_path: Path) -> None:
    text = _lines(20_000)
    path = tmp_path / "one.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(text))
    fd = os.open(path, os.O_RDONLY)
    try:
        held, copies = [], []
        for k, block in enumerate(_zstd.stream(path, fd, SPACING, 10_000)):
            copies.append(bytes(block))
            if k % 3 == 0:  # these are held to the end: none may be written again
                held.append((k, block))
        assert b"".join(copies) == text
        assert all(bytes(block) == copies[k] for k, block in held)
    finally:
        os.close(fd)


def test_blocks_are_reused_once_let_go_of_and_new_while_held() -> None:
    blocks = _zstd._Blocks(100, most=2)
    a = blocks.take()
    first = id(a)  # (the pool keeps it alive: no other object can take its id)
    b = blocks.take()  # a is held here
    assert a is not b and len(a) == len(b) == 100
    del a
    c = blocks.take()
    assert id(c) == first  # the first one, let go of
    d = blocks.take()  # b and c held, the pool full: a new one, not kept
    assert d is not b and d is not c
    del d
    e = blocks.take()
    assert e is not b and e is not c


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 6, 9])
def test_a_file_that_ends_inside_a_frame_header_is_truncated(tmp_path: Path, cut: int) -> None:
    first = zstandard.ZstdCompressor(level=3).compress(_lines(100))
    second = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(_lines(100, 1))
    for name, tail in (("zstd", second), ("skippable", _skippable(b"x" * 20))):
        path = tmp_path / f"cut{cut}-{name}.zst"
        path.write_bytes(first + tail[:cut])
        with pytest.raises(CorruptMetaFileError, match="truncated") as info:
            _stream(path, 1 << 20)
        assert info.value.offset == len(first)


def test_bytes_between_frames_that_start_no_frame_are_an_error_naming_their_offset(tmp_path: Path) -> None:
    frame = zstandard.ZstdCompressor(level=3).compress(_lines(100))
    path = tmp_path / "garbage.zst"
    path.write_bytes(frame + b"not a frame" + frame)
    with pytest.raises(CorruptMetaFileError, match="no zstd frame starts") as info:
        _stream(path, 1 << 20)
    assert info.value.offset == len(frame)
