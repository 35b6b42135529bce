from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Hashable
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile, group_by
from rank_dataset.core.parsers import LineError, parse_label
from rank_dataset.files.group import _labels as group_labels
from tests_helpers import start_together


def samples(path: Path) -> list[str]:
    """The samples of a file, as the index's contract says: non-blank lines without their ending."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    return [line.decode() for line in lines if line.strip(b" \t\r\x0b\x0c")]


def reference(path: Path, key: Callable[[str], Hashable]) -> dict[Hashable, list[int]]:
    """The contract, written plainly: read every sample, group its number under its key."""
    groups: dict[Hashable, list[int]] = {}
    for i, line in enumerate(samples(path)):
        groups.setdefault(key(line), []).append(i)
    try:
        return dict(sorted(groups.items()))
    except TypeError:
        return groups


def label(line: str) -> int:
    return parse_label(line)[1]


def as_lists(groups: dict[Hashable, np.ndarray]) -> dict[Hashable, list[int]]:
    for ids in groups.values():
        assert ids.dtype == np.int64 and not ids.flags.writeable
    return {k: v.tolist() for k, v in groups.items()}


@pytest.mark.parametrize("n", [1, 2, 7, 100, 5_000, 70_000])
def test_labels_match_the_label_parser(write_meta, n: int) -> None:
    rng = np.random.default_rng(n)
    labels = rng.integers(-3, max(2, n // 50), n)
    p = write_meta(f"train/{i}/img {i}.JPEG {v}" for i, v in enumerate(labels.tolist()))
    assert as_lists(group_by(p)) == reference(p, label)


def test_labels_of_every_form_the_parser_accepts(tmp_path: Path) -> None:
    lines = [
        "a 1",
        "a\t2",
        "a  -3  ",  # a sign, whitespace after the label
        "a +4\r",
        "é/ü 5",  # non-ASCII path
        "图片 6",
        "a\u30007",  # a Unicode space before the label
        "a 8\u3000",  # and after it
        "  lead 9",  # leading whitespace stays in the path
        "a 123456789012345678",  # 18 digits: the longest the fast path decodes
        "a 1234567890123456789",  # 19 digits: still an int64
        "a 00000000000000000000000042",
        "a 1_000",  # int() accepts underscores
        "a\x1c10",  # str.split() splits at \x1c too
    ]
    p = tmp_path / "m.txt"
    p.write_bytes(b"\xef\xbb\xbf" + "\n\n \n".join(lines).encode() + b"\r\n")
    got = as_lists(group_by(p))
    assert got == reference(p, label)
    assert sorted(got) == sorted([1, 2, -3, 4, 5, 6, 7, 8, 9, 123456789012345678, 1234567890123456789, 42, 1000, 10])


@pytest.mark.parametrize(
    ("bad", "line"),
    [("nolabel", 3), ("a b", 3), ("7", 3), ("  7", 3), ("a 3x", 3), ("a --3", 3), ("a 99999999999999999999", 3)],
)
def test_a_line_without_a_label_is_named(tmp_path: Path, bad: str, line: int) -> None:
    p = tmp_path / "m.txt"
    p.write_text(f"a 1\n\n{bad}\nb 2\n")
    with pytest.raises(ValueError, match=rf"m\.txt:{line}: .*{bad.split()[-1]}"):
        group_by(p)
    with pytest.raises((LineError, OverflowError, ValueError)):
        np.int64(label(bad))


def random_label_file(rng: np.random.Generator, n: int) -> bytes:
    """n lines of labelled samples, with blank lines, "\\r\\n" or "\\n", tabs, signs, long labels, a
    final newline or none."""
    ending = str(rng.choice(["\n", "\r\n"]))
    lines = []
    for i in range(n):
        if rng.random() < 0.03:
            lines.append(str(rng.choice(["", " ", "\t \r"])))
        sep = str(rng.choice([" ", "\t", " \t "]))
        value = int(rng.integers(-50, 60)) * 10 ** int(rng.choice([0, 0, 0, 1, 9, 16]))
        lines.append(f"d/{i}{'x' * int(rng.integers(0, 40))}.jpg{sep}{value}{' ' * int(rng.random() < 0.05)}")
    return ending.join(lines).encode() + (ending.encode() if rng.random() < 0.7 else b"")


@pytest.mark.parametrize("block", [16, 100, 1000, 1 << 20])
@pytest.mark.parametrize("n", [1, 2, 3, 50, 2_000])
def test_labels_over_many_blocks_match_the_label_parser(tmp_path: Path, monkeypatch, block: int, n: int) -> None:
    monkeypatch.setattr(group_labels, "_CHUNK", block)  # blocks of a few lines: every kind of boundary
    rng = np.random.default_rng([n, block])
    p = tmp_path / "m.txt"
    p.write_bytes(random_label_file(rng, n))
    assert as_lists(group_by(p)) == reference(p, label)


@pytest.mark.parametrize("block", [8, 64, 333, 1 << 20])
def test_the_first_bad_line_is_named_across_blocks(tmp_path: Path, monkeypatch, block: int) -> None:
    monkeypatch.setattr(group_labels, "_CHUNK", block)
    lines = [f"img{i}.jpg {i % 7}" for i in range(300)]
    lines[123] = "img123.jpg seven"
    lines[250] = "no_label_here"
    p = tmp_path / "m.txt"
    p.write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    with pytest.raises(ValueError, match=r"m\.txt:125: label 'seven' is not an integer"):
        group_by(p)


def test_labels_outside_int64_are_named(tmp_path: Path) -> None:
    p = tmp_path / "m.txt"
    p.write_text("a 1\nb 9223372036854775807\nc -9223372036854775808\nd 9223372036854775808\n")
    with pytest.raises(ValueError, match=r"m\.txt:4: label outside the int64 range"):
        group_by(p)
    p.write_text("a 1\nb 9223372036854775807\nc -9223372036854775808\n")
    assert as_lists(group_by(p)) == {-(2**63): [2], 1: [0], 2**63 - 1: [1]}


def test_the_grouping_is_cached_beside_the_index_and_redone_for_a_changed_file(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"x{i} {i % 3}" for i in range(1000))
    first = group_by(p)
    grouping, index = sorted((tmp_path / "cache").iterdir(), key=lambda x: x.suffix)
    assert (index.suffix, grouping.name) == (".rdidx", index.name.removesuffix(".rdidx") + ".label.rdgrp")
    again = group_by(p)
    assert all(isinstance(v, np.memmap) for v in again.values())
    assert as_lists(again) == as_lists(first) == reference(p, label)
    p.write_text("".join(f"y{i} {i % 5}\n" for i in range(999)))  # same file, new content
    assert as_lists(group_by(p)) == reference(p, label)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # replaced, not added to


def test_a_damaged_cache_is_not_trusted(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"x{i} {i % 4}" for i in range(500))
    group_by(p)
    (cache,) = (tmp_path / "cache").glob("*.rdgrp")
    data = bytearray(cache.read_bytes())
    cache.write_bytes(bytes(data[:-8]))  # torn
    assert as_lists(group_by(p)) == reference(p, label)
    data[200:208] = b"\xff" * 8  # the bounds
    cache.write_bytes(bytes(data))
    assert as_lists(group_by(p)) == reference(p, label)


def test_samples_are_numbered_as_the_dataset_numbers_them(write_meta) -> None:
    p = write_meta(["a 1", "", "   ", "b 2", "c 1"])
    mf = MetaFile(p)
    groups = group_by(p)
    assert [mf[i] for i in groups[1].tolist()] == ["a 1", "c 1"] and [mf[i] for i in groups[2].tolist()] == ["b 2"]


def test_a_function_key_in_key_order_else_first_appearance(write_meta, tmp_path: Path) -> None:
    p = write_meta(["b 1", "a 2", "b 3", "c 1"])
    by_letter = group_by(p, key=lambda line: line[0])
    assert as_lists(by_letter) == {"a": [1], "b": [0, 2], "c": [3]}
    mixed = group_by(p, key=lambda line: line[0] if line[0] != "a" else 7)  # str and int: no order
    assert list(mixed) == ["b", 7, "c"] and as_lists(mixed) == reference(p, lambda s: s[0] if s[0] != "a" else 7)
    assert not list((tmp_path / "cache").glob("*.rdgrp"))  # no name, no cache


def test_a_function_key_is_cached_under_its_name_only(write_meta, tmp_path: Path) -> None:
    p = write_meta(["b 1", "a 2", "b 3", "c 1"])
    calls = []

    def key(line: str) -> tuple[str, int]:
        calls.append(line)
        return (line[0], len(line))

    first = group_by(p, key=key, cache_name="letter")
    assert as_lists(first) == {("a", 3): [1], ("b", 3): [0, 2], ("c", 3): [3]} and len(calls) == 4
    assert as_lists(group_by(p, key=key, cache_name="letter")) == as_lists(first) and len(calls) == 4
    assert [c.name.split(".")[-2] for c in (tmp_path / "cache").glob("*.rdgrp")] == ["letter"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key": "json"}, ValueError, "key must be"),
        ({"key": "label", "cache_name": "x"}, ValueError, "cache_name is for a function key"),
        ({"key": len, "cache_name": "a b"}, ValueError, "cache_name must be"),
        ({"key": len, "cache_name": "label"}, ValueError, "choose another name"),
        ({"key": lambda line: [line]}, TypeError, r"m\.txt:1: key returned \['a 1'\]"),
        ({"key": lambda line: object(), "cache_name": "obj"}, TypeError, "a key to be cached"),
    ],
)
def test_arguments_are_checked(tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    p = tmp_path / "m.txt"
    p.write_text("a 1\nb 2\n")
    with pytest.raises(error, match=match):
        group_by(p, **kwargs)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.txt'$"):
        group_by(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        group_by(tmp_path)
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="no samples"):
        group_by(tmp_path / "blank.txt")


_COUNTED = """
import os, sys
from rank_dataset import group_by
def key(line):
    if line == "x0 0":  # once per process that evaluates the key
        open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
    return int(line.split()[-1]) % 7
