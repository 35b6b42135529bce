"""The meta server, over HTTP, as a real process on a loopback port."""

from __future__ import annotations

import contextlib
import json
import re
import select
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import requests

from rank_dataset import MetaFile
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.server import protocol
from rank_dataset.server.local import wait_until_up
from tests_helpers import free_port, rewrite


@pytest.fixture
def served(write_meta, start_server):
    meta = write_meta(n=1000)
    return MetaFile(meta), start_server([meta])


def test_endpoints(served) -> None:
    mf, server = served
    assert requests.get(f"{server.url}/healthz").text == "ok"
    assert requests.get(f"{server.url}/len").json()["num_samples"] == 1000
    assert requests.get(f"{server.url}/sample/7").text == mf[7]
    body = np.array([5, 0, 999, 5], "<i8").tobytes()
    shard = protocol.decode_frame(requests.post(f"{server.url}/samples", data=body).content)
    assert shard.texts(range(4)) == [mf[5], mf[0], mf[999], mf[5]]
    spec = ShardSpec(1000, 3, 2, mini_epoch=2, mini_epoch_idx=1, seed=4, epoch=2)
    params = {"world_size": 3, "rank": 2, "mini_epoch": 2, "mini_epoch_idx": 1, "seed": 4, "epoch": 2}
    response = requests.get(f"{server.url}/shard", params=params)
    assert int(response.headers["Content-Length"]) == len(response.content)
    shard = protocol.decode_frame(response.content)
    assert np.array_equal(shard.ids, spec.indices())
    assert shard.texts(range(len(shard))) == [mf[int(i)] for i in spec.indices()]
    evals = requests.get(f"{server.url}/shard", params={"world_size": 3, "rank": 0, "is_test": "true"})
    assert np.array_equal(protocol.decode_frame(evals.content).ids, np.arange(334))


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "message"),
    [
        ("GET", "/sample/1000", {}, 404, "sample index 1000 is out of range for 1000 samples"),
        ("GET", "/sample/-1", {}, 404, "sample index -1 is out of range"),
        ("GET", "/sample/abc", {}, 400, "index must be an integer, got 'abc'"),
        ("POST", "/sample/1", {}, 405, "Method Not Allowed"),
        ("POST", "/samples", {"data": b"abc"}, 400, "not a multiple of 8"),
        ("POST", "/samples", {"data": np.array([1, 1000], "<i8").tobytes()}, 404, "sample index 1000 is out"),
        ("GET", "/samples", {}, 405, "Method Not Allowed"),
        ("GET", "/shard", {"params": {"world_size": 2}}, 400, "the shard parameter 'rank' is required"),
        ("GET", "/shard", {"params": {"world_size": 2, "rank": 2}}, 400, r"rank must be in \[0, world_size=2\)"),
        ("GET", "/shard", {"params": {"world_size": 0, "rank": 0}}, 400, "world_size must be >= 1"),
        ("GET", "/shard", {"params": {"world_size": "x", "rank": 0}}, 400, "world_size must be an integer"),
        ("GET", "/shard", {"params": {"world_size": 1, "rank": 0, "seeds": 1}}, 400, "unknown shard parameter"),
        ("GET", "/shard", {"params": {"world_size": 1, "rank": 0, "is_test": "maybe"}}, 400, "is_test must be"),
        ("GET", "/shard", {"params": {"world_size": 2, "rank": 0, "mini_epoch_idx": 1}}, 400, "mini_epoch_idx"),
        ("GET", "/shard", {"params": {"world_size": 2, "rank": 0, "num_samples": 5}}, 409, "num_samples=5"),
        ("GET", "/nope", {}, 404, "no such endpoint '/nope'"),
        # numbers no client sends: each a 4xx with a message, never a 500
        ("GET", "/shard", {"params": {"world_size": 2**70, "rank": 0}}, 400, "world_size must be at most 1048576"),
        ("GET", "/shard", {"params": {"world_size": 2, "rank": -1}}, 400, r"rank must be in \[0, world_size=2\)"),
        ("GET", "/shard", {"params": {"world_size": 2, "rank": 2**64}}, 400, r"rank must be in \[0, world_size=2\)"),
        (
            "GET",
            "/shard",
            {"params": {"world_size": 4, "rank": 0, "mini_epoch": 2**61, "mini_epoch_idx": 2**61 - 1}},
            400,
            "mini_epoch=2305843009213693952 is too large for 1000 samples on 4 ranks",
        ),
        ("GET", "/shard", {"params": {"world_size": "1_0", "rank": 0}}, 400, "world_size must be an integer"),
        ("GET", "/shard", {"params": {"world_size": " 1", "rank": 0}}, 400, "world_size must be an integer"),
        ("GET", "/shard", {"params": {"world_size": "\uff11", "rank": 0}}, 400, "world_size must be an integer"),
        ("GET", "/shard", {"params": {"world_size": "9" * 101, "rank": 0}}, 400, "at most 100 digits"),
        ("GET", "/shard", {"params": [("world_size", 2), ("rank", 0), ("rank", 1)]}, 400, "'rank' is given more"),
        ("GET", f"/sample/{2**70}", {}, 404, "sample index 1180591620717411303424 is out of range"),
        ("GET", "/sample/1e3", {}, 400, "index must be an integer, got '1e3'"),
        ("GET", f"/sample/{'9' * 5000}", {}, 400, "index must have at most 100 digits"),
    ],
)
def test_client_mistakes_are_4xx_with_a_message(served, method, path, kwargs, status, message) -> None:
    _, server = served
    response = requests.request(method, f"{server.url}{path}", **kwargs)
    assert response.status_code == status
    assert re.search(message, response.json()["error"])
    assert requests.get(f"{server.url}/healthz").status_code == 200  # still serving


