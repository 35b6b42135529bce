"""The native kernels (``core/_kernels.c``) against their numpy reference (``core/_reference.py``), byte
for byte, on random and hostile inputs; the path picker (``core/native.py``) and its environment
variable, in subprocesses.

Run against a sanitizer build too (``make test-asan``): with ``RANK_DATASET_NATIVE=require`` a
library that does not load fails these tests instead of skipping them.
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset.core import _reference as ref
from rank_dataset.core import native
from rank_dataset.core._native_lib import Kernels
from rank_dataset.files.index.scan import scan_buffer
from rank_dataset.files.read.lines import _line_ok, check_utf8
from rank_dataset.files.read.lines import bounds_ok as _bounds_ok
from rank_dataset.files.read.lines import rows_ok as _rows_ok


def _u8(b: bytes) -> np.ndarray:
    return np.frombuffer(b, np.uint8)


# --- newline counting and finding --------------------------------------------------------------------

_ALPHABET = [b"a", b"b", b" ", b"\t", b"\n", b"\r", b"\x00", b"\x0b", b"\xef", b"\xbb", b"\xbf", b"\xc3", b"\x80"]


def _random_bytes(rng: np.random.Generator, size: int, newline_weight: float = 0.1) -> bytes:
    weights = np.ones(len(_ALPHABET))
    weights[_ALPHABET.index(b"\n")] = newline_weight * len(_ALPHABET)
    weights[_ALPHABET.index(b"a")] = 3
    picks = rng.choice(len(_ALPHABET), size=size, p=weights / weights.sum())
    return b"".join(_ALPHABET[i] for i in picks)


@pytest.mark.parametrize("seed", range(20))
def test_count_and_find_match_numpy(kernels: Kernels, seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = _u8(_random_bytes(rng, int(rng.integers(0, 3000))))
    for byte in (10, 0, 13, 0xBF):
        assert kernels.count_byte(buf, byte) == ref.count_byte(buf, byte)
        np.testing.assert_array_equal(kernels.find_byte(buf, byte), ref.find_byte(buf, byte))


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 15, 16, 17, 255 * 8 - 1, 255 * 8, 255 * 8 + 1, 10_000])
def test_count_at_word_and_counter_edges(kernels: Kernels, size: int) -> None:
    """Every byte a newline, none, and one at each end: the 8-byte words and 255-word counters' edges."""
    for buf in (np.full(size, 10, np.uint8), np.zeros(size, np.uint8), np.full(size, 0x8A, np.uint8)):
        assert kernels.count_byte(buf) == ref.count_byte(buf)
    if size:
        buf = np.zeros(size, np.uint8)
        buf[[0, -1]] = 10
        assert kernels.count_byte(buf) == ref.count_byte(buf) == (1 if size == 1 else 2)
        np.testing.assert_array_equal(kernels.find_byte(buf), ref.find_byte(buf))


def test_count_a_read_only_buffer_and_a_strided_one(kernels: Kernels) -> None:
    data = b"a\nb\n\nc" * 100
    assert kernels.count_byte(data) == data.count(b"\n")
    strided = _u8(data)[::2]
    assert kernels.count_byte(strided) == ref.count_byte(strided)


def test_native_find_reports_a_short_output_array(kernels: Kernels) -> None:
    lib = kernels._lib
    buf = _u8(b"\n\n\n")
    out = np.full(2, -7, np.int64)
    assert lib.rd_find_byte(buf.ctypes.data, 3, 10, out.ctypes.data, 2) == -3  # RD_ECAP
    assert out.tolist() == [0, 1]  # the first cap of them, nothing past
    assert lib.rd_count_byte(buf.ctypes.data, -1, 10) == -1  # a negative size is refused
    assert lib.rd_count_byte(None, 5, 10) == -1  # so is a null buffer with a size
    assert lib.rd_count_byte(None, 0, 10) == 0


# --- the chunk scan -----------------------------------------------------------------------------------

_HOSTILE_SCANS = [
    b"",
    b"\n",
    b"\n\n\n",
    b"\r\n",
    b"\r",
    b"a",
    b" ",
    b"a\r",
    b"a\r\r\n",
    b"\ra",
    b"\x00",
    b"a\x00b\n\x00\n",
    b" \t\x0b\x0c\r\n  \n\t\n",
    b"\xef\xbb\xbf",
    b"\xef\xbb\xbf\n",
    b"\xef\xbb\xbf\r\n",
    b"\xef\xbb\xbf\r",
    b"\xef\xbb\xbfa",
    b"\xef\xbb\xbf \n a\n",
    b"\xef\xbb",
    b"\xef\xbb\n\xbf",
    b"a 1\n\n  \nbb 2\r\nc 3",
    b"x" * 70_000 + b"\n" + b"y" * 70_001,  # lines longer than any buffer
    b"\n" * 1000 + b"z",
    b"\xff\xfe\xc3\x28\n\x80\n",
]


def _same_scan(a: ref.LineScan, b: ref.LineScan) -> None:
    np.testing.assert_array_equal(a.starts, b.starts)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert (a.ascii, a.newlines) == (b.ascii, b.newlines)
    np.testing.assert_array_equal(a.marks.reshape(-1, 2), b.marks.reshape(-1, 2))
    for arr in (a.starts, a.lengths, a.marks, b.starts, b.lengths, b.marks):
        assert arr.dtype == np.int64


@pytest.mark.parametrize("data", _HOSTILE_SCANS, ids=range(len(_HOSTILE_SCANS)))
@pytest.mark.parametrize("offset", [0, 5, 4 << 20])
@pytest.mark.parametrize("last", [True, False])
def test_scan_matches_numpy_on_hostile_buffers(kernels: Kernels, data: bytes, offset: int, last: bool) -> None:
    buf = _u8(data)
    want = ref.scan_lines(buf, offset, last)
    _same_scan(kernels.scan_lines(buf, offset, last), want)
    chunk = scan_buffer(buf, offset, last)  # the reference is the files layer's scan, unchanged
    _same_scan(ref.LineScan(chunk.starts, chunk.lengths, chunk.ascii, chunk.newlines, chunk.marks), want)


