"""group_by, ids_of and the recipes on Parquet meta files: the results of the text file of the same
lines (row i is sample i, its line the columns joined by a tab); bad input is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rank_dataset import class_balanced, group_by, ids_of, repeat_factor
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.group import grouping
from rank_dataset.files.index.load import load_index

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _write(tmp_path: Path, columns: dict[str, list[object]], groups: int, name: str = "meta") -> tuple[Path, Path]:
    """The Parquet file of ``columns`` in row groups of ``groups`` rows, and the text file of its lines
    (the columns joined by a tab, a null as an empty field), written without the reader."""
    parquet, text = tmp_path / f"{name}.parquet", tmp_path / f"{name}.txt"
    pq.write_table(pa.table(columns), parquet, row_group_size=groups)
    names = list(columns)
    n = len(columns[names[0]])
    lines = ["\t".join("" if columns[c][i] is None else str(columns[c][i]) for c in names) for i in range(n)]
    text.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return parquet, text


def _labelled(n: int, label_type: str = "int") -> dict[str, list[object]]:
    labels = [i * 7919 % 37 - (5 if i % 17 == 0 else 0) for i in range(n)]  # some negative
    return {
        "path": [f"train/n{i % 7:08d}/img_{i}{'_é' if i % 11 == 0 else ''}.JPEG" for i in range(n)],
        # An integer column is read alone; a text one as the lines (parsed in numpy, as a text file's).
        "label": labels if label_type == "int" else [f" {x}" if x % 3 == 0 else str(x) for x in labels],
    }


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _directory(line: str) -> str:
    return line.split("/")[1]


@pytest.mark.parametrize("label_type", ["int", "str"])
@pytest.mark.parametrize(("n", "groups"), [(1, 1), (700, 64), (6000, 1000), (6000, 100_000)])
def test_group_by_and_ids_of_give_the_text_files_results(tmp_path: Path, n: int, groups: int, label_type: str) -> None:
    parquet, text = _write(tmp_path, _labelled(n, label_type), groups)
    by_label = group_by(text)
    for _ in range(2):  # grouped, then from the cache
        assert _same(group_by(parquet), by_label)
        assert _same(group_by(parquet, _directory, cache_name="dir"), group_by(text, _directory, cache_name="dir"))
    assert sum(len(v) for v in by_label.values()) == n
    wanted = [f"train/n{i % 7:08d}/img_{i}{'_é' if i % 11 == 0 else ''}.JPEG" for i in {0, n // 2, n - 1}]
    assert np.array_equal(ids_of(parquet, wanted), ids_of(text, wanted))
    assert ids_of(parquet, wanted).size == len(set(wanted))


def test_the_recipes_give_the_text_files_sources(tmp_path: Path) -> None:
    parquet, text = _write(tmp_path, _labelled(3000), 500)

    def described(sources: list) -> list:
        return [(s.name.split("[")[1], s.weight, s.repeat, np.asarray(s.ids).tolist()) for s in sources]

    assert described(class_balanced(parquet, power=0.5)) == described(class_balanced(text, power=0.5))

    def categories(line: str) -> list[int]:
        return [int(line.split()[-1]) % 5, len(line) % 3]

    a = repeat_factor(parquet, categories=categories, threshold=0.3)
    assert described(a) == described(repeat_factor(text, categories=categories, threshold=0.3))
    assert len(a) > 1


@pytest.mark.parametrize("label_type", ["int", "str"])
def test_rows_a_text_file_would_split_or_skip_are_one_sample_each(tmp_path: Path, label_type: str) -> None:
    # A value holding a newline, a CR or a tab is still one row, one sample: numbered as the file
    # reader numbers it, and labelled from the whole line (for a text label, row by row).
    n = 500
    columns = _labelled(n, label_type)
    columns["path"][10] = "two\nlines"
    columns["path"][11] = "cr\r"
    columns["path"][300] = "a\ttab"
    parquet = tmp_path / "odd.parquet"
    pq.write_table(pa.table(columns), parquet, row_group_size=100)
    groups = group_by(parquet)
    expected: dict[int, list[int]] = {}
    for i, label in enumerate(columns["label"]):
        expected.setdefault(int(str(label)), []).append(i)
    assert {k: v.tolist() for k, v in groups.items()} == dict(sorted(expected.items()))
    assert ids_of(parquet, ["two\nlines"], key=lambda line: line.rsplit("\t", 1)[0]).tolist() == [10]


@pytest.mark.parametrize("bad", ["", "   ", "no_label"])
def test_a_row_without_a_label_is_named_by_file_and_row(tmp_path: Path, bad: str) -> None:
    columns = {"line": [f"img_{i}.jpg {i % 3}" for i in range(400)]}
    columns["line"][250] = bad  # a blank row is a sample too (a text file would skip the line)
    parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.table(columns), parquet, row_group_size=64)
    with pytest.raises(ValueError, match=rf"^{parquet}, row 250: "):
        group_by(parquet)


def test_a_null_label_is_named_by_file_and_row(tmp_path: Path) -> None:
    columns = _labelled(400)
    columns["label"][123] = None  # the line ends with its tab: no label
    parquet = tmp_path / "null.parquet"
    pq.write_table(pa.table(columns), parquet, row_group_size=100)
    with pytest.raises(ValueError, match=rf"^{parquet}, row 123: "):
        group_by(parquet)


def test_a_file_rewritten_after_indexing_is_metafilechangederror(tmp_path: Path) -> None:
    parquet, text = _write(tmp_path, _labelled(2000), 300)
    index = load_index(parquet)
    columns = _labelled(2000)
    columns["label"] = [int(x) + 1 for x in columns["label"]]  # type: ignore[call-overload]
    pq.write_table(pa.table(columns), parquet, row_group_size=300)
    with pytest.raises(MetaFileChangedError, match=str(parquet)):
        grouping._group(parquet, index, "label")
    shifted = group_by(parquet)  # indexed again, grouped anew
    assert _same({k - 1: v for k, v in shifted.items()}, group_by(text))


def test_a_schema_changed_since_indexing_is_metafilechangederror(tmp_path: Path) -> None:
    parquet, _ = _write(tmp_path, _labelled(1000), 300)
    index = load_index(parquet)
    columns = _labelled(1000)
    columns["label"] = [str(x) for x in columns["label"]]  # another type, the same text
    pq.write_table(pa.table(columns), parquet, row_group_size=300)
    with pytest.raises(MetaFileChangedError, match="schema changed"):
        grouping._group(parquet, index, "label")
