"""The decoder layer of compressed and Parquet meta files (rank_dataset.files.formats), on real files."""

from __future__ import annotations

import gzip
import os
import re
import struct
from pathlib import Path

import numpy as np
import psutil
import pytest
import zstandard

from rank_dataset.errors import CorruptMetaFileError
from rank_dataset.files.formats import (
    GZIP,
    PARQUET,
    TEXT,
    ZSTD,
    Checkpoints,
    DecompressedView,
    Decompression,
    detect_path,
)

SPACING = 64 << 10  # small, so that small files have many checkpoints


def _text(n: int = 40_000) -> bytes:
    return b"".join(b'{"path": "img/%07d.jpg", "label": %d}\n' % (i, i * 7919 % 1000) for i in range(n))


def _gzip_members(raw: bytes, member: int) -> bytes:
    return b"".join(gzip.compress(raw[k : k + member], 6) for k in range(0, len(raw), member))


def _zstd_frames(raw: bytes, frame: int) -> bytes:
    c = zstandard.ZstdCompressor(level=3)
    return b"".join(c.compress(raw[k : k + frame]) for k in range(0, len(raw), frame))


def _skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A5E, len(payload)) + payload


RAW = _text()
FILES = {
    "one.gz": gzip.compress(RAW, 6),
    "members.gz": _gzip_members(RAW, 100_000),  # several members, as cat a.gz b.gz
    "bgzf.gz": _gzip_members(RAW, 65_280) + gzip.compress(b""),  # BGZF-like: 64 KiB members and an empty last one
    "one.zst": zstandard.ZstdCompressor(level=3).compress(RAW),
    "frames.zst": _zstd_frames(RAW, 50_000),
    "seekable.zst": _zstd_frames(RAW, 50_000) + _skippable(b"a seek table"),
    "stream.zst": zstandard.ZstdCompressor(level=3).compressobj().compress(RAW)
    + zstandard.ZstdCompressor(level=3).compressobj().flush(),
}


def _decompress(path: Path) -> tuple[bytes, Checkpoints]:
    fd = os.open(path, os.O_RDONLY)
    try:
        d = Decompression(path, fd, detect_path(path), spacing=SPACING, block=100_000)
        out = b"".join(d)
        return out, d.checkpoints
    finally:
        os.close(fd)


@pytest.mark.parametrize("block", [1_000, 30_000, 99_999])
def test_members_longer_than_a_block_are_read_once(tmp_path: Path, block: int) -> None:
    # A member that decompresses to more than a block (cat of two big .gz files): zlib stops at the
    # block's end, and at the member's end leaves the rest of the input in two places; it is read once.
    path = _write(tmp_path, "members.gz", FILES["members.gz"])
    fd = os.open(path, os.O_RDONLY)
    try:
        d = Decompression(path, fd, GZIP, spacing=SPACING, block=block)
        parts = list(d)
        assert b"".join(parts) == RAW and max(len(p) for p in parts) <= block
        assert d.checkpoints.size == len(RAW)
    finally:
        os.close(fd)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_formats_are_told_by_content_not_name(tmp_path: Path) -> None:
    assert detect_path(_write(tmp_path, "a.txt", FILES["one.gz"])) is GZIP
    assert detect_path(_write(tmp_path, "b.gz", FILES["one.zst"])) is ZSTD
    assert detect_path(_write(tmp_path, "c.zst", _skippable(b"x") + FILES["one.zst"])) is ZSTD
    assert detect_path(_write(tmp_path, "d.gz", RAW)) is TEXT
    assert detect_path(_write(tmp_path, "e.parquet", b"PAR1 but no footer")) is TEXT


