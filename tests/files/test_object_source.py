"""The object store source (ObjectFile) against a real S3 server (SeaweedFS), a local HTTP server with
Range, and a proxy that injects faults: exact reads, pinned to the ETag, clear errors at construction,
retries, and no client across a fork."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import numpy as np
import pytest

pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")

from fault_proxy import running_proxy
from http_helpers import range_server
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.io import is_url
from rank_dataset.files.io import object as object_source
from rank_dataset.files.io.object import ObjectFile
from s3_helpers import read_in_child


def _data(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_is_url() -> None:
    assert is_url("s3://b/k") and is_url("gs://b/k") and is_url("az://c/k") and is_url("https://h/k")
    assert not is_url("/data/meta.txt") and not is_url("file:///data/meta.txt") and not is_url(b"s3://b/k")
    with pytest.raises(ValueError, match="names no object"):
        ObjectFile("s3://bucket")


def test_reads_are_exact(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_source, "REQUEST", 3 << 20)  # several GETs per stream
    data = _data((10 << 20) + 12345)
    url = s3.put("src/exact.bin", data)
    source = ObjectFile(url)
    assert str(source.path) == url and source.size == len(data) and source.key.etag
    assert source.read(0, 10) == data[:10] and source.read(len(data) - 7, 7) == data[-7:]
    assert b"".join(source.stream()) == data
    blocks = list(source.stream(5, 5 + (4 << 20) + 3, block=1 << 20))
    assert [len(b) for b in blocks] == [1 << 20] * 4 + [3] and b"".join(blocks) == data[5 : 5 + (4 << 20) + 3]
    out = np.empty(100_000, np.uint8)
    source.read_into(out, 999)
    assert out.tobytes() == data[999 : 999 + 100_000]
    with pytest.raises(MetaFileChangedError, match="shrank"):
        source.read(len(data) - 2, 3)
    # The key travels, the client does not: the copy makes its own and reads the same object.
    copy = pickle.loads(pickle.dumps(source))
    assert copy.key == source.key and copy.read(100, 50) == data[100:150]


def test_replaced_object_is_a_change(s3: Any) -> None:
    url = s3.put("src/replaced.txt", b"a\nb\nc\n" * 1000)
    source = ObjectFile(url)
    source.check()
    s3.put("src/replaced.txt", b"x\ny\nz\n" * 1000)  # same size, other bytes: only the ETag tells
    with pytest.raises(MetaFileChangedError, match=r"meta file s3://meta/src/replaced.txt changed: it was replaced"):
        source.read(0, 6)
    with pytest.raises(MetaFileChangedError, match=r"s3://meta/src/replaced.txt changed"):
        list(source.stream())
    with pytest.raises(MetaFileChangedError, match="ETag changed"):
        source.check()


def test_errors_at_construction_name_url_and_status(s3: Any) -> None:
    s3.put("src/there.txt", b"x\n")
    with pytest.raises(FileNotFoundError, match=r"meta file not found: s3://meta/src/missing.txt \(HTTP 404"):
        ObjectFile("s3://meta/src/missing.txt")
    with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket/src/there.txt \(HTTP 404"):
        ObjectFile("s3://no-such-bucket/src/there.txt")
    with pytest.raises(PermissionError, match=r"s3://meta/src/there.txt: access denied \(HTTP 403"):
        ObjectFile("s3://meta/src/there.txt", storage_options={"secret_access_key": "wrong"})


def test_storage_options_without_environment(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3.put("src/options.txt", b"hello\n")
    for name in s3.env():
        monkeypatch.delenv(name)
    options = {
        "endpoint": s3.endpoint,
        "access_key_id": "rankdataset",
        "secret_access_key": "rankdataset-secret",
        "region": "us-east-1",
    }
    assert ObjectFile(url, storage_options=options).read(0, 6) == b"hello\n"


def test_https_server_with_range() -> None:
    data = _data(3 << 20, seed=1)
    with range_server() as server:
        server.objects["dir/meta.bin"] = data
        source = ObjectFile(server.url("dir/meta.bin"))
        assert source.size == len(data) and source.key.etag
        assert source.read(1000, 5000) == data[1000:6000] and b"".join(source.stream(block=1 << 20)) == data
        server.objects["dir/meta.bin"] = data[::-1]
        with pytest.raises(MetaFileChangedError, match=r"meta file http://127.0.0.1:\d+/dir/meta.bin changed"):
            source.read(0, 10)
        with pytest.raises(FileNotFoundError, match=r"HTTP 404"):
            ObjectFile(server.url("dir/none.bin"))


def test_faults_are_retried(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """503s, dropped connections and bodies cut short (one request in four fails) cost retries, not
    the read."""
    monkeypatch.setattr(object_source, "REQUEST", 1 << 20)
    data = _data(6 << 20, seed=2)
    url = s3.put("src/faults.bin", data)
    with running_proxy(("127.0.0.1", s3.port), every=4) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        source = ObjectFile(url, timeout=60)
        assert b"".join(source.stream()) == data
        assert [source.read(a, 70_000) for a in range(0, 6 << 20, 1 << 20)] == [
            data[a : a + 70_000] for a in range(0, 6 << 20, 1 << 20)
        ]
        faults = proxy.stats()["faults"]
        assert all(faults.values()), faults


@pytest.mark.slow  # retries every GET until its timeout runs out: about 10 s, so make test, not test-quick
def test_short_bodies_for_good_are_corrupt(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3.put("src/short.bin", _data(100_000, seed=3))
    with running_proxy(("127.0.0.1", s3.port), every=1) as proxy:  # every GET: 503, reset or short
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        source = ObjectFile(url, timeout=20)
        with pytest.raises((CorruptMetaFileError, OSError), match=r"s3://meta/src/short.bin"):
            source.read(0, 100_000)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_no_client_crosses_a_fork(s3: Any, method: str) -> None:
    """A spawned or forkserver child makes its own client; a child forked from a process that ran one
    is told it cannot (obstore's runtime does not survive a fork: a request would hang), not left to hang."""
    url = s3.put("src/fork.txt", b"fork\n" * 10)
    source = ObjectFile(url)
    assert source.read(0, 4) == b"fork"  # the parent's client runs before the child starts
    context = multiprocessing.get_context(method)
    ours, theirs = context.Pipe()
    child = context.Process(target=read_in_child, args=(url, theirs, s3.env()))
    child.start()
    got = ours.recv() if ours.poll(60) else "no answer"
    child.join(30)
    assert child.exitcode == 0
    if method == "fork":
        assert "cannot run in a process forked" in got and "spawn or forkserver" in got
    else:
        assert got == b"fork"
    assert source.read(4, 5) == b"\nfork"  # the parent's client still serves


def test_without_obstore_a_url_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rank_dataset.files.io import _stores

    monkeypatch.setitem(__import__("sys").modules, "obstore.store", None)
    monkeypatch.setattr(_stores, "_stores", {})
    with pytest.raises(ImportError, match=r"pip install 'rank-dataset\[cloud\]'"):
        ObjectFile("s3://bucket/meta.txt")


@pytest.mark.timeout(120)
def test_a_stalled_server_fails_within_the_timeout() -> None:
    """The dataset's timeout bounds a read with its retries: a server that never answers a HEAD, or
    stops sending a body halfway, is an error naming the URL, not a hang (the client's own bound
    would be 30 minutes: past the test's timeout). The requests held show that retries were made."""
    from rank_dataset import RankDataset

    data = b"".join(b"line %d\n" % i for i in range(200_000))
    with range_server() as server:
        server.objects["s/meta.txt"] = data
        url = server.url("s/meta.txt")
        source = ObjectFile(url, timeout=4)
        server.stall = "body"
        with pytest.raises((OSError, CorruptMetaFileError), match=r"http://127.0.0.1:\d+/s/meta.txt"):
            source.read(0, len(data))
        assert server.stalled >= 2  # asked again after the first stall
        server.stall = "head"
        with pytest.raises(
            OSError,
            match=r"meta file http://127.0.0.1:\d+/s/meta.txt: the object store failed \(timed out, "
            r"(not retried: an attempt may take a quarter of|\d+ retries within) timeout=4 s\)",
        ):
            RankDataset(url, timeout=4, rank=0, world_size=1)  # the dataset's timeout reaches the client


def test_spread_start_delays_are_spread_over_a_bounded_window(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """512 ranks' first requests come evenly over a window of 2 ms a rank (about 1 s: about 500 first
    requests a second, against S3's 5,500 GETs a second a prefix), each rank in its slot, processes of
    one rank apart in it; the window is capped, and 0 turns it off."""
    from rank_dataset.files.io import _stores

    w, window = 512, 512 * _stores.SPREAD_PER_PROCESS
    delays = np.array([_stores.start_delay(r, w, 40_000 + 7 * r) for r in range(w)])
    slot = window / w
    assert ((delays >= np.arange(w) * slot) & (delays < (np.arange(w) + 1) * slot)).all()
    assert (np.histogram(delays, bins=16, range=(0, window))[0] == w // 16).all()  # 32 starts a 64 ms
    assert _stores.start_delay(9, w, 123) == _stores.start_delay(9, w, 123)  # deterministic
    same_rank = {_stores.start_delay(9, w, pid) for pid in range(1000, 1064)}
    assert len(same_rank) == 64 and max(same_rank) - min(same_rank) > slot / 2  # workers apart in the slot
    huge = [_stores.start_delay(r, 1 << 20, r) for r in range(0, 1 << 20, 4099)]
    assert max(huge) < _stores.SPREAD_MAX and max(huge) > _stores.SPREAD_MAX * 0.99
    assert _stores.start_delay(0, 1, 5) < 0.002 and _stores.start_delay(300, w, 5, per_process=0) == 0
    # The process's requests go through it, once (a forked child waits its own).
    monkeypatch.setenv("RANK_DATASET_OBJECT_SPREAD_MS", "nonsense")
    monkeypatch.setattr(_stores, "_started", False)
    with pytest.raises(ValueError, match="RANK_DATASET_OBJECT_SPREAD_MS must be a number >= 0, got 'nonsense'"):
        ObjectFile(s3.put("src/spread.txt", b"x\n"))
    monkeypatch.setenv("RANK_DATASET_OBJECT_SPREAD_MS", "1")
    assert ObjectFile("s3://meta/src/spread.txt").read(0, 2) == b"x\n" and _stores._started