def test_token(write_meta, start_server) -> None:
    meta = write_meta(n=10)
    server = start_server([meta], "--token", "s3cret")
    assert requests.get(f"{server.url}/healthz").status_code == 200  # health needs no token
    for path in ["/len", "/sample/1", "/shard?world_size=1&rank=0"]:
        response = requests.get(f"{server.url}{path}")
        assert response.status_code == 401 and "token" in response.json()["error"]
        assert requests.get(f"{server.url}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert requests.get(f"{server.url}{path}", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    from_env = start_server([meta], env={"RANK_DATASET_TOKEN": "envtoken"})
    assert requests.get(f"{from_env.url}/len").status_code == 401
    assert requests.get(f"{from_env.url}/len", headers={"Authorization": "Bearer envtoken"}).status_code == 200
    assert "envtoken" not in " ".join(from_env.proc.args)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_exit_on_signals(start_server, write_meta, sig) -> None:
    server = start_server([write_meta(n=5)])
    assert server.stop(sig) == 0


@pytest.mark.slow  # a real server with several worker processes
def test_several_workers(write_meta, start_server) -> None:
    meta = write_meta(n=100)
    server = start_server([meta], "--workers", "2", "--timeout-request", "1")
    for i in range(20):
        assert requests.get(f"{server.url}/sample/{i}").text == MetaFile(meta)[i]
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        _closed_within(silent, 4.0)  # each worker process has the limits too
    finally:
        for sock in silent:
            sock.close()
    assert server.stop() == 0


def test_serve_errors_name_the_file(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rank_dataset", "serve", str(tmp_path / "missing.txt")], capture_output=True, text=True
    )
    assert out.returncode != 0 and "missing.txt" in out.stderr


def test_serves_without_torch(write_meta, tmp_path) -> None:
    meta = write_meta(n=50)
    port = free_port()
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from rank_dataset.cli import main\n"
        f"sys.argv = ['rank-dataset', 'serve', {str(meta)!r}, '--port', '{port}']\n"
        "main()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", proc, timeout=60)
        assert requests.get(f"http://127.0.0.1:{port}/sample/3").text == MetaFile(meta)[3]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


# --- Limits: hostile and broken clients ------------------------------------------------------------
# Raw sockets on 127.0.0.1 only; every loop below is bounded in count and time.


