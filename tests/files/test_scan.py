"""The line scanner: its contract (samples are the non-blank lines without their ending, whatever the
chunk boundaries), and a leading UTF-8 byte order mark is not part of the first sample."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile, build_index
from rank_dataset.files.index import scan as scan_mod
from rank_dataset.files.index.scan import BOM
from tests_helpers import random_file, reference_index


@pytest.mark.parametrize(
    ("data", "samples"),
    [
        (BOM + b"a 1\nb 2\n", [b"a 1", b"b 2"]),
        (BOM + b"a 1\r\nb 2", [b"a 1", b"b 2"]),
        (BOM + b"\n\na 1\n", [b"a 1"]),  # a first line that is only the mark is empty
        (BOM + b"  \r\na 1\n", [b"a 1"]),
        (BOM + b" a 1\n", [b" a 1"]),  # what follows the mark is kept as it is
        (BOM, []),
        (BOM + b"x", [b"x"]),
        (b"a 1\n" + BOM + b"b 2\n", [b"a 1", BOM + b"b 2"]),  # only at the start of the file
        (b"\xef\xbb\xbe a\n", [b"\xef\xbb\xbe a"]),  # U+FEFE: not the mark
    ],
)
def test_leading_bom_is_not_part_of_the_first_sample(tmp_path: Path, data: bytes, samples: list[bytes]) -> None:
    p = tmp_path / "m.txt"
    p.write_bytes(data)
    for chunk in (1, 2, 1 << 20):
        spans = build_index(p, chunk_size=chunk)
        assert [data[s:e] for s, e in spans] == samples
    if samples:
        mf = MetaFile(p)
        assert [mf.raw(i) for i in range(len(mf))] == samples
        assert mf.read(np.arange(len(mf))[::-1]).texts(range(len(mf))) == [s.decode() for s in samples[::-1]]
        line = data[: data.index(samples[0])].count(b"\n") + 1
        assert mf.where(0) == f"{p.resolve()}:{line}"


def reference_samples(data: bytes) -> list[bytes]:
    """The contract, written plainly: non-blank lines without their ending."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip(b" \t\r\x0b\x0c"):
            out.append(line)
    return out


