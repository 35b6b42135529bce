"""A new store is one module: an in-memory byte source registered under a made-up scheme (``mem://``),
in this test only, is read through MetaFile, the file reader, group_by and the collective reader."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import MetaFile, RankDataset, group_by
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.io import ByteSource, ObjectKey, ShortRead, UrlPath, register_scheme

#: The objects of the ``mem://`` store: URL -> bytes.
STORE: dict[str, bytes] = {}


class MemFile(ByteSource):
    """An object of :data:`STORE`, identified by its URL, size and the hash of its bytes (its ETag);
    every read pinned to that ETag, as an object store's."""

    def __init__(self, url: UrlPath, key: ObjectKey | None, checked: bool) -> None:
        self.path = url
        if str(url) not in STORE:
            if key is None:
                raise FileNotFoundError(f"meta file not found: {url}")
            raise MetaFileChangedError(url, "it was deleted")
        self.key = self._now() if key is None or checked else key
        if key is not None and checked and key.change(self.key) is not None:
            raise MetaFileChangedError(url, str(key.change(self.key)))

    def _now(self) -> ObjectKey:
        data = STORE[str(self.path)]
        return ObjectKey(str(self.path), len(data), hashlib.md5(data).hexdigest())

    def _data(self) -> bytes:
        if str(self.path) not in STORE or self._now().etag != self.key.etag:
            raise MetaFileChangedError(self.path, "it was replaced")
        return STORE[str(self.path)]

    def read(self, offset: int, count: int) -> bytes:
        if offset + count > self.size:
            raise MetaFileChangedError(self.path, "it shrank while being read")
        return self._data()[offset : offset + count]

    def read_into(self, out: npt.NDArray[np.uint8], offset: int, until: int | None = None) -> None:
        if offset + out.size > self.size:
            raise ShortRead(self.size)
        out[:] = np.frombuffer(self._data(), np.uint8, out.size, offset)

    def pread(self, count: int, offset: int) -> bytes:
        return self._data()[offset : offset + max(count, 0)]

    def check(self) -> None:
        self._data()


LINES = [f"img/{i}.jpg {i % 7}" for i in range(500)]
URL = "mem://bucket/data/meta.txt"


@pytest.fixture
def mem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``mem://`` store registered, :data:`URL` in it, and the same lines in a local file."""
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    register_scheme("mem", MemFile)
    STORE[URL] = "".join(f"{line}\n" for line in LINES).encode()
    local = tmp_path / "meta.txt"
    local.write_bytes(STORE[URL])
    yield local
    STORE.clear()


def test_metafile_reads_a_registered_store(mem: Path) -> None:
    mf = MetaFile(URL)
    assert len(mf) == len(LINES) and [mf[i] for i in range(len(mf))] == LINES
    assert MetaFile(URL).fingerprint == MetaFile(mem).fingerprint  # the index was built once, then cached
    assert list(Path(mem.parent / "cache").glob("*.rdidx"))
    STORE[URL] = STORE[URL].replace(b"img/0.jpg", b"img/9.jpg")  # the same size, another ETag
    with pytest.raises(MetaFileChangedError, match="it was replaced"):
        mf[0]


def test_the_file_reader_reads_a_registered_store(mem: Path) -> None:
    def items(path: Any) -> list[Any]:
        ds = RankDataset(path, is_test=True, rank=0, world_size=1)
        return [x for batch in DataLoader(ds, batch_size=64, num_workers=0, collate_fn=list) for x in batch]

    assert items(URL) == items(mem) and len(items(URL)) == len(LINES)


def test_group_by_reads_a_registered_store(mem: Path) -> None:
    def lists(groups: dict[Any, Any]) -> dict[Any, list[int]]:
        return {k: v.tolist() for k, v in groups.items()}

    assert lists(group_by(URL)) == lists(group_by(mem)) and len(group_by(URL)) == 7
    prefix = lists(group_by(mem, lambda line: line[:5]))
    assert lists(group_by(URL, lambda line: line[:5], cache_name="prefix")) == prefix
    assert lists(group_by(URL, lambda line: line[:5], cache_name="prefix")) == prefix  # from its cache
    assert list(Path(mem.parent / "cache").glob("*.prefix.rdgrp"))


def test_the_collective_reader_reads_a_registered_store(mem: Path, tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60)
    )
    try:
        ds = RankDataset(URL, is_test=True, reader="collective")
        got = [ds[i] for i in range(len(ds))]
    finally:
        dist.destroy_process_group()
    plain = RankDataset(mem, is_test=True, rank=0, world_size=1)
    assert got == [plain[i] for i in range(len(plain))] and len(got) == len(LINES)
