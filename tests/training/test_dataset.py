from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import MetaFile, RandomSampler, RankDataset, ReloadConfig
from rank_dataset.plan import ShardSpec
from tests_helpers import imagenet_line, spawn_workers, start_methods


def test_items_are_the_planned_samples(write_meta) -> None:
    p = write_meta(n=1003)
    mf = MetaFile(p)
    for w, m, is_test in [(1, 1, False), (3, 2, False), (4, 3, True), (8, 1, False)]:
        for r in range(w):
            ds = RankDataset(p, is_test=is_test, reload_cfg={"mini_epoch": m, "seed": 7}, rank=r, world_size=w)
            spec = ShardSpec(len(mf), w, r, is_test=is_test, mini_epoch=m, seed=7)
            assert np.array_equal(ds.indices, spec.indices())
            assert len(ds) == len(spec.indices())
            assert [ds[i] for i in range(len(ds))] == [mf[int(j)] for j in ds.indices]


def test_indices_read_only_and_set_epoch_reshards(write_meta) -> None:
    p = write_meta(n=100)
    ds = RankDataset(p, reload_cfg={"mini_epoch": 2, "seed": 1}, rank=1, world_size=2)
    with pytest.raises(ValueError, match="read-only"):
        ds.indices[0] = 5
    first = ds.indices.copy()
    ds.set_epoch(0, mini_epoch_idx=1)
    second = ds.indices.copy()
    assert not set(first) & set(second)
    ds.set_epoch(1)
    assert not np.array_equal(ds.indices, first)
    ds.set_epoch(0, 0)
    assert np.array_equal(ds.indices, first)
    with pytest.raises(ValueError, match=r"mini_epoch_idx must be in \[0, mini_epoch=2\)"):
        ds.set_epoch(0, 2)


def test_parsers(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"path": f"{i}.jpg", "label": i}) + "\n" for i in range(10)))
    ds = RankDataset(p, is_test=True, parser="json", rank=0, world_size=1)
    assert ds[3] == {"path": "3.jpg", "label": 3}
    ds = RankDataset(p, is_test=True, parser=lambda s: len(s), rank=0, world_size=1)
    assert ds[0] == len(p.read_text().splitlines()[0])


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2\n')
    ds = RankDataset(p, is_test=True, parser="json", rank=0, world_size=1)
    assert ds[0] == {"a": 1}
    with pytest.raises(ValueError, match=r"m\.jsonl:3: invalid JSON"):
        ds[1]
    with pytest.raises(ValueError, match=r"m\.jsonl:3: invalid JSON"):
        ds.__getitems__([0, 1])


def test_label_parser_error(tmp_path: Path) -> None:
    p = tmp_path / "m.txt"
    p.write_text("a.jpg 1\nb.jpg x\n")
    ds = RankDataset(p, is_test=True, parser="label", rank=0, world_size=1)
    assert ds[0] == ("a.jpg", 1)
    with pytest.raises(ValueError, match=r"m\.txt:2: label 'x' is not an integer"):
        ds[1]


