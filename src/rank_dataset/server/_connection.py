"""The meta server's connection guards: what uvicorn does not bound, bounded per connection.

uvicorn times a connection out only while it is idle after an answer (``timeout_keep_alive``), and a
next request's first byte disarms that; nor does it bound how long an answer waits for a client that
reads none of it. Each connection is wrapped in a :class:`_Guard`, an asyncio protocol around the one
uvicorn makes, installed by the event loop that ``serve`` names in uvicorn's ``loop`` setting
(:func:`new_event_loop`). The guard sees only asyncio's protocol and transport calls; the request's
boundaries come from the ASGI side (:class:`TrackRequests`, the app's outermost layer), which finds
its connection's guard by the scope's ``client`` (the peer's address). The guard enforces:

- request timeout: a connection delivers a whole request (head and body) within ``timeout_request``
  seconds of its start or of its previous answer, else it is closed (an app reading the body sees
  the client leave);
- send timeout: a connection whose client reads none of its answer for ``timeout_send`` seconds
  (the transport's buffer stays full) is aborted, which frees what the answer holds;
- descriptors: each process keeps its connections ``_RESERVED_FDS`` below its soft limit on open
  files (past it the server could accept nobody): a connection past that aborts the ones waiting
  longest for a request (its head or body, or idle after an answer), or itself if every other is busy;
- lingering close: when uvicorn closes a connection whose request has not all been read (a body
  refused with 413 or 401, a head with 400, a request turned away with 503), the answer is sent,
  the sending side shut down, and what the client still sends is read and discarded (up to
  ``_LINGER_BYTES`` and ``_LINGER_SECONDS``), so that the client reads the answer instead of a
  reset (nginx's ``lingering_close``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rank_dataset.server.limits import ServerLimits

__all__ = ["TrackRequests", "new_event_loop"]

# Descriptors a server process keeps free of connections: the meta files and index read by a build,
# shard segments in flight, the listening socket, the event loop's own, logs.
_RESERVED_FDS = 64
# A lingering close reads and discards at most this much, for at most this long.
_LINGER_BYTES = 32 << 20
_LINGER_SECONDS = 10.0

_log = logging.getLogger("uvicorn.error")


@functools.cache
def _connection_budget() -> int | None:
    """Connections this process may hold: its soft limit on open files less _RESERVED_FDS (None: no limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else max(1, soft - _RESERVED_FDS)


# A connection's phase: no request yet or its answer sent; a request's head in, not all its body; a
# whole request in, its answer not all sent.
_IDLE, _BODY, _BUSY = "idle", "body", "busy"

# This process's guarded connections, the longest waiting for a request first, and by peer address
# (one event loop runs them all).
_connections: dict[_Guard, None] = {}
_by_peer: dict[tuple[str, int], _Guard] = {}


def _peer(info: Any) -> tuple[str, int] | None:
    """A peer address as the ASGI scope's ``client`` gives it."""
    return (str(info[0]), int(info[1])) if isinstance(info, (list, tuple)) and len(info) >= 2 else None


class _Transport:
    """The transport as the HTTP protocol sees it: ``close()`` may become a lingering close."""

    def __init__(self, transport: asyncio.Transport, guard: _Guard) -> None:
        self._transport, self._guard = transport, guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if not self._guard.linger():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._guard.lingering or self._transport.is_closing()


class _Guard(asyncio.Protocol):
    """One connection: ``inner`` (uvicorn's HTTP protocol) under the guards of the module."""

    raw: asyncio.Transport
    peer: tuple[str, int] | None

    def __init__(self, inner: asyncio.Protocol, timeout_request: float, timeout_send: float) -> None:
        self.inner = inner
        self.timeout_request, self.timeout_send = timeout_request, timeout_send
        self.phase = _IDLE
        self.sent_since_answer = False  # bytes of a next request came in since the last answer
        self.lingering = False
        self._linger_left = _LINGER_BYTES
        self._timers: dict[str, asyncio.TimerHandle] = {}

    # asyncio's protocol calls, passed on to the HTTP protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = cast(asyncio.Transport, transport)
        self.peer = _peer(transport.get_extra_info("peername"))
        if self.peer is not None:
            _by_peer[self.peer] = self
        self.inner.connection_made(cast(asyncio.Transport, _Transport(self.raw, self)))
        self._wait_for_request()
        budget = _connection_budget()
        if budget is not None and len(_connections) > budget:
            self._shed(budget)

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            self.sent_since_answer = True
            self.inner.data_received(data)
            return
        self._linger_left -= len(data)  # discarded: the request was answered already
        if self._linger_left < 0:
            self.raw.close()

    def eof_received(self) -> bool | None:
        if self.lingering:
            self.raw.close()  # the client sent all it had: done
            return None
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()
        if "send" not in self._timers:
            self._after("send", self.timeout_send, self._send_timed_out)

    def resume_writing(self) -> None:
        self.inner.resume_writing()
        self._cancel("send")

    def connection_lost(self, exc: Exception | None) -> None:
        _connections.pop(self, None)
        if self.peer is not None and _by_peer.get(self.peer) is self:
            del _by_peer[self.peer]
        for name in list(self._timers):
            self._cancel(name)
        self.inner.connection_lost(exc)

    # a request's phases, told by TrackRequests

    def head_received(self) -> None:
        self.phase = _BODY

    def request_received(self) -> None:
        self.phase = _BUSY
        self._cancel("request")

    def answered(self) -> None:
        if not self.raw.is_closing() and not self.lingering:
            self._wait_for_request()

    def _wait_for_request(self) -> None:
        """From now, the next request has ``timeout_request`` seconds to arrive (unless the connection
        has no peer address, by which TrackRequests would tell when it has)."""
        self.phase, self.sent_since_answer = _IDLE, False
        self._cancel("request")
        if self.peer is not None:
            self._after("request", self.timeout_request, self._request_timed_out)
        _connections.pop(self, None)
        _connections[self] = None  # waiting since now

    # the guards

    def _request_timed_out(self) -> None:
        del self._timers["request"]
        if self.phase != _BUSY:
            _log.info("closing a connection that sent no whole request in %gs", self.timeout_request)
            self.raw.close()

    def _send_timed_out(self) -> None:
        del self._timers["send"]
        _log.info("closing a connection that read none of its answer in %gs", self.timeout_send)
        self.raw.abort()  # close() would wait for the buffer to drain, which it does not

    def _shed(self, budget: int) -> None:
        """Abort the connections waiting longest for a request until this process holds ``budget``."""
        excess = len(_connections) - budget
        victims = [g for g in _connections if g is not self and (g.lingering or g.phase != _BUSY)][:excess]
        if len(victims) < excess:  # every other connection is busy with a request: this one goes
            victims.append(self)
        _log.info("%d connections at the descriptor limit: closing %d waiting ones", budget, len(victims))
        for guard in victims:
            _connections.pop(guard, None)
            guard.raw.abort()  # at once: they owe a request and are owed nothing

    def linger(self) -> bool:
        """For the HTTP protocol's close(): if part of a request is still to come (a body, or the rest
        of a head), shut down the sending side (after the answer) and read and discard what the
        client still sends, for a while. False: close now."""
        owed = self.phase == _BODY or (self.phase == _IDLE and self.sent_since_answer)
        if self.lingering or not owed or self.raw.is_closing() or not self.raw.can_write_eof():
            return False
        self.lingering = True
        self.raw.write_eof()  # after the answer: the client reads it, then the end
        self.raw.resume_reading()  # the HTTP protocol pauses reading a body it has not asked for
        self._after("linger", _LINGER_SECONDS, self.raw.close)
        return True

    def _after(self, name: str, seconds: float, callback: Callable[[], None]) -> None:
        self._timers[name] = asyncio.get_running_loop().call_later(seconds, callback)

    def _cancel(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()


class TrackRequests:
    """ASGI middleware (outermost): tells each request's connection guard when its head is in, when
    its body is, and when its answer is sent. Outside a guarded server (a test client) it only
    passes requests on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = _by_peer.get(_peer(scope.get("client")) or ("", 0)) if scope["type"] == "http" else None
        if guard is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        guard.head_received()
        if int(headers.get(b"content-length", b"0") or 0) == 0 and b"transfer-encoding" not in headers:
            guard.request_received()  # no body (h11 has checked the header's digits)

        async def tracked_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                guard.request_received()
            return message

        async def tracked_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                guard.answered()

        await self.app(scope, tracked_receive, tracked_send)


class _GuardedServers:
    """Mixed into an event loop class: each server it creates wraps its connections in guards."""

    async def create_server(self, protocol_factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any) -> Any:
        limits = ServerLimits.from_env()
        timeouts = float(limits.timeout_request), float(limits.timeout_send)

        def guarded() -> asyncio.Protocol:
            return _Guard(protocol_factory(), *timeouts)

        return await super().create_server(guarded, *args, **kwargs)  # type: ignore[misc]


@functools.cache
def _loop_class() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is part of the server extra
        base: type[asyncio.AbstractEventLoop] = asyncio.SelectorEventLoop
    else:
        base = uvloop.Loop
    return type("GuardedLoop", (_GuardedServers, base), {})


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop (uvloop's if installed, as uvicorn's ``auto``, else asyncio's) whose servers guard
    their connections: uvicorn's ``loop`` setting in ``serve``. The timeouts are the
    :class:`ServerLimits` that ``serve`` set in the environment."""
    return _loop_class()()
