"""The field kernel ``line_fields`` (``core/_kernels.c``) against its numpy reference (``core/_reference.py``),
byte for byte, on random and hostile lines; and both against ``str.split()`` and the index's scan, whose
lines they number and split.

Run against the sanitizer builds too (``make test-asan``): with ``RANK_DATASET_NATIVE=require`` a library that
does not load fails these tests instead of skipping them.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset.core import _reference as ref
from rank_dataset.core._native_lib import Kernels


def _u8(b: bytes) -> np.ndarray:
    return np.frombuffer(b, np.uint8)


def _fields(impl: Any, data: bytes, first: int, second: int, cap: int | None = None) -> tuple[Any, ...]:
    """``(samples, flagged, firsts, seconds, out_first)``: the kernel's results, the values it wrote, and its
    whole first output (a guard of 7s after the ``cap`` slots shows a write past them)."""
    buf = _u8(data)
    cap = buf.size + 1 if cap is None else cap
    a, b = np.full(cap + 4, 7, np.uint32), np.full(cap + 4, 7, np.uint32)
    samples, flagged = impl.line_fields(buf, first, second, a[:cap], b[:cap])
    assert a[cap:].tolist() == b[cap:].tolist() == [7] * 4
    return samples, flagged, a[: min(samples, cap)].tolist(), b[: min(samples, cap)].tolist(), a[:cap].tolist()


_ODD = [
    b"0", b"00012", b"4294967295", b"4294967296", b"12345678901", b"+5", b"-3", b"1_0", b"6.5", b"\x01", b"\x00",
    b"\x1b", b"\xc2\xa0", b"\xc3\xa9", b"\xe3\x80\x80", b"\xef\xbb\xbf", b"\x80", b"\xe2\x80\xa8", b"",
]  # fmt: skip
_SEPARATORS = [b" ", b"  ", b"\t", b" \t ", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b"\r"]


def _random_lines(rng: np.random.Generator, lines: int) -> bytes:
    """Lines of 0-5 fields (mostly numbers, a path first), joined by runs of whitespace; now and then an odd
    piece (a control byte, a Unicode space, a number out of range) in a field or in place of one; blank
    lines between; CRLF or LF."""
    out = []
    for _ in range(lines):
        fields = []
        for k in range(int(rng.integers(0, 6))):
            field = b"d/%d.jpg" % rng.integers(0, 99) if k == 0 else b"%d" % rng.integers(1, 5000)
            if rng.random() < 0.08:
                odd = _ODD[int(rng.integers(0, len(_ODD)))]
                at = int(rng.integers(0, len(field) + 1))
                field = odd if rng.random() < 0.5 else field[:at] + odd + field[at:]
            fields.append(field)
        seps = [_SEPARATORS[int(rng.integers(0, len(_SEPARATORS)))] for _ in range(len(fields) + 1)]
        line = (seps[0] if rng.random() < 0.1 else b"") + b"".join(f + s for f, s in zip(fields, seps[1:]))
        out.append(line + (b"\r\n" if rng.random() < 0.3 else b"\n") + (b"\n" if rng.random() < 0.05 else b""))
    return b"".join(out)[: None if rng.random() < 0.5 else -1]  # the last line without its newline, at times


def _expected_by_split(line: bytes, first: int, second: int) -> tuple[int, int] | None:
    """What a line's fields are by ``str.split()`` and ``int()`` where the kernel vouches for them."""
    fields = line.decode("utf-8", "replace").split()
    if len(fields) <= max(first, second):
        return None
    try:
        values = int(fields[first]), int(fields[second])
    except ValueError:
        return None
    return values if all(1 <= v < 2**32 for v in values) else None