@pytest.mark.parametrize("seed", range(60))
def test_scan_matches_numpy_on_random_buffers(kernels: Kernels, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = _random_bytes(rng, int(rng.integers(0, 2000)), newline_weight=float(rng.choice([0.02, 0.1, 0.4])))
    if seed % 3 == 0:
        data = ref.BOM + data
    buf = _u8(data)
    offset = int(rng.choice([0, 0, int(rng.integers(0, 1 << 40))]))
    mark = int(rng.choice([1, 3, 8, 64, 1 << 20]))
    for last in (True, False):
        _same_scan(kernels.scan_lines(buf, offset, last, mark), ref.scan_lines(buf, offset, last, mark))


def test_scan_marks_a_line_longer_than_the_mark_interval_once_per_multiple(kernels: Kernels) -> None:
    buf = _u8(b"a" * 50 + b"\n" + b"b\n" * 10)
    got = kernels.scan_lines(buf, 3, True, 10)
    _same_scan(got, ref.scan_lines(buf, 3, True, 10))
    # Multiples 10, 20, ..., 70 of the file: five fall in the long line (the next line, at 54, is
    # theirs), then the lines at 60 and 70 (lines 4 and 9 of the chunk).
    assert got.marks.tolist() == [[54, 1]] * 5 + [[60, 4], [70, 9]]


@pytest.mark.parametrize(
    "data",
    [b"x" * 300_000 + b"\n" + b"a\n" * 200_000, b"a b c\n" * 100_000, b"\n" * 300_000 + b"a\n" * 1000],
    ids=["short-lines-after-a-long-one", "short-lines", "blank-lines"],
)
def test_scan_sizes_its_arrays_whatever_the_lines(kernels: Kernels, data: bytes) -> None:
    """Lines much shorter after the first 256 KiB (which size the arrays): scanned again, exactly."""
    buf = _u8(data)
    got = kernels.scan_lines(buf, 0, True)
    _same_scan(got, ref.scan_lines(buf, 0, True))
    assert got.starts.base is None or got.starts.base.size == got.starts.size  # trimmed, not a view


def test_scan_of_a_read_only_mmap(kernels: Kernels, tmp_path: Path) -> None:
    p = tmp_path / "meta.txt"
    p.write_bytes(b"a 1\r\n\n b\nlast")
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = np.frombuffer(mm, np.uint8)
        _same_scan(kernels.scan_lines(buf, 0, True), ref.scan_lines(buf, 0, True))
        del buf


def test_scan_refuses_bad_arguments(kernels: Kernels) -> None:
    with pytest.raises(ValueError):
        kernels.scan_lines(_u8(b"a\n"), -1, True)
    with pytest.raises(ValueError):
        kernels.scan_lines(_u8(b"a\n"), 0, True, 0)
    # The raw call: arrays too small for what the buffer holds are an error, not a write past them.
    lib, buf = kernels._lib, _u8(b"a\nb\nc\n")
    starts, lengths, marks = np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros((1, 2), np.int64)
    code = lib.rd_scan_lines(
        buf.ctypes.data, 6, 0, 1, 1 << 20, starts.ctypes.data, lengths.ctypes.data, 1, marks.ctypes.data, 0, 0
    )
    assert code == -1  # no result array
    result = np.zeros(4, np.int64)
    args = (buf.ctypes.data, 6, 0, 1, 1 << 20, starts.ctypes.data, lengths.ctypes.data, 1, marks.ctypes.data)
    assert lib.rd_scan_lines(*args, 1, result.ctypes.data) == -3  # two samples, room for one
    assert lib.rd_scan_lines(*args[:7], 3, marks.ctypes.data, 0, result.ctypes.data) == -3  # a mark, no room
    big = 1 << 62
    assert lib.rd_scan_lines(*args[:2], big * 2 - 1, *args[3:], 1, result.ctypes.data) == -1  # offset overflows


# --- the row gather -----------------------------------------------------------------------------------


def _rows(rng: np.random.Generator, n: int, longest: int, slack: int = 0) -> tuple[Any, ...]:
    lengths = rng.integers(0, longest + 1, n)
    src_starts = np.cumsum(lengths) - lengths + rng.integers(0, slack + 1, n).cumsum()
    src = rng.integers(0, 256, int(src_starts[-1] + lengths[-1]) if n else 0, dtype=np.uint8)
    order = rng.permutation(n)  # a sampler's random order
    dst_starts = (np.cumsum(lengths[order]) - lengths[order])[np.argsort(order)]
    return src, src_starts, lengths, dst_starts, int(lengths.sum())


@pytest.mark.parametrize(("n", "longest"), [(0, 5), (1, 0), (1, 9), (50, 40), (3000, 60), (40, 70_000), (5000, 3)])
@pytest.mark.parametrize("dtypes", [(np.int64,) * 3, (np.uint32,) * 3, (np.int32, np.uint64, np.uint32)])
def test_copy_rows_matches_numpy(impl: Any, n: int, longest: int, dtypes: tuple[Any, ...]) -> None:
    rng = np.random.default_rng(n + longest)
    src, src_starts, lengths, dst_starts, total = _rows(rng, n, longest, slack=3)
    fill = rng.integers(0, 256, total + 16, dtype=np.uint8)  # bytes outside the rows must stay
    want, got = fill.copy(), fill.copy()
    ref.copy_rows(src, src_starts, lengths, want, dst_starts)
    s, ln, d = (a.astype(t) for a, t in zip((src_starts, lengths, dst_starts), dtypes))
    impl.copy_rows(src, s, ln, got, d)
    assert got.tobytes() == want.tobytes()
    for k in range(min(n, 50)):  # and it is what it says
        assert got[dst_starts[k] : dst_starts[k] + lengths[k]].tobytes() == src[src_starts[k] :][: lengths[k]].tobytes()


def test_copy_rows_at_both_buffers_edges(kernels: Kernels) -> None:
    src = np.arange(10, dtype=np.uint8)
    dst = np.zeros(10, np.uint8)
    kernels.copy_rows(src, [0, 7], [3, 3], dst, [7, 0])  # first and last bytes of each
    assert dst.tolist() == [7, 8, 9, 0, 0, 0, 0, 0, 1, 2]


_HOSTILE_ROWS = [
    ([8], [3], [0]),  # past the end of src
    ([0], [11], [0]),  # longer than src
    ([-1], [2], [0]),  # before src
    ([0], [-1], [0]),  # a negative length
    ([0], [3], [8]),  # past the end of dst
    ([0], [2], [-1]),  # before dst
    ([1 << 62], [1 << 62], [0]),  # a start + length that overflows int64
    ([0], [1 << 62], [(1 << 63) - 4]),
    ([0, 2, 9], [1, 1, 2], [0, 1, 2]),  # a bad row after good ones: nothing is written
]


@pytest.mark.parametrize(("s", "ln", "d"), _HOSTILE_ROWS)
def test_copy_rows_refuses_spans_outside_the_buffers(kernels: Kernels, s: list, ln: list, d: list) -> None:
    src, dst = np.arange(10, dtype=np.uint8), np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="outside"):
        kernels.copy_rows(src, np.array(s, np.int64), np.array(ln, np.int64), dst, np.array(d, np.int64))
    assert not dst.any()


