"""The fault-injecting proxy (tests/fault_proxy.py) in front of SeaweedFS, with obstore as the client:
with latency, the same bytes; with a 503 or a reset on every other GET, obstore's retries get the same
bytes; a body cut short is detected (obstore asks the rest again, from where it stopped, and when
every answer is cut it raises, never returning fewer bytes); the proxy counts what it did and stops
without a trace."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

import s3_helpers
from fault_proxy import FaultProxy, running_proxy

obstore = pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")

N, SIZE = 12, 100_000


@pytest.fixture(scope="module")
def objects(s3_server: Any) -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    data = {f"proxy/{i}.bin": rng.integers(0, 256, SIZE + i, dtype=np.uint8).tobytes() for i in range(N)}
    for name, value in data.items():
        s3_server.put(name, value)
    return data


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with running_proxy(("127.0.0.1", s3_server.port)) as running:
        yield running


def _store(endpoint: str) -> Any:
    """An obstore client of the bucket through ``endpoint``, retrying quickly (up to 5 times)."""
    from obstore.store import S3Store

    backoff = {"init_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=200), "base": 2}
    return S3Store(
        s3_helpers.BUCKET,
        endpoint=endpoint,
        access_key_id=s3_helpers.ACCESS_KEY,
        secret_access_key=s3_helpers.SECRET_KEY,
        region=s3_helpers.REGION,
        client_options={"allow_http": True},
        retry_config={"max_retries": 5, "retry_timeout": timedelta(seconds=60), "backoff": backoff},
    )


def _read_all(store: Any, names: list[str]) -> list[bytes]:
    async def together() -> list[bytes]:
        answers = await asyncio.gather(*[obstore.get_async(store, name) for name in names])
        return [bytes(await answer.bytes_async()) for answer in answers]

    return asyncio.run(together())


def test_latency_same_bytes_counted(objects: dict[str, bytes], proxy: FaultProxy) -> None:
    proxy.set(latency=0.05)
    store = _store(proxy.endpoint)
    t = time.perf_counter()
    got = _read_all(store, list(objects))
    elapsed = time.perf_counter() - t
    assert got == list(objects.values())
    assert elapsed >= 0.05  # every request waited its latency at least once
    stats = proxy.stats()
    assert stats["requests"] == stats["gets"] == N and stats["faults"] == {"503": 0, "reset": 0, "short": 0}
    body = sum(map(len, objects.values()))
    assert body < stats["bytes_down"] < body + N * 4096  # the bodies and their heads
    assert 0 < stats["bytes_up"] < N * 4096 and stats["cpu_s"] > 0 and stats["latency_ms"] == 50


@pytest.mark.parametrize("kind", ["503", "reset"])
def test_failed_requests_are_retried_to_the_same_bytes(objects: dict[str, bytes], proxy: FaultProxy, kind: str) -> None:
    proxy.set(every=2, faults=[kind])
    store = _store(proxy.endpoint)
    names = list(objects)
    # One at a time, so that the counter's turns are known: the 2nd GET fails, its retry (the 3rd)
    # is answered, the 4th fails, ...: every object but the first costs two GETs.
    assert [bytes(obstore.get(store, name).bytes()) for name in names] == list(objects.values())
    stats = proxy.stats()
    assert stats["gets"] == 2 * N - 1 and stats["faults"][kind] == N - 1
    assert sum(stats["faults"].values()) == N - 1


def test_a_short_body_is_resumed_or_an_error_never_fewer_bytes(objects: dict[str, bytes], proxy: FaultProxy) -> None:
    store = _store(proxy.endpoint)
    names = list(objects)
    proxy.set(every=2, faults=["short"])
    assert [bytes(obstore.get(store, name).bytes()) for name in names] == list(objects.values())
    stats = proxy.stats()
    assert stats["gets"] == 2 * N - 1 and stats["faults"]["short"] == N - 1
    # obstore asked only the rest of a cut body (a ranged GET from where it stopped), not the whole.
    body = sum(map(len, objects.values()))
    assert stats["bytes_down"] < body + N * 4096 + (N - 1) * 4096

    proxy.set(every=1)  # every answer cut: after its retries obstore raises, whichever way it is read
    value = objects[names[0]]
    reads = {
        "bytes": lambda: bytes(obstore.get(store, names[0]).bytes()),
        "range": lambda: bytes(obstore.get_range(store, names[0], start=1000, end=81000)),
        "stream": lambda: b"".join(bytes(c) for c in obstore.get(store, names[0]).stream()),
    }
    for how, read in reads.items():
        with pytest.raises(obstore.exceptions.GenericError, match="IncompleteBody"):
            got = read()
            pytest.fail(f"{how}: {len(got)} of {len(value)} bytes returned from bodies all cut short")
    stats = proxy.stats()
    assert stats["gets"] == stats["faults"]["short"] == 3 * 6  # the first ask and 5 retries, each read


def test_bad_settings_are_refused(proxy: FaultProxy) -> None:
    with pytest.raises(urllib.error.HTTPError, match="400"):
        proxy.set(faults=["slow"])
    assert proxy.stats()["every"] == 0


def test_stops_without_a_trace(s3_server: Any) -> None:
    with running_proxy(("127.0.0.1", s3_server.port), latency=0.01) as running:
        port, proc = running.port, running.proc
        assert running.stats()["requests"] == 0
    assert proc.returncode == 0  # it ended when its stdin closed, not killed
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))


def _answer(stream: Any) -> bytes:
    """One response's status line, read whole (head and Content-Length body) from a socket's file."""
    status = stream.readline()
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    stream.read(length)
    return bytes(status)


def test_request_bodies_chunked_or_after_100_continue(proxy: FaultProxy) -> None:
    """A body sent after ``Expect: 100-continue`` (botocore's PUTs) or in chunks reaches the target whole:
    the target's answer (SeaweedFS refuses the unsigned PUT: 403) comes back, nothing hangs."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock, sock.makefile("rb") as stream:
        sock.sendall(b"PUT /meta/x.bin HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert _answer(stream) == b"HTTP/1.1 100 Continue\r\n"
        sock.sendall(b"hello")
        assert _answer(stream).startswith(b"HTTP/1.1 403 ")
        sock.sendall(b"PUT /meta/y.bin HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.sendall(b"5\r\nhello\r\n0\r\n\r\n")
        assert _answer(stream).startswith(b"HTTP/1.1 403 ")
    stats = proxy.stats()
    assert stats["requests"] == 2 and stats["gets"] == 0
