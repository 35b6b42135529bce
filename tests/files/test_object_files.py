"""Meta files in object storage read as local ones are: the index (built by one streaming pass, cached
on this node, never in the bucket) and MetaFile's reads (coalesced ranged GETs), against a real S3 server
(SeaweedFS) and a local HTTP server with Range."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")

from http_helpers import range_server
from rank_dataset import MetaFile
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.index.load import load_index


def _lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    pads = rng.integers(0, 40, n)
    return [f"img_{i:07d}_{'é' if i % 97 == 0 else ''}{'x' * int(pads[i])}.jpg {i % 1000}" for i in range(n)]


def _same(local: MetaFile, remote: MetaFile, picks: np.ndarray) -> None:
    assert len(remote) == len(local) and remote.fingerprint == local.fingerprint
    assert [remote[int(i)] for i in picks[:50]] == [local[int(i)] for i in picks[:50]]
    a, b = local.read(picks), remote.read(picks)
    assert len(a) == len(b) == picks.size
    assert b.texts(range(len(b))) == a.texts(range(len(a)))


def test_text_object_reads_as_the_local_file(s3: Any, tmp_path: Path) -> None:
    local = tmp_path / "meta.txt"
    local.write_text("\n".join(_lines(200_000)) + "\n")
    url = s3.put("files/meta.txt", local)
    remote, here = MetaFile(url), MetaFile(local)
    assert str(remote.paths[0]) == url
    rng = np.random.default_rng(1)
    for picks in (rng.permutation(len(here))[:5000], np.arange(len(here)), np.sort(rng.choice(len(here), 300))):
        _same(here, remote, picks)
    assert remote.where(12345).startswith(f"{url}:")
    # Pickled (a spawn worker): the URL stays whole, and the copy reads the object itself.
    copy = pickle.loads(pickle.dumps(remote))
    assert str(copy.paths[0]) == url and copy[77] == here[77]
    # The index is cached on this node: loaded again, not rebuilt.
    first = load_index(remote.paths[0])
    assert first.cache is not None and first.cache.exists() and load_index(remote.paths[0]).cache == first.cache


def test_replaced_object_is_refused(s3: Any) -> None:
    url = s3.put("files/swap.txt", "".join(f"line {i}\n" for i in range(10_000)).encode())
    mf = MetaFile(url)
    s3.put("files/swap.txt", "".join(f"LINE {i}\n" for i in range(10_000)).encode())
    with pytest.raises(MetaFileChangedError, match=r"meta file s3://meta/files/swap.txt changed"):
        mf.read(np.arange(100))
    again = MetaFile(url)  # a new MetaFile indexes the object as it is now
    assert again[3] == "LINE 3"


@pytest.mark.parametrize("fmt", ["gz", "gz-members", "zst", "zst-frames"])
def test_compressed_object_reads_as_the_local_file(s3: Any, tmp_path: Path, fmt: str) -> None:
    """gzip (one stream, or many members) and zstd (one frame, or many) objects, recognised by content:
    the index from one streaming pass (checkpoints in it), reads through the checkpoints."""
    import gzip

    import zstandard

    text = ("\n".join(_lines(60_000, seed=3)) + "\n").encode()
    parts = [text[i : i + 400_000] for i in range(0, len(text), 400_000)]
    data = {
        "gz": gzip.compress(text),
        "gz-members": b"".join(gzip.compress(p) for p in parts),
        "zst": zstandard.ZstdCompressor().compress(text),
        "zst-frames": b"".join(zstandard.ZstdCompressor().compress(p) for p in parts),
    }[fmt]
    local = tmp_path / f"meta.{fmt}"
    local.write_bytes(data)
    url = s3.put(f"files/meta.{fmt}", data)
    remote, here = MetaFile(url), MetaFile(local)
    assert load_index(remote.paths[0]).format.compressed
    rng = np.random.default_rng(4)
    for picks in (rng.permutation(len(here))[:4000], np.arange(len(here))):
        _same(here, remote, picks)
    assert remote.where(31_000) == here.where(31_000).replace(str(local), url)


def test_parquet_object_reads_as_the_local_file(s3: Any, tmp_path: Path) -> None:
    """A Parquet object, read by pyarrow through ranged GETs pinned to its ETag: MetaFile (all
    columns, or some), group_by and the file reader give what the same file on disk gives."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from rank_dataset import RankDataset, group_by
    from rank_dataset.files.io.object import COUNTS

    n = 30_000
    table = pa.table(
        {
            "path": [f"img_{i:06d}.jpg" for i in range(n)],
            "w": [i * 0.5 for i in range(n)],
            "label": [i % 11 for i in range(n)],
        }
    )
    local = tmp_path / "m.parquet"
    pq.write_table(table, local, row_group_size=4000)
    url = s3.put("files/m.parquet", local)
    picks = np.random.default_rng(6).permutation(n)
    remote = MetaFile(url)
    _same(MetaFile(local), remote, picks)
    before = dict(COUNTS)
    assert len(remote.read(picks)) == n
    # Each row group's column chunks once (the footer was read once), not the object a row.
    assert COUNTS["bytes"] - before["bytes"] <= local.stat().st_size
    chosen = ["path", "label"]
    _same(MetaFile(local, columns=chosen), MetaFile(url, columns=chosen), picks[:2000])
    assert pickle.loads(pickle.dumps(remote))[123] == MetaFile(local)[123]
    got, want = group_by(url), group_by(local)
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in got)
    for rank in range(2):
        a = RankDataset(url, reload_cfg={"seed": 1}, rank=rank, world_size=2, parser=None)
        b = RankDataset(local, reload_cfg={"seed": 1}, rank=rank, world_size=2, parser=None)
        assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
        a.close()
        b.close()
    with pytest.raises(ValueError, match=r"s3://meta/files/m.parquet has no column 'nope'"):
        MetaFile(url, columns=["nope"])
    pq.write_table(table.slice(0, 100), tmp_path / "other.parquet")
    s3.put("files/m.parquet", tmp_path / "other.parquet")
    with pytest.raises(MetaFileChangedError, match=r"meta file s3://meta/files/m.parquet changed"):
        remote.read(picks[:10])


