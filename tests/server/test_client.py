"""ServerDataset and RankServerDataset against a real server process."""

from __future__ import annotations

import http.server
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from rank_dataset import MetaFile, RandomSampler, RankDataset, RankServerDataset, ServerDataset, Source
from rank_dataset.server.transport import MetaServer, _retry_after
from tests_helpers import Server, spawn_workers, start_methods

SETTINGS = [
    (1, 1, False, 0, 0),
    (3, 1, False, 5, 1),
    (4, 3, False, 2, 7),
    (8, 2, False, 1, 0),  # N = 1003 is not divisible
    (3, 2, True, 0, 0),
    (2000, 1, False, 3, 2),  # N < W
]


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The seconds of every ``time.sleep`` in this process from here on (they are still slept): the
    client's waits between retries, counted instead of timed."""
    recorded: list[float] = []
    real = time.sleep

    def sleep(seconds: float) -> None:
        recorded.append(seconds)
        real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return recorded


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
    # A line its parser rejects is named by the server and the sample, in both ways of reading.
    as_json = ServerDataset(server.url, parser="json")
    with pytest.raises(ValueError, match=f"^{server.url} sample 5: "):
        as_json[5]
    with pytest.raises(ValueError, match=f"^{server.url} sample 3: "):
        as_json.__getitems__([3, 1])


@pytest.mark.parametrize("context", start_methods("fork", "spawn"))
def test_dataloader_workers(meta, server, context: str) -> None:
    mf = MetaFile(meta)
    ds = ServerDataset(server.url)
    loader = DataLoader(ds, batch_size=100, num_workers=spawn_workers(context), multiprocessing_context=context)
    assert [line for batch in loader for line in batch] == [mf[i] for i in range(len(mf))]
    rds = RankServerDataset(server.url, reload_cfg={"seed": 3}, rank=1, world_size=3)
    loader = DataLoader(
        rds,
        batch_size=64,
        sampler=RandomSampler(rds),
        num_workers=spawn_workers(context),
        multiprocessing_context=context,
    )
    assert sorted(x for batch in loader for x in batch) == sorted(mf[int(i)] for i in rds.indices)


def test_token(meta, start_server) -> None:
    server = start_server([meta], "--token", "abc")
    with pytest.raises(PermissionError, match="token"):
        ServerDataset(server.url)
    with pytest.raises(PermissionError):
        RankServerDataset(server.url, rank=0, world_size=1, token="wrong")
    assert len(RankServerDataset(server.url, rank=0, world_size=2, token="abc")) == 502


def test_timeout_is_seconds_or_a_timedelta(server) -> None:
    import datetime

    assert ServerDataset(server.url, timeout=datetime.timedelta(seconds=12)).server.timeout == 12.0
    assert ServerDataset(server.url, timeout=12).server.timeout == 12.0
    rds = RankServerDataset(server.url, rank=0, world_size=1, timeout=datetime.timedelta(minutes=1))
    assert rds.server.timeout == 60.0
    with pytest.raises(TypeError, match="timeout must be seconds"):
        ServerDataset(server.url, timeout="12")


def test_bad_arguments_are_value_errors(server) -> None:
    with pytest.raises(ValueError, match="url must start with http"):
        ServerDataset("localhost:1")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        RankServerDataset(server.url, rank=2, world_size=2)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        ServerDataset(server.url, retries=-1)


def test_killed_server_gives_connection_error_within_timeout(meta, server, sleeps) -> None:
    ds = ServerDataset(server.url, timeout=2.0, retries=3)
    assert ds[0]
    server.stop(signal.SIGKILL)
    sleeps.clear()
    with pytest.raises(ConnectionError, match=rf"meta server at {server.url} did not answer .* after \d attempts") as e:
        ds[1]
    attempts = int(re.search(r"after (\d) attempts", str(e.value)).group(1))  # type: ignore[union-attr]
    # Up to retries + 1 attempts, and no wait that would end past the timeout.
    assert 1 <= attempts <= 4 and len(sleeps) == attempts - 1 and sum(sleeps) <= 2.0, (attempts, sleeps)
    with pytest.raises(ConnectionError, match=server.url):
        RankServerDataset(server.url, rank=0, world_size=1, timeout=1.0)


