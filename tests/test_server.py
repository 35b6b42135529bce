"""The meta server, over HTTP, as a real process on a loopback port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from rank_dataset import MetaFile, protocol
from rank_dataset.plan import ShardSpec
from tests_helpers import free_port


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


def test_several_workers(write_meta, start_server) -> None:
    meta = write_meta(n=100)
    server = start_server([meta], "--workers", "2")
    for i in range(20):
        assert requests.get(f"{server.url}/sample/{i}").text == MetaFile(meta)[i]
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
        for _ in range(200):
            try:
                if requests.get(f"http://127.0.0.1:{port}/sample/3", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        assert requests.get(f"http://127.0.0.1:{port}/sample/3").text == MetaFile(meta)[3]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