def test_missing_object_names_url_and_status(s3: Any) -> None:
    with pytest.raises(FileNotFoundError, match=r"meta file not found: s3://meta/files/none.txt \(HTTP 404"):
        MetaFile("s3://meta/files/none.txt")


def test_http_object_reads_as_the_local_file(tmp_path: Path) -> None:
    local = tmp_path / "meta.txt"
    local.write_text("\n".join(_lines(20_000, seed=5)) + "\n")
    with range_server() as server:
        server.objects["m/meta.txt"] = local.read_bytes()
        remote, here = MetaFile(server.url("m/meta.txt")), MetaFile(local)
        _same(here, remote, np.random.default_rng(2).permutation(len(here)))


def test_cli_index_of_an_object(s3: Any) -> None:
    from click.testing import CliRunner

    from rank_dataset.cli import cli

    url = s3.put("files/cli.txt", b"a 1\nb 2\n\nc 3\n")
    done = CliRunner().invoke(cli, ["index", url])
    assert done.exit_code == 0, done.output
    assert done.output == f"3\t{url}\n"
    missing = CliRunner().invoke(cli, ["index", "s3://meta/files/nothing.txt"])
    assert missing.exit_code != 0 and "s3://meta/files/nothing.txt (HTTP 404" in missing.output


def test_rank_dataset_file_reader_over_an_object(s3: Any, tmp_path: Path) -> None:
    """Each rank's shard from the object equals the shard from the local file, epoch after epoch."""
    from rank_dataset import RankDataset

    local = tmp_path / "meta.txt"
    local.write_text("\n".join(_lines(30_000, seed=9)) + "\n")
    url = s3.put("files/dataset.txt", local)
    cfg = {"mini_epoch": 2, "seed": 3}
    for rank in range(2):
        remote = RankDataset(url, reload_cfg=cfg, rank=rank, world_size=2, parser=None)
        here = RankDataset(local, reload_cfg=cfg, rank=rank, world_size=2, parser=None)
        for epoch, mini in ((0, 0), (0, 1), (1, 0)):
            remote.set_epoch(epoch, mini)
            here.set_epoch(epoch, mini)
            assert len(remote) == len(here) > 0
            assert [remote[i] for i in range(len(remote))] == [here[i] for i in range(len(here))]
        remote.close()
        here.close()