@pytest.mark.parametrize("name", sorted(n for n in FILES if n != "stream.zst"))
def test_stream_and_random_reads_give_the_decompressed_bytes(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name, FILES[name])
    out, cp = _decompress(path)
    assert out == RAW
    assert cp.size == len(RAW) and cp.format is detect_path(path)
    # Checkpoints: increasing from (0, 0); zstd's frame starts at least SPACING of output apart, gzip's
    # at most (and at each member's start).
    assert tuple(cp.points[0]) == (0, 0)
    assert (np.diff(cp.points, axis=0) > 0).all()
    gaps = np.diff(np.append(cp.points[:, 0], len(RAW)))
    if cp.format is ZSTD:
        assert (gaps[:-1] >= SPACING).all()
    if name != "one.zst":  # gzip: a point past every SPACING (at a deflate block's end); zstd: frame starts
        assert len(cp.points) >= 5
    kept = Checkpoints.from_bytes(cp.to_bytes())
    rng = np.random.default_rng(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, kept) as view:
            for a in [0, len(RAW) - 1, *rng.integers(0, len(RAW), 20).tolist()]:
                b = min(len(RAW), a + int(rng.integers(1, 3 * SPACING)))
                assert view.read(a, b) == RAW[a:b]
            assert view.read(5, 5) == b""
            with pytest.raises(ValueError, match="not within"):
                view.read(0, len(RAW) + 1)
    finally:
        os.close(fd)


def test_a_read_decompresses_from_the_nearest_checkpoint_only(tmp_path: Path) -> None:
    for name in ("one.gz", "frames.zst"):
        path = _write(tmp_path, name, FILES[name])
        _, cp = _decompress(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            with DecompressedView(path, fd, cp) as view:
                a = len(RAW) - 1000
                view.read(a, a + 10)
                # From the checkpoint before a: at most the widest gap between two checkpoints, and 10.
                widest = int(np.diff(np.append(cp.points[:, 0], len(RAW))).max())
                assert view.decompressed <= widest + 10 < len(RAW) / 4
        finally:
            os.close(fd)


@pytest.mark.parametrize("name", ["one.zst", "frames.zst", "one.gz", "members.gz"])
def test_reads_in_order_decompress_the_file_once(tmp_path: Path, name: str) -> None:
    # A build reads spans in ascending order. zstd's decoder goes on from where the read before stopped,
    # so a file of one frame is decompressed once, not once from its start for every span; indexed_gzip
    # starts every read from the checkpoint before it, so a gzip read given ``until`` reads on to the
    # next checkpoint and keeps the bytes past its end for the next read.
    path = _write(tmp_path, name, FILES[name])
    _, cp = _decompress(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        step = len(RAW) // 37
        with DecompressedView(path, fd, cp) as view:
            got = b"".join(view.read(a, min(a + step, len(RAW)), len(RAW)) for a in range(0, len(RAW), step))
            assert got == RAW and view.decompressed == len(RAW)
            assert view.read(10, 20) == RAW[10:20]  # backwards: from the checkpoint again
            assert view.read(len(RAW) - 5, len(RAW)) == RAW[-5:]
        if cp.format is GZIP:  # and reads no further than ``until``
            with DecompressedView(path, fd, cp) as view:
                end = int(cp.points[2, 0]) + 100
                assert view.read(0, end - 50, end) + view.read(end - 50, end, end) == RAW[:end]
                assert view.decompressed == end
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["one.zst", "frames.zst", "seekable.zst"])
def test_zstd_reads_in_any_order_give_the_text_and_decode_only_what_they_need(tmp_path: Path, name: str) -> None:
    # The decoder goes on from where the last read stopped (skipping to a read ahead), starts again
    # from a checkpoint for a read behind it, and takes a read that starts a little before the last
    # one's end from that end (a line's end looked for past a cut), decoding nothing again.
    path = _write(tmp_path, name, FILES[name])
    _, cp = _decompress(path)
    rng = np.random.default_rng(len(name))
    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, cp) as view:
            for _ in range(200):
                a = int(rng.integers(0, len(RAW)))
                b = min(len(RAW), a + int(rng.choice([0, 1, 100, 30_000, 300_000])))
                assert view.read(a, b) == RAW[a:b], (a, b)
            a = len(RAW) // 3
            assert view.read(a, a + 50_000) == RAW[a : a + 50_000]
            before = view.decompressed
            assert view.read(a + 49_000, a + 49_990) == RAW[a + 49_000 : a + 49_990]  # within the last read
            assert view.read(a + 49_990, a + 60_000) == RAW[a + 49_990 : a + 60_000]  # and on from it
            assert view.decompressed == before + 10_000
    finally:
        os.close(fd)


