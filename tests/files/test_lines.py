"""files.read.lines.window_ok, the line checks a build makes of each window it reads, on either kernel path: the
native one (one check_lines call: bounds, blank rows, newlines inside rows) and numpy's (bounds_ok and rows_ok,
newlines left to a search of the copied shard) judge every span alike. (Under RANK_DATASET_NATIVE=0 the
"native" side is check_lines' numpy reference.)"""

from __future__ import annotations

import numpy as np
import pytest

from rank_dataset.core import native
from rank_dataset.files.index.scan import BOM, NEWLINE, scan_buffer
from rank_dataset.files.read import lines
from rank_dataset.files.read.lines import check_from, window_ok

_PIECES = [b"a 1", b"bb 22", b" ", b"", b"\t", b"c\r", b"\xc3\xa9 3", b"x y z"]


def _file(rng: np.random.Generator, bom: bool) -> bytes:
    body = b"\n".join(_PIECES[i] for i in rng.integers(0, len(_PIECES), 40))
    if rng.random() < 0.5:
        body += b"\n"
    return (BOM if bom else b"") + body


def _judge(data: bytes, s: np.ndarray, e: np.ndarray, path: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(native, "FUSED", path == "native")
    lo, hi = int(check_from(s).min()), int(e.max()) + 2
    buf = np.zeros(hi - lo + 8, np.uint8)
    got = np.frombuffer(data[lo:hi], np.uint8)
    buf[: got.size] = got
    ok, newlines_checked = window_ok(buf, lo, s, e, len(data))
    assert newlines_checked == (path == "native")
    return ok


@pytest.mark.parametrize("seed", range(40))
def test_native_and_numpy_judge_spans_alike(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    data = _file(rng, bom=seed % 3 == 0)
    found = scan_buffer(np.frombuffer(data, np.uint8), 0, True)
    s, e = found.starts.copy(), found.starts + found.lengths
    assert _judge(data, s, e, "native", monkeypatch) and _judge(data, s, e, "numpy", monkeypatch)
    for _ in range(30):  # one span spoilt: moved, grown past its line ending, or two lines as one
        s2, e2 = s.copy(), e.copy()
        k = int(rng.integers(0, s.size))
        how = rng.integers(0, 3)
        if how == 0:
            s2[k] = max(0, s2[k] + int(rng.integers(-2, 3)))
        elif how == 1:
            e2[k] = min(len(data), e2[k] + int(rng.integers(1, 3)))
        elif k + 1 < s.size:
            e2[k] = e2[k + 1]
        if not (0 <= s2[k] <= e2[k] <= len(data)):
            continue
        inside = NEWLINE in data[s2[k] : e2[k]]
        numpy_ok = _judge(data, s2, e2, "numpy", monkeypatch)
        assert _judge(data, s2, e2, "native", monkeypatch) == (numpy_ok and not inside), (seed, k, how)


def test_the_numpy_path_leaves_newlines_to_the_shard_search(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"a 1\nb 2\nc 3\n"
    s, e = np.array([0], np.int64), np.array([7], np.int64)  # "a 1\nb 2": two lines as one
    monkeypatch.setattr(native, "FUSED", False)
    buf = np.zeros(len(data) + 8, np.uint8)
    buf[: len(data)] = np.frombuffer(data, np.uint8)
    assert window_ok(buf, 0, s, e, len(data)) == (True, False)
    assert lines.rows_ok(buf, s, e)  # (gather's search of the copied shard finds the newline)
