"""Compressed meta files read in place through MetaFile: the same samples and shards as the plain
file of the same lines, for every plan kind; bad input is a clear error, never a wrong sample."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zstandard

from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files import formats
from rank_dataset.files.formats import spans as spans_mod
from rank_dataset.files.formats.zstd import ZSTD
from rank_dataset.files.read.metafile import MetaFile
from rank_dataset.plan.mix import MixPlan, Source
from rank_dataset.plan.spec import ShardSpec
from tests_helpers import COMPRESSORS, compressed_pair, gzip_members, hostile_lines, zstd_frames


@pytest.fixture(autouse=True)
def _small_spans(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Small spans, so that small files have many (and reads cross span boundaries).
    monkeypatch.setattr(spans_mod, "SPAN", 32 << 10)
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))


def _lines(n: int, tag: str = "a") -> bytes:
    # JSON lines with non-ASCII text, amid hostile_lines' blank lines, CRLF endings and byte order mark.
    return hostile_lines(n, lambda i: f'{{"path": "{tag}/{i:06d}.jpg", "label": {i * 7919 % 1000}, "t": "é{i}"}}')


def _pair(tmp_path: Path, name: str, raw: bytes) -> tuple[MetaFile, MetaFile]:
    plain, packed = compressed_pair(tmp_path, name, raw)
    return MetaFile(plain), MetaFile(packed)


def _specs(n: int) -> list[ShardSpec]:
    specs = [ShardSpec(n, w, r, seed=3, epoch=1) for w in (1, 3, 8) for r in range(w)]
    specs += [ShardSpec(n, 4, r, mini_epoch=3, mini_epoch_idx=i, seed=5) for r in range(4) for i in range(3)]
    specs += [ShardSpec(n, 5, r, is_test=True) for r in range(5)]
    return specs


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_shards_are_those_of_the_plain_file(tmp_path: Path, name: str) -> None:
    text, packed = _pair(tmp_path, name, _lines(6000))
    assert len(packed) == len(text) > 5000
    for spec in _specs(len(text)):
        idx = spec.indices()
        a, b = text.read(idx), packed.read(idx)
        assert np.array_equal(a.bounds, b.bounds) and bytes(a.data) == bytes(b.data), spec
    for i in (0, 1, len(text) // 2, len(text) - 1):
        assert packed[i] == text[i]
        assert packed.where(i).rsplit(":", 1)[1] == text.where(i).rsplit(":", 1)[1]
    assert packed.read(np.arange(len(text))).texts(range(len(text))) == [text[i] for i in range(len(text))]


def test_a_mix_of_compressed_files_gives_the_plain_files_shards(tmp_path: Path) -> None:
    raw_a, raw_b = _lines(3000, "a"), _lines(1700, "b")
    for name, raw in (("a.txt", raw_a), ("b.txt", raw_b)):
        (tmp_path / name).write_bytes(raw)
    (tmp_path / "a.gz").write_bytes(gzip_members(raw_a, 30_000))
    (tmp_path / "b.zst").write_bytes(zstd_frames(raw_b, 30_000))
    text, packed = MetaFile([tmp_path / "a.txt", tmp_path / "b.txt"]), MetaFile([tmp_path / "a.gz", tmp_path / "b.zst"])
    sizes = [len(MetaFile(tmp_path / "a.txt")), len(MetaFile(tmp_path / "b.txt"))]
    plan = MixPlan.from_sources(sizes, [Source("a", repeat=0.5), Source("b", weight=2)])
    for r in range(4):
        spec = ShardSpec(plan.epoch_size, 4, r, seed=9, mix=plan)
        a, b = text.read(spec.indices()), packed.read(spec.indices())
        assert np.array_equal(a.bounds, b.bounds) and bytes(a.data) == bytes(b.data)


@pytest.mark.parametrize("name", ["one.gz", "frames.zst"])
def test_a_file_rewritten_in_place_is_metafilechangederror(tmp_path: Path, name: str) -> None:
    raw = _lines(3000)
    _, packed = _pair(tmp_path, name, raw)
    path = packed.paths[0]
    data = COMPRESSORS[name](raw.replace(b"a/0", b"a/9"))  # other lines, the same length
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data)
        f.truncate()
    with pytest.raises(MetaFileChangedError):
        packed.read(np.arange(100))
    with pytest.raises(MetaFileChangedError):
        packed.raw(7)


@pytest.mark.parametrize("name", ["one.gz", "members.gz", "frames.zst"])
def test_a_corrupt_file_is_an_error_naming_file_and_compressed_offset(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    data = bytearray(COMPRESSORS[name](_lines(3000)))
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetaFileError) as info:
        MetaFile(path)
    assert info.value.path == path and f"compressed byte {info.value.offset:,}" in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["one.gz", "one.zst"])
def test_a_truncated_file_is_an_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    data = COMPRESSORS[name](_lines(3000))
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptMetaFileError, match="truncated"):
        MetaFile(path)


def test_lines_not_utf8_in_a_gz_are_named_by_file_and_line(tmp_path: Path) -> None:
    raw = b"a 1\nb 2\n\nc \xff\xfe 3\nd 4\n"
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(raw))
    mf = MetaFile(path)
    with pytest.raises(ValueError, match=rf"{path}:4: line is not valid UTF-8"):
        mf.read(np.arange(len(mf)))
    with pytest.raises(ValueError, match=rf"{path}:4: line is not valid UTF-8"):
        mf[2]


def test_the_format_is_told_by_content_not_name(tmp_path: Path) -> None:
    raw = _lines(500)
    (tmp_path / "plain.txt").write_bytes(raw)
    (tmp_path / "packed.txt").write_bytes(gzip.compress(raw))
    (tmp_path / "packed.gz").write_bytes(zstandard.ZstdCompressor().compress(raw))
    text = MetaFile(tmp_path / "plain.txt")
    for name in ("packed.txt", "packed.gz"):
        mf = MetaFile(tmp_path / name)
        assert [mf[i] for i in range(len(mf))] == [text[i] for i in range(len(text))]


def test_nothing_is_left_open(tmp_path: Path) -> None:
    _, packed = _pair(tmp_path, "members.gz", _lines(3000))
    before = len(os.listdir("/proc/self/fd"))
    packed.read(np.arange(len(packed))[::-1])
    packed[3]
    assert len(os.listdir("/proc/self/fd")) == before


def test_group_by_reads_a_compressed_file_and_a_parquet_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rank_dataset import MetaFile, group_by

    p = tmp_path / "meta.txt.gz"
    p.write_bytes(gzip.compress(b"".join(f"img_{i}.jpg {i % 3}\n".encode() for i in range(100))))
    assert MetaFile(p)[5] == "img_5.jpg 2"
    assert {k: v.tolist() for k, v in group_by(p).items()} == {k: list(range(k, 100, 3)) for k in range(3)}
    q = tmp_path / "meta.parquet"
    pq.write_table(pa.table({"path": ["a.jpg", "b.jpg"], "label": [0, 1]}), q)
    assert MetaFile(q)[1] == "b.jpg\t1"
    assert {k: v.tolist() for k, v in group_by(q).items()} == {0: [0], 1: [1]}


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_span_source_loads_each_range_exactly(tmp_path: Path, name: str) -> None:
    # Ranges in about file order (a build's batches): dense and sparse, overlapping, empty, crossing
    # spans, running past the end; loaded from two threads at once, as a build's threads do. A file
    # of one zstd frame is decoded by the source's own thread, ahead of the loads.
    rng = np.random.default_rng(len(name))
    raw = rng.integers(0, 256, 400_000, dtype=np.uint8).tobytes()
    path = tmp_path / name
    path.write_bytes(COMPRESSORS[name](raw))
    fd = os.open(path, os.O_RDONLY)
    opened: list[int] = []

    def open_fd() -> int:
        opened.append(os.open(path, os.O_RDONLY))
        return opened[-1]

    decompression = formats.Decompression(path, fd, formats.detect_path(path), spacing=50_000)
    assert b"".join(decompression) == raw
    source = formats.SpanSource(path, fd, decompression.checkpoints, open_fd)
    errors: list[BaseException] = []

    def loads(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for at in range(0, len(raw), 60_000):
                n = int(r.choice([1, 5, 300]))
                starts = np.sort(r.integers(at, at + 90_000, n)) + r.integers(-30, 30, n)
                starts = np.clip(starts, 0, len(raw))
                stops = starts + r.choice([0, 1, 40, 5_000, 70_000], n)
                pad = int(r.integers(0, 9))
                buf, shift = source.load(starts, stops, len(raw), pad=pad)
                cut = np.minimum(stops, len(raw))
                shifts = np.broadcast_to(shift, starts.shape)
                for s, e, k in zip(starts.tolist(), cut.tolist(), shifts.tolist()):
                    assert buf[s - k : e - k].tobytes() == raw[s:e], (seed, s, e)
                    assert e <= s or e - k + pad <= buf.size
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=loads, args=(seed,)) for seed in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors[0]
        assert source.read(1000, 300_000) == raw[1000:300_000]
    finally:
        source.close()
        os.close(fd)
    for other in opened:
        with pytest.raises(OSError):
            os.fstat(other)  # closed with the source
    # A decoder (and descriptor) a thread that decoded: the source's one, or the two loaders' and this one's.
    assert (len(opened) == 1) if name == "one.zst" else (1 <= len(opened) <= 3)


def test_span_source_cuts_ranges_at_the_decompressed_end_and_closes_what_it_opened(tmp_path: Path) -> None:
    # A range past the decompressed bytes is cut at their end (as Window.load cuts at the file's);
    # a decoder that cannot start (damaged gzip checkpoints) leaves no descriptor open.
    raw = b"".join(b"line %d\n" % i for i in range(20_000))
    path = tmp_path / "one.gz"
    path.write_bytes(gzip.compress(raw))
    fd = os.open(path, os.O_RDONLY)
    opened: list[int] = []

    def open_fd() -> int:
        opened.append(os.open(path, os.O_RDONLY))
        return opened[-1]

    try:
        decompression = formats.Decompression(path, fd, formats.GZIP, spacing=50_000)
        assert b"".join(decompression) == raw
        cp = decompression.checkpoints
        source = formats.SpanSource(path, fd, cp, open_fd)
        n = len(raw)
        buf, shift = source.load(np.array([n - 10]), np.array([n + 50]), n + 50, pad=8)
        k = int(np.broadcast_to(shift, (1,))[0])
        assert buf[n - 10 - k : n - k].tobytes() == raw[-10:]
        source.close()
        damaged = formats.Checkpoints(cp.format, cp.size, cp.points, b"GZIDX" + bytes(40))
        source = formats.SpanSource(path, fd, damaged, open_fd)
        with pytest.raises(CorruptMetaFileError, match="checkpoints cannot be loaded"):
            source.read(0, 100)
        source.close()
    finally:
        os.close(fd)
    for other in opened:
        with pytest.raises(OSError):
            os.fstat(other)


@pytest.mark.parametrize(
    ("points", "size"),
    [([0], 0), ([0], 10), ([0], 4 << 20), ([0, 3, 8], 9), ([0, 4, 5, 8, 12], 13), ([0, 1, 2, 3], 4), ([0, 7], 7)],
)
def test_zstd_span_cuts_are_the_frame_starts_and_every_span_sorted_and_distinct(points: list[int], size: int) -> None:
    # Frame starts on and between the span multiples, as many frames as spans, and none: every cut once.
    checkpoints = formats.Checkpoints(ZSTD, size, np.array([[p, p] for p in points], np.int64), b"")
    cuts = ZSTD.span_cuts(checkpoints, 4)
    assert cuts.dtype == np.int64
    assert cuts.tolist() == sorted(set(points) | set(range(0, size, 4)))


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_read_ahead_keeps_a_one_frame_files_first_spans_until_a_batch_pins_them(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a file of one zstd frame is read ahead (a read of any span decodes those before it); the
    # spans read ahead outlive the source's few kept ones until a pin reaches them or passes them.
    monkeypatch.setattr(spans_mod, "SPAN", 20_000)
    raw = b"".join(b"img/%06d.jpg %d\n" % (i, i % 7) for i in range(20_000))
    path = tmp_path / name
    path.write_bytes(COMPRESSORS[name](raw))
    fd = os.open(path, os.O_RDONLY)
    decompression = formats.Decompression(path, fd, formats.detect_path(path), spacing=50_000)
    assert b"".join(decompression) == raw
    source = formats.SpanSource(path, fd, decompression.checkpoints, lambda: os.open(path, os.O_RDONLY))
    try:
        started = source.read_ahead(8)
        assert started == (8 if name == "one.zst" else 0)
        if started:
            assert source.span(7) == raw[7 * 20_000 : 8 * 20_000]  # (waits for the decoder)
            assert set(range(8)) <= set(source._kept)  # more than the few kept: read ahead
            # A batch of lines starting in spans 0-2 pins them and span 3 (a line may run on into it).
            assert source.pin(0, 3 * 20_000 - 1) == (0, 4)
            source.unpin(0, 4)
            for k in range(9, len(raw) // 20_000):
                source.span(k)
            assert not set(range(4)) & set(source._kept)
            assert set(range(4, 8)) <= set(source._kept)  # not reached by a batch yet
        assert source.read(0, len(raw)) == raw
    finally:
        source.close()
        os.close(fd)


def test_a_build_that_fails_before_reading_ahead_is_done_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The source opened ahead of the first pass is closed (its descriptors, its decoder thread) when
    # the first pass fails; the next build reads the file whole.
    from rank_dataset.files.read import _gather as gather_mod

    monkeypatch.setattr(spans_mod, "SPAN", 20_000)
    raw = b"".join(b"img/%06d.jpg %d\n" % (i, i % 7) for i in range(20_000))
    path = tmp_path / "one.zst"
    path.write_bytes(COMPRESSORS["one.zst"](raw))
    mf = MetaFile(path)
    opened: list[formats.SpanSource] = []
    read_ahead = formats.SpanSource.read_ahead

    def counting(self: formats.SpanSource, count: int | None = None) -> int:
        opened.append(self)
        return read_ahead(self, count)

    monkeypatch.setattr(formats.SpanSource, "read_ahead", counting)
    first_pass = gather_mod._first_pass

    def failing(*args: object, **kwargs: object) -> object:
        raise OSError("the index could not be read")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(gather_mod, "_first_pass", failing)
    with pytest.raises(OSError, match="could not be read"):
        mf.read(np.arange(len(mf)))
    assert len(opened) == 1 and not opened[0]._kept
    assert len(os.listdir("/proc/self/fd")) == before
    assert not [t for t in threading.enumerate() if t.name.startswith("rank-dataset-spans") and t.is_alive()]
    monkeypatch.setattr(gather_mod, "_first_pass", first_pass)
    shard = mf.read(np.arange(len(mf))[::-1])
    assert shard.texts([0, len(mf) - 1]) == ["img/019999.jpg 0", "img/000000.jpg 0"]
    assert len(opened) == 2


@pytest.mark.parametrize("frame", [997, 4096, 32 << 10, 100_003, 1 << 30])
def test_zstd_frames_of_any_size_give_the_plain_files_shards(tmp_path: Path, frame: int) -> None:
    # Frames cut anywhere in a line (1 << 30: one frame, read ahead), rows across the 32 KiB spans'
    # edges and the frames', CRLF endings, a byte order mark and no newline after the last line.
    raw = _lines(3000)
    plain, packed = tmp_path / "meta.txt", tmp_path / "meta.zst"
    plain.write_bytes(raw)
    packed.write_bytes(zstd_frames(raw, frame))
    text, zst = MetaFile(plain), MetaFile(packed)
    for spec in [ShardSpec(len(text), 1, 0, seed=2), *(ShardSpec(len(text), 8, r, seed=2) for r in (0, 7))]:
        a, b = text.read(spec.indices()), zst.read(spec.indices())
        assert np.array_equal(a.bounds, b.bounds) and bytes(a.data) == bytes(b.data), spec
