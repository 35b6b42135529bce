"""ServerDataset and RankServerDataset against a real server process."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import MetaFile, RandomSampler, RankDataset, RankServerDataset, ServerDataset
from tests_helpers import Server

SETTINGS = [
    (1, 1, False, 0, 0),
    (3, 1, False, 5, 1),
    (4, 3, False, 2, 7),
    (8, 2, False, 1, 0),  # N = 1003 is not divisible
    (3, 2, True, 0, 0),
    (2000, 1, False, 3, 2),  # N < W
]


@pytest.fixture
def meta(write_meta):
    return write_meta(n=1003)


@pytest.fixture
def server(meta, start_server) -> Server:
    return start_server([meta])


@pytest.mark.parametrize(("w", "m", "is_test", "seed", "epoch"), SETTINGS)
def test_same_indices_and_samples_as_rank_dataset(meta, server, w, m, is_test, seed, epoch) -> None:
    cfg = {"mini_epoch": m, "seed": seed, "epoch": epoch, "mini_epoch_idx": m - 1}
    for r in sorted({0, w // 2, w - 1}):
        local = RankDataset(meta, is_test=is_test, reload_cfg=cfg, rank=r, world_size=w, parser="label")
        remote = RankServerDataset(server.url, is_test=is_test, reload_cfg=cfg, rank=r, world_size=w, parser="label")
        assert np.array_equal(local.indices, remote.indices)
        assert [local[i] for i in range(len(local))] == [remote[i] for i in range(len(remote))]
        remote.set_epoch(epoch + 1, 0)
        local.set_epoch(epoch + 1, 0)
        assert np.array_equal(local.indices, remote.indices)


def test_two_jobs_share_one_server(meta, server) -> None:
    a = RankServerDataset(server.url, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=0, world_size=2)
    b = RankServerDataset(server.url, reload_cfg={"seed": 9}, rank=2, world_size=4)
    a_ref = RankDataset(meta, reload_cfg={"seed": 1, "mini_epoch": 2}, rank=0, world_size=2)
    b_ref = RankDataset(meta, reload_cfg={"seed": 9}, rank=2, world_size=4)
    for epoch in range(3):  # interleaved: the server keeps no state between requests
        for ds, ref in [(a, a_ref), (b, b_ref)]:
            ds.set_epoch(epoch, epoch % ds.reload_cfg.mini_epoch)
            ref.set_epoch(epoch, epoch % ref.reload_cfg.mini_epoch)
            assert np.array_equal(ds.indices, ref.indices)


def test_server_dataset(meta, server) -> None:
    mf = MetaFile(meta)
    ds = ServerDataset(server.url, parser="label")
    assert len(ds) == 1003
    assert ds[5] == ds[-998] == (mf[5].rsplit(" ", 1)[0], int(mf[5].rsplit(" ", 1)[1]))
    assert [x[0] for x in ds.__getitems__([3, 1, 3])] == [mf[i].rsplit(" ", 1)[0] for i in [3, 1, 3]]
    with pytest.raises(IndexError, match="1003 is out of range"):
        ds[1003]
    with pytest.raises(TypeError):
        ds["1"]  # type: ignore[index]


def test_dataloader_workers(meta, server) -> None:
    mf = MetaFile(meta)
    ds = ServerDataset(server.url)
    got = [line for batch in DataLoader(ds, batch_size=100, num_workers=2) for line in batch]
    assert got == [mf[i] for i in range(len(mf))]
    rds = RankServerDataset(server.url, reload_cfg={"seed": 3}, rank=1, world_size=3)
    for context in ["fork", "spawn"]:
        loader = DataLoader(
            rds, batch_size=64, sampler=RandomSampler(rds), num_workers=2, multiprocessing_context=context
        )
        assert sorted(x for batch in loader for x in batch) == sorted(mf[int(i)] for i in rds.indices)


def test_token(meta, start_server) -> None:
    server = start_server([meta], "--token", "abc")
    with pytest.raises(PermissionError, match="token"):
        ServerDataset(server.url)
    with pytest.raises(PermissionError):
        RankServerDataset(server.url, rank=0, world_size=1, token="wrong")
    assert len(RankServerDataset(server.url, rank=0, world_size=2, token="abc")) == 502


def test_bad_arguments_are_value_errors(server) -> None:
    with pytest.raises(ValueError, match="url must start with http"):
        ServerDataset("localhost:1")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        RankServerDataset(server.url, rank=2, world_size=2)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        ServerDataset(server.url, retries=-1)


def test_killed_server_gives_connection_error_within_timeout(meta, server) -> None:
    ds = ServerDataset(server.url, timeout=2.0, retries=3)
    assert ds[0]
    server.stop(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"meta server at {server.url} did not answer .* after \d attempts"):
        ds[1]
    assert time.monotonic() - start < 2.0 + 1.0
    with pytest.raises(ConnectionError, match=server.url):
        RankServerDataset(server.url, rank=0, world_size=1, timeout=1.0)


def test_server_back_within_retry_window(meta, server, start_server) -> None:
    ds = ServerDataset(server.url, timeout=20.0, retries=50)
    rds = RankServerDataset(server.url, reload_cfg={"seed": 2}, rank=0, world_size=2, timeout=20.0, retries=50)
    server.stop(signal.SIGKILL)
    restarted: list[Server] = []
    timer = threading.Timer(1.0, lambda: restarted.append(start_server([meta], port=server.port)))
    timer.start()
    try:
        assert ds[10] == MetaFile(meta)[10]  # retried until the server came back
        rds.set_epoch(1)
        assert np.array_equal(
            rds.indices, RankDataset(meta, reload_cfg={"seed": 2, "epoch": 1}, rank=0, world_size=2).indices
        )
    finally:
        timer.join()
    assert restarted


def test_empty_eval_shards_when_fewer_samples_than_ranks(write_meta, start_server) -> None:
    meta = write_meta(n=7)
    server = start_server([meta])
    sizes = []
    for r in range(10):
        local = RankDataset(meta, is_test=True, rank=r, world_size=10)
        remote = RankServerDataset(server.url, is_test=True, rank=r, world_size=10)
        assert np.array_equal(local.indices, remote.indices)
        sizes.append(len(remote))
    assert sizes == [1] * 7 + [0] * 3
