"""The bed's delay line (:mod:`multihost.delay`) on loopback: bytes pass unchanged, in order, both ways, and a
round trip through it takes at least twice its delay (a lower bound: a loaded machine only adds to it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from multihost import delay

DELAY_MS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP server on loopback that sends back what it gets, until the client half-closes; its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    server.close()


@pytest.fixture
def line(echo: int) -> Iterator[int]:
    """The delay line in front of the echo server; its port."""
    port = _free_port()
    args = [f"127.0.0.1:{port}", f"127.0.0.1:{echo}", str(DELAY_MS)]
    proc = subprocess.Popen([sys.executable, str(Path(delay.__file__)), *args], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
    yield port
    proc.kill()
    proc.wait()


def test_bytes_pass_unchanged_and_each_round_trip_gains_twice_the_delay(line: int) -> None:
    data = bytes(range(256)) * (3 << 12)  # 3 MiB, more than a chunk in flight
    with socket.create_connection(("127.0.0.1", line), timeout=30) as conn:
        for _ in range(3):
            start = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            assert time.monotonic() - start >= 2 * DELAY_MS / 1000
        sender = threading.Thread(target=lambda: (conn.sendall(data), conn.shutdown(socket.SHUT_WR)))
        sender.start()
        got = bytearray()
        while chunk := conn.recv(1 << 16):
            got += chunk
        sender.join()
    assert bytes(got) == data  # the half-close came through after the bytes, and back