@pytest.mark.slow  # a real server, hundreds of raw requests
def test_malformed_numbers_are_never_a_server_error(served) -> None:
    _, server = served
    odd = ["-1", "0", str(2**63 - 1), str(2**63), str(2**64), str(-(2**70)), "1e3", "0x10", "", "nan", "+7", "٣"]
    fields = ["world_size", "rank", "mini_epoch", "mini_epoch_idx", "seed", "epoch", "plan_world_size"]
    fields += ["resume_mini_epoch_idx", "resume_offset", "num_samples"]
    with requests.Session() as session:
        for field in fields:
            for value in odd:
                params = {"world_size": 4, "rank": 1, "mini_epoch": 2, field: value}
                response = session.get(f"{server.url}/shard", params=params, timeout=10)
                assert response.status_code < 500, (field, value, response.text)
                if response.status_code >= 400:
                    assert response.json()["error"], (field, value)
        for value in odd:
            response = session.get(f"{server.url}/sample/{value}", timeout=10)
            assert response.status_code < 500 and (response.ok or response.json()["error"]), value


def _answer(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server answered on ``sock``, up to its close or ``timeout``."""
    return _answer_and_close(sock, timeout)[0]


def _answer_and_close(sock: socket.socket, timeout: float = 30.0) -> tuple[bytes, bool]:
    """What the server answered on ``sock``, and whether the server closed it (else ``timeout``, a guard
    against a hang, passed with no byte)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return data, True
    except TimeoutError:
        return data, False
    return data, True


def test_declared_oversized_body_is_refused_before_it_is_read(served) -> None:
    _, server = served
    rss = psutil.Process(server.proc.pid).memory_info().rss
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /samples HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (512 << 20))
        answer, closed = _answer_and_close(sock)  # no byte of the body sent yet: refused on its head alone
        assert closed  # by the server, which does not wait for the body
        assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower()
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"].startswith("a request body of 536870912 bytes")
        sent = 0  # the server closed the connection: the body goes nowhere
        with contextlib.suppress(OSError):
            while sent < 512 << 20:
                sock.sendall(bytes(1 << 20))
                sent += 1 << 20
        assert sent < 64 << 20
    assert psutil.Process(server.proc.pid).memory_info().rss - rss < 50 << 20
    assert requests.get(f"{server.url}/healthz").status_code == 200


def test_chunked_body_is_capped_as_it_streams(write_meta, start_server) -> None:
    meta = write_meta(n=1000)
    server = start_server([meta], "--max-body-size", "65536")
    # within the limit, chunked (a generator body) is fine
    chunks = (np.array([i], "<i8").tobytes() for i in (3, 1, 4))
    shard = protocol.decode_frame(requests.post(f"{server.url}/samples", data=chunks).content)
    assert shard.ids.tolist() == [3, 1, 4]
    # over it, the answer is 413 as soon as the limit is passed, though the body never ends
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /samples HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(5):
            sock.sendall(b"4000\r\n" + bytes(16384) + b"\r\n")
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower()
    assert "more than 65536 bytes" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    response = requests.post(f"{server.url}/samples", data=bytes(65536 + 8))
    assert response.status_code == 413 and "at most 65536" in response.json()["error"]