def test_copy_rows_refuses_a_read_only_or_mismatched_destination(kernels: Kernels) -> None:
    src = np.arange(10, dtype=np.uint8)
    with pytest.raises(ValueError):
        kernels.copy_rows(src, [0], [2], np.frombuffer(bytes(10), np.uint8), [0])
    with pytest.raises(ValueError):
        kernels.copy_rows(src, [0, 1], [2], np.zeros(10, np.uint8), [0])
    with pytest.raises(TypeError):
        kernels.copy_rows(src, [0.5], [2], np.zeros(10, np.uint8), [0])


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
@pytest.mark.parametrize("seed", range(4))
def test_pack_rows_matches_numpy(impl: Any, dtype: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    src, src_starts, lengths, _, total = _rows(rng, int(rng.integers(0, 3000)), 80, slack=5)
    order = rng.permutation(lengths.size)
    want, got = np.full(total + 3, 7, np.uint8), np.full(total + 3, 7, np.uint8)
    want_off, got_off = np.empty(lengths.size + 1, dtype), np.empty(lengths.size + 1, dtype)
    ref.pack_rows(src, src_starts[order], lengths[order], want, want_off)
    impl.pack_rows(src, src_starts[order], lengths[order], got, got_off)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(got_off, want_off)


def test_pack_rows_refuses_what_does_not_fit(kernels: Kernels) -> None:
    src, dst = np.arange(10, dtype=np.uint8), np.zeros(4, np.uint8)
    off = np.zeros(3, np.uint32)
    with pytest.raises(ValueError, match="too small"):
        kernels.pack_rows(src, [0, 5], [3, 3], dst, off)
    with pytest.raises(ValueError, match="outside"):
        kernels.pack_rows(src, [0, 9], [1, 2], dst, off)
    assert not dst.any() and not off.any()
    with pytest.raises(TypeError):
        kernels.pack_rows(src, [0, 5], [1, 1], dst, np.zeros(3, np.int32))


def _sparse(tmp_path: Path, size: int) -> np.memmap:
    """A file of ``size`` bytes that takes no disk but the pages written (a sparse file), mapped."""
    p = tmp_path / f"sparse-{size}"
    with open(p, "wb") as f:
        f.truncate(size)
    return np.memmap(p, np.uint8, "r+", shape=(size,))


_GIB = 1 << 30


def test_copy_and_pack_rows_past_4_gib(kernels: Kernels, tmp_path: Path) -> None:
    """Offsets past 2**32 in both buffers, with int64 offsets, on sparse 5 GiB files (a few pages written)."""
    src, dst = _sparse(tmp_path, 5 * _GIB), _sparse(tmp_path, 5 * _GIB + 1)
    at = [4 * _GIB + 17, (1 << 32) - 3, 5 * _GIB - 5]  # past 4 GiB, across it, at the very end
    for i, a in enumerate(at):
        src[a : a + 5] = np.frombuffer(f"row{i}!".encode()[:5], np.uint8)
    to = np.array([5 * _GIB - 4, 3, (1 << 32) - 1], np.int64)
    kernels.copy_rows(src, np.array(at), np.array([5, 5, 5]), dst, to)
    assert [dst[t : t + 5].tobytes() for t in to.tolist()] == [b"row0!", b"row1!", b"row2!"]
    with pytest.raises(ValueError, match="outside"):
        kernels.copy_rows(src, np.array([5 * _GIB - 4]), np.array([5]), dst, np.array([0]))
    packed, offsets = np.zeros(15, np.uint8), np.zeros(4, np.int64)
    kernels.pack_rows(src, np.array(at, np.int64), np.array([5, 5, 5]), packed, offsets)
    assert packed.tobytes() == b"row0!row1!row2!" and offsets.tolist() == [0, 5, 10, 15]
    # A total past 4 GiB does not fit uint32 offsets: refused before a byte is copied.
    with pytest.raises(ValueError, match="overflow"):
        kernels.pack_rows(src, np.array([0, 0]), np.array([3 * _GIB, 2 * _GIB]), dst, np.zeros(3, np.uint32))
    del src, dst


# --- UTF-8 --------------------------------------------------------------------------------------------

_VALID = [b"", b"a", b"\x00", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80"]
_VALID += [b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", "é日本🎉".encode(), b"plain ascii text!"]
_INVALID = {
    "continuation first": [b"\x80", b"\xbf", b"\x80abc"],
    "overlong": [b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\x9f\xbf", b"\xf0\x80\x80\xaf", b"\xf0\x8f\xbf\xbf"],
    "surrogate": [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb0\x80"],
    "truncated at end": [b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"abcdefgh\xe2"],
    "past U+10FFFF": [b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf", b"\xf8\x88\x80\x80\x80"],
    "never UTF-8": [b"\xfe", b"\xff", b"a\xffb"],
    "bad continuation": [b"\xe2\x28\xa1", b"\xc3\x28", b"\xf0\x9f\x98\x28", b"\xe2\x82a"],
}


def _first_invalid(rows: list[bytes]) -> int:
    for i, row in enumerate(rows):
        try:
            row.decode("utf-8")
        except UnicodeDecodeError:
            return i
    return -1


def _packed(rows: list[bytes], dtype: Any = np.uint32) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(r) for r in rows], np.int64)
    bounds = np.zeros(len(rows) + 1, dtype)
    np.cumsum(lengths, out=bounds[1:], dtype=bounds.dtype)
    return _u8(b"".join(rows)), bounds


@pytest.mark.parametrize("kind", list(_INVALID))
def test_utf8_every_class_of_invalid(impl: Any, kind: str) -> None:
    for bad in _INVALID[kind]:
        for pad in (b"", b"1234567", b"abcdefghijklmnop"):  # the bad byte at every place of a word
            rows = [*_VALID, pad + bad, b"ok", pad + bad]
            data, bounds = _packed(rows)
            assert impl.utf8_first_invalid(data, bounds) == len(_VALID), (bad, pad)
    data, bounds = _packed(_VALID)
    assert impl.utf8_first_invalid(data, bounds) == -1


def test_utf8_a_sequence_cut_across_two_rows_is_the_first_rows_fault(impl: Any) -> None:
    rows = [b"ok", b"x\xe2\x82", b"\xac y", b"fine"]  # "€" split between rows 1 and 2
    data, bounds = _packed(rows)
    assert impl.utf8_first_invalid(data, bounds) == _first_invalid(rows) == 1
    # The gather's check (which calls the kernel, or this reference) names that row too, not the next one.
    with pytest.raises(ValueError, match="line 1: line is not valid UTF-8"):
        check_utf8(lambda row: f"line {row}", data, bounds)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_utf8_matches_python_and_numpy_on_random_rows(kernels: Kernels, seed: int, dtype: Any) -> None:
    rng = np.random.default_rng(seed)
    pieces = _VALID + [b for group in _INVALID.values() for b in group]
    weights = np.array([20.0] * len(_VALID) + [1.0] * (len(pieces) - len(_VALID)))
    rows = []
    for _ in range(int(rng.integers(0, 300))):
        picks = rng.choice(len(pieces), size=int(rng.integers(0, 6)), p=weights / weights.sum())
        rows.append(b"".join(pieces[i] for i in picks))
    data, bounds = _packed(rows, dtype)
    want = _first_invalid(rows)
    assert kernels.utf8_first_invalid(data, bounds) == ref.utf8_first_invalid(data, bounds) == want
    if want < 0:
        check_utf8(str, data, bounds)
    else:
        with pytest.raises(ValueError):
            check_utf8(str, data, bounds)


def test_utf8_refuses_bounds_outside_the_data(kernels: Kernels) -> None:
    data = _u8(b"abcdef")
    for bounds in ([0, 7], [-1, 2], [3, 2, 6], [0, 1 << 40]):
        with pytest.raises(ValueError, match="outside"):
            kernels.utf8_first_invalid(data, np.array(bounds, np.int64))
    with pytest.raises(ValueError):
        kernels.utf8_first_invalid(data, np.array([], np.int64))
    assert kernels.utf8_first_invalid(data, np.array([6], np.int64)) == -1  # no rows


# --- stray bytes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(60))
def test_lines_bad_matches_the_gathers_line_check(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = _u8(_random_bytes(rng, int(rng.integers(1, 400)), newline_weight=0.03))
    n = int(rng.integers(0, 40))
    starts = rng.integers(0, buf.size + 1, n)
    if seed % 2:  # ascending, as a shard's rows (the kernel's newline search then runs once)
        starts.sort()
    ends = np.minimum(starts + rng.integers(0, 12, n), buf.size)
    ok = [_line_ok(buf[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]
    want = ok.index(False) if False in ok else -1
    assert impl.lines_bad(buf, starts.astype(np.int64), ends.astype(np.int64)) == want
    good = [k for k, fine in enumerate(ok) if fine]  # the rows that pass, alone: nothing found
    assert impl.lines_bad(buf, starts[good].astype(np.int64), ends[good].astype(np.int64)) == -1


def test_lines_bad_on_hostile_rows(kernels: Kernels) -> None:
    buf = _u8(b"a b\n \t\r\x0b\x0c\x00 x")
    cases = {(0, 3): -1, (0, 4): 0, (4, 9): 0, (3, 3): 0, (9, 10): -1, (10, 11): 0, (11, 12): -1}
    for (s, e), want in cases.items():
        got = kernels.lines_bad(buf, np.array([s]), np.array([e]))
        assert got == ref.lines_bad(buf, np.array([s]), np.array([e])) == want, (s, e)
    for s, e in ((0, 13), (-1, 2), (5, 4)):
        with pytest.raises(ValueError, match="outside"):
            kernels.lines_bad(buf, np.array([0, s]), np.array([1, e]))
    zero = np.array([0])
    assert kernels.lines_bad(_u8(b""), zero, zero) == ref.lines_bad(_u8(b""), zero, zero) == 0


# --- the gather's line checks -------------------------------------------------------------------------


def _candidate_spans(rng: np.random.Generator, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The file's samples, and spans near them that are not (a byte more or less at either end, two
    lines at once, empty), shuffled together."""
    found = ref.scan_lines(_u8(data), 0, True)
    s, ln = found.starts, found.lengths
    wrong_s = np.clip(s + rng.integers(-2, 3, s.size), 0, len(data))
    wrong_ln = np.clip(ln + rng.integers(-2, 6, s.size), 0, None)
    wrong_ln = np.minimum(wrong_ln, len(data) - wrong_s)
    starts, lengths = np.concatenate([s, s, wrong_s]), np.concatenate([ln, ln, wrong_ln])
    order = rng.permutation(starts.size)[: int(rng.integers(0, starts.size + 1))]
    return starts[order].astype(np.int64), lengths[order].astype(np.int64)


@pytest.mark.parametrize("seed", range(80))
def test_check_lines_matches_the_gathers_checks(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = _random_bytes(rng, int(rng.integers(0, 600)), newline_weight=float(rng.choice([0.05, 0.2])))
    if seed % 4 == 0:
        data = ref.BOM + data
    starts, lengths = _candidate_spans(rng, data)
    if seed % 2:
        starts, lengths = starts[np.argsort(starts, kind="stable")], lengths[np.argsort(starts, kind="stable")]
    bom = data.startswith(ref.BOM)
    buf = _u8(data + bytes(8))  # the gather reads a window with padding after it
    want = ref.check_lines(buf, starts, starts, lengths, len(data), bom)
    assert impl.check_lines(buf, starts, starts, lengths, len(data), bom) == want
    # The gather's own checks agree on whether every row is a sample.
    ends = starts + lengths
    gathers = (
        bool(
            _bounds_ok(buf, 0, starts, ends, len(data))
            and _rows_ok(buf, starts, ends)
            and all(b"\n" not in data[a:b] for a, b in zip(starts.tolist(), ends.tolist()))
        )
        if starts.size
        else True
    )
    assert (want == -1) == gathers
    # From a window of the file (its rows at other places in the buffer): the same answer.
    lo = int(rng.integers(0, len(data) + 1))
    keep = (starts - 1 >= lo) | ((starts == 3) & bom & (lo == 0)) | ((starts == 0) & (lo == 0))
    window = _u8(data[lo:] + bytes(8))
    s2, l2 = starts[keep], lengths[keep]
    want2 = ref.check_lines(buf, s2, s2, l2, len(data), bom)
    assert impl.check_lines(window, s2 - lo, s2, l2, len(data), bom) == want2


def test_check_lines_on_hostile_rows(kernels: Kernels) -> None:
    data = b"a b\r\n\n c\r\r\nx\ry\n  \nlast\r"
    buf = _u8(data + bytes(4))
    cases = {  # (start, length): is it a sample?
        (0, 3): True,  # "a b" before "\r\n"
        (0, 4): False,  # "a b\r": ends with a CR before "\n"
        (1, 2): False,  # does not follow a newline
        (5, 0): False,  # empty
        (6, 3): True,  # " c\r" before "\r\n": its CR is text
        (11, 3): True,  # "x\ry": a CR inside is text
        (15, 2): False,  # blank
        (18, 4): True,  # "last" before a final "\r"
        (18, 5): False,  # "last\r" at the end of the file
        (11, 6): False,  # two lines
    }
    for (s, n), sample in cases.items():
        one = np.array([s], np.int64), np.array([n], np.int64)
        got = kernels.check_lines(buf, one[0], one[0], one[1], len(data), False)
        assert got == ref.check_lines(buf, one[0], one[0], one[1], len(data), False) == (-1 if sample else 0), (s, n)
    with_bom = _u8(ref.BOM + b"a\n" + bytes(4))
    zero, three, one_byte = np.array([0]), np.array([3]), np.array([1])
    assert kernels.check_lines(with_bom, three, three, one_byte, 5, True) == -1  # after the mark
    assert kernels.check_lines(with_bom, zero, zero, np.array([4]), 5, True) == 0  # the mark is not text
    # Bytes the checks need that the buffer does not hold: an error, not a read past it.
    tight = _u8(b"ab\ncd\r")
    for at, start, n in ((0, 3, 2), (3, 3, 5), (5, 5, 2), (-1, 0, 1)):
        with pytest.raises(ValueError, match="outside"):
            kernels.check_lines(tight[: at + n + 1] if at >= 0 else tight, [at], [start], [n], 8, False)
    with pytest.raises(ValueError, match="outside"):
        kernels.check_lines(_u8(b"\ncd\r"), [1], [3], [2], 7, False)  # the byte after the CR is not held


def test_check_lines_looks_ahead_without_reading_rows_it_has_not_checked(kernels: Kernels) -> None:
    # The check starts loading rows 32 ahead of the one it checks, before checking their offsets: rows
    # outside the buffer (far past it, before it, of a length past it) after the first bad row change
    # nothing, and one after the good rows is the error it was (ASan runs this too: make test-asan).
    data = b"".join(b"row %02d\n" % i for i in range(40))
    buf = _u8(data + bytes(8))
    starts, lengths = np.arange(0, len(data), 7, dtype=np.int64), np.full(40, 6, np.int64)
    assert kernels.check_lines(buf, starts, starts, lengths, len(data), False) == -1
    wild_at = starts.copy()
    wild_at[33:] = [1 << 62, -(1 << 62), -1, len(buf), len(buf) - 1, 5, 5]
    wild_len = lengths.copy()
    wild_len[38:] = [1 << 62, -(1 << 62)]
    bad_at = wild_at.copy()
    bad_at[10] += 1  # row 10 is read from a place that does not follow a newline
    assert kernels.check_lines(buf, bad_at, starts, wild_len, len(data), False) == 10
    with pytest.raises(ValueError, match="outside"):
        kernels.check_lines(buf, wild_at, starts, wild_len, len(data), False)  # row 33: past the buffer


# --- the fused gather of a window, and the visiting order --------------------------------------------


def _gather_case(rng: np.random.Generator, data: bytes, starts: np.ndarray, lengths: np.ndarray) -> tuple[Any, ...]:
    """A shard's offsets whose rows take ``lengths`` in a random item order, and those rows' numbers."""
    rows = rng.permutation(starts.size)
    widths = np.empty(starts.size, np.int64)
    widths[rows] = lengths
    bounds = np.zeros(starts.size + 1, np.int64)
    np.cumsum(widths, out=bounds[1:])
    return rows, bounds


def _both_gathers(impl: Any, buf: np.ndarray, shift: int, starts: Any, rows: Any, bounds: Any, size: int, bom: bool):
    """``(result, dst)`` of ``impl``'s gather and of the reference's, from one zeroed destination each
    (a ValueError is the result ``"outside"``)."""
    total = int(np.asarray(bounds)[-1]) if np.asarray(bounds).size else 0
    got = []
    for one in (impl, ref):
        dst = np.full(total + 5, 0xAA, np.uint8)
        try:
            out: Any = one.gather_lines(buf, shift, starts, rows, bounds, dst, size, bom)
        except ValueError as exc:
            assert "outside" in str(exc)
            out = "outside"
        got.append((out, dst.tobytes()))
    return got


@pytest.mark.parametrize("seed", range(80))
def test_gather_lines_matches_the_reference(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = _random_bytes(rng, int(rng.integers(0, 600)), newline_weight=float(rng.choice([0.05, 0.2])))
    if seed % 4 == 0:
        data = ref.BOM + data
    bom = data.startswith(ref.BOM)
    if seed % 3 == 0:  # the file's samples only, in about file order: every row copied
        found = ref.scan_lines(_u8(data), 0, True)
        starts, lengths = found.starts.astype(np.int64), found.lengths.astype(np.int64)
    else:
        starts, lengths = _candidate_spans(rng, data)
    rows, bounds = _gather_case(rng, data, starts, lengths)
    for dtype in (np.uint32, np.int64):
        (mine, a), (want, b) = _both_gathers(
            impl, _u8(data), 0, starts, rows.astype(dtype), bounds.astype(dtype), len(data), bom
        )
        assert mine == want and a == b
        if seed % 3 == 0:
            assert want == -1
            shard = np.frombuffer(a, np.uint8)
            for k in range(starts.size):  # each row at its place, exactly
                r = int(rows[k])
                assert shard[bounds[r] : bounds[r + 1]].tobytes() == data[starts[k] : starts[k] + lengths[k]]
    # From a window of the file (bytes [lo, hi) only): rows at its edges, or past them, as the reference.
    lo, hi = sorted(int(x) for x in rng.integers(0, len(data) + 1, 2))
    window = _u8(data[lo:hi])
    (mine, a), (want, b) = _both_gathers(impl, window, lo, starts, rows, bounds, len(data), bom)
    assert mine == want and a == b


def test_gather_lines_on_hostile_rows(kernels: Kernels) -> None:
    data = b"a b\r\n\n c\r\r\nx\ry\n  \nlast\r"  # CRLF, an empty line, a CR inside, a blank line, no final LF
    buf = _u8(data)
    cases = {  # (start, length): is it a sample? (as test_check_lines_on_hostile_rows)
        (0, 3): True,
        (0, 4): False,
        (1, 2): False,
        (5, 0): False,
        (6, 3): True,
        (11, 3): True,
        (15, 2): False,
        (18, 4): True,
        (18, 5): False,
        (11, 6): False,
    }
    for (s, n), sample in cases.items():
        dst = np.zeros(n, np.uint8)
        one = np.array([s], np.int64)
        for impl in (kernels, ref):
            assert impl.gather_lines(buf, 0, one, [0], [0, n], dst, len(data), False) == (-1 if sample else 0)
        if sample:
            assert dst.tobytes() == data[s : s + n]
    # The rows before a bad one are copied, none after it.
    starts, bounds = np.array([0, 1, 6], np.int64), np.array([0, 3, 5, 8])
    for impl in (kernels, ref):
        dst = np.zeros(8, np.uint8)
        assert impl.gather_lines(buf, 0, starts, [0, 1, 2], bounds, dst, len(data), False) == 1
        assert dst.tobytes() == b"a b" + bytes(5)
    # Outside its buffers: the row's bytes past the window (a line longer than what was read), the byte
    # its check needs past it, a row number past the offsets, a place past the shard, a negative shift.
    refused = [
        (_u8(data[:3]), 0, [0], [0], [0, 3], 3),  # "a b" held, but not the "\r" after it
        (_u8(data[:2]), 0, [0], [0], [0, 3], 3),  # the row itself cut
        (_u8(data[6:10]), 6, [6], [0], [0, 3], 3),  # " c\r" and its "\r", but not the "\n" after that
        (_u8(data[6:]), 6, [6], [0], [0, 3], 3),  # the byte before the row not held
        (buf, 0, [0], [1], [0, 3], 3),  # row 1 of a shard of 1
        (buf, 0, [0], [-1], [0, 3], 3),
        (buf, 0, [0], [0], [0, 3], 2),  # the shard's data too small
        (buf, 0, [0], [0], [2, 0], 3),  # offsets that go backwards
    ]
    for window, shift, s, r, b, room in refused:
        for impl in (kernels, ref):
            with pytest.raises(ValueError, match="outside"):
                impl.gather_lines(
                    window, shift, np.array(s, np.int64), r, b, np.zeros(room, np.uint8), len(data), False
                )
    with pytest.raises(ValueError, match="shift"):
        kernels.gather_lines(buf, -1, np.array([0], np.int64), [0], [0, 3], np.zeros(3, np.uint8), len(data), False)
    with_bom = _u8(ref.BOM + b"a\n")
    for impl in (kernels, ref):
        dst = np.zeros(4, np.uint8)
        assert impl.gather_lines(with_bom, 0, np.array([3], np.int64), [0], [0, 1], dst, 5, True) == -1
        assert impl.gather_lines(with_bom, 0, np.array([0], np.int64), [0], [0, 4], dst, 5, True) == 0
        assert impl.gather_lines(_u8(b""), 0, np.empty(0, np.int64), [], [0], dst, 0, False) == -1


@pytest.mark.parametrize("n", [0, 1, 7, 4096, 100_003])
@pytest.mark.parametrize("buckets", [1, 3, 4096, 65536])
@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_bucket_order_is_numpys_stable_argsort(impl: Any, n: int, buckets: int, dtype: Any) -> None:
    keys = np.random.default_rng(n + buckets).integers(0, buckets, n).astype(np.uint16)
    order, counts = impl.bucket_order(keys, buckets, dtype)
    assert order.dtype == dtype and counts.dtype == np.int64
    assert np.array_equal(order, np.argsort(keys, kind="stable"))
    assert np.array_equal(counts, np.bincount(keys, minlength=buckets))


def test_bucket_order_refuses_bad_keys(kernels: Kernels) -> None:
    keys = np.array([0, 5, 2], np.uint16)
    for impl in (kernels, ref):
        with pytest.raises(ValueError, match=r"key 5 \(item 1\) is not below buckets \(5\)"):
            impl.bucket_order(keys, 5)
        with pytest.raises(TypeError, match="uint16"):
            impl.bucket_order(keys.astype(np.int64), 8)
        with pytest.raises(TypeError, match="uint32 or int64"):
            impl.bucket_order(keys, 8, np.int32)
        with pytest.raises(ValueError, match="buckets"):
            impl.bucket_order(keys, 0)


def _packed_by_hand(costs: list[int], bounds: list[int], limit: int, fill: list[int]) -> tuple[list[int], list[int]]:
    """Greedy packing item by item: a run takes the next item while its total stays within ``limit``."""
    starts, totals = [0] * len(costs), []
    for b, t in enumerate(fill):
        for i in range(bounds[b], bounds[b + 1]):
            if t + costs[i] > limit:
                starts[i], t = 1, 0
            t += costs[i]
        totals.append(t)
    return starts, totals


@pytest.mark.parametrize("seed", range(40))
def test_pack_runs_is_the_greedy_packing(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(0, 400)), int(rng.integers(1, 6))
    limit = int(rng.integers(0, 60))
    costs = rng.integers(0, limit + 1, n)
    if seed % 4 == 0:  # runs of zero costs, and items of the whole limit
        costs[rng.random(n) < 0.3] = 0
        costs[rng.random(n) < 0.1] = limit
    bounds = np.concatenate(([0], np.sort(rng.integers(0, n + 1, k - 1)), [n]))
    fill = rng.integers(0, limit + 1, k)
    starts, totals = impl.pack_runs(costs, bounds, limit, fill)
    want = _packed_by_hand(costs.tolist(), bounds.tolist(), limit, fill.tolist())
    assert starts.dtype == np.uint8 and totals.dtype == np.int64
    assert (starts.tolist(), totals.tolist()) == want


def test_pack_runs_refuses_bad_arguments(kernels: Kernels) -> None:
    for impl in (kernels, ref):
        with pytest.raises(ValueError, match=r"cost 9 of item 1 is outside \[0, 5\]"):
            impl.pack_runs([1, 9], [0, 2], 5, [0])
        with pytest.raises(ValueError, match="bounds must rise from 0 to the 2 costs"):
            impl.pack_runs([1, 1], [0, 1], 5, [0])
        with pytest.raises(ValueError, match="fill must hold one total"):
            impl.pack_runs([1, 1], [0, 2], 5, [6])
        with pytest.raises(ValueError, match="limit must be >= 0"):
            impl.pack_runs([], [0], -1, [0])


def _split_by_hand(costs: list[int], offsets: list[int], world: int) -> list[int]:
    """Each batch's items by cost, highest first (ties: the earlier), dealt in rounds of ``world`` to the ranks
    by their totals so far, lowest first (ties: the lower rank)."""
    out = [0] * len(costs)
    for a, z in itertools.pairwise(offsets):
        items = sorted(range(a, z), key=lambda i: (-costs[i], i))
        totals = [0] * world
        for k in range(0, len(items), world):
            ranks = sorted(range(world), key=lambda r: (totals[r], r))
            for i, r in zip(items[k : k + world], ranks):
                out[i] = r
                totals[r] += costs[i]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_split_costs_deals_by_cost_in_rounds(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    world = int(rng.choice([1, 2, 3, 4, 8, 64]))
    lengths = rng.integers(0, 5 * world + 3, int(rng.integers(0, 12)))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    costs = rng.integers(0, 6 if seed % 2 else 10**9, int(offsets[-1]))  # ties, or nearly none
    got = impl.split_costs(costs, offsets, world)
    assert got.dtype == np.int64
    assert got.tolist() == _split_by_hand(costs.tolist(), offsets.tolist(), world)


def test_split_costs_refuses_bad_arguments(kernels: Kernels) -> None:
    for impl in (kernels, ref):
        with pytest.raises(ValueError, match="offsets must rise from 0 to the 3 costs"):
            impl.split_costs([1, 2, 3], [0, 2], 2)
        with pytest.raises(ValueError, match="world must be >= 1"):
            impl.split_costs([1], [0, 1], 0)


# --- the permutation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 10, 17, 1000, 65_537, 10**6 + 3, 2**40 + 5, 2**62])
def test_permute_cells_matches_the_plans_permutation(impl: Any, n: int) -> None:
    from rank_dataset.plan.permutation import _grid, _round_keys, permute

    rng = np.random.default_rng(n % 1000)
    positions = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, 3000)]))
    rows, col_bits = _grid(n)
    for seed, epoch in ((0, 0), (7, 3), (2**70 + 1, -5)):
        keys = [int(k) for k in _round_keys(seed, epoch)]
        got = impl.permute_cells(n, rows, col_bits, keys, positions)
        np.testing.assert_array_equal(got, permute(n, seed, epoch, positions))
        assert got.dtype == np.int64
    if n <= 10**6 + 3:  # a bijection of [0, n)
        whole = impl.permute_cells(n, rows, col_bits, keys, np.arange(n))
        assert np.array_equal(np.sort(whole), np.arange(n))


def test_permute_cells_for_many_grids(kernels: Kernels) -> None:
    """Grids of every height from 1 to 2**31 rows (the modulo by multiplication, for each divisor kind)."""
    from rank_dataset.plan.permutation import _grid, _round_keys, permute

    rng = np.random.default_rng(1)
    sizes = [int(x) for x in np.exp2(rng.uniform(0, 62, 300))] + [2**k + d for k in range(1, 62, 3) for d in (-1, 0, 1)]
    keys = [int(k) for k in _round_keys(3, 4)]
    for n in sorted({max(1, x) for x in sizes}):
        positions = rng.integers(0, n, 200)
        got = kernels.permute_cells(n, *_grid(n), keys, positions)
        np.testing.assert_array_equal(got, permute(n, 3, 4, positions), err_msg=str(n))


def test_permute_cells_refuses_positions_outside_and_a_grid_too_small(kernels: Kernels) -> None:
    for bad in ([-1], [10], [0, 3, 1 << 62]):
        with pytest.raises(ValueError, match="outside"):
            kernels.permute_cells(10, 4, 2, [1, 2], np.array(bad))
    with pytest.raises(ValueError):
        kernels.permute_cells(10, 2, 2, [1, 2], np.array([0]))  # 2 x 4 cells < 10
    with pytest.raises(ValueError):
        kernels.permute_cells(10, 4, 40, [1, 2], np.array([0]))


# --- the collective reader's exchange -----------------------------------------------------------------


def _owned(rng: np.random.Generator, w: int, total: int) -> np.ndarray:
    """``w + 1`` ascending offsets from 0 to ``total`` (some slices empty)."""
    cuts = np.sort(rng.integers(0, total + 1, w - 1)) if w > 1 else np.zeros(0, np.int64)
    return np.concatenate([[0], cuts, [total]]).astype(np.int64)


@pytest.mark.parametrize("req", [np.uint32, np.int64])
@pytest.mark.parametrize("seed", range(6))
def test_route_items_matches_numpy(impl: Any, seed: int, req: Any) -> None:
    rng = np.random.default_rng(seed)
    w, total = int(rng.integers(1, 9)), int(rng.integers(1, 5000))
    owned = _owned(rng, w, total)
    per_round = int(rng.integers(1, 200))
    rounds = max(1, -(-int(np.diff(owned).max()) // per_round))
    items = rng.permutation(total)[: int(rng.integers(0, total + 1))].astype(np.int64)
    want = ref.route_items(items, owned, rounds, per_round, True, req)
    got = impl.route_items(items, owned, rounds, per_round, True, req)
    assert want is not None and got is not None
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    counts, order, request = got
    assert order.dtype == np.int32 and int(counts.sum()) == items.size
    # Each grouped item is its owner's sample request[j], served in its key's round.
    key = np.repeat(np.arange(w * rounds), counts)
    owner, round_ = np.divmod(key, rounds)
    np.testing.assert_array_equal(owned[owner] + request.astype(np.int64), items[order])
    np.testing.assert_array_equal(request.astype(np.int64) // per_round, round_)


@pytest.mark.parametrize("total", [10, 1000, 10**9])
def test_route_items_finds_a_repeat_or_lets_it_be(impl: Any, total: int) -> None:
    """A repeat anywhere is None where checked (a bitmap, or for a plan much smaller than the samples a
    sort); unchecked, repeats are routed as any item."""
    rng = np.random.default_rng(total)
    owned = np.array([0, total // 3, total], np.int64)
    for _ in range(20):
        items = rng.integers(0, total, int(rng.integers(2, 12))).astype(np.int64)
        items[-1] = items[int(rng.integers(0, items.size - 1))]
        assert impl.route_items(items, owned, 1, total, True, np.int64) is None
        want = ref.route_items(items, owned, 1, total, False, np.int64)
        got = impl.route_items(items, owned, 1, total, False, np.int64)
        assert got is not None and want is not None
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


@pytest.mark.parametrize("seed", range(4))
def test_route_items_finds_a_repeat_in_any_round_of_any_slice(impl: Any, seed: int) -> None:
    """Over several owners and rounds (the kernel checks a group of requests at a time, in a bitmap of a
    round): a plan that repeats one sample anywhere is None, the same plan without the repeat is routed
    as numpy routes it, and a check that found a repeat leaves no trace on the next call."""
    rng = np.random.default_rng(seed)
    w, total = int(rng.integers(2, 9)), int(rng.integers(500, 5000))
    owned = _owned(rng, w, total)
    per_round = int(rng.integers(1, 100))
    rounds = max(1, -(-int(np.diff(owned).max()) // per_round))
    for _ in range(10):
        items = rng.permutation(total)[: int(rng.integers(2, total + 1))].astype(np.int64)
        repeated = np.insert(items, int(rng.integers(0, items.size + 1)), items[int(rng.integers(0, items.size))])
        assert impl.route_items(repeated, owned, rounds, per_round, True, np.uint32) is None
        want = ref.route_items(items, owned, rounds, per_round, True, np.uint32)
        got = impl.route_items(items, owned, rounds, per_round, True, np.uint32)
        assert got is not None and want is not None
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


def test_route_items_refuses_hostile_arguments(kernels: Kernels) -> None:
    owned = np.array([0, 5, 10], np.int64)
    for items in ([-1], [10], [0, 1 << 62], [3, -(1 << 63)]):
        with pytest.raises(ValueError, match="outside"):
            kernels.route_items(np.array(items, np.int64), owned, 5, 1, True, np.int64)
    with pytest.raises(ValueError, match="outside"):  # round 4 of rounds 0..3
        kernels.route_items(np.array([4], np.int64), owned, 4, 1, False, np.int64)
    for bad_owned in ([1, 5, 10], [0, 6, 5], [0]):
        with pytest.raises(ValueError):
            kernels.route_items(np.array([0], np.int64), np.array(bad_owned, np.int64), 5, 1, False, np.int64)
    with pytest.raises(ValueError):  # a slice's numbers do not fit uint32
        kernels.route_items(np.array([0], np.int64), np.array([0, 1 << 33], np.int64), 1, 1 << 33, False, np.uint32)
    with pytest.raises(ValueError):
        kernels.route_items(np.array([0], np.int64), owned, 0, 1, False, np.int64)
    with pytest.raises(TypeError):
        kernels.route_items(np.array([0], np.int64), owned, 5, 1, False, np.int32)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
@pytest.mark.parametrize("seed", range(4))
def test_scatter_bounds_matches_numpy(impl: Any, dtype: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    lengths = rng.integers(0, 90, n).astype(rng.choice([np.uint32, np.int64]))
    order = rng.permutation(n).astype(np.int32)
    counts = np.bincount(rng.integers(0, 7, n), minlength=7).astype(np.int64)
    want, got = np.full(n + 1, 5, dtype), np.full(n + 1, 5, dtype)
    want_sums = ref.scatter_bounds(lengths, order, counts, want)
    got_sums = impl.scatter_bounds(lengths, order, counts, got)
    assert got.tobytes() == want.tobytes() and got_sums.tobytes() == want_sums.tobytes()
    placed = np.empty(n, np.int64)
    placed[order] = lengths
    np.testing.assert_array_equal(np.diff(got.astype(np.int64)), placed)


def test_scatter_bounds_refuses_hostile_arguments(kernels: Kernels) -> None:
    lengths, bounds = np.array([1, 2, 3], np.int64), np.zeros(4, np.uint32)
    for order, counts in (
        ([0, 1, 3], [3]),
        ([0, -1, 2], [3]),
        ([0, 1, 2], [2]),
        ([0, 1, 2], [2, 2]),
        ([0, 1, 2], [-1, 4]),
    ):
        with pytest.raises(ValueError):
            kernels.scatter_bounds(lengths, np.array(order, np.int64), np.array(counts, np.int64), bounds)
    with pytest.raises(ValueError, match="overflow"):
        kernels.scatter_bounds(
            np.array([1 << 31, 1 << 31], np.int64), np.array([0, 1]), np.array([2]), np.zeros(3, np.uint32)
        )
    with pytest.raises(ValueError):
        kernels.scatter_bounds(lengths, np.array([0, 1, 2]), np.array([3]), np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        kernels.scatter_bounds(lengths, np.array([0, 1, 2]), np.array([3]), np.zeros(4, np.int32))


def _round(rng: np.random.Generator, w: int) -> tuple[Any, ...]:
    """An owner's round: its slice (starts, lengths within src, from lo), and each requester's rows."""
    held = int(rng.integers(1, 400))
    lengths = rng.integers(0, 120, held)
    starts = np.cumsum(lengths + 1) - lengths - 1 + 7  # a byte between lines, 7 before the first
    lo = int(rng.integers(0, 7))
    src = rng.integers(0, 256, int(starts[-1] + lengths[-1]) - lo + 3).astype(np.uint8)
    counts = rng.integers(0, 60, w)
    rows = rng.integers(0, held, int(counts.sum()) + 5)
    at = np.cumsum(counts) - counts + rng.integers(0, 2, w)
    at = np.minimum(at, rows.size - counts)
    # The lengths as the requesters were told them: one a request.
    return src, lo, starts.astype(np.uint32), lengths[rows].astype(np.uint32), rows.astype(np.uint32), at, counts


@pytest.mark.parametrize("status", [0, 2])
@pytest.mark.parametrize("seed", range(5))
def test_pack_requests_matches_numpy(impl: Any, seed: int, status: int) -> None:
    rng = np.random.default_rng(seed)
    src, lo, starts, lengths, rows, at, counts = _round(rng, int(rng.integers(1, 9)))
    head = int(rng.integers(0, 3))
    sizes = impl.pack_requests(src, lo, starts, lengths, rows, at, counts, head, status, None)
    want_sizes = ref.pack_requests(src, lo, starts, lengths, rows, at, counts, head, status, None)
    assert sizes.tobytes() == want_sizes.tobytes()
    want, got = np.full(int(sizes.sum()), 9, np.uint8), np.full(int(sizes.sum()), 9, np.uint8)
    ref.pack_requests(src, lo, starts, lengths, rows, at, counts, head, status, want)
    impl.pack_requests(src, lo, starts, lengths, rows, at, counts, head, status, got)
    assert got.tobytes() == want.tobytes()
    if status == 0 and counts[0]:  # the first requester's first line, after its head
        row = int(rows[at[0]])
        line = src[int(starts[row]) - lo :][: int(lengths[at[0]])]
        assert got[head : head + line.size].tobytes() == line.tobytes()


def test_pack_requests_refuses_hostile_arguments(kernels: Kernels) -> None:
    src = np.arange(20, dtype=np.uint8)
    starts, lengths = np.array([0, 5, 18], np.int64), np.array([4], np.int64)  # row 2's line ends past src
    ok = {"src": src, "lo": 0, "starts": starts, "lengths": lengths, "head": 1, "status": 0}
    for rows, at, counts in (([0, 3], [0], [2]), ([0, -1], [0], [2]), ([0, 1], [1], [2]), ([0, 1], [-1], [1])):
        with pytest.raises(ValueError):
            kernels.pack_requests(
                **{**ok, "lengths": np.full(2, 4)},
                rows=np.array(rows),
                at=np.array(at),
                counts=np.array(counts),
                send=None,
            )
    with pytest.raises(ValueError):  # a length for each row asked for
        kernels.pack_requests(**ok, rows=np.array([0, 1]), at=np.array([0]), counts=np.array([2]), send=None)
    with pytest.raises(ValueError):  # a negative length
        kernels.pack_requests(**{**ok, "lengths": np.array([-1])}, rows=np.array([0]), at=[0], counts=[1], send=None)
    send = np.full(5, 7, np.uint8)
    with pytest.raises(ValueError, match="outside"):  # sizes fine, the line outside what was read
        kernels.pack_requests(rows=np.array([2]), at=np.array([0]), counts=np.array([1]), send=send, **ok)
    with pytest.raises(ValueError, match="outside"):  # a start before lo
        kernels.pack_requests(**{**ok, "lo": 1}, rows=np.array([0]), at=np.array([0]), counts=np.array([1]), send=send)
    with pytest.raises(ValueError, match="too small"):
        kernels.pack_requests(
            rows=np.array([0]), at=np.array([0]), counts=np.array([1]), send=np.zeros(9, np.uint8), **ok
        )


@pytest.mark.parametrize("seed", range(5))
def test_place_lines_matches_numpy(impl: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, w, head = int(rng.integers(0, 2000)), int(rng.integers(1, 9)), int(rng.integers(0, 3))
    bounds = np.concatenate([[0], np.cumsum(rng.integers(0, 70, n))]).astype(rng.choice([np.uint32, np.int64]))
    order = rng.permutation(n).astype(np.int32)
    take = int(rng.integers(0, n + 1))  # this round's items: a part of order, cut among the owners
    counts = np.bincount(rng.integers(0, w, take), minlength=w).astype(np.int64)
    at = np.cumsum(counts) - counts + (n - take)
    idx = order[n - take :].astype(np.int64)
    parts = ref._split_sums(bounds[idx + 1].astype(np.int64) - bounds[idx], counts) + head
    got_buf = rng.integers(0, 256, int(parts.sum())).astype(np.uint8)
    want, got = np.full(int(bounds[-1]) + 2, 3, np.uint8), np.full(int(bounds[-1]) + 2, 3, np.uint8)
    ref.place_lines(got_buf, parts, order, at, counts, head, bounds, want)
    impl.place_lines(got_buf, parts, order, at, counts, head, bounds, got)
    assert got.tobytes() == want.tobytes()


def test_place_lines_refuses_hostile_arguments(kernels: Kernels) -> None:
    bounds, order = np.array([0, 3, 5], np.uint32), np.array([1, 0], np.int32)
    got = np.arange(7, dtype=np.uint8)  # a head, item 1's 2 bytes, item 0's 3 bytes, one byte over
    data = np.full(5, 9, np.uint8)
    cases = [
        (got, [7], [1, 0], [0], [2], bounds),  # the lines do not fill the part
        (got[:6], [7], [1, 0], [0], [2], bounds),  # the part past what arrived
        (got[:6], [6], [1, 2], [0], [2], bounds),  # an item outside the shard
        (got[:6], [6], [1, 0], [1], [2], bounds),  # a range past order
        (got[:6], [6], [1, 0], [0], [2], np.array([0, 3, 9], np.uint32)),  # a line past the data
        (got[:6], [3, 3], [1, 0], [0, 1], [1, 1], bounds),  # an owner's part cut short
    ]
    for buf, parts, od, at, counts, b in cases:
        with pytest.raises(ValueError):
            kernels.place_lines(
                buf, np.array(parts), np.array(od, np.int32), np.array(at), np.array(counts), 1, b, data
            )
    data[:] = 9  # (a line placed before the faulty one stays: the caller discards the shard)
    kernels.place_lines(got[:6], np.array([6]), order, np.array([0]), np.array([2]), 1, bounds, data)
    assert data.tolist() == [3, 4, 5, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_copy_lines_matches_numpy(impl: Any, seed: int) -> None:
    # An owner's round (its samples [first, stop) read into a buffer from byte lo of its slice) copied
    # into a requester's shard: the requests in any order, to rows in any order, some rows not this
    # round's (left as they are).
    rng = np.random.default_rng(seed)
    held, n = int(rng.integers(1, 3000)), int(rng.integers(0, 2000))
    lengths = rng.integers(0, 60, held)
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(rng.choice([np.uint32, np.int64]))
    first = int(rng.integers(0, held))
    stop = int(rng.integers(first, held + 1))
    lo, hi = int(starts[first]), (int(starts[stop]) if stop < held else int(starts[-1] + lengths[-1] + 1))
    src = rng.integers(0, 256, hi - lo).astype(np.uint8)
    take = min(n, stop - first)
    request = (first + rng.permutation(stop - first)[:take]).astype(rng.choice([np.uint32, np.int64]))
    rows = rng.permutation(n)[:take].astype(rng.choice([np.int32, np.int64]))
    row_lengths = rng.integers(0, 60, n)
    row_lengths[rows] = lengths[request]
    bounds = np.concatenate([[0], np.cumsum(row_lengths)]).astype(rng.choice([np.uint32, np.int64]))
    want, got = np.full(int(bounds[-1]) + 2, 3, np.uint8), np.full(int(bounds[-1]) + 2, 3, np.uint8)
    ref.copy_lines(src, lo, starts, request, rows, bounds, want)
    impl.copy_lines(src, lo, starts, request, rows, bounds, got)
    assert got.tobytes() == want.tobytes()
    for q, r in zip(request.tolist(), rows.tolist()):  # and each is the line the request names
        line = src[int(starts[q]) - lo :][: int(lengths[q])]
        assert got[int(bounds[r]) : int(bounds[r + 1])].tobytes() == line.tobytes()


def test_copy_lines_refuses_hostile_arguments(impl: Any) -> None:
    src, starts = np.arange(10, dtype=np.uint8), np.array([0, 4, 7], np.uint32)
    bounds = np.array([0, 3, 5], np.uint32)
    cases = [
        dict(request=[0], rows=[2]),  # a row outside the shard
        dict(request=[3], rows=[0]),  # a request outside the table
        dict(request=[-1], rows=[0]),
        dict(request=[2, 0], rows=[0]),  # more requests than rows
        dict(request=[2], rows=[0], lo=8),  # a start before lo
        dict(request=[2], rows=[0], src=src[:9]),  # a line past the buffer
        dict(request=[0], rows=[1], bounds=np.array([0, 3, 9], np.uint32)),  # a line past the data
    ]
    for case in cases:
        kw: dict[str, Any] = {"src": src, "lo": 0, "starts": starts, "bounds": bounds, **case}
        with pytest.raises(ValueError):
            impl.copy_lines(
                kw["src"], kw["lo"], kw["starts"], np.array(kw["request"]), np.array(kw["rows"]), kw["bounds"],
                np.zeros(5, np.uint8),
            )  # fmt: skip
    data = np.zeros(5, np.uint8)
    impl.copy_lines(src, 2, starts, np.array([2, 1]), np.array([0, 1], np.int32), bounds, data)
    assert data.tolist() == [5, 6, 7, 2, 3]


# --- the check of a slice against its count -------------------------------------------------------------


def _mutations(rng: np.random.Generator, data: bytes, count: int) -> list[bytes]:
    """``data`` changed here and there: a byte replaced, inserted or removed (an alphabet of line breaks,
    blanks and the byte order mark's bytes), or a piece cut from the end."""
    out = []
    for _ in range(count):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 3))):
            at = int(rng.integers(0, len(b) + 1))
            new = _ALPHABET[int(rng.integers(0, len(_ALPHABET)))]
            kind = int(rng.integers(0, 4))
            if kind == 0 and at < len(b):
                b[at : at + 1] = new
            elif kind == 1:
                b[at:at] = new
            elif kind == 2 and at < len(b):
                del b[at]
            else:
                del b[len(b) - int(rng.integers(0, 3)) :]
        out.append(bytes(b))
    return out


def _verify_both(impl: Any, data: bytes, offset: int, last: bool, starts: Any, base: int, lengths: Any) -> Any:
    buf = _u8(data)
    want = ref.verify_lines(buf, offset, last, starts, base, lengths)
    got = impl.verify_lines(buf, offset, last, starts, base, lengths)
    assert got == want, (data[:200], offset, last)
    return got


@pytest.mark.parametrize("seed", range(40))
def test_verify_lines_matches_numpy_on_changed_buffers(impl: Any, seed: int) -> None:
    """A buffer checked against the scan of itself (``bad`` -1), then changed: ``bad`` is where the
    scan of the changed buffer first differs, whatever the change."""
    rng = np.random.default_rng(seed)
    data = _random_bytes(rng, int(rng.integers(0, 600)), float(rng.uniform(0.02, 0.3)))
    if seed % 5 == 0:
        data = b"\xef\xbb\xbf" + data
    offset = 0 if seed % 2 else int(rng.integers(1, 100))
    for last in (True, False):
        scan = ref.scan_lines(_u8(data), offset, last)
        base = int(rng.integers(-5, 5))
        starts = (scan.starts - offset + base).astype(rng.choice([np.int64, np.uint32]) if base >= 0 else np.int64)
        lengths = scan.lengths.astype(np.uint32)
        assert _verify_both(impl, data, offset, last, starts, base, lengths) == (-1, scan.newlines, scan.ascii)
        for changed in _mutations(rng, data, 30):
            _verify_both(impl, changed, offset, last, starts, base, lengths)


@pytest.mark.parametrize("data", _HOSTILE_SCANS, ids=range(len(_HOSTILE_SCANS)))
@pytest.mark.parametrize("last", [True, False])
def test_verify_lines_on_hostile_buffers_and_counts(impl: Any, data: bytes, last: bool) -> None:
    rng = np.random.default_rng(len(data))
    for offset in (0, 7):
        scan = ref.scan_lines(_u8(data), offset, last)
        starts, lengths = scan.starts - offset, scan.lengths
        assert _verify_both(impl, data, offset, last, starts, 0, lengths)[0] == -1
        n = starts.size
        hostile = [
            (starts[:-1], lengths[:-1]),  # one sample fewer than the buffer holds
            (np.append(starts, len(data)), np.append(lengths, 1)),  # one more, past the end
            (starts[::-1].copy(), lengths[::-1].copy()),  # out of order
            (starts + 1, lengths),
            (starts, lengths + 1),
            (starts, lengths - 1),
            (starts - 1 - 2**40, lengths),
            (starts, np.zeros(n, np.int64)),
            (starts + rng.integers(-2, 3, n), lengths + rng.integers(-2, 3, n)),
        ]
        for s, ln in hostile:
            _verify_both(impl, data, offset, last, np.asarray(s, np.int64), 0, np.asarray(ln, np.int64))


def test_verify_lines_refuses_bad_arguments(kernels: Kernels) -> None:
    buf = _u8(b"a\nb\n")
    with pytest.raises(ValueError):
        kernels.verify_lines(buf, 0, True, np.array([0, 2]), 0, np.array([1]))
    with pytest.raises(ValueError):
        kernels.verify_lines(buf, -1, True, np.array([0]), 0, np.array([1]))


# --- the path picker ----------------------------------------------------------------------------------


def test_both_kernel_objects_have_every_kernel_with_one_signature() -> None:
    assert (ref.FUSED, Kernels.FUSED) == (False, True)
    for name in set(native._KERNELS.values()) - {"FUSED"}:
        theirs = list(inspect.signature(getattr(Kernels, name)).parameters.values())[1:]  # self
        ours = list(inspect.signature(getattr(ref, name)).parameters.values())
        assert [(p.name, p.default) for p in ours] == [(p.name, p.default) for p in theirs], name


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RANK_DATASET_NATIVE")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([str(Path(native.__file__).parents[2]), full.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=120
    )


_PROBE = """
    import warnings
    import numpy as np
    from rank_dataset.core import native
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = native.count_newlines(np.frombuffer(b"a\\nb\\n", np.uint8))
        b = native.count_newlines(np.frombuffer(b"\\n", np.uint8))
    print(a, b, native.describe().split()[0], len([w for w in caught if issubclass(w.category, RuntimeWarning)]))
    print(native.describe())
"""


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_mode_0_takes_numpy_without_a_word() -> None:
    done = _run(_PROBE, RANK_DATASET_NATIVE="0")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "2 1 numpy 0" and "RANK_DATASET_NATIVE=0" in second


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_auto_without_a_library_takes_numpy_and_says_so_once(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing.so")
    done = _run(_PROBE, RANK_DATASET_NATIVE_LIB=missing)  # auto by default
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "2 1 numpy 1" and missing in second


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_auto_with_a_library_that_does_not_load_takes_numpy(tmp_path: Path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a shared library")
    done = _run(_PROBE, RANK_DATASET_NATIVE="auto", RANK_DATASET_NATIVE_LIB=str(junk))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "2 1 numpy 1"


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_require_without_a_library_fails_clearly(tmp_path: Path) -> None:
    done = _run(_PROBE, RANK_DATASET_NATIVE="require", RANK_DATASET_NATIVE_LIB=str(tmp_path / "nothing.so"))
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "RANK_DATASET_NATIVE=require" in done.stderr


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_an_unknown_mode_is_an_error() -> None:
    done = _run(_PROBE, RANK_DATASET_NATIVE="fast")
    assert done.returncode != 0 and "must be one of auto, 0, require" in done.stderr


def test_auto_and_require_take_the_built_library(kernels: Kernels) -> None:
    lib = {k: v for k, v in os.environ.items() if k == "RANK_DATASET_NATIVE_LIB"}  # the sanitizer build, say
    for mode in ("auto", "require"):
        done = _run(_PROBE, RANK_DATASET_NATIVE=mode, **lib)
        assert done.returncode == 0, done.stderr
        first, second = done.stdout.splitlines()
        assert first == "2 1 native 0" and second == f"native ({kernels.path})"


def test_a_library_older_than_its_source_is_used_with_a_warning(kernels: Kernels, tmp_path: Path) -> None:
    lib, source = tmp_path / "_kernels.so", tmp_path / "_kernels.c"
    lib.write_bytes(kernels.path.read_bytes())
    source.write_text("/* newer */")
    os.utime(lib, (1, 1))
    done = _run(_PROBE, RANK_DATASET_NATIVE="auto", RANK_DATASET_NATIVE_LIB=str(lib))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "2 1 native 1"


@pytest.mark.no_library  # the numpy path or an error: the sanitizer build is never loaded
def test_version_says_which_path_is_in_use() -> None:
    code = "import sys; from rank_dataset.cli import main; sys.argv[1:] = ['--version']; main()"
    done = _run(code, RANK_DATASET_NATIVE="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "kernels: numpy (RANK_DATASET_NATIVE=0)"


# --- opening files beneath a directory (the payloads' page-cache path) ---------------------------------


def _open_tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.bin").write_bytes(b"a" * 5000)
    (root / "empty.bin").write_bytes(b"")
    (root / "sub" / "b.bin").write_bytes(b"b" * 3)
    (outside / "secret.bin").write_bytes(b"SECRET")
    (root / "up.bin").symlink_to("../outside/secret.bin")  # relative, out of the root
    (root / "abs.bin").symlink_to(outside / "secret.bin")  # absolute
    (root / "in.bin").symlink_to("sub/b.bin")  # relative, inside: the last component, never followed
    (root / "subin").symlink_to("sub")  # a directory link inside: followed on the way
    (root / "outdir").symlink_to("../outside")  # directory links out of the root, relative and absolute
    (root / "absdir").symlink_to(outside)
    (root / "magic").symlink_to("/proc/self/fd")
    os.mkfifo(root / "fifo")
    return root, outside


def _opened(kernels: Kernels, root: Path, names: list[str], probe_max: int = 1 << 20) -> list[tuple[int, int]]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = kernels.open_files(fd, names, probe_max)
    finally:
        os.close(fd)
    if out is None:
        pytest.skip("no openat2 on this system")
    n = len(names)
    assert len(out) == 3 * n
    got = []
    for i in range(n):
        if out[i] >= 0:
            assert os.pread(out[i], out[n + i] + 1, 0) == (root / names[i]).read_bytes()
            os.close(out[i])
        else:
            assert out[2 * n + i] not in (native.OPEN_HIT, native.OPEN_MISS)
        got.append((out[n + i], out[2 * n + i]))
    return got


@pytest.mark.skipif(sys.platform != "linux", reason="openat2 is Linux's")
def test_open_files_opens_beneath_and_refuses_escapes(kernels: Kernels, tmp_path: Path) -> None:
    import errno

    root, _ = _open_tree(tmp_path)
    for name in ("a.bin", "empty.bin", "sub/b.bin", "sub//b.bin", "./a.bin", "subin/b.bin"):
        (root / name).read_bytes()  # in the page cache
    names = ["a.bin", "empty.bin", "sub/b.bin", "sub//b.bin", "./a.bin", "subin/b.bin", "missing.bin",
             "sub/missing/x", "up.bin", "abs.bin", "in.bin", "sub/../../outside/secret.bin", "../outside/secret.bin",
             "/etc/passwd", "magic/0", "sub", "fifo", "a.bin/", "a.bin/x", "outdir/secret.bin", "absdir/secret.bin",
             "../../../../etc/passwd"]  # fmt: skip
    got = dict(zip(names, _opened(kernels, root, names)))
    hit = native.OPEN_HIT
    assert got["a.bin"] == (5000, hit) and got["./a.bin"] == (5000, hit) and got["empty.bin"] == (0, hit)
    assert got["sub/b.bin"] == got["sub//b.bin"] == got["subin/b.bin"] == (3, hit)
    assert got["missing.bin"] == got["sub/missing/x"] == (0, -errno.ENOENT)
    for name in ("outdir/secret.bin", "absdir/secret.bin", "sub/../../outside/secret.bin", "../outside/secret.bin",
                 "/etc/passwd", "../../../../etc/passwd"):  # fmt: skip
        assert got[name] == (0, -errno.EXDEV), name  # never opened
    for name in ("up.bin", "abs.bin", "in.bin"):  # O_NOFOLLOW: a link as the last component is never opened
        assert got[name] == (0, -errno.ELOOP), name
    assert got["magic/0"][1] in (-errno.EXDEV, -errno.ELOOP)
    assert got["sub"] == got["fifo"] == (0, native.OPEN_NOT_FILE)
    assert got["a.bin/"] == got["a.bin/x"] == (0, -errno.ENOTDIR)
    # Larger than probe_max (or probe_max < 0): open, not probed.
    assert _opened(kernels, root, ["a.bin", "sub/b.bin"], probe_max=100) == [(5000, native.OPEN_MISS), (3, hit)]
    assert _opened(kernels, root, ["sub/b.bin"], probe_max=-1) == [(3, native.OPEN_MISS)]
    assert _opened(kernels, root, []) == []


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or sys.platform != "linux", reason="Linux")
def test_open_files_tells_an_evicted_file(kernels: Kernels, tmp_path: Path) -> None:
    root, _ = _open_tree(tmp_path)
    (root / "big.bin").write_bytes(os.urandom(1 << 18))
    os.sync()
    (root / "big.bin").read_bytes()
    fd = os.open(root / "big.bin", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    [(size, status)] = _opened(kernels, root, ["big.bin"])
    assert size == 1 << 18
    # EAGAIN: not in the page cache; a file system that keeps its pages (tmpfs) or cannot tell says a hit.
    assert status in (native.OPEN_MISS, native.OPEN_HIT)
    if status == native.OPEN_HIT and os.statvfs(root).f_blocks:
        probe = os.open(root / "big.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(probe, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(probe, [bytearray(1)], (1 << 18) - 1, os.RWF_NOWAIT)
            except OSError:
                pytest.fail("the probe in Python says a miss where the kernel said a hit")
        finally:
            os.close(probe)


def test_open_files_checks_its_arguments(kernels: Kernels, tmp_path: Path) -> None:
    root = tmp_path
    (root / "a").write_bytes(b"x")
    fd = os.open(root, os.O_RDONLY)
    try:
        for bad in (["a", ""], ["a\0b"], [""]):
            with pytest.raises(ValueError, match="empty or holds a NUL"):
                kernels.open_files(fd, bad, 10)
        lib = kernels._lib
        out = (ctypes.c_int64 * 6)()
        # the buffer must be exactly n NUL-ended names; the output 3n int64 at least; nothing opened otherwise
        assert lib.rd_open_files(fd, b"a\0", 2, 2, 10, out, 6) == -2
        assert lib.rd_open_files(fd, b"a\0a\0", 3, 2, 10, out, 6) == -2
        assert lib.rd_open_files(fd, b"a", 1, 1, 10, out, 3) == -2
        assert lib.rd_open_files(fd, b"a\0a\0", 4, 2, 10, out, 5) == -1
        assert lib.rd_open_files(fd, b"a\0", 2, -1, 10, out, 6) == -1
        assert lib.rd_open_files(fd, None, 2, 1, 10, out, 6) == -1
        assert lib.rd_open_files(fd, b"a\0", 2, 1, 10, None, 3) == -1
        assert lib.rd_open_files(fd, None, 0, 0, 10, None, 0) in (0, -6)
        assert list(out) == [0] * 6
        if sys.platform == "linux" and lib.rd_open_files(-1, b"a\0", 2, 1, 10, out, 3) == 0:
            assert list(out[:3]) == [-1, 0, -9]  # EBADF: a descriptor that is not a directory's
    finally:
        os.close(fd)
