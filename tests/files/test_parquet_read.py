"""Parquet meta files read in place: MetaFile, RankDataset (plain, mini-epochs, mixes), the meta server
and ``rank-dataset index`` give the samples of the text file of the same lines (row i is line i: its
chosen columns joined by a tab); bad input is a clear error, never a wrong sample."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import requests
from click.testing import CliRunner

from rank_dataset.cli import cli
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.read.metafile import MetaFile
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.server import protocol

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _columns(n: int, tag: str = "a") -> dict[str, list[object]]:
    return {
        "path": [f"{tag}/{i:06d}{'é' if i % 11 == 0 else ''}.jpg" for i in range(n)],
        "label": [i * 7919 % 1000 for i in range(n)],
        "note": [None if i % 5 == 0 else f"n{i % 13}" for i in range(n)],
    }


def _write_pair(tmp_path: Path, n: int, groups: int, columns: list[str], tag: str = "a") -> tuple[Path, Path]:
    """A Parquet file of ``n`` rows in row groups of ``groups`` rows, and the text file of its lines
    (``columns`` joined by a tab, a null as an empty field), written independently of the reader."""
    data = _columns(n, tag)
    name = f"{tag}_{n}_{groups}"
    parquet, text = tmp_path / f"{name}.parquet", tmp_path / f"{name}.txt"
    pq.write_table(pa.table(data), parquet, row_group_size=groups, write_page_checksum=True)
    lines = ["\t".join("" if data[c][i] is None else str(data[c][i]) for c in columns) for i in range(n)]
    text.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return parquet, text


def _specs(n: int) -> list[ShardSpec]:
    specs = [ShardSpec(n, w, r, seed=3, epoch=1) for w in (1, 3, 8) for r in range(w)]
    specs += [ShardSpec(n, 4, r, mini_epoch=3, mini_epoch_idx=i, seed=5) for r in range(4) for i in range(3)]
    specs += [ShardSpec(n, 5, r, is_test=True) for r in range(5)]
    return specs


def _same(a: object, b: object) -> bool:
    return bool(np.array_equal(a.bounds, b.bounds)) and bytes(a.data) == bytes(b.data)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("n", "groups"), [(1, 1), (300, 1), (999, 999), (5000, 777), (5000, 100_000), (70_000, 9000)])
def test_shards_are_those_of_the_text_file(tmp_path: Path, n: int, groups: int) -> None:
    parquet, text = _write_pair(tmp_path, n, groups, ["path", "label", "note"])
    a, b = MetaFile(text), MetaFile(parquet)
    assert len(b) == len(a) == n
    for spec in _specs(n):
        assert _same(a.read(spec.indices()), b.read(spec.indices())), spec
    # A row group's rows are rendered as asked: out of order, and some many times over.
    picks = np.random.default_rng(n).integers(0, n, 3 * n)
    assert _same(a.read(picks), b.read(picks))
    for i in sorted({0, n // 2, n - 1}):
        assert b[i] == a[i] and b.raw(i) == a.raw(i)
    assert b.where(n - 1) == f"{parquet}, row {n - 1}"


def test_row_groups_past_what_the_first_pass_keeps_are_decoded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rank_dataset.files.read import _parquet_gather

    monkeypatch.setattr(_parquet_gather, "_PARQUET_KEPT", 20_000)  # a few of the row groups' rows only
    parquet, text = _write_pair(tmp_path, 70_000, 3000, ["path", "label", "note"])
    a, b = MetaFile(text), MetaFile(parquet)
    for spec in [ShardSpec(70_000, 1, 0, seed=1), ShardSpec(70_000, 3, 2, seed=2, epoch=1)]:
        assert _same(a.read(spec.indices()), b.read(spec.indices()))


def test_columns_pick_and_order_the_fields(tmp_path: Path) -> None:
    parquet, text = _write_pair(tmp_path, 2000, 300, ["label", "path"])
    a, b = MetaFile(text), MetaFile(parquet, columns=["label", "path"])
    idx = ShardSpec(2000, 3, 1, seed=2).indices()
    assert _same(a.read(idx), b.read(idx)) and b[7] == a[7] == "433\ta/000007.jpg"
    assert MetaFile(parquet, columns=["path"])[11] == "a/000011é.jpg"
    # The same file read with other columns holds other samples: another fingerprint.
    assert len({MetaFile(parquet).fingerprint, b.fingerprint, MetaFile(parquet, columns=["path"]).fingerprint}) == 3
    assert MetaFile(parquet, columns=["label", "path"]).fingerprint == b.fingerprint
    mf = pickle.loads(pickle.dumps(b))  # as a worker or another rank receives it: reads without reindexing
    assert _same(mf.read(idx), a.read(idx))


def test_columns_are_checked_when_the_file_is_opened(tmp_path: Path) -> None:
    parquet, text = _write_pair(tmp_path, 50, 10, ["path"])
    with pytest.raises(ValueError, match=r"has no column 'nope'; its columns are \['path', 'label', 'note'\]"):
        MetaFile(parquet, columns=["path", "nope"])
    with pytest.raises(ValueError, match=r"columns= picks the columns of a Parquet meta file.* is text"):
        MetaFile(text, columns=["path"])
    with pytest.raises(ValueError, match="names 'path' twice"):
        MetaFile(parquet, columns=["path", "path"])
    with pytest.raises(TypeError, match="sequence of column names"):
        MetaFile(parquet, columns="path")  # type: ignore[arg-type]


def test_nested_and_binary_columns_are_refused_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    table = pa.table({"ok": ["a", "b"], "tags": [[1], [2, 3]], "blob": pa.array([b"\x00", b"\x01"], pa.binary())})
    pq.write_table(table, path)
    with pytest.raises(ValueError, match="column 'tags' is nested"):
        MetaFile(path)
    with pytest.raises(ValueError, match="column 'blob' is binary"):
        MetaFile(path, columns=["ok", "blob"])
    assert MetaFile(path, columns=["ok"])[1] == "b"


def test_every_row_is_a_sample_even_blank_or_holding_a_newline(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    pq.write_table(pa.table({"a": ["x", None, "two\nlines", "  "], "b": [1, None, 3, 4]}), path)
    mf = MetaFile(path)
    assert [mf[i] for i in range(4)] == ["x\t1", "\t", "two\nlines\t3", "  \t4"]
    assert MetaFile(path, columns=["a"]).read(np.array([2, 1, 0])).texts(range(3)) == ["two\nlines", "", "x"]


def test_a_schema_changed_since_the_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.parquet"
    pq.write_table(pa.table({"path": ["a", "b", "c"], "label": [1, 2, 3]}), path)
    mf = MetaFile(path)
    pq.write_table(pa.table({"path": ["a", "b", "c"], "label": ["1", "2", "3"]}), path)  # label became a string
    with pytest.raises(MetaFileChangedError, match="schema changed since it was indexed"):
        mf.read(np.arange(3))
    with pytest.raises(MetaFileChangedError, match="schema changed since it was indexed"):
        mf[0]
    pq.write_table(pa.table({"path": ["a", "b", "c"]}), path)  # label gone
    with pytest.raises(MetaFileChangedError, match=r"schema changed since it was indexed.*no column 'label'"):
        mf.read(np.arange(3))


def test_a_file_rewritten_in_place_is_metafilechangederror(tmp_path: Path) -> None:
    parquet, _ = _write_pair(tmp_path, 3000, 500, ["path"])
    mf = MetaFile(parquet)
    other = tmp_path / "other.parquet"
    data = _columns(3000, "b")  # the same schema and row groups, other values
    pq.write_table(pa.table(data), other, row_group_size=500, write_page_checksum=True)
    with open(parquet, "r+b") as f:  # in place: the same inode
        f.write(other.read_bytes())
        f.truncate()
    with pytest.raises(MetaFileChangedError, match=r"modified|size changed"):
        mf.read(np.arange(100))
    with pytest.raises(MetaFileChangedError):
        mf.raw(7)


def test_a_truncated_or_corrupt_file_is_an_error_naming_it(tmp_path: Path) -> None:
    parquet, _ = _write_pair(tmp_path, 5000, 2500, ["path"])
    data = parquet.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptMetaFileError, match="truncated") as info:
        MetaFile(cut)
    assert info.value.path == cut and str(cut) in str(info.value)
    footer = tmp_path / "footer.parquet"
    footer.write_bytes(data[:-12] + b"\xff" * 8 + data[-4:])
    with pytest.raises(CorruptMetaFileError) as info:
        MetaFile(footer)
    assert info.value.path == footer
    # Damage inside the second row group's first page (written with its checksum).
    first = pq.ParquetFile(parquet).metadata.row_group(1).column(0).data_page_offset
    damaged = bytearray(data)
    for i in range(first + 40, first + 104):
        damaged[i] ^= 0x5A
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(damaged))
    mf = MetaFile(bad)  # the footer is whole: the index is made
    assert mf[0] == "a/000000é.jpg\t0\t"  # the first row group is whole
    with pytest.raises(CorruptMetaFileError, match="row group 1") as info:
        mf.read(np.arange(5000))
    assert info.value.path == bad and info.value.offset == first and str(bad) in str(info.value)


def test_rank_datasets_give_the_text_files_items(tmp_path: Path) -> None:
    from rank_dataset import RankDataset

    parquet, text = _write_pair(tmp_path, 4000, 333, ["path", "label"])
    for cfg in ({"seed": 4}, {"seed": 4, "mini_epoch": 3, "mini_epoch_idx": 2}):
        for r in range(3):
            a = RankDataset(text, reload_cfg=cfg, rank=r, world_size=3, parser="label")
            b = RankDataset(parquet, reload_cfg=cfg, rank=r, world_size=3, parser="label", columns=["path", "label"])
            assert len(a) == len(b) and np.array_equal(a.indices, b.indices)
            assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    with pytest.raises(ValueError, match="give the MetaFile its columns="):
        RankDataset(MetaFile(parquet), rank=0, world_size=1, columns=["path"])
    # The collective reader reads Parquet files too (tests/shards/test_collective.py), under a process group.
    with pytest.raises(ValueError, match=r"initialised torch\.distributed process group"):
        RankDataset(parquet, rank=0, world_size=1, columns=["path"], reader="collective")


def test_a_mix_of_sources_with_their_own_columns(tmp_path: Path) -> None:
    from rank_dataset import RankDataset

    pa_, ta = _write_pair(tmp_path, 3000, 400, ["path"], tag="a")
    pb, tb = _write_pair(tmp_path, 1700, 5000, ["label", "note"], tag="b")
    text = [Source(ta, repeat=0.5), Source(tb, weight=2)]
    mixed = [Source(pa_, repeat=0.5, columns=["path"]), Source(pb, weight=2, columns=["label", "note"])]
    cfg = {"seed": 9, "epoch_size": 2500}
    for r in range(4):
        a = RankDataset(text, reload_cfg=cfg, rank=r, world_size=4)
        b = RankDataset(mixed, reload_cfg=cfg, rank=r, world_size=4)
        assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    # The plan alone, through MetaFile: the same shards.
    plan = MixPlan.from_sources([3000, 1700], text)
    ma, mb = MetaFile([ta, tb]), MetaFile.from_files([pa_, pb], [("path",), ("label", "note")])
    spec = ShardSpec(plan.epoch_size, 4, 1, seed=9, mix=plan)
    assert _same(ma.read(spec.indices()), mb.read(spec.indices()))
    twice = [Source(pa_, columns=["path"]), Source(pa_, columns=["label"])]
    with pytest.raises(ValueError, match="a file is read with one choice of columns"):
        RankDataset(twice, rank=0, world_size=1)
    with pytest.raises(ValueError, match="is text"):
        RankDataset([Source(ta, columns=["path"])], rank=0, world_size=1)


def test_the_server_serves_the_text_files_shards(tmp_path: Path, start_server) -> None:
    parquet, text = _write_pair(tmp_path, 3000, 250, ["path", "label"])
    mf = MetaFile(text)
    server = start_server([parquet], "--columns", "path,label")
    assert requests.get(f"{server.url}/len").json()["num_samples"] == 3000
    assert requests.get(f"{server.url}/sample/17").text == mf[17]
    for r in range(3):
        spec = ShardSpec(3000, 3, r, mini_epoch=2, mini_epoch_idx=1, seed=4, epoch=2)
        params = {"world_size": 3, "rank": r, "mini_epoch": 2, "mini_epoch_idx": 1, "seed": 4, "epoch": 2}
        shard = protocol.decode_frame(requests.get(f"{server.url}/shard", params=params).content)
        assert np.array_equal(shard.ids, spec.indices()) and _same(shard, mf.read(spec.indices()))


def test_index_command_reads_the_footer(tmp_path: Path) -> None:
    parquet, _ = _write_pair(tmp_path, 1234, 100, ["path"])
    result = CliRunner().invoke(cli, ["index", str(parquet)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"1234\t{parquet}"]
    assert CliRunner().invoke(cli, ["index", "--columns", "label,path", str(parquet)]).exit_code == 0
    bad = CliRunner().invoke(cli, ["index", "--columns", "path,nope", str(parquet)])
    assert bad.exit_code == 1 and "no column 'nope'" in bad.output and "'label'" in bad.output
    assert not any(name.endswith(".idx") for name in os.listdir(tmp_path))