print("ready", flush=True)
sys.stdin.readline()
groups = group_by(sys.argv[1], key=key, cache_name="mod7")
print(sum(len(v) for v in groups.values()), flush=True)
"""


@pytest.mark.slow  # several processes grouping one file at once
def test_many_processes_asking_at_once_group_the_file_once(write_meta, tmp_path: Path) -> None:
    p = write_meta(f"x{i} {i}" for i in range(200_000))
    MetaFile(p)  # indexed already: what is measured is the grouping
    marks = tmp_path / "marks"
    marks.mkdir()
    argv = [sys.executable, "-c", _COUNTED, str(p), str(marks)]
    assert [out.strip() for out in start_together(argv, 6)] == ["200000"] * 6
    assert len(list(marks.iterdir())) == 1
    assert sorted(x.suffix for x in (tmp_path / "cache").iterdir()) == [".rdgrp", ".rdidx"]  # no lock, no tmp


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSPC])
def test_a_cache_whose_space_cannot_be_reserved(write_meta, tmp_path: Path, monkeypatch, code: int) -> None:
    # No reservation on this file system: the grouping is written to the cache the plain way. No space
    # left: nothing is cached, and the grouping is still returned.
    p = write_meta(f"x{i} {i % 6}" for i in range(3000))

    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    assert as_lists(group_by(p)) == reference(p, label)
    cached = list((tmp_path / "cache").glob("*.rdgrp"))
    assert len(cached) == (code == errno.EOPNOTSUPP)
    assert not list((tmp_path / "cache").glob("*.tmp"))
    monkeypatch.undo()
    assert as_lists(group_by(p)) == reference(p, label)
