"""group_by, ids_of and the recipes on compressed meta files: the results of the plain file of the
same lines, read in one checked decompression; bad input is a clear error, never a wrong grouping."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import class_balanced, group_by, ids_of, repeat_factor
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.group import _labels as group_labels
from rank_dataset.files.group import _lines as group_lines
from rank_dataset.files.group import grouping
from rank_dataset.files.index.load import load_index
from tests_helpers import COMPRESSORS, compressed_pair, hostile_lines, zstd_frames


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small blocks, so that small files are decompressed, parsed and read in many (lines cross them).
    monkeypatch.setattr(group_lines, "STREAM_BLOCK", 7_000)
    monkeypatch.setattr(group_labels, "_CHUNK", 20_000)
    monkeypatch.setattr(group_lines, "BLOCK", 700)


def _lines(n: int) -> bytes:
    # The demo's shape, non-ASCII, amid hostile_lines' blank lines, CRLF endings and byte order mark.
    return hostile_lines(n, lambda i: f"train/n{i % 7:08d}/img_{i}_é.JPEG {i * 7919 % 37}")


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _directory(line: str) -> str:
    return line.split("/")[1]


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_group_by_and_ids_of_give_the_plain_files_results(tmp_path: Path, name: str) -> None:
    plain, packed = compressed_pair(tmp_path, name, _lines(6000))
    assert len(packed.read_bytes()) < len(plain.read_bytes())
    by_label = group_by(plain)
    assert len(by_label) == 37 and sum(len(v) for v in by_label.values()) > 5000
    for _ in range(2):  # built, then from the cache
        assert _same(group_by(packed), by_label)
        assert _same(group_by(packed, _directory, cache_name="dir"), group_by(plain, _directory, cache_name="dir"))
    assert _same(group_by(packed, lambda line: line[-2:]), group_by(plain, lambda line: line[-2:]))
    wanted = ["train/n00000003/img_10_é.JPEG", "train/n00000000/img_5999_é.JPEG", "train/n00000000/img_0_é.JPEG"]
    assert np.array_equal(ids_of(packed, wanted), ids_of(plain, wanted))
    assert ids_of(packed, wanted).size == 3
    with pytest.raises(KeyError, match="1 of 1 keys are in no line"):
        ids_of(packed, ["train/n00000000/img_5_é.JPEG"])  # a whitespace line, not a sample


@pytest.mark.parametrize("name", ["members.gz", "one.zst"])
def test_the_recipes_give_the_plain_files_sources(tmp_path: Path, name: str) -> None:
    plain, packed = compressed_pair(tmp_path, name, _lines(3000))

    def described(sources: list) -> list:
        return [(s.name.split("[")[1], s.weight, s.repeat, np.asarray(s.ids).tolist()) for s in sources]

    assert described(class_balanced(packed, power=0.5)) == described(class_balanced(plain, power=0.5))

    def categories(line: str) -> list[int]:
        return [int(line.split()[-1]) % 5, len(line) % 3]

    a = repeat_factor(packed, categories=categories, threshold=0.3)
    assert described(a) == described(repeat_factor(plain, categories=categories, threshold=0.3))
    assert len(a) > 1


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_a_line_without_a_label_is_named_by_file_and_line(tmp_path: Path, name: str) -> None:
    raw = _lines(3000).split(b"\n")
    raw[2500] = b"train/n00000001/img_no_label.JPEG"
    plain, packed = compressed_pair(tmp_path, name, b"\n".join(raw))
    with pytest.raises(ValueError, match=rf"{plain}:2501: ") as text:
        group_by(plain)
    with pytest.raises(ValueError, match=rf"{packed}:2501: ") as info:
        group_by(packed)
    assert str(info.value).replace(str(packed), str(plain)) == str(text.value)


@pytest.mark.parametrize("name", ["one.gz", "members.gz", "one.zst", "frames.zst"])
@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_corrupt_or_truncated_file_is_an_error_naming_file_and_compressed_offset(
    tmp_path: Path, name: str, damage: str
) -> None:
    path = tmp_path / name
    data = bytearray(COMPRESSORS[name](_lines(3000)))
    if damage == "corrupt":
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0x5A
    else:
        del data[len(data) - 100 :]
    path.write_bytes(bytes(data))
    for call in (lambda: group_by(path), lambda: ids_of(path, ["x"]), lambda: class_balanced(path)):
        with pytest.raises(CorruptMetaFileError) as info:
            call()
        assert info.value.path == path and f"compressed byte {info.value.offset:,}" in str(info.value)
        assert 0 <= info.value.offset < len(data) and str(path) in str(info.value)
        if damage == "truncated":
            assert "truncated" in str(info.value)


@pytest.mark.parametrize("name", ["one.gz", "frames.zst"])
@pytest.mark.parametrize("key", ["label", "function"])
def test_a_file_rewritten_in_place_after_indexing_is_metafilechangederror(tmp_path: Path, name: str, key: str) -> None:
    raw = _lines(3000)
    _, path = compressed_pair(tmp_path, name, raw)
    index = load_index(path)
    with open(path, "r+b") as f:  # in place: the same inode; other lines, the same size
        f.write(COMPRESSORS[name](raw.replace(b"img_1", b"img_9")))
        f.truncate()
    # The grouping reads through the index it was given, as when the file changes while it is grouped.
    with pytest.raises(MetaFileChangedError, match=rf"{path}.*(modified|size changed)"):
        grouping._group(path, index, "label" if key == "label" else _directory)
    assert _same(group_by(path), group_by(tmp_path / f"{name}.txt"))  # indexed again, grouped anew


def test_a_file_rewritten_while_it_is_grouped_is_metafilechangederror(tmp_path: Path) -> None:
    raw = _lines(3000)
    _, path = compressed_pair(tmp_path, "frames.zst", raw)
    seen = []

    def rewrite_once(line: str) -> str:
        if not seen:  # the first line: rewrite the file in place while it is being read
            with open(path, "r+b") as f:
                f.write(zstd_frames(raw[::-1], 40_000))
        seen.append(line)
        return line[:3]

    with pytest.raises(MetaFileChangedError, match="while it was grouped"):
        group_by(path, rewrite_once)


def test_lines_not_utf8_in_a_gz_are_grouped_as_the_plain_files(tmp_path: Path) -> None:
    # Grouping decodes a line with replacement, as for a plain file; RankDataset and MetaFile name it.
    raw = b"a 1\nb 2\n\nc \xff\xfe 3\nd 4\n"
    (tmp_path / "bad.txt").write_bytes(raw)
    (tmp_path / "bad.gz").write_bytes(gzip.compress(raw))
    assert _same(group_by(tmp_path / "bad.gz"), group_by(tmp_path / "bad.txt"))
    first = lambda line: line[:1]  # noqa: E731
    assert _same(group_by(tmp_path / "bad.gz", first), group_by(tmp_path / "bad.txt", first))


def test_nothing_is_left_open(tmp_path: Path) -> None:
    import os

    _, path = compressed_pair(tmp_path, "members.gz", _lines(3000))
    before = len(os.listdir("/proc/self/fd"))
    group_by(path)
    group_by(path, _directory)
    raw = _lines(3000).split(b"\n")
    raw[2000] = b"no label"
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\n".join(raw)))
    with pytest.raises(ValueError, match=r"bad\.gz:2001: "):
        group_by(tmp_path / "bad.gz")
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("name", ["one.gz", "frames.zst"])
def test_lines_not_json_or_not_utf8_are_named_by_file_and_line_as_for_text(tmp_path: Path, name: str) -> None:
    from rank_dataset import RankDataset

    plain, packed = compressed_pair(tmp_path, name, b'{"a": 1}\n\n{"a": 2\n{"a": 4}\n')
    for path in (plain, packed):
        ds = RankDataset(path, is_test=True, parser="json", rank=0, world_size=1)
        try:
            assert ds[0] == {"a": 1} and ds[2] == {"a": 4}
            with pytest.raises(ValueError, match=rf"{path}:3: invalid JSON"):
                ds[1]
        finally:
            ds.close()
    (tmp_path / "utf8").mkdir()
    plain, packed = compressed_pair(tmp_path / "utf8", name, b'{"a": 1}\n\n{"a": 2}\n{"a": "\xff"}\n')
    for path in (plain, packed):
        with pytest.raises(ValueError, match=rf"{path}:4: line is not valid UTF-8"):
            RankDataset(path, is_test=True, rank=0, world_size=1)
