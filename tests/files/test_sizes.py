"""sizes_of: each sample's width and height from its line (text fields by position, JSON fields and Parquet
columns by name, functions of the line), cached beside the index and memory-mapped; bad sizes named."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset import MetaFile, sizes_of
from rank_dataset.files.group import _lines as group_lines
from tests_helpers import start_together


def _sizes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    # Up to 10 digits: the longest go through Python, the rest through numpy.
    big = rng.random(n) < 0.02
    w = np.where(big, rng.integers(10**8, 2**32, n), rng.integers(1, 9000, n))
    return w, rng.integers(1, 9000, n)


def _text(rng: np.random.Generator, w: np.ndarray, h: np.ndarray) -> bytes:
    """Lines of every form the fields may take: tabs or runs of blanks, CRLF, blank lines between, leading
    whitespace, non-ASCII paths, a Unicode space (which str.split() takes as whitespace) in some paths."""
    out = []
    for i in range(w.size):
        path = f"d/{i}{'é' if i % 7 == 0 else ''}{'x' * int(rng.integers(0, 30))}.jpg"
        if i % 53 == 0:
            path = "\u3000" + path  # leading Unicode whitespace: not a field
        sep = [" ", "\t", "  ", " \t "][i % 4]
        lead = " " if i % 17 == 0 else ""
        end = "\r\n" if i % 3 == 0 else "\n"
        out.append(f"{lead}{path}{sep}{w[i]}{sep}{h[i]}{sep}{i % 10}{end}" + ("\n" if i % 29 == 0 else ""))
    return "".join(out).encode()


@pytest.mark.parametrize("block", [7, 1000, 1 << 20])
@pytest.mark.parametrize("n", [1, 3, 2_000])
def test_text_fields_by_position_match_str_split(tmp_path: Path, monkeypatch, block: int, n: int) -> None:
    monkeypatch.setattr(group_lines, "BLOCK", block)  # blocks of a few lines: every kind of boundary
    rng = np.random.default_rng([n, block])
    w, h = _sizes(rng, n)
    p = tmp_path / "m.txt"
    p.write_bytes(_text(rng, w, h))
    sizes = sizes_of(p)
    assert sizes.width.dtype == sizes.height.dtype == np.uint32
    assert sizes.width.tolist() == w.tolist() and sizes.height.tolist() == h.tolist()
    assert not sizes.width.flags.writeable
    lines = MetaFile(p)
    assert [int(lines[i].split()[2]) for i in range(n)] == h.tolist()  # numbered as the dataset numbers them
    swapped = sizes_of(p, 2, 1)
    assert swapped.width.tolist() == h.tolist() and swapped.height.tolist() == w.tolist()


def test_the_sizes_are_cached_beside_the_index_and_read_again_for_a_changed_file(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"x{i}.jpg {i + 1} {2 * i + 1} 0" for i in range(1000))
    first = sizes_of(p)
    cached = sorted(x.name for x in (tmp_path / "cache").iterdir())
    assert len(cached) == 2 and cached[1].endswith(".sizes-1-2.rdcol") and cached[0].endswith(".rdidx")
    again = sizes_of(p)
    assert isinstance(again.width, np.memmap) and again.width.tolist() == first.width.tolist()
    p.write_text("".join(f"y{i}.jpg {i + 5} {i + 6}\n" for i in range(999)))  # same file, new content
    assert sizes_of(p).width.tolist() == list(range(5, 1004))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # replaced, not added to


def test_a_function_is_called_once_per_line_and_cached_under_its_name(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"img_{i}_{3 * i + 2}x{i + 7}.jpg" for i in range(500))
    calls = []

    def width(line: str) -> int:
        calls.append(line)
        return int(line.split("_")[2].split("x")[0])

    def height(line: str) -> float:
        return float(line.split("x")[1].removesuffix(".jpg"))  # an integral float is a size

    sizes = sizes_of(p, width, height, cache_name="wh")
    assert sizes.width.tolist() == [3 * i + 2 for i in range(500)] and sizes.height.tolist() == [
        i + 7 for i in range(500)
    ]
    assert len(calls) == 500
    assert sizes_of(p, width, height, cache_name="wh").height.tolist() == sizes.height.tolist()
    assert len(calls) == 500  # read from the cache
    sizes_of(p, width, height)  # no name: read anew, not cached
    assert len(calls) == 1000
    assert sum(x.suffix == ".rdcol" for x in (tmp_path / "cache").iterdir()) == 1


def test_json_fields_by_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    w, h = _sizes(rng, 300)
    p = tmp_path / "m.jsonl.gz"
    text = "".join(json.dumps({"path": f"{i}.jpg", "w": int(w[i]), "h": int(h[i])}) + "\n" for i in range(300))
    p.write_bytes(gzip.compress(text.encode()))
    sizes = sizes_of(p, "w", "h")
    assert sizes.width.tolist() == w.tolist() and sizes.height.tolist() == h.tolist()


def test_parquet_columns_by_name(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(4)
    w, h = _sizes(rng, 1000)
    p = tmp_path / "m.parquet"
    table = pa.table({"path": [f"{i}.jpg" for i in range(1000)], "width": w.astype(np.int64), "height": h})
    pq.write_table(table, p, row_group_size=128)
    sizes = sizes_of(p, "width", "height")
    assert sizes.width.tolist() == w.tolist() and sizes.height.tolist() == h.tolist()
    with pytest.raises(ValueError, match=r"has no column 'wide'; its columns are \['path', 'width', 'height'\]"):
        sizes_of(p, "wide", "height")
    bad = pa.table({"path": ["a", "b", "c"], "width": [640, None, 3], "height": [1, 2, 3]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet, row 1: column 'width' is None, not an integer"):
        sizes_of(tmp_path / "bad.parquet", "width", "height")


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("c.jpg 640", r"m\.txt:4: no field 2 \(the line has 2\): 'c\.jpg 640'"),
        ("c.jpg 640 wide", r"m\.txt:4: field 2 is 'wide', not an integer in \[1, 2\*\*32\)"),
        ("c.jpg 640 0", r"m\.txt:4: field 2 is 0, not an integer"),
        ("c.jpg 640 4294967296", r"m\.txt:4: field 2 is 4294967296, not an integer"),
        ("c.jpg 640 48.5", r"m\.txt:4: field 2 is '48\.5'"),
        ("\x01", r"m\.txt:4: no field 1 \(the line has 1\)"),
    ],
)
def test_a_bad_or_missing_size_names_the_file_line_and_value(tmp_path: Path, line: str, match: str) -> None:
    p = tmp_path / "m.txt"
    p.write_text(f"a.jpg 1 2\nb.jpg 3 4\n\n{line}\nd.jpg 5 6\n")
    with pytest.raises(ValueError, match=match):
        sizes_of(p)
    assert not list((tmp_path / "cache").glob("*.rdcol*"))  # nothing half-built is left


def test_bad_json_and_function_sizes_are_named(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"w": 3, "h": 4}\n{"w": 3}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: no field 'h'"):
        sizes_of(p, "w", "h")
    p.write_text('{"w": 3, "h": 4}\n{"w": 3, "h": "tall"}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: field 'h' is 'tall', not an integer"):
        sizes_of(p, "w", "h")
    q = tmp_path / "f.txt"
    q.write_text("a 1\nb -2\n")
    with pytest.raises(ValueError, match=r"f\.txt:2: width\(line\) is -2"):
        sizes_of(q, lambda s: int(s.split()[1]), lambda s: 1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"width": 1, "height": "h"}, TypeError, "two field positions"),
        ({"width": True, "height": 2}, TypeError, "two field positions"),
        ({"width": -1, "height": 2}, ValueError, "0-based and non-negative"),
        ({"width": 1, "height": 2, "cache_name": "x"}, ValueError, "cache_name is for functions"),
        ({"width": len, "height": len, "cache_name": "a b"}, ValueError, "1-64 letters"),
    ],
)
def test_arguments_are_checked(write_meta, kwargs: dict[str, Any], error: type, match: str) -> None:
    p = write_meta(["a 1 2"])
    with pytest.raises(error, match=match):
        sizes_of(p, **kwargs)


def test_sizes_of_an_object_equal_the_local_file_and_are_cached_on_this_node(s3: Any, tmp_path: Path) -> None:
    pytest.importorskip("obstore")
    from rank_dataset.files.io.object import COUNTS

    rng = np.random.default_rng(5)
    w, h = _sizes(rng, 40_000)  # the index's checks of a cached file read its first bytes and its ends
    data = _text(rng, w, h)
    url = s3.put("sizes/m.txt", data)
    local = tmp_path / "m.txt"
    local.write_bytes(data)
    remote = sizes_of(url)
    assert remote.width.tolist() == sizes_of(local).width.tolist() == w.tolist()
    before = dict(COUNTS)
    assert sizes_of(url).height.tolist() == h.tolist()
    assert COUNTS["bytes"] - before["bytes"] < len(data) // 4  # cached: the index's checks (about 200 KB), not the file
    bad = s3.put("sizes/bad.txt", b"a.jpg 1 2\nb.jpg 3\n")
    with pytest.raises(ValueError, match=r"s3://meta/sizes/bad\.txt:2: no field 2"):
        sizes_of(bad)


_COUNTED = """
import os, sys
from rank_dataset import sizes_of
def width(line):
    if line.startswith("x0 "):  # once per process that reads the lines
        open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
    return int(line.split()[1])
print("ready", flush=True)
sys.stdin.readline()
sizes = sizes_of(sys.argv[1], width, lambda line: int(line.split()[2]), cache_name="wh")
print(int(sizes.width.sum()), flush=True)
"""


@pytest.mark.slow  # several processes asking at once
def test_many_processes_asking_at_once_read_the_file_once(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"x{i} {i + 1} 7" for i in range(100_000))
    MetaFile(p)  # indexed already: what is measured is the reading of the sizes
    marks = tmp_path / "marks"
    marks.mkdir()
    outs = start_together([sys.executable, "-c", _COUNTED, str(p), str(marks)], 5)
    assert [out.strip() for out in outs] == [str(100_000 * 100_001 // 2)] * 5
    assert len(list(marks.iterdir())) == 1  # one process built the cache under the lock, the others mapped it
    assert sorted(x.suffix for x in (tmp_path / "cache").iterdir()) == [".rdcol", ".rdidx"]  # no lock, no tmp