def test_errors(write_meta, tmp_path: Path) -> None:
    p = write_meta(n=10)
    with pytest.raises(FileNotFoundError, match=r"meta file not found: '.*missing\.txt'$"):
        RankDataset(tmp_path / "missing.txt", rank=0, world_size=1)
    with pytest.raises(FileNotFoundError, match="is a directory: give the meta file in it"):
        RankDataset(tmp_path, rank=0, world_size=1)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match=r"no samples in .*empty\.txt"):
        RankDataset(empty, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        RankDataset(p, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        RankDataset(p, rank=0, world_size=0)
    with pytest.raises(ValueError, match="unknown reload_cfg key 'seeds'"):
        RankDataset(p, reload_cfg={"seeds": 1}, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"mini_epoch_idx'\] must be in"):
        RankDataset(p, reload_cfg={"mini_epoch": 2, "mini_epoch_idx": 3}, rank=0, world_size=1)
    ds = RankDataset(p, reload_cfg=ReloadConfig(seed=2), rank=0, world_size=3)
    with pytest.raises(IndexError, match="dataset index 4 is out of range for a shard of 4 samples"):
        ds[4]
    with pytest.raises(TypeError, match="dataset index must be an int"):
        ds["1"]  # type: ignore[index]


def test_invalid_utf8_is_found_when_the_shard_is_built(tmp_path: Path) -> None:
    p = tmp_path / "m.txt"
    p.write_bytes("é\n".encode() * 9 + b"\xff\n")
    with pytest.raises(ValueError, match=r"m\.txt:10: line is not valid UTF-8"):
        RankDataset(p, is_test=True, rank=0, world_size=1)


@pytest.mark.parametrize("context", start_methods("fork", "spawn", "forkserver"))
def test_dataloader_workers(write_meta, context: str) -> None:
    p = write_meta(n=5000)
    ds = RankDataset(p, reload_cfg={"seed": 3, "mini_epoch": 2}, rank=1, world_size=3, parser="label")
    sampler = RandomSampler(ds, seed=1)
    loader = DataLoader(
        ds, batch_size=64, sampler=sampler, num_workers=spawn_workers(context), multiprocessing_context=context
    )
    paths, labels = [], []
    for batch_paths, batch_labels in loader:
        paths += batch_paths
        labels += batch_labels.tolist()
    expect = sorted(imagenet_line(int(i)) for i in ds.indices)
    assert sorted(f"{a} {b}" for a, b in zip(paths, labels)) == expect


# -- the keywords every dataset shares: timeout, reader, is_test -----------------------------------


def test_timeout_is_seconds_or_a_timedelta_everywhere(write_meta) -> None:
    import datetime

    from rank_dataset.core.checks import timeout_seconds, timeout_timedelta

    assert timeout_seconds(2) == timeout_seconds(2.0) == timeout_seconds(datetime.timedelta(seconds=2)) == 2.0
    assert timeout_timedelta(1.5) == datetime.timedelta(seconds=1.5) and timeout_timedelta(None) is None
    for bad, error in [(True, TypeError), ("30", TypeError), (0, ValueError), (-1.0, ValueError)]:
        with pytest.raises(error, match="timeout"):
            timeout_seconds(bad)
    meta = write_meta(n=10)
    for timeout in (20.0, datetime.timedelta(seconds=20)):  # both read, then refused for the file reader
        with pytest.raises(ValueError, match=r"timeout applies to reader='collective' \(its exchanges\) and"):
            RankDataset(meta, timeout=timeout)
    with pytest.raises(TypeError, match=r"timeout must be seconds \(an int or a float\) or a datetime.timedelta"):
        RankDataset(meta, reader="collective", timeout="20")


def test_reader_is_a_name_or_a_shard_reader(write_meta) -> None:
    from rank_dataset.shards.reader import FileReader
    from rank_dataset.training.dataset import ShardedDataset

    meta = write_meta(n=30)
    by_name = RankDataset(meta, reload_cfg={"seed": 3}, rank=1, world_size=2)
    reader = FileReader(MetaFile(meta))
    by_object = RankDataset(reader=reader, reload_cfg={"seed": 3}, rank=1, world_size=2)
    assert by_object.reader is reader and isinstance(by_name.reader, FileReader)  # ds.reader: the object
    assert by_object.indices.tolist() == by_name.indices.tolist() and by_object[0] == by_name[0]
    assert by_object.meta is reader.meta
    with pytest.raises(ValueError, match="meta_file= goes with reader='file' or 'collective'"):
        RankDataset(meta, reader=FileReader(MetaFile(meta)))
    with pytest.raises(ValueError, match="reader must be 'file', 'collective' or a ShardReader"):
        RankDataset(meta, reader="files")
    with pytest.raises(TypeError, match="reader must be 'file', 'collective' or a ShardReader"):
        RankDataset(reader=object())
    with pytest.raises(TypeError, match="RankDataset needs meta_file"):
        RankDataset()
    with pytest.raises(TypeError, match=r"ShardedDataset takes the reader itself \(a ShardReader\)"):
        ShardedDataset("file")  # type: ignore[arg-type]


def test_the_eval_layout_is_is_test_a_bool_everywhere(write_meta) -> None:
    import inspect

    from rank_dataset import RankServerDataset
    from rank_dataset.training.dataset import ShardedDataset

    for cls in (RankDataset, RankServerDataset, ShardedDataset):
        assert inspect.signature(cls).parameters["is_test"].default is False
    meta = write_meta(n=10)
    assert RankDataset(meta, is_test=True, rank=0, world_size=2).indices.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="is_test must be a bool"):
        RankDataset(meta, is_test="yes")  # type: ignore[arg-type]


def test_set_epoch_to_the_shard_held_builds_nothing(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    """The constructor builds the first shard: the first ``set_epoch(0, 0)`` (what a training loop calls
    before each epoch) keeps it instead of reading the file again (issue 44, item 6)."""
    from rank_dataset.shards.reader import FileReader

    p = write_meta(n=100)
    builds: list[ShardSpec] = []
    build = FileReader.build
    monkeypatch.setattr(FileReader, "build", lambda self, spec: builds.append(spec) or build(self, spec))
    ds = RankDataset(p, reload_cfg={"mini_epoch": 2, "seed": 1}, rank=1, world_size=2)
    first = ds.indices.copy()
    assert len(builds) == 1
    ds.set_epoch(0, 0)
    assert len(builds) == 1 and np.array_equal(ds.indices, first)
    assert [ds[i] for i in range(len(ds))] == [MetaFile(p)[int(j)] for j in first]
    ds.set_epoch(0, 1)
    ds.set_epoch(0, 1)
    assert len(builds) == 2
    ds.set_epoch(1)
    ds.set_epoch(0, 0)
    assert len(builds) == 4 and np.array_equal(ds.indices, first)