@pytest.mark.parametrize(
    "data",
    [
        b"a\nb\nc\n",
        b"a\nb\nc",  # no final newline
        b"a\r\nb\r\nc\r\n",
        b"a\r\nb\nc",
        b"\n\n\na\n\n",
        b"  \n\t\na b\n \t \r\n x\n",  # whitespace-only lines are not samples, leading space is kept
        b"only",
        b"x\r",
        b"\xe5\x9b\xbe\xe7\x89\x87/1.jpg 3\n\xc3\xa9 4\n",
    ],
)
def test_samples_follow_the_contract(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "m.txt"
    p.write_bytes(data)
    mf = MetaFile(p)
    expect = reference_samples(data)
    assert len(mf) == len(expect)
    assert [mf.raw(i) for i in range(len(mf))] == expect
    assert [mf[i] for i in range(len(mf))] == [x.decode() for x in expect]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_chunk_boundaries_do_not_matter(tmp_path: Path, chunk: int) -> None:
    rng = np.random.default_rng(chunk)
    parts = []
    for _ in range(500):
        kind = rng.integers(0, 6)
        parts.append([b"", b"   ", b"\t", b"x" * int(rng.integers(1, 40)), b" y ", b"z\r"][kind])
    data = b"\n".join(parts) + (b"\n" if chunk % 2 else b"")
    p = tmp_path / "m.txt"
    p.write_bytes(data)
    spans = build_index(p, chunk_size=chunk)
    got = [data[s:e] for s, e in spans]
    assert got == reference_samples(data)


@pytest.mark.parametrize("seed", range(6))
def test_chunks_match_a_plain_reference_whatever_their_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Chunks of one byte up to ones larger than the file: lines longer than a chunk and than the
    # page a chunk bound looks at first, CRLFs and blank lines at every place relative to a bound.
    rng = np.random.default_rng(seed)
    p = tmp_path / "m.txt"
    for trial in range(12):
        data = random_file(rng, int(rng.choice([50, 600, 20_000])))
        p.write_bytes(data)
        mark = int(rng.integers(1, 200))
        monkeypatch.setattr(scan_mod, "MARK", mark)
        spans, marks = reference_index(data, mark)
        for chunk_size in sorted({1, 2, 3, int(rng.integers(4, 100)), 4096, 1 << 20}):
            if chunk_size < 64 and len(data) > 1000:
                continue  # a thread job per byte: slow, and the small files cover these sizes
            chunks = list(scan_mod.scan_map(p, lambda chunk: chunk, chunk_size))
            what = f"seed {seed}, file {trial}, chunk size {chunk_size}: {data[:60]!r}"
            # The chunks tile the file, each ending just past a newline but the last.
            assert [c.offset for c in chunks] == [0] + [c.offset + c.nbytes for c in chunks[:-1]], what
            assert sum(c.nbytes for c in chunks) == len(data), what
            assert all(data[c.offset + c.nbytes - 1] == ord("\n") for c in chunks[:-1]), what
            got = [(int(s), int(s + n)) for c in chunks for s, n in zip(c.starts, c.lengths)]
            assert got == spans, what
            assert all(c.ascii == data[c.offset : c.offset + c.nbytes].isascii() for c in chunks), what
            assert sum(c.newlines for c in chunks) == data.count(b"\n"), what
            lines_before = np.cumsum([0] + [c.newlines for c in chunks[:-1]])
            got_marks = [(int(o), int(k + before)) for c, before in zip(chunks, lines_before) for o, k in c.marks]
            assert got_marks == marks, what


def test_chunk_bounds_stop_at_a_file_shorter_than_its_size(tmp_path: Path) -> None:
    # A file that shrank after its size was taken: the bounds end (the read of the missing bytes
    # then fails), they do not look for a newline past the end forever.
    p = tmp_path / "m.txt"
    p.write_bytes(b"a\n" * 5000)
    with open(p, "rb") as f:
        assert scan_mod.chunk_bounds(f, 50_000, 1000) == [0, *range(1002, 10_000, 1000), 50_000]


def _cut(data: bytes, rng: np.random.Generator) -> list[bytes]:
    """``data`` in blocks of random sizes, empty ones and ones without a newline among them."""
    cuts = np.sort(rng.integers(0, len(data) + 1, int(rng.integers(0, 40))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@pytest.mark.parametrize("seed", range(6))
def test_blocks_scan_as_the_file_of_their_bytes(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    # scan_blocks (a compressed file's decompressed bytes, made in a thread of their own) finds what
    # a scan of a file of the same bytes does, wherever the blocks are cut.
    rng = np.random.default_rng(100 + seed)
    for trial in range(12):
        data = random_file(rng, int(rng.choice([50, 600, 20_000])))
        mark = int(rng.integers(1, 200))
        monkeypatch.setattr(scan_mod, "MARK", mark)
        spans, marks = reference_index(data, mark)
        chunks = list(scan_mod.scan_blocks(iter(_cut(data, rng)), lambda chunk: chunk))
        what = f"seed {seed}, file {trial}: {data[:60]!r}"
        assert [c.offset for c in chunks] == [0] + [c.offset + c.nbytes for c in chunks[:-1]], what
        assert sum(c.nbytes for c in chunks) == len(data), what
        assert [(int(s), int(s + n)) for c in chunks for s, n in zip(c.starts, c.lengths)] == spans, what
        assert sum(c.newlines for c in chunks) == data.count(b"\n"), what
        lines_before = np.cumsum([0] + [c.newlines for c in chunks[:-1]])
        got_marks = [(int(o), int(k + before)) for c, before in zip(chunks, lines_before) for o, k in c.marks]
        assert got_marks == marks, what


def test_blocks_error_reaches_the_reader_and_their_thread_ends() -> None:
    # The blocks are made in a thread of their own: an error there is the reader's, and a reader
    # that stops early stops the maker (its generator closed, as a decoder's cleanup needs).
    closed: list[str] = []

    def blocks(fail: bool):  # type: ignore[no-untyped-def]
        try:
            for k in range(1000):
                if fail and k == 3:
                    raise ValueError("corrupt at block 3")
                yield b"a 1\nb 2\n" * 100
        finally:
            closed.append("fail" if fail else "stop")

    before = threading.active_count()
    with pytest.raises(ValueError, match="corrupt at block 3"):
        for _ in scan_mod.scan_blocks(blocks(True), lambda chunk: chunk.nbytes):
            pass
    scan = scan_mod.scan_blocks(blocks(False), lambda chunk: chunk.nbytes)
    assert next(scan) == 800
    scan.close()
    assert closed == ["fail", "stop"]
    assert threading.active_count() == before


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_build_index_refuses_a_compressed_file(tmp_path, suffix: str) -> None:
    import gzip

    import zstandard

    raw = b"a 1\nb 2\n"
    data = gzip.compress(raw) if suffix == ".gz" else zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / f"meta.txt{suffix}"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"build_index\(.*meta\.txt.*\): the file is (gzip|zstd).*MetaFile\(path\)"):
        build_index(path)
    assert len(MetaFile(path)) == 2