@pytest.mark.slow  # 120,000 lines grouped five ways, on disk and over S3: about 8 s, so make test, not test-quick
@pytest.mark.parametrize("fmt", ["txt", "gz"])
def test_grouping_passes_over_an_object_equal_the_local_files(s3: Any, tmp_path: Path, fmt: str) -> None:
    """group_by (by label and by a function, cached on this node), ids_of, class_balanced and
    repeat_factor (factors, and LVIS categories) over an object give what they give over the same
    file on disk; the object is read front to back (a few GETs), and the cached grouping costs one
    HEAD the second time."""
    import gzip

    from rank_dataset import class_balanced, group_by, ids_of, repeat_factor
    from rank_dataset.files.io.object import COUNTS

    lines = _lines(120_000, seed=11)
    text = ("\n".join(lines) + "\n").encode()
    data = gzip.compress(text) if fmt == "gz" else text
    local = tmp_path / f"labels.{fmt}"
    local.write_bytes(data)
    url = s3.put(f"group/labels.{fmt}", data)

    def same(a: dict[Any, np.ndarray], b: dict[Any, np.ndarray]) -> None:
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)

    same(group_by(url), group_by(local))
    before = dict(COUNTS)
    same(group_by(url), group_by(local))  # cached: the index's checks (a HEAD, the first bytes, the ends)
    assert COUNTS["gets"] - before["gets"] <= 5 and COUNTS["bytes"] - before["bytes"] < len(text) // 10
    first_char = lambda line: line[4:7]  # noqa: E731 - a key function
    same(group_by(url, key=first_char, cache_name="pre"), group_by(local, key=first_char, cache_name="pre"))
    same(group_by(url, key=len), group_by(local, key=len))  # a function without a cache name
    wanted = [lines[i].split()[0] for i in (5, 77_777, 119_999)] + ["absent.jpg"]
    found = ids_of(url, wanted, missing="ignore").tolist()
    assert found == ids_of(local, wanted, missing="ignore").tolist() == [5, 77_777, 119_999]
    remote, here = class_balanced(url, power=0.5), class_balanced(local, power=0.5)
    assert [(s.name, s.weight, np.asarray(s.ids).tolist()) for s in remote] == [
        (s.name, s.weight, np.asarray(s.ids).tolist()) for s in here
    ]
    assert all(str(s.paths[0]) == url for s in remote)
    factors = 1 + (np.arange(len(lines)) % 3) / 2
    for kwargs in ({"factors": factors}, {"categories": lambda line: [int(line.split()[-1]) % 5], "threshold": 0.5}):
        a, b = repeat_factor(url, **kwargs), repeat_factor(local, **kwargs)  # type: ignore[arg-type]
        assert [(s.name, s.repeat, np.asarray(s.ids).tolist()) for s in a] == [
            (s.name, s.repeat, np.asarray(s.ids).tolist()) for s in b
        ]


def test_grouping_names_the_line_of_an_object(s3: Any) -> None:
    from rank_dataset import group_by

    url = s3.put("group/bad.txt", b"a.jpg 1\nb.jpg 2\nc.jpg nolabel\nd.jpg 4\n")
    with pytest.raises(ValueError, match=r"s3://meta/group/bad.txt:3"):
        group_by(url)


def test_sources_mixing_an_object_and_a_local_file(s3: Any, tmp_path: Path) -> None:
    from rank_dataset import RankDataset, Source

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(_lines(3000, seed=1)) + "\n")
    b.write_text("".join(f"b_{i} 1\n" for i in range(500)))
    url = s3.put("files/mix_a.txt", a)
    cfg = {"seed": 4}
    remote = RankDataset(
        [Source(url, weight=2), Source(b, repeat=2)], reload_cfg=cfg, rank=0, world_size=1, parser=None
    )
    here = RankDataset([Source(a, weight=2), Source(b, repeat=2)], reload_cfg=cfg, rank=0, world_size=1, parser=None)
    assert [remote[i] for i in range(len(remote))] == [here[i] for i in range(len(here))]


def test_meta_server_serves_an_object(s3: Any, tmp_path: Path) -> None:
    """The meta server's app over MetaFile(URL) (what `rank-dataset serve URL` makes) answers as over
    the local file."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from rank_dataset.server.app import create_app

    local = tmp_path / "served.txt"
    local.write_text("\n".join(_lines(5000, seed=8)) + "\n")
    url = s3.put("files/served.txt", local)
    remote, here = TestClient(create_app(MetaFile(url))), TestClient(create_app(MetaFile(local)))
    assert remote.get("/len").json()["num_samples"] == here.get("/len").json()["num_samples"] == 5000
    params = {"world_size": 2, "rank": 1, "seed": 3}
    got, want = remote.get("/shard", params=params), here.get("/shard", params=params)
    assert got.status_code == want.status_code == 200 and got.content == want.content


def test_cli_serve_of_an_object_end_to_end(s3: Any, tmp_path: Path, start_server: Any) -> None:
    """`rank-dataset serve s3://...` as a real process on a loopback port (the S3 settings from the
    environment it inherits): a batch and a shard fetched over HTTP are those of the local file."""
    requests = pytest.importorskip("requests")
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.server import protocol

    local = tmp_path / "served.txt"
    local.write_text("\n".join(_lines(8000, seed=12)) + "\n")
    url = s3.put("files/served_cli.txt", local)
    here = MetaFile(local)
    server = start_server([url])  # waits for /healthz, then the meta file is indexed and served
    assert requests.get(f"{server.url}/len", timeout=60).json()["num_samples"] == 8000
    picks = np.array([7999, 0, 4321, 7], "<i8")
    batch = protocol.decode_frame(requests.post(f"{server.url}/samples", data=picks.tobytes(), timeout=60).content)
    assert batch.texts(range(4)) == [here[int(i)] for i in picks]
    params = {"world_size": 4, "rank": 3, "seed": 5}
    shard = protocol.decode_frame(requests.get(f"{server.url}/shard", params=params, timeout=60).content)
    spec = ShardSpec(8000, 4, 3, seed=5)
    assert np.array_equal(shard.ids, spec.indices())
    assert shard.texts(range(len(shard))) == [here[int(i)] for i in spec.indices()]
    assert server.stop() == 0
