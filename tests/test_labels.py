from __future__ import annotations

import numpy as np
import pytest

from rank_dataset._labels import PAD, tail_labels
from rank_dataset.parsers import LineError, parse_label
from rank_dataset.scan import _scan_chunk, _spans

_PIECES = ["a", "b", " ", "\t", "-", "+", "0", "1", "9", "5", "\u3000", "\xa0", "é", "x/", "\x1c", "_", "12345678"]
_PIECES.append("9" * 11)


@pytest.mark.parametrize("seed", range(4))
def test_what_is_decoded_is_what_the_parser_reads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["".join(rng.choice(_PIECES, rng.integers(1, 9))) for _ in range(40_000)]
    lines = [line for line in lines if line.strip(" \t\r\x0b\x0c")]
    data = ("\n".join(lines) + "\n").encode()
    spans, _ = _spans(_scan_chunk(np.frombuffer(data, np.uint8), 0, last=True))
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
    spans, _ = _spans(_scan_chunk(np.frombuffer(data, np.uint8), 0, last=True))
    labels, decoded = tail_labels(np.frombuffer(b"\n" * PAD + data, np.uint8), spans[:, 0] + PAD, spans[:, 1] + PAD)
    assert decoded.all()
    assert labels.tolist() == values.tolist()