def test_a_zstd_read_that_fails_midway_leaves_no_decoder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read of the file that fails (EIO) after the decoder went on: the next read starts afresh,
    # not from wherever the decoder got to.
    from rank_dataset.files.formats import _raw  # the zstd codec's reads go through it

    path = _write(tmp_path, "one.zst", FILES["one.zst"])
    _, cp = _decompress(path)
    pread, calls = os.pread, []

    def failing(fd: int, n: int, at: int) -> bytes:
        calls.append(at)
        if len(calls) == 2:  # after the first 8 KiB were decoded
            raise OSError(5, "Input/output error")
        return pread(fd, n, at)

    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, cp) as view:
            monkeypatch.setattr(_raw.os, "pread", failing)
            with pytest.raises(OSError):
                view.read(0, len(RAW))
            monkeypatch.setattr(_raw.os, "pread", pread)
            assert view.read(0, 100) == RAW[:100]
            assert view.read(100, 5000) == RAW[100:5000]
    finally:
        os.close(fd)


def test_a_zstd_frame_corrupt_after_indexing_is_an_error_naming_file_and_offset(tmp_path: Path) -> None:
    # Checkpoints of the file as it was; its second half changed since (same size): the read there
    # is a CorruptMetaFileError naming the file and a compressed offset, never wrong bytes.
    path = _write(tmp_path, "frames.zst", FILES["frames.zst"])
    _, cp = _decompress(path)
    data = bytearray(FILES["frames.zst"])
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, cp) as view, pytest.raises(CorruptMetaFileError) as info:
            view.read(0, len(RAW))
    finally:
        os.close(fd)
    assert info.value.path == path and len(data) // 2 <= info.value.offset <= len(data)
    assert f"compressed byte {info.value.offset:,}" in str(info.value)


def test_a_single_frame_zstd_file_has_one_checkpoint(tmp_path: Path) -> None:
    _, cp = _decompress(_write(tmp_path, "one.zst", FILES["one.zst"]))
    assert cp.points.tolist() == [[0, 0]]
    assert cp.compressed_span(len(RAW) - 10, len(RAW), len(FILES["one.zst"])) == (0, len(FILES["one.zst"]))


