"""The collective reader's reads of a slice (``shards/_text.py``'s ``chunks`` and ``Text.count``): every piece
a view of one buffer, read into again for the next, and still the slice's bytes, cut at line ends, whatever
the lines' lengths against a read's."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

import rank_dataset.shards._text as text_module
from rank_dataset.files.index.scan import scan_buffer
from rank_dataset.files.io import FileKey
from rank_dataset.shards._text import Text, chunks


def _file(tmp_path: Path, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(400):
        kind = rng.random()
        size = int(rng.integers(300, 900)) if kind < 0.05 else (0 if kind < 0.1 else int(rng.integers(1, 40)))
        lines.append(bytes(rng.integers(97, 123, size).astype(np.uint8)))
    raw = b"\n".join(lines) + (b"\n" if seed % 2 else b"")
    (tmp_path / "meta.txt").write_bytes(raw)
    return raw


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("read", [64, 257, 4096, 1 << 20])
def test_pieces_are_the_slice_cut_at_line_ends_whatever_a_reads_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, read: int
) -> None:
    raw = _file(tmp_path, seed)
    monkeypatch.setattr(text_module, "READ", read)  # lines of up to 900 bytes: longer than some reads
    path = tmp_path / "meta.txt"
    text = Text(path, FileKey.of(os.stat(path)))
    cuts = [0, *sorted({raw.index(b"\n", x) + 1 for x in (len(raw) // 3, 2 * len(raw) // 3)}), len(raw)]
    for lo, hi in itertools.pairwise(cuts):
        got, at = [], lo
        with text.open() as reading:
            for buf, offset, last in chunks(reading, lo, hi):
                assert offset == at and last == (offset + buf.size == len(raw))
                assert buf.size and (last or buf[-1] == ord("\n"))
                got.append(bytes(buf))  # a copy: the next piece is read into the same buffer
                at += buf.size
        assert b"".join(got) == raw[lo:hi]
        # The count finds, piece by piece, the samples one scan of the whole slice finds.
        whole = scan_buffer(np.frombuffer(raw[lo:hi], np.uint8), 0, hi == len(raw))
        counted = list(text.count(lo, hi))
        starts = np.concatenate([c.starts for c in counted])
        lengths = np.concatenate([c.lengths for c in counted])
        assert starts.tolist() == whole.starts.tolist() and lengths.tolist() == whole.lengths.tolist()
        assert sum(c.newlines for c in counted) == whole.newlines == raw[lo:hi].count(b"\n")
