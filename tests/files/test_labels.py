from __future__ import annotations

import numpy as np
import pytest

from rank_dataset.core.parsers import LineError, parse_label
from rank_dataset.files.group._block_labels import PAD, block_labels, tail_labels
from rank_dataset.files.index.scan import _spans, scan_buffer

_PIECES = ["a", "b", " ", "\t", "-", "+", "0", "1", "9", "5", "\u3000", "\xa0", "é", "x/", "\x1c", "_", "12345678"]
_PIECES.append("9" * 11)


@pytest.mark.parametrize("seed", range(4))
def test_what_is_decoded_is_what_the_parser_reads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["".join(rng.choice(_PIECES, rng.integers(1, 9))) for _ in range(40_000)]
    lines = [line for line in lines if line.strip(" \t\r\x0b\x0c")]
    data = ("\n".join(lines) + "\n").encode()
    spans, _ = _spans(scan_buffer(np.frombuffer(data, np.uint8), 0, last=True))
    assert len(spans) == len(lines)
    buf = np.frombuffer(b"\n" * PAD + data, np.uint8)
    labels, decoded = tail_labels(buf, spans[:, 0] + PAD, spans[:, 1] + PAD)
    for line, value, ok in zip(lines, labels.tolist(), decoded.tolist()):
        try:
            want = parse_label(line)[1]
        except LineError:
            want = None
        if ok:
            assert value == want, line
    assert decoded.any()


def test_the_common_lines_are_all_decoded() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(-(10**18) + 1, 10**18, 5000) // 10 ** rng.integers(0, 18, 5000)
    seps = rng.choice([" ", "\t", "  "], 5000)
    lines = [f"dir/{i} é{sep}{v:+d}" if i % 3 else f"图{i}{sep}{v}  " for i, (sep, v) in enumerate(zip(seps, values))]
    data = ("\n".join(lines) + "\n").encode()
    spans, _ = _spans(scan_buffer(np.frombuffer(data, np.uint8), 0, last=True))
    labels, decoded = tail_labels(np.frombuffer(b"\n" * PAD + data, np.uint8), spans[:, 0] + PAD, spans[:, 1] + PAD)
    assert decoded.all()
    assert labels.tolist() == values.tolist()


def reference_samples(data: bytes) -> list[str]:
    """The samples of a file's bytes, as the index's contract says: non-blank lines without their ending."""
    lines = [line.removesuffix(b"\r") for line in data.removeprefix(b"\xef\xbb\xbf").split(b"\n")]
    return [line.decode("utf-8", "replace") for line in lines if line.strip(b" \t\r\x0b\x0c")]


def label_or_none(line: str) -> int | None:
    try:
        value = parse_label(line)[1]
    except LineError:
        return None
    return value if -(2**63) <= value < 2**63 else None


def read_block(data: bytes) -> tuple[np.ndarray, list[int | None], list[str]]:
    """block_labels over a whole file's bytes, the parser finishing what it leaves: the labels (None
    where the parser fails) and the samples' texts as the block sees them."""
    body = data if data.endswith(b"\n") else data + b"\n"
    buf = np.frombuffer(b"\n" * PAD + body, np.uint8)
    labels, todo, starts, ends = block_labels(buf, buf.size, file_start=True)
    got: list[int | None] = labels.tolist()
    texts = {}
    for row, a, b in zip(todo.tolist(), starts.tolist(), ends.tolist()):
        texts[row] = buf[a:b].tobytes().decode("utf-8", "replace")
        got[row] = label_or_none(texts[row])
    return labels, got, [texts.get(i, "") for i in range(len(got))]


_LINE_PIECES = ["a", "x/y.jpg", " ", "\t", "  ", "-", "+", "0", "7", "42", "999", "1234567", "12345678", "\r", "\u3000"]
_LINE_PIECES += ["\x1c", "_", "é", "\x0b", "9" * 19, "9" * 25]


@pytest.mark.parametrize("seed", range(12))
def test_block_labels_are_the_parsers_over_random_files(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 2, 3, 10, 100, 2000]))
    lines = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            lines.append("".join(rng.choice([" ", "\t", "\r", "", "\x0b"], rng.integers(0, 4))))  # blank
        elif kind < 0.6:
            sep = str(rng.choice([" ", "\t", "  "]))
            lines.append(f"dir/{rng.integers(1000)}.jpg{sep}{rng.integers(-999, 10 ** int(rng.integers(1, 12)))}")
        else:
            lines.append("".join(rng.choice(_LINE_PIECES, rng.integers(1, 6))))
    ending = str(rng.choice(["\n", "\r\n"]))
    data = ending.join(lines).encode() + (ending.encode() if rng.random() < 0.7 else b"")
    if rng.random() < 0.3:
        data = b"\xef\xbb\xbf" + data
    want = reference_samples(data)
    labels, got, texts = read_block(data)
    assert labels.dtype == np.int64 and len(got) == len(want)
    assert got == [label_or_none(line) for line in want]
    assert all(text in ("", line) for text, line in zip(texts, want))  # a sample left to the parser is that line


def test_block_labels_decode_the_common_lines_in_numpy() -> None:
    rng = np.random.default_rng(1)
    values = rng.integers(-(10**7) + 1, 10**7, 3000) // 10 ** rng.integers(0, 7, 3000)
    seps = rng.choice([" ", "\t", " \t"], 3000)
    pairs = enumerate(zip(seps, values))
    lines = [f"train/n0{i}/img {i}.JPEG{s}{v:+d}" if i % 2 else f"图 {i}{s}{v}" for i, (s, v) in pairs]
    for ending in ("\n", "\r\n"):
        buf = np.frombuffer(b"\n" * PAD + ending.join(lines).encode() + ending.encode(), np.uint8)
        labels, todo, _, _ = block_labels(buf, buf.size, file_start=True)
        assert todo.size == 0 and labels.tolist() == values.tolist()