def test_compressed_span_covers_only_the_checkpoints_around_a_range(tmp_path: Path) -> None:
    path = _write(tmp_path, "one.gz", FILES["one.gz"])
    _, cp = _decompress(path)
    lo, hi = cp.compressed_span(len(RAW) // 2, len(RAW) // 2 + 10, path.stat().st_size)
    assert 0 < lo < hi < path.stat().st_size
    assert hi - lo < path.stat().st_size / 4


def test_empty_and_tiny_files(tmp_path: Path) -> None:
    cases = [("e.gz", b""), ("t.gz", b"a\n"), ("t.zst", b"a\n"), ("e.zst", b"")]
    for name, text in cases:
        data = gzip.compress(text) if name.endswith(".gz") else zstandard.ZstdCompressor().compress(text)
        out, cp = _decompress(_write(tmp_path, name, data))
        assert out == text and cp.size == len(text) and cp.points[0].tolist() == [0, 0]


def _damaged(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    for i in range(at, at + 64):
        b[i] ^= 0x5A
    return bytes(b)


@pytest.mark.parametrize("name", ["one.gz", "members.gz", "bgzf.gz", "one.zst", "frames.zst"])
def test_truncated_files_are_errors_naming_file_and_offset(tmp_path: Path, name: str) -> None:
    data = FILES[name]
    for cut in (len(data) // 2, len(data) - 3):
        path = _write(tmp_path, f"cut{cut}.{name}", data[:cut])
        with pytest.raises(CorruptMetaFileError, match=r"truncated") as info:
            _decompress(path)
        assert info.value.path == path and 0 <= info.value.offset <= cut
        assert str(path) in str(info.value)


CHECKED = {  # zstd frames written with their checksum (as the zstd tool does by default)
    "checked.zst": zstandard.ZstdCompressor(level=3, write_checksum=True).compress(RAW),
    "checked-frames.zst": b"".join(
        zstandard.ZstdCompressor(level=3, write_checksum=True).compress(RAW[k : k + 50_000])
        for k in range(0, len(RAW), 50_000)
    ),
}


@pytest.mark.parametrize(
    "name",
    [
        "one.gz",
        "members.gz",
        "bgzf.gz",
        "checked.zst",
        "checked-frames.zst",
    ],
)
def test_corrupt_files_are_errors_naming_file_and_offset(tmp_path: Path, name: str) -> None:
    data = {**FILES, **CHECKED}[name]
    path = _write(tmp_path, f"bad.{name}", _damaged(data, len(data) // 2))
    with pytest.raises(CorruptMetaFileError) as info:
        _decompress(path)
    assert info.value.path == path and 0 <= info.value.offset <= len(data)
    assert f"compressed byte {info.value.offset:,}" in str(info.value)


@pytest.mark.parametrize("name", ["one.gz", "one.zst"])
def test_bytes_after_the_end_are_refused(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name, FILES[name] + b"trailing garbage")
    with pytest.raises(CorruptMetaFileError):
        _decompress(path)


def test_a_file_that_shrank_under_a_view_is_an_error_not_short_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, "frames.zst", FILES["frames.zst"])
    _, cp = _decompress(path)
    path.write_bytes(FILES["frames.zst"][: len(FILES["frames.zst"]) // 2])
    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, cp) as view, pytest.raises(CorruptMetaFileError):
            view.read(len(RAW) - 100, len(RAW))
    finally:
        os.close(fd)


def test_checkpoints_refuse_damaged_bytes() -> None:
    cp = Checkpoints(ZSTD, 10, np.array([[0, 0], [5, 3]], np.int64))
    raw = cp.to_bytes()
    assert Checkpoints.from_bytes(raw).points.tolist() == [[0, 0], [5, 3]]
    with pytest.raises(ValueError, match="damaged"):
        Checkpoints.from_bytes(raw[:-1])
    with pytest.raises(ValueError, match="too short"):
        Checkpoints.from_bytes(raw[:8])
    bad = bytearray(raw)
    bad[-8:] = struct.pack("<q", -1)  # input offsets decreasing
    with pytest.raises(ValueError, match="not increasing"):
        Checkpoints.from_bytes(bytes(bad))


def test_a_decompression_reads_compressed_files_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gzip or zstd"):
        Decompression(tmp_path, 0, TEXT)


# Parquet ---------------------------------------------------------------------------------------------

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(tmp_path: Path, table: object, name: str = "m.parquet", row_group_size: int = 1000) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=row_group_size, write_page_checksum=True)
    return path


def test_parquet_rows_are_lines_of_their_columns_joined_by_tabs(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ParquetRows

    n = 3500
    paths = [f"img/{i:05d}.jpg" for i in range(n)]
    labels = [i % 7 for i in range(n)]
    table = pa.table({"path": paths, "label": labels, "score": [i / 4 for i in range(n)]})
    path = _parquet(tmp_path, table)
    assert detect_path(path) is PARQUET
    rows = ParquetRows(path, ["path", "label"])
    assert len(rows) == n and rows.bounds.tolist() == [0, 1000, 2000, 3000, 3500]
    pick = np.array([3499, 0, 1500, 999, 1000, 1500])
    assert rows.lines(pick) == [f"{paths[i]}\t{labels[i]}".encode() for i in pick]
    assert ParquetRows(path, ["label", "path"]).lines(np.array([2]))[0] == b"2\timg/00002.jpg"
    assert ParquetRows(path).lines(np.array([3]))[0] == b"img/00003.jpg\t3\t0.75"  # all columns by default


def test_parquet_nulls_are_empty_fields(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ParquetRows

    path = _parquet(tmp_path, pa.table({"a": ["x", None, "z"], "b": [1, 2, None]}))
    assert ParquetRows(path).lines(np.arange(3)) == [b"x\t1", b"\t2", b"z\t"]
    assert ParquetRows(path, ["a"]).lines(np.arange(3)) == [b"x", b"", b"z"]


def test_parquet_refuses_nested_binary_and_missing_columns_naming_them(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ParquetRows

    table = pa.table({"ok": ["a"], "tags": [[1, 2]], "blob": pa.array([b"\x00"], pa.binary()), "s": [{"x": 1}]})
    path = _parquet(tmp_path, table)
    with pytest.raises(ValueError, match="column 'tags' is nested"):
        ParquetRows(path)
    with pytest.raises(ValueError, match="column 'blob' is binary"):
        ParquetRows(path, ["ok", "blob"])
    with pytest.raises(ValueError, match="column 's' is nested"):
        ParquetRows(path, ["s"])
    with pytest.raises(ValueError, match="no column 'nope'"):
        ParquetRows(path, ["nope"])
    with pytest.raises(ValueError, match="non-empty sequence"):
        ParquetRows(path, "ok")
    assert ParquetRows(path, ["ok"]).lines(np.array([0])) == [b"a"]


def test_parquet_schema_hash_tells_a_changed_schema(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ParquetRows

    path = _parquet(tmp_path, pa.table({"path": ["a", "b"], "label": [1, 2]}))
    before = ParquetRows(path, ["path", "label"]).schema_hash
    _parquet(tmp_path, pa.table({"path": ["a", "b"], "label": ["1", "2"]}))  # label became a string
    now = ParquetRows(path, ["path", "label"])
    assert now.schema_hash != before and ParquetRows(path, ["path", "label"]).schema_hash == now.schema_hash
    assert ParquetRows(path, ["path"]).schema_hash != now.schema_hash  # the chosen columns' schema


def test_parquet_with_a_damaged_footer_or_data_is_an_error(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ParquetRows

    path = _parquet(tmp_path, pa.table({"path": [f"p{i}" for i in range(5000)]}), row_group_size=2500)
    data = path.read_bytes()
    bad = _write(tmp_path, "footer.parquet", data[:-12] + b"\xff" * 8 + data[-4:])
    with pytest.raises(CorruptMetaFileError) as info:
        ParquetRows(bad)
    assert info.value.path == bad
    first = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    path.write_bytes(_damaged(data, first + 40))  # in the second row group's page (with its checksum)
    rows = ParquetRows(path)
    assert rows.lines(np.array([0])) == [b"p0"]  # the first row group is whole
    with pytest.raises(CorruptMetaFileError) as info:
        rows.lines(np.array([4000]))
    assert info.value.path == path and info.value.offset == first and "row group 1" in str(info.value)


@pytest.mark.parametrize("field", [0, 4])  # the CRC32, the size
def test_a_wrong_trailer_of_a_member_before_the_last_is_an_error(tmp_path: Path, field: int) -> None:
    first = gzip.compress(RAW[:100_000], 6)
    bad = bytearray(first)
    bad[len(first) - 8 + field] ^= 0x01  # the inflated bytes are right; the trailer says otherwise
    path = _write(tmp_path, "members.gz", bytes(bad) + gzip.compress(RAW[100_000:], 6))
    with pytest.raises(CorruptMetaFileError, match="in the member starting at byte 0: decoding failed between") as info:
        _decompress(path)
    assert info.value.offset == 0


def test_a_single_member_gzip_corrupt_in_the_middle_says_where_decoding_failed(tmp_path: Path) -> None:
    # Not "at compressed byte 0" alone, which reads as if the start were broken: the member that
    # starts there, and the few bytes within which decoding failed (at or after the damage).
    data = FILES["one.gz"]
    middle = len(data) // 2
    path = _write(tmp_path, "bad-one.gz", _damaged(data, middle))
    with pytest.raises(CorruptMetaFileError) as info:
        _decompress(path)
    found = re.search(
        r"in the member starting at byte 0: decoding failed between compressed bytes ([\d,]+) and ([\d,]+)",
        str(info.value),
    )
    assert found is not None, str(info.value)
    lo, hi = (int(x.replace(",", "")) for x in found.groups())
    assert middle <= hi and lo < hi <= lo + 512 and hi <= len(data)
    assert info.value.offset == 0  # the fault lies at or after the member's start


def test_the_one_frame_advice_names_the_file_and_is_not_given_again_after_its_fix(tmp_path: Path) -> None:
    from rank_dataset.files.formats import ADVISED_ABOVE, one_frame_advice

    raw = _text()
    while len(raw) <= ADVISED_ABOVE + (1 << 20):
        raw += raw
    path = _write(tmp_path, "my data.txt.zst", zstandard.ZstdCompressor(level=1).compress(raw))
    advice = one_frame_advice(path, _decompress(path)[1])
    assert advice is not None and str(path) in advice and "meta.txt" not in advice
    assert "zstd -dc '" + str(path) + "' | pzstd" in advice  # the file's name, quoted for the shell
    # What its fixes write is never advised about: pzstd's frames (ADVISED_ABOVE apart), split's (4 MiB).
    for frame in (ADVISED_ABOVE, 4 << 20):
        fixed = _write(tmp_path, f"fixed{frame}.zst", _zstd_frames(raw, frame))
        assert one_frame_advice(fixed, _decompress(fixed)[1]) is None
    # A one-frame file no larger than pzstd's frames is not advised about either: rewritten by pzstd it
    # would still be one frame, and be advised about again.
    small = _write(tmp_path, "small.zst", zstandard.ZstdCompressor(level=1).compress(raw[: ADVISED_ABOVE - 1]))
    assert one_frame_advice(small, _decompress(small)[1]) is None


def test_a_corrupt_member_stops_the_checkpoints_with_the_checked_pass(tmp_path: Path) -> None:
    # indexed_gzip alone gives bytes without end on this file, in 1 MiB reads: gated by zlib, it stops.
    data = _damaged(FILES["members.gz"], len(FILES["members.gz"]) // 2)
    path = _write(tmp_path, "bad.gz", data)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptMetaFileError):
            b"".join(Decompression(path, fd, GZIP, spacing=SPACING, block=1 << 20))
    finally:
        os.close(fd)


def test_a_zstd_read_past_a_checkpoint_reads_little_of_the_next_frame(tmp_path: Path) -> None:
    # What a slice owner of the collective reader does at its slice's end: finish a line a few bytes
    # into the next frame. That needs the next frame's first block (a few KiB compressed), not a whole
    # read of 128 KiB: at W = 8 on a 5 MB file, that was 8% of the file read again per build.
    # Lines that compress about 8x, as real paths do (the demo's compress 70x): a frame of 1 MiB is
    # larger than a read of 128 KiB, its first block (128 KiB of text) much smaller.
    tags = np.random.default_rng(0).integers(0, 1 << 16, 60_000).tolist()
    raw = b"".join(b'{"path": "img/%07d.jpg", "tag": "%04x"}\n' % (i, t) for i, t in enumerate(tags))
    path = _write(tmp_path, "big.frames.zst", _zstd_frames(raw, 1 << 20))
    _, cp = _decompress(path)
    (out1, in1), (_, in2) = cp.points[1], cp.points[2]
    assert in2 - in1 > 128 << 10  # a frame is larger compressed than a whole read
    fd = os.open(path, os.O_RDONLY)
    try:
        with DecompressedView(path, fd, cp) as view:
            me = psutil.Process()
            before = me.io_counters().read_chars
            assert view.read(int(out1) - 50, int(out1) + 20) == raw[int(out1) - 50 : int(out1) + 20]
            read = me.io_counters().read_chars - before
        assert int(in1) <= read <= int(in1) + (48 << 10), (read, int(in1))
    finally:
        os.close(fd)
