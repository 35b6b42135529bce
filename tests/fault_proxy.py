"""A fault-injecting HTTP/1.1 proxy on loopback, for the tests and the benchmarks: in front of a real
server (SeaweedFS's S3 port), it adds a fixed latency to every request, and, of every ``every`` GETs,
fails one, in turn of ``faults``: a 503, a connection reset, or a body cut short (half of it sent,
then the connection closed). It counts the requests, the GETs, the faults and the bytes each way,
and reports its own CPU time.

It runs in a process of its own (``python fault_proxy.py``, started by :class:`FaultProxy`), so that
its CPU time is its own and it takes no GIL from the process under test. It is an asyncio server:
a request waiting its latency costs a timer, not a thread, so hundreds may wait together. Each
client connection has one upstream connection, kept alive as the client keeps its own. It stops when
its stdin closes (the parent closed it, or died), so that nothing outlives the test.

Control, on the same port (never forwarded, never counted): ``GET /__fault_proxy__/stats`` (JSON),
``GET /__fault_proxy__/set?latency_ms=10&every=5&faults=503,reset,short&reset=1`` (``reset=1``
zeroes the counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

KINDS = ("503", "reset", "short")
CONTROL = "/__fault_proxy__/"
_PIECE = 1 << 18  # bytes relayed at a time
_NO_BODY = (204, 304)


class _State:
    def __init__(self, target: tuple[str, int], latency: float, every: int, faults: Sequence[str]) -> None:
        self.target = target
        self.set(latency, every, faults)
        self.zero()

    def set(self, latency: float, every: int, faults: Sequence[str]) -> None:
        if latency < 0 or every < 0 or not faults or any(kind not in KINDS for kind in faults):
            raise ValueError(f"latency >= 0, every >= 0 and faults among {KINDS}, got {latency}, {every}, {faults}")
        self.latency, self.every, self.faults = latency, every, tuple(faults)

    def zero(self) -> None:
        self.requests = self.gets = self.bytes_up = self.bytes_down = self.connections = 0
        self.counts = dict.fromkeys(KINDS, 0)
        self.cpu0 = time.process_time()

    def fault(self) -> str | None:
        """The fault of the GET arriving now (the counter's turn), or None."""
        n = self.gets
        self.gets += 1
        if self.every and n % self.every == self.every - 1:
            return self.faults[(n // self.every) % len(self.faults)]
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "gets": self.gets,
            "faults": dict(self.counts),
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "connections": self.connections,
            "cpu_s": time.process_time() - self.cpu0,
            "latency_ms": self.latency * 1000,
            "every": self.every,
        }


async def _head(reader: asyncio.StreamReader) -> bytes | None:
    """A message's head (through the blank line), or None at a clean end of the stream."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    first, *rest = head.decode("latin-1").split("\r\n")
    fields: dict[str, str] = {}
    for line in rest:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return first, fields


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """A chunked body's pieces as they are on the wire (size lines, data, trailers)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        n = int(line.split(b";", 1)[0], 16)
        if n:
            yield line + await reader.readexactly(n + 2)
            continue
        tail = line
        while True:  # trailers, then the blank line
            data = await reader.readuntil(b"\r\n")
            tail += data
            if data == b"\r\n":
                yield tail
                return


async def _chunked(state: _State, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
    """Relay a chunked body as it is, counted before it is sent."""
    async for piece in _chunks(reader):
        state.bytes_down += len(piece)
        out.write(piece)
        await out.drain()


async def _relay(state: _State, reader: asyncio.StreamReader, out: asyncio.StreamWriter, count: int) -> None:
    """Relay ``count`` bytes (-1: until the end of the stream), each piece counted before it is sent
    (the counts never lag what a client has received)."""
    done = 0
    while count < 0 or done < count:
        data = await reader.read(_PIECE if count < 0 else min(_PIECE, count - done))
        if not data:
            if count < 0:
                break
            raise asyncio.IncompleteReadError(b"", count - done)
        state.bytes_down += len(data)
        done += len(data)
        out.write(data)
        await out.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Upstream:
    """A client connection's connection to the target, opened when first needed."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = False  # a request went over it (then its close may be a kept-alive one's end)

    async def ask(self, request: bytes) -> tuple[bytes, asyncio.StreamReader]:
        """Send ``request``; the answer's head and the reader of its body. A kept-alive connection
        closed by the target between requests is opened again once."""
        for attempt in (0, 1):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(*self.target, limit=1 << 20)
                self.used = False
            assert self.reader is not None
            reused = self.used
            self.used = True
            try:
                self.writer.write(request)
                await self.writer.drain()
                head = await _head(self.reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                head = None
            if head is not None:
                return head, self.reader
            self.close()
            if not reused or attempt:
                raise ConnectionError(f"the target {self.target} closed the connection")
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _control(state: _State, target: str, writer: asyncio.StreamWriter) -> None:
    where = urlsplit(target)
    ask = {k: v[-1] for k, v in parse_qs(where.query).items()}
    status = "200 OK"
    try:
        if where.path.endswith("/set"):
            state.set(
                float(ask.get("latency_ms", state.latency * 1000)) / 1000,
                int(ask.get("every", state.every)),
                ask["faults"].split(",") if "faults" in ask else state.faults,
            )
            if ask.get("reset") == "1":
                state.zero()
        body = json.dumps(state.stats()).encode()
    except (ValueError, KeyError) as exc:
        status, body = "400 Bad Request", str(exc).encode()
    writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()


async def _serve(state: _State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    state.connections += 1
    upstream = _Upstream(state.target)
    try:
        while True:
            head = await _head(reader)
            if head is None:
                return
            first, fields = _headers(head)
            method, target = first.split(" ", 2)[:2]
            if fields.get("expect", "").lower() == "100-continue":
                # Answered here, and not asked of the target: the body is read whole before it is sent.
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                head = b"".join(line for line in head.splitlines(True) if not line.lower().startswith(b"expect:"))
            body = b""
            if "content-length" in fields:
                body = await reader.readexactly(int(fields["content-length"]))
            elif fields.get("transfer-encoding", "").lower() == "chunked":
                body = b"".join([piece async for piece in _chunks(reader)])
            if target.startswith(CONTROL):
                await _control(state, target, writer)
                continue
            state.requests += 1
            state.bytes_up += len(head) + len(body)
            kind = state.fault() if method == "GET" else None
            if state.latency:
                await asyncio.sleep(state.latency)
            if kind == "503":
                state.counts["503"] += 1
                answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
                state.bytes_down += len(answer)
                writer.write(answer)
                await writer.drain()
                continue
            if kind == "reset":
                state.counts["reset"] += 1
                _abort(writer)
                return
            answer, body_reader = await upstream.ask(head + body)
            status_line, got = _headers(answer)
            status = int(status_line.split(" ", 2)[1])
            length = int(got["content-length"]) if "content-length" in got else None
            if method == "HEAD" or status in _NO_BODY or 100 <= status < 200:
                length = 0
            state.bytes_down += len(answer)
            writer.write(answer)
            if kind == "short" and length is not None and length > 1:
                state.counts["short"] += 1
                await _relay(state, body_reader, writer, length // 2)
                upstream.close()  # the rest of the body is never read
                writer.close()  # a clean close (FIN) before the Content-Length is met
                return
            if length is not None:
                await _relay(state, body_reader, writer, length)
            elif got.get("transfer-encoding", "").lower() == "chunked":
                await _chunked(state, body_reader, writer)
            else:  # the body runs to the end of the connection
                await _relay(state, body_reader, writer, -1)
                return
            if got.get("connection", "").lower() == "close":
                upstream.close()
            if fields.get("connection", "").lower() == "close":
                return
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        _abort(writer)  # a broken exchange ends the client's connection, as a broken server would
    finally:
        upstream.close()
        if not writer.is_closing():
            writer.close()


async def _main(state: _State) -> None:
    server = await asyncio.start_server(lambda r, w: _serve(state, r, w), "127.0.0.1", 0, limit=1 << 20, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    # Stop when stdin closes: the parent closed it, or died.
    def watch() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=watch, daemon=True).start()
    async with server:
        await done


class FaultProxy:
    """The proxy in a process of its own, in front of ``target`` (host, port): ``latency`` seconds
    added to each request; of every ``every`` GETs (0: none), one fails, in turn of ``faults``."""

    def __init__(
        self, target: tuple[str, int], latency: float = 0.0, every: int = 0, faults: Sequence[str] = KINDS
    ) -> None:
        args = [sys.executable, os.path.abspath(__file__), f"{target[0]}:{target[1]}", str(latency), str(every)]
        self.proc = subprocess.Popen(
            [*args, ",".join(faults)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"the fault proxy did not start: {line!r} {err}")
        self.port = int(line.split()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ask(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}{CONTROL}{path}", timeout=30) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """Counts since the start or the last reset: requests, gets, faults (by kind), bytes_up,
        bytes_down, connections, and the proxy process's CPU seconds (cpu_s)."""
        return self._ask("stats")

    def set(
        self,
        latency: float | None = None,
        every: int | None = None,
        faults: Sequence[str] | None = None,
        reset: bool = True,
    ) -> dict[str, Any]:
        """Change the settings given (and zero the counts, with ``reset``); the stats before the zeroing
        are not kept."""
        ask = []
        if latency is not None:
            ask.append(f"latency_ms={latency * 1000}")
        if every is not None:
            ask.append(f"every={every}")
        if faults is not None:
            ask.append(f"faults={','.join(faults)}")
        if reset:
            ask.append("reset=1")
        return self._ask("set?" + "&".join(ask))

    def close(self) -> None:
        """Stop the process (its stdin closed; killed if it does not end within 10 s)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextlib.contextmanager
def running_proxy(
    target: tuple[str, int], latency: float = 0.0, every: int = 0, faults: Sequence[str] = KINDS
) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` for the block, stopped on exit."""
    proxy = FaultProxy(target, latency, every, faults)
    try:
        yield proxy
    finally:
        proxy.close()


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    latency, every, faults = float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    asyncio.run(_main(_State((host, int(port)), latency, every, faults)))
