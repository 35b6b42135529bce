"""``storage_options=``: explicit obstore settings (endpoint, keys, region) given to MetaFile, Source and
RankDataset (both readers), with an environment that names no endpoint and no credentials, against a
real S3 server (SeaweedFS). The settings travel with the paths to other processes (no client is made
before a read), and the secret never shows in a repr or a message."""

from __future__ import annotations

import datetime
import multiprocessing
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")

from rank_dataset import MetaFile, RankDataset, Source
from rank_dataset.core.checks import UrlPath
from s3_helpers import ACCESS_KEY, REGION, SECRET_KEY, unpickle_in_child

_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP")


@pytest.fixture
def bare(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The S3 server, with an environment that does not point at it: only explicit settings reach it."""
    for name in (*_ENV, "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return s3_server


def _options(server: Any, secret: str = SECRET_KEY) -> dict[str, str]:
    return {"endpoint": server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": secret, "region": REGION}


def _lines(n: int) -> str:
    return "".join(f"img_{i:06d}_{'y' * (i % 13)}.jpg {i % 7}\n" for i in range(n))


def test_url_path_carries_settings_and_hides_them() -> None:
    url = UrlPath("s3://b/dir/m.txt", {"secret_access_key": "hush", "region": "r"}, 12.0)
    again = pickle.loads(pickle.dumps(url))
    assert again == url and isinstance(again, UrlPath) and again.storage_options == url.storage_options
    assert again.timeout == 12.0 and UrlPath(again).storage_options["region"] == "r"  # kept when remade
    assert "hush" not in repr(url) and "hush" not in str(url) and "hush" not in f"{url}"
    assert UrlPath(url, {"region": "other"}).storage_options == {"region": "other"}  # given ones win
    with pytest.raises(TypeError, match="storage_options must be a mapping"):
        UrlPath("s3://b/m.txt", ["endpoint"])  # type: ignore[arg-type]


def test_metafile_and_source_with_storage_options_only(bare: Any, tmp_path: Path) -> None:
    local = tmp_path / "m.txt"
    local.write_text(_lines(20_000))
    url = bare.put("options/m.txt", local)
    here = MetaFile(local)
    remote = MetaFile(url, storage_options=_options(bare))
    picks = np.random.default_rng(0).permutation(len(here))[:3000]
    assert len(remote) == len(here) and remote.fingerprint == here.fingerprint
    assert remote.read(picks).texts(range(picks.size)) == here.read(picks).texts(range(picks.size))
    copy = pickle.loads(pickle.dumps(remote))  # the settings go with it
    assert copy[12_345] == here[12_345]
    source = Source(url, weight=1, storage_options=_options(bare))
    for shown in (repr(remote), repr(source), repr(remote.paths), str(source.paths)):
        assert SECRET_KEY not in shown and url in shown
    ds = RankDataset([source, Source(local, repeat=1)], reload_cfg={"seed": 2}, rank=0, world_size=1, parser=None)
    ref = RankDataset([Source(local, weight=1), Source(local, repeat=1)], reload_cfg={"seed": 2}, rank=0, world_size=1)
    assert [ds[i] for i in range(len(ds))] == [ref[i] for i in range(len(ref))]
    ds.close()
    ref.close()
    # The grouping passes too, and the sources class_balanced makes carry the settings.
    from rank_dataset import class_balanced, group_by, ids_of

    got, want = group_by(url, storage_options=_options(bare)), group_by(local)
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in got)
    assert ids_of(url, ["img_000007_yyyyyyy.jpg"], storage_options=_options(bare)).tolist() == [7]
    classes = class_balanced(url, storage_options=_options(bare))
    assert classes[0].paths[0].storage_options["endpoint"] == bare.endpoint  # type: ignore[attr-defined]


def test_wrong_secret_is_denied_without_showing_it(bare: Any) -> None:
    url = bare.put("options/denied.txt", b"a 1\n")
    with pytest.raises(PermissionError, match=r"s3://meta/options/denied.txt: access denied \(HTTP 403") as got:
        MetaFile(url, storage_options=_options(bare, secret="not-the-secret-42"))
    assert "not-the-secret-42" not in str(got.value) and "not-the-secret-42" not in repr(got.value)


def test_rank_dataset_file_reader_and_spawned_worker(bare: Any, tmp_path: Path) -> None:
    """The file reader with storage_options; the dataset pickled to a spawned process (as to a
    DataLoader worker) makes no client until it reads, then reads the object with the settings alone."""
    local = tmp_path / "d.txt"
    local.write_text(_lines(5000))
    url = bare.put("options/d.txt", local)
    cfg = {"seed": 5, "mini_epoch": 2}
    ds = RankDataset(url, reload_cfg=cfg, rank=1, world_size=2, parser=None, storage_options=_options(bare), timeout=60)
    ref = RankDataset(local, reload_cfg=cfg, rank=1, world_size=2, parser=None)
    assert [ds[i] for i in range(len(ds))] == [ref[i] for i in range(len(ref))]
    assert ds.meta is not None and ds.meta.paths[0].timeout == 60.0  # type: ignore[attr-defined]
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=unpickle_in_child, args=(pickle.dumps(ds), theirs))
    child.start()
    got = [ours.recv() if ours.poll(120) else "no answer" for _ in range(2)]
    child.join(60)
    assert child.exitcode == 0
    assert got == [0, [ref.meta[i] for i in range(3)]]  # type: ignore[index]
    ds.close()
    ref.close()


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_collective_reader_with_storage_options(bare: Any, tmp_path: Path, one_rank_group: None) -> None:
    local = tmp_path / "c.txt"
    local.write_text(_lines(8000))
    url = bare.put("options/c.txt", local)
    cfg = {"seed": 7}
    ds = RankDataset(url, reader="collective", reload_cfg=cfg, parser=None, storage_options=_options(bare), timeout=60)
    ref = RankDataset(local, reload_cfg=cfg, rank=0, world_size=1, parser=None)
    path = ds.reader.paths[0]  # type: ignore[attr-defined]
    assert path.timeout == 60.0 and path.storage_options["endpoint"] == bare.endpoint  # what its reads use
    for epoch in range(2):
        ds.set_epoch(epoch)
        ref.set_epoch(epoch)
        assert [ds[i] for i in range(len(ds))] == [ref[i] for i in range(len(ref))]
    ds.close()
    ref.close()


def test_storage_options_misplaced_are_refused(bare: Any, tmp_path: Path) -> None:
    local = tmp_path / "x.txt"
    local.write_text("a 1\n")
    with pytest.raises(ValueError, match=r"storage_options= applies to a path or a list of paths: give each Source"):
        RankDataset([Source(local)], rank=0, world_size=1, storage_options={"region": "r"})
    with pytest.raises(ValueError, match=r"timeout applies to reader='collective' .* and to meta files in object"):
        RankDataset(local, rank=0, world_size=1, timeout=5)


def test_settings_obstore_refuses_are_named_without_their_values(bare: Any) -> None:
    """A key obstore does not know, or a value it cannot parse, is a ValueError naming the bucket and
    the key, never the value; a client setting (allow_http, timeouts) among them goes to the client."""
    url = bare.put("options/keys.txt", b"k 1\n")
    with pytest.raises(
        ValueError, match=r"storage_options for s3://meta/options were refused .*'bogus_key' is not valid"
    ):
        MetaFile(url, storage_options={**_options(bare), "bogus_key": "x"})
    with pytest.raises(ValueError, match=r"storage_options for s3://meta/options were refused") as got:
        MetaFile(url, storage_options={**_options(bare), "skip_signature": "hidden-value-77"})
    assert "hidden-value-77" not in str(got.value)
    with_client = {**_options(bare), "allow_http": "true", "user_agent": "rank-dataset-tests"}
    assert MetaFile(url, storage_options=with_client)[0] == "k 1"