@pytest.mark.slow  # a real server stopped and started again
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


@pytest.mark.slow  # a real server, one pass linger a request
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


# --- How the client treats a server at its limits: a scripted stub server on 127.0.0.1 ----------


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers, body) of the server's script; the last repeats."""

    def do_GET(self) -> None:
        server: Any = self.server
        server.times.append(time.monotonic())
        status, headers, body = server.script[min(len(server.times), len(server.script)) - 1]
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[Callable[..., Any]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(*script: tuple[int, dict[str, str], bytes]) -> Any:
        server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
        server.script, server.times = list(script), []
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


LENGTH = (200, {"Content-Type": "application/json"}, json.dumps({"num_samples": 7, "fingerprint": None}).encode())
BUSY = (503, {"Retry-After": "1"}, b'{"error": "busy", "kind": "busy"}')


def test_busy_server_is_retried_after_its_retry_after(stub, sleeps) -> None:
    server = stub(BUSY, BUSY, LENGTH)
    # retries=0: a 503 does not use up retries, only time
    assert MetaServer(server.url, timeout=10, retries=0).num_samples() == (7, None)
    gaps = np.diff(server.times)
    assert len(server.times) == 3 and all(gap >= 1.0 for gap in gaps), gaps  # a lower bound: load only adds
    assert len(sleeps) == 2 and all(1.0 <= s <= 1.1 for s in sleeps), sleeps  # Retry-After, plus its jitter


def test_busy_server_without_retry_after_is_retried_with_backoff(stub, sleeps) -> None:
    server = stub((503, {}, b"Service Unavailable"), LENGTH)
    assert MetaServer(server.url, timeout=10, retries=0).num_samples() == (7, None)
    assert len(server.times) == 2 and len(sleeps) == 1 and sleeps[0] < 0.5, sleeps  # the first backoff step


def test_busy_retries_end_with_the_timeout(stub, sleeps) -> None:
    server = stub(BUSY)
    with pytest.raises(ConnectionError, match=r"was still busy with GET /len after \d attempts within 2.5s"):
        MetaServer(server.url, timeout=2.5).num_samples()
    # Each wait honours Retry-After, and none would end past the timeout (2.5 s).
    assert sleeps and all(s >= 1.0 for s in sleeps) and sum(sleeps) <= 2.5, sleeps
    assert len(server.times) == len(sleeps) + 1
    late = stub((503, {"Retry-After": "30"}, b"busy"))
    sleeps.clear()
    with pytest.raises(ConnectionError, match="after 1 attempts"):  # asked to come back too late: at once
        MetaServer(late.url, timeout=5).num_samples()
    assert sleeps == [] and len(late.times) == 1


@pytest.mark.parametrize("status", [400, 404, 408, 413, 429, 431])
def test_other_4xx_are_not_retried(stub, status) -> None:
    server = stub((status, {"Retry-After": "1"}, json.dumps({"error": "no", "kind": "request"}).encode()))
    with pytest.raises(ValueError, match=f"HTTP {status}: no"):
        MetaServer(server.url, timeout=10).num_samples()
    assert len(server.times) == 1


def test_retry_after_forms() -> None:
    from email.utils import formatdate

    assert _retry_after("3") == 3.0 and _retry_after(" 0 ") == 0.0
    assert _retry_after(None) is None and _retry_after("soon") is None and _retry_after("-1") is None
    before = time.time()
    seconds = _retry_after(formatdate(before + 10, usegmt=True)) or 0
    # The date is in whole seconds (up to 1 s earlier), and the clock went on meanwhile.
    assert 10 - 1 - (time.time() - before) <= seconds <= 10
    assert _retry_after(formatdate(time.time() - 100, usegmt=True)) == 0.0


# --- The original project's keywords: (meta_file, server_ip=, server_port=) ----------------------


def test_original_keywords(meta, server) -> None:
    port = server.url.rsplit(":", 1)[1]
    cfg = {"seed": 3, "mini_epoch": 2}
    by_url = RankServerDataset(server.url, reload_cfg=cfg, rank=1, world_size=2, parser="label")
    for p in (port, int(port), f" {port} "):  # the original README writes the port as a str
        old = RankServerDataset(
            str(meta),
            server_ip="127.0.0.1",
            server_port=p,
            is_test=False,
            reload_cfg=cfg,
            rank=1,
            world_size=2,
            parser="label",
        )
        assert np.array_equal(old.indices, by_url.indices)
        assert old[0] == by_url[0]
        plain = ServerDataset(meta, server_ip="127.0.0.1", server_port=p)
        assert len(plain) == 1003 and plain[7] == ServerDataset(server.url)[7]
    positional = ServerDataset(str(meta), "127.0.0.1", port)  # the original's positional order
    assert positional.server.url == server.url
    # Only the file name is compared: the client may see the file under another directory, or not at all.
    assert len(ServerDataset(f"/elsewhere/{meta.name}", server_ip="localhost", server_port=port)) == 1003


def test_original_keywords_check_the_served_file(meta, server) -> None:
    port = server.url.rsplit(":", 1)[1]
    with pytest.raises(ValueError, match=rf"serves no file named 'other.txt' \(it serves {meta.name}\)"):
        ServerDataset("/data/other.txt", server_ip="127.0.0.1", server_port=port)
    with pytest.raises(ValueError, match=r"serves no file named 'other\.txt'"):
        RankServerDataset("other.txt", server_ip="127.0.0.1", server_port=port, rank=0, world_size=1)


@pytest.mark.parametrize(
    ("ip", "port", "message"),
    [
        ("127.0.0.1", None, "server_port is missing"),
        (None, "80", "server_ip is missing"),
        ("127.0.0.1", "80x", r"server_port must be an integer in \[1, 65535\].*'80x'"),
        ("127.0.0.1", 0, r"server_port must be an integer in \[1, 65535\].*got 0"),
        ("127.0.0.1", 70000, "got 70000"),
        ("127.0.0.1", True, "got True"),
        ("127.0.0.1", 8.0, "got 8.0"),
        ("", 80, "server_ip must be a host name or address"),
    ],
)
def test_original_keywords_bad_values(meta, ip, port, message) -> None:
    for cls in (ServerDataset, RankServerDataset):
        with pytest.raises(ValueError, match=message):
            cls("meta.txt", server_ip=ip, server_port=port)


def test_url_and_keywords_together_are_refused(server) -> None:
    with pytest.raises(ValueError, match=r"either a URL .* or a meta file name"):
        ServerDataset(server.url, server_ip="127.0.0.1", server_port=1)
    with pytest.raises(ValueError, match=r"either a meta file name .* or sources"):
        port = server.url.rsplit(":", 1)[1]
        RankServerDataset("x.txt", server_ip="127.0.0.1", server_port=port, sources=Source("x.txt"))


def test_original_keywords_pick_one_of_several_served_files(write_meta, start_server) -> None:
    a, b = write_meta(n=30, name="a.txt"), write_meta(["b0", "b1", "b2", "b3", "b4"], name="b.txt")
    server = start_server([a, b])
    port = server.url.rsplit(":", 1)[1]
    only_b = ServerDataset("b.txt", server_ip="127.0.0.1", server_port=port)
    assert len(only_b) == 5 and only_b[0] == "b0" and only_b[-1] == "b4"
    assert only_b.__getitems__([4, 0, 2]) == ["b4", "b0", "b2"]
    with pytest.raises(IndexError):
        only_b[5]
    ds = RankServerDataset(
        "b.txt", server_ip="127.0.0.1", server_port=port, reload_cfg={"seed": 1}, rank=0, world_size=1
    )
    ref = RankDataset([Source(str(b))], reload_cfg={"seed": 1}, rank=0, world_size=1)
    assert np.array_equal(ds.indices, ref.indices)
    assert sorted(ds[i] for i in range(len(ds))) == ["b0", "b1", "b2", "b3", "b4"]