@pytest.mark.parametrize("seed", range(60))
def test_line_fields_match_numpy_on_random_lines(kernels: Kernels, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = _random_lines(rng, int(rng.integers(0, 120)))
    first, second = (int(x) for x in rng.integers(0, 4, 2))
    for cap in (None, 0, 1, int(rng.integers(0, 40))):
        assert _fields(kernels, data, first, second, cap) == _fields(ref, data, first, second, cap)


def _varied_lines(rng: np.random.Generator, lines: int) -> bytes:
    """Lines of every length (a path of 1 to 150 bytes, so that a line may fit a 64-byte window, cross it or outrun
    two of them), 0-6 fields of 1-12 digits after it, now and then an odd piece anywhere (before, in or after the
    fields read) or a non-ASCII path; blank lines between; CRLF or LF."""
    out = []
    for _ in range(lines):
        size = int(rng.choice([1, 8, 20, 40, 60, 70, 100, 150]))
        path = bytes(rng.integers(33, 127, int(rng.integers(1, size + 1)), dtype=np.uint8))
        if rng.random() < 0.05:
            path = "é/画像".encode() + path
        fields = [path] + [
            b"%0*d" % (int(rng.integers(1, 13)), int(rng.integers(0, 10 ** int(rng.integers(1, 11)))))
            for _ in range(int(rng.integers(0, 7)))
        ]
        if rng.random() < 0.1:
            k = int(rng.integers(0, len(fields)))
            fields[k] += _ODD[int(rng.integers(0, len(_ODD)))]
        seps = [_SEPARATORS[int(rng.integers(0, len(_SEPARATORS)))] if rng.random() < 0.2 else b" " for _ in fields]
        line = b"".join(f + s for f, s in zip(fields, seps))[: None if rng.random() < 0.5 else -1]
        out.append(line + (b"\r\n" if rng.random() < 0.2 else b"\n") + (b"\n" if rng.random() < 0.03 else b""))
    return b"".join(out)


@pytest.mark.parametrize("seed", range(40))
def test_line_fields_match_numpy_on_lines_of_every_length(kernels: Kernels, seed: int) -> None:
    # Many lines, so that the 64-byte windows read most of them and hand the others (long, odd) to the byte loop,
    # at every alignment of the buffer.
    rng = np.random.default_rng([seed, 2])
    data = _varied_lines(rng, int(rng.integers(50, 400)))
    a, b = (int(x) for x in rng.choice([0, 1, 2, 3, 5], 2))
    for first, second in ((1, 2), (a, b)):  # sizes_of's default, which the kernel reads with constant loops
        for skip in range(4):
            for cap in (None, int(rng.integers(0, 300))):
                got = _fields(kernels, data[skip:], first, second, cap)
                assert got == _fields(ref, data[skip:], first, second, cap)


@pytest.mark.parametrize("seed", range(30))
def test_line_fields_agree_with_str_split_and_number_samples_as_the_scan(impl: Any, seed: int) -> None:
    rng = np.random.default_rng([seed, 1])
    data = _random_lines(rng, int(rng.integers(1, 150)))
    first, second = (int(x) for x in rng.integers(0, 3, 2))
    samples, flagged, a, b, _ = _fields(impl, data, first, second)
    scan = ref.scan_lines(_u8(data), 5, True)  # not at offset 0: a byte order mark is a line's bytes here
    assert samples == scan.starts.size
    assert flagged == sum(x == 0 for x in a)
    for k, (start, length) in enumerate(zip((scan.starts - 5).tolist(), scan.lengths.tolist())):
        line = data[start : start + length]
        if a[k]:  # vouched for: exactly what Python reads
            assert (a[k], b[k]) == _expected_by_split(line, first, second)
        else:  # flagged: left to Python, and never a line Python reads as plain digits that numpy would miss
            assert b[k] == 0
            text = line.decode("utf-8", "replace")
            plain = all(c < 0x80 and not ref.FIELD_UNSURE[c] for c in line)
            if plain and _expected_by_split(line, first, second) is not None:
                fields = text.split()
                assert any(not f.isdigit() or len(f) > ref.FIELD_DIGITS for f in (fields[first], fields[second]))


@pytest.mark.parametrize(
    ("data", "first", "second", "expected"),
    [
        (b"", 1, 2, (0, 0, [], [])),
        (b"\n\n \t\r\n\x0b\x0c\n", 1, 2, (0, 0, [], [])),  # blank lines are no samples
        (b"\x1c\n", 0, 0, (1, 1, [0], [0])),  # a separator: a sample (not ASCII blank) of no field
        (b"a 640 480 3\n", 1, 2, (1, 0, [640], [480])),
        (b"a 640 480 3", 2, 1, (1, 0, [480], [640])),  # no final newline
        (b"a\t640\r\n", 1, 1, (1, 0, [640], [640])),
        (b"a 4294967295 0000000001\n", 1, 2, (1, 0, [4294967295], [1])),
        (b"a 4294967296 1\na 0 1\na 12345678901 1\na 00000000001 1\n", 1, 2, (4, 4, [0] * 4, [0] * 4)),
        (b"a 64x 1\na 64\xc2\xa01 1\na\xc2\xa0b 1 2\na 1 2 \xc2\xa0\n", 1, 2, (4, 3, [0, 0, 0, 1], [0, 0, 0, 2])),
        (b"\x01 1 2\na\x1b 1 2\n\xe3\x80\x80a 1 2\n", 1, 2, (3, 3, [0] * 3, [0] * 3)),
        (b"a 1\n\n  \nb 2 3\n", 1, 2, (2, 1, [0, 2], [0, 3])),
        (b"a\x1d1\x1f2\n", 1, 2, (1, 0, [1], [2])),  # 28-31 split fields, as str.split() splits them
        (b"\xc3\xa9 1 2\n\x80 3 4\n", 1, 2, (2, 0, [1, 3], [2, 4])),  # non-ASCII bytes in a field before
    ],
)
def test_line_fields_on_hostile_lines(impl: Any, data: bytes, first: int, second: int, expected: tuple) -> None:
    assert _fields(impl, data, first, second)[:4] == expected


def test_line_fields_writes_no_more_than_its_outputs_hold(impl: Any) -> None:
    data = b"".join(b"p %d %d\n" % (i + 1, i + 2) for i in range(100))
    samples, flagged, a, b, whole = _fields(impl, data, 1, 2, cap=10)
    assert (samples, flagged, a, b) == (100, 0, list(range(1, 11)), list(range(2, 12)))
    assert whole == a  # the 10 written
    assert _fields(impl, data, 1, 2, cap=0)[:2] == (100, 0)


@pytest.mark.parametrize("size", [15, 16, 17, 31, 32, 33, 64, 1000])
def test_line_fields_at_the_vector_edges(kernels: Kernels, size: int) -> None:
    # A long first field ending at every offset of the 16- and 8-byte steps, the buffer ending after it.
    for cut in range(size - 8, size + 1):
        data = b"x" * max(cut - 6, 1) + b" 12 34"
        assert _fields(kernels, data, 1, 2) == _fields(ref, data, 1, 2) == (1, 0, [12], [34], [12] + [7] * len(data))
        data = b"\xc3\xa9" * (cut // 2) + b" 5 6\n" + b"y" * cut
        assert _fields(kernels, data, 2, 1) == _fields(ref, data, 2, 1)


@pytest.mark.parametrize("shift", range(-3, 4))
def test_a_field_across_64_bytes_keeps_its_non_ascii_start(impl: Any, shift: int) -> None:
    # "12\xc3\xa934" is one field (not a number): its first bytes end one 64-byte block, its last the next.
    data = b"x" * (59 + shift) + b" 12\xc3\xa934 5\n" + b"y 1 2\n" * 20 + b"z 7 8"
    assert _fields(impl, data, 1, 2)[:4] == (22, 1, [0] + [1] * 20 + [7], [0] + [2] * 20 + [8])


def test_line_fields_of_a_read_only_mmap(kernels: Kernels, tmp_path: Path) -> None:
    p = tmp_path / "m.txt"
    p.write_bytes(b"".join(b"d/%d.jpg %d %d 1\n" % (i, i + 1, 3 * i + 1) for i in range(5000)))
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        buf = np.frombuffer(m, np.uint8)
        a, b = np.empty(5000, np.uint32), np.empty(5000, np.uint32)
        assert kernels.line_fields(buf, 1, 2, a, b) == (5000, 0)
        del buf
    assert a.tolist() == list(range(1, 5001)) and b.tolist() == list(range(1, 15001, 3))


def test_line_fields_refuses_bad_arguments(impl: Any) -> None:
    buf = _u8(b"a 1 2\n")
    out = np.empty(2, np.uint32)
    with pytest.raises(ValueError, match="must be >= 0"):
        impl.line_fields(buf, -1, 2, out, out.copy())
    with pytest.raises(ValueError, match="outputs"):
        impl.line_fields(buf, 1, 2, out, np.empty(3, np.uint32))


def test_native_line_fields_refuses_outputs_it_cannot_write(kernels: Kernels) -> None:
    buf = _u8(b"a 1 2\n")
    out = np.empty(2, np.uint32)
    with pytest.raises(TypeError, match="uint32"):
        kernels.line_fields(buf, 1, 2, np.empty(2, np.int64), out)
    frozen = out.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        kernels.line_fields(buf, 1, 2, out.copy(), frozen)
    with pytest.raises(ValueError, match="writeable contiguous"):
        kernels.line_fields(buf, 1, 2, np.empty(4, np.uint32)[::2], out)