def test_header_size_is_limited_before_any_work(write_meta, start_server) -> None:
    meta = write_meta(n=10)
    server = start_server([meta], "--token", "s3cret", "--max-header-size", "8192")
    token = b"Authorization: Bearer s3cret\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /len HTTP/1.1\r\nHost: t\r\n" + token + b"X-Pad: " + b"a" * 7000 + b"\r\n\r\n")
        assert _answer(sock, 2).startswith(b"HTTP/1.1 200 ")  # under the limit
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        # a 32 MiB header, sent until the server answers: 400 (h11's limit), not 401 (the token check)
        sock.sendall(b"GET /len HTTP/1.1\r\nHost: t\r\nX-Big: ")
        sent = 0
        with contextlib.suppress(OSError):
            while sent < 32 << 20 and not select.select([sock], [], [], 0)[0]:
                sock.sendall(b"a" * 65536)
                sent += 65536
        answer, closed = _answer_and_close(sock)
        assert answer.startswith(b"HTTP/1.1 400 ") and closed, answer[:200]
        assert sent < 16 << 20  # refused once past the limit, not read to its end
    assert requests.get(f"{server.url}/len", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def _closed_within(socks: list[socket.socket], seconds: float, trickle: list[socket.socket] = ()) -> float:
    """Seconds until the server closed every socket (raises if it did not within ``seconds``);
    meanwhile one byte every 0.2 s goes out on each of ``trickle``, as a slowloris client does."""
    start = time.monotonic()
    open_ = {s.fileno(): s for s in socks}
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    while open_ and time.monotonic() - start < seconds:
        for fd, _ in poller.poll(200):
            try:
                closed = open_[fd].recv(4096) == b""
            except ConnectionResetError:
                closed = True
            if closed:
                poller.unregister(fd)
                del open_[fd]
        for s in trickle:
            if s.fileno() in open_:
                with contextlib.suppress(OSError):
                    s.send(b"X")
    assert not open_, f"{len(open_)} of {len(socks)} connections still open after {seconds}s"
    return time.monotonic() - start


def _half_open(port: int, count: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """``count`` connections that never finish a request: silent, half a head, half a body, trickling."""
    socks, trickle = [], []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        kind = i % 4
        if kind == 1:
            sock.sendall(b"GET /len HTTP/1.1\r\nHost: t\r\n")
        elif kind == 2:
            sock.sendall(b"POST /samples HTTP/1.1\r\nHost: t\r\nContent-Length: 800\r\n\r\n" + bytes(8))
        elif kind == 3:
            sock.sendall(b"GET /len HTTP/1.1\r\n")
            trickle.append(sock)
        socks.append(sock)
    return socks, trickle


def test_half_open_connections_are_timed_out_and_lock_nobody_out(write_meta, start_server) -> None:
    # Two servers, each held by 400 half-open connections: one with a request timeout of 1 s, one with
    # the default 10 s, whose connections tell the order of events without a clock.
    meta = write_meta(n=100)
    server = start_server([meta], "--timeout-request", "1")
    slow = start_server([meta])
    slow_socks, _ = _half_open(slow.port, 400)
    socks, trickle = _half_open(server.port, 400)
    try:
        for i in range(5):  # real clients are served meanwhile ...
            assert requests.get(f"{slow.url}/sample/{i}", timeout=5).text == MetaFile(meta)[i]
            assert requests.get(f"{server.url}/sample/{i}", timeout=5).text == MetaFile(meta)[i]
        # ... at once: before the 10 s request timeout freed anything.
        assert all(_is_open(sock) for sock in slow_socks)
        # The request timeout (1 s) closed them all, the trickling ones too, and before the default one
        # closed the other server's (30 s: a guard against a hang).
        _closed_within(socks, 30.0, trickle)
        assert all(_is_open(sock) for sock in slow_socks)
    finally:
        for sock in socks + slow_socks:
            sock.close()
    assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200


@pytest.mark.slow  # a real server held at its limits for seconds
def test_half_open_connections_past_the_concurrency_limit_only_delay_a_client(write_meta, start_server) -> None:
    from rank_dataset.server.transport import MetaServer

    meta = write_meta(n=100)
    server = start_server([meta], "--timeout-request", "3", "--limit-concurrency", "50")
    socks, _ = _half_open(server.port, 80)
    try:
        turned_away = requests.get(f"{server.url}/len", timeout=10)
        assert turned_away.status_code == 503  # the half-open connections hold the limit
        # The client retries (within its timeout of 10 s) until the request timeout has closed them.
        assert MetaServer(server.url, timeout=10).num_samples()[0] == 100
        _closed_within(socks, 30.0)
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
def served_keep_alive(write_meta, start_server):
    return start_server([write_meta(n=10)], "--timeout-keep-alive", "1")


def test_idle_connection_closed_after_keep_alive(served_keep_alive, served) -> None:
    server, default = served_keep_alive, served[1]  # keep-alive 1 s; the default, 5 s
    with (
        socket.create_connection(("127.0.0.1", server.port)) as sock,
        socket.create_connection(("127.0.0.1", default.port)) as other,
    ):
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        start = time.monotonic()
        answer, closed = _answer_and_close(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and closed
        assert time.monotonic() - start > 0.8  # kept alive first (a lower bound: load only adds)
        assert _is_open(other)  # closed before the default keep-alive closed the other


def _stalled_shard_request(port: int) -> socket.socket:
    """A client that asks for a whole shard and reads none of it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /shard?world_size=1&rank=0 HTTP/1.1\r\nHost: t\r\n\r\n")
    return sock


@pytest.mark.slow  # a real server, 11 MB frames
def test_a_client_gone_mid_frame_frees_its_build_at_once(write_meta, start_server) -> None:
    meta = write_meta(n=200_000)  # a whole shard of some 11 MB: more than the socket buffers hold
    server = start_server([meta], "--max-builds", "1")
    for _ in range(3):
        # Each asks for a whole shard, reads the start of its answer and leaves (closing a socket with
        # unread data resets it). Had the one build slot stayed with a sender, the next would wait 1 s
        # for it and be answered 503.
        sock = _stalled_shard_request(server.port)
        sock.settimeout(30)
        assert sock.recv(12) == b"HTTP/1.1 200"
        sock.close()
    body = np.array([199_999, 0], "<i8").tobytes()
    answer = requests.post(f"{server.url}/samples", data=body, timeout=10)
    assert answer.status_code == 200
    assert protocol.decode_frame(answer.content).texts([0, 1]) == [MetaFile(meta)[199_999], MetaFile(meta)[0]]


@pytest.mark.slow  # a real server held at its limits for seconds
def test_shard_builds_are_bounded_and_a_stalled_reader_is_cut_off(write_meta, start_server) -> None:
    from rank_dataset import RankServerDataset

    meta = write_meta(n=200_000)  # a whole shard of some 11 MB: more than the socket buffers hold
    server = start_server([meta], "--max-builds", "1", "--timeout-send", "2")
    stalled = _stalled_shard_request(server.port)
    try:
        time.sleep(0.5)  # its build holds the only slot while the answer waits for it to read
        start = time.monotonic()
        busy = requests.get(f"{server.url}/shard", params={"world_size": 4, "rank": 0}, timeout=10)
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert busy.json()["kind"] == "busy" and time.monotonic() - start > 0.9  # it waited 1 s for a slot
        assert requests.get(f"{server.url}/sample/5", timeout=5).text == MetaFile(meta)[5]  # not a build
        # The client retries after Retry-After (within its timeout of 15 s) until the send timeout has
        # cut the stalled reader off.
        ds = RankServerDataset(server.url, rank=0, world_size=4, timeout=15, retries=0)
        assert len(ds) == 50_000
        assert len(_answer(stalled, 5)) < 11_000_000  # closed without the whole answer
    finally:
        stalled.close()


def test_serve_flags_are_the_server_limits() -> None:
    import dataclasses

    from rank_dataset.cli import serve_cmd
    from rank_dataset.server.limits import DEFAULT_LIMITS, ServerLimits

    options = {o.name: o for o in serve_cmd.params}
    for limit in dataclasses.fields(ServerLimits):
        option = options[limit.name]
        assert option.default == getattr(DEFAULT_LIMITS, limit.name), limit.name
        assert option.help == limit.metadata["help"]
    assert set(options) - {f.name for f in dataclasses.fields(ServerLimits)} == {
        "meta_files", "host", "port", "token", "workers", "columns"
    }  # fmt: skip


def test_serve_takes_the_old_limit_keywords_with_a_warning(write_meta) -> None:
    from rank_dataset.server.app import serve

    p = write_meta(n=10)
    # An invalid limit is refused before anything is served: the keyword reached ServerLimits.
    with pytest.warns(DeprecationWarning, match="limits=ServerLimits"), pytest.raises(ValueError, match="max_builds"):
        serve([p], max_builds=0)


CHANGED_LINES = [f"{i}.jpg {i}" for i in range(1000)]


def test_server_answers_409_when_its_file_changed_and_keeps_serving(write_meta, start_server) -> None:
    p = write_meta(CHANGED_LINES)
    server = start_server([p])
    assert requests.get(f"{server.url}/sample/3").text == "3.jpg 3"
    rewrite(p, CHANGED_LINES[: len(CHANGED_LINES) // 2])  # shorter: through a map, SIGBUS killed the server
    for method, path, kwargs in [
        ("GET", "/shard", {"params": {"world_size": 2, "rank": 1}}),
        ("POST", "/samples", {"data": np.array([999, 3], "<i8").tobytes()}),
        ("GET", "/sample/999", {}),
    ]:
        response = requests.request(method, f"{server.url}{path}", timeout=30, **kwargs)
        assert response.status_code == 409, response.text
        body = response.json()
        assert body["kind"] == "files" and str(p) in body["error"] and "restart the meta server" in body["error"]
    assert requests.get(f"{server.url}/healthz", timeout=30).status_code == 200
    assert server.proc.poll() is None


# --- Hostile input: descriptors, and a refused body still being sent --------------------------------


def test_half_sent_heads_past_the_descriptor_limit_lock_nobody_out(write_meta, start_server) -> None:
    # 1100 connections that each sent half a request head, to a server allowed 1024 descriptors: it
    # closes the ones waiting longest, so a real client is still served at once.
    meta = write_meta(n=100)
    server = start_server([meta], fd_limit=1024)
    socks = []
    try:
        for _ in range(1100):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /len HTTP/1.1\r\nHost: t\r\n")
            socks.append(sock)
        for i in range(5):  # served at once: the newest connections are still open after (below)
            assert requests.get(f"{server.url}/sample/{i}", timeout=5).text == MetaFile(meta)[i]
        # The server closed the oldest (at least those past 1024 less its reserve), well before its
        # 10 s request timeout; the newest are still open.
        closed = 0
        for sock in socks:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                try:
                    closed += sock.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
        assert 1100 - 1024 <= closed < 1100
        assert all(_is_open(sock) for sock in socks[-100:])
    finally:
        for sock in socks:
            sock.close()
    assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200


def _is_open(sock: socket.socket) -> bool:
    """Whether the server has not closed ``sock`` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False


def _send_all(sock: socket.socket, head: bytes, body: int, chunked: bool = False) -> None:
    """Send ``head`` and ``body`` bytes of body (chunked: in 64 KiB chunks, then the last chunk) the way a
    client that does not read before it has sent its request does; raises if the server resets."""
    sock.sendall(head)
    block = 64 << 10
    for _ in range(body // block):
        sock.sendall(b"10000\r\n" + bytes(block) + b"\r\n" if chunked else bytes(block))
    if chunked:
        sock.sendall(b"0\r\n\r\n")


@pytest.mark.parametrize("chunked", [False, True])
def test_refused_body_still_being_sent_gets_its_answer(write_meta, start_server, chunked) -> None:
    # 413 for an 8 MiB body on a 1 MiB limit: the client, still sending, gets the answer, not a reset.
    server = start_server([write_meta(n=10)], "--max-body-size", str(1 << 20))
    length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % (8 << 20)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            _send_all(sock, b"POST /samples HTTP/1.1\r\nHost: t\r\n" + length + b"\r\n\r\n", 8 << 20, chunked)
            answer = _answer(sock, 10)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert "bytes" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    response = requests.post(f"{server.url}/samples", data=bytes(8 << 20), timeout=10)
    assert response.status_code == 413 and "at most 1048576" in response.json()["error"]
    assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200


def test_unauthorised_body_still_being_sent_gets_its_answer(write_meta, start_server) -> None:
    server = start_server([write_meta(n=10)], "--token", "s3cret")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        _send_all(sock, b"POST /samples HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (8 << 20), 8 << 20)
        answer = _answer(sock, 10)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
