"""The line scanner: a leading UTF-8 byte order mark is not part of the first sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile, build_index
from rank_dataset.scan import BOM


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
