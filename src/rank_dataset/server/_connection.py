"""The meta server's connections: uvicorn's h11 protocol with the two timeouts uvicorn lacks. No torch.

uvicorn times out a connection only while it is idle after an answer (``timeout_keep_alive``), and
the first byte of a next request disarms that. Nothing bounds how long a request may take to arrive,
so a client that opens connections and sends nothing, or half a request, or a byte now and then,
holds them open for ever (uvicorn issue #157). Nor does anything bound how long an answer may wait
for a client that stops reading it. This subclass adds both:

- request timeout: a connection must deliver a whole request (head and body) within
  ``timeout_request`` seconds of its start or of its previous answer, else it is closed;
- send timeout: a connection whose client reads none of the answer for ``timeout_send`` seconds
  (the transport's buffer stays full) is closed, which frees what the answer holds.

Two more guards, against what a hostile client can still do within those timeouts:

- descriptors: past the process's limit on open files the server cannot accept a connection at all,
  and a real client is turned away (libuv accepts and drops it). So each server process keeps its
  connections ``_RESERVED_FDS`` below its soft limit: when a new connection would pass that, the
  oldest connections that are waiting for a request (its head or its body, or idle after an answer)
  are closed first. Thousands of half-sent requests then cost only themselves.
- lingering close: an answer that refuses a request whose body has not all arrived (413, 401) ends
  the connection, and closing a socket with unread data makes the kernel reset it, so a client
  still sending its body gets a reset instead of the answer. Instead, the answer is sent, the
  sending side shut down, and what the client still sends is read and discarded, up to
  ``_LINGER_BYTES`` and ``_LINGER_SECONDS``, before the connection is closed (as nginx's
  ``lingering_close`` does).

h11 is also the implementation that bounds a request's head (``h11_max_incomplete_event_size``,
answered 400); httptools reads headers of any size. uvicorn loads this class by name
(``http="rank_dataset.server._connection:TimeoutH11Protocol"``) in each worker process, which reads the
timeouts from the environment that ``serve`` set.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

from uvicorn.protocols.http.h11_impl import H11Protocol

from rank_dataset.server.limits import ServerLimits

__all__ = ["TimeoutH11Protocol"]

# Descriptors a server process keeps free of connections: the meta files and index read by a build,
# shard segments in flight, the listening socket, the event loop's own, logs.
_RESERVED_FDS = 64
# A lingering close reads and discards at most this much, for at most this long.
_LINGER_BYTES = 32 << 20
_LINGER_SECONDS = 10.0


@functools.cache
def _timeouts() -> tuple[float, float]:
    limits = ServerLimits.from_env()
    return float(limits.timeout_request), float(limits.timeout_send)


@functools.cache
def _connection_budget() -> int | None:
    """Connections this process may hold: its soft limit on open files, less _RESERVED_FDS (None: no limit)."""
    if resource is None:  # pragma: no cover - not on Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else max(1, soft - _RESERVED_FDS)


# This process's connections, the longest waiting for a request first (one event loop runs them all).
_waiting_order: dict[TimeoutH11Protocol, None] = {}


class _LingeringTransport:
    """The transport as uvicorn sees it: ``close()`` may become a lingering close (see the module)."""

    def __init__(self, transport: asyncio.Transport, protocol: TimeoutH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if not self._protocol._linger():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol._lingering or self._transport.is_closing()


class TimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a request timeout, a send timeout, descriptor shedding and
    lingering close (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_request, self.timeout_send = _timeouts()
        self._request_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._raw: asyncio.Transport | None = None
        self._lingering = False
        self._linger_left = 0
        self._linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no asyncio subclass)
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._arm_request_timer()
        _waiting_order[self] = None
        budget = _connection_budget()
        if budget is not None and len(_waiting_order) > budget:
            self._shed(budget)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_request_timer()  # the next request has timeout_request seconds to arrive
            _waiting_order.pop(self, None)
            _waiting_order[self] = None  # waiting again, since now

    def connection_lost(self, exc: Exception | None) -> None:
        _waiting_order.pop(self, None)
        for timer in (self._request_timer, self._send_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._request_timer = self._send_timer = self._linger_timer = None
        super().connection_lost(exc)

    # -- descriptors ------------------------------------------------------------------------------

    def _waiting_for_request(self) -> bool:
        """True while the client owes a request (its head or body), or after an answer, idle."""
        cycle = self.cycle
        return self._lingering or cycle is None or cycle.response_complete or cycle.more_body

    def _shed(self, budget: int) -> None:
        """Close the connections waiting longest for a request until this process holds ``budget``."""
        excess = len(_waiting_order) - budget
        victims = [p for p in _waiting_order if p is not self and p._waiting_for_request()][:excess]
        if len(victims) < excess:  # every other connection is busy with a request: this one goes
            victims.append(self)
        self.logger.info("%d connections at the descriptor limit: closing %d waiting ones", budget, len(victims))
        for protocol in victims:
            _waiting_order.pop(protocol, None)
            assert protocol._raw is not None
            protocol._raw.abort()  # at once: they owe a request and are owed nothing

    # -- lingering close --------------------------------------------------------------------------

    def _linger(self) -> bool:
        """Called for uvicorn's close(): if the request's body has not all arrived, shut down the
        sending side (after the answer) and read and discard the rest for a while. False: close now."""
        cycle, raw = self.cycle, self._raw
        if self._lingering or raw is None or raw.is_closing() or cycle is None or not cycle.more_body:
            return False
        if not raw.can_write_eof():  # pragma: no cover - TCP transports can
            return False
        self._lingering = True
        self._linger_left = _LINGER_BYTES
        raw.write_eof()  # after the answer: the client reads it, then the end
        raw.resume_reading()  # uvicorn pauses reading a body it has not asked for yet
        self._linger_timer = self.loop.call_later(_LINGER_SECONDS, raw.close)
        return True

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # discarded: the request was answered already
            self._linger_left -= len(data)
            if self._linger_left < 0 and self._raw is not None:
                self._raw.close()
            return
        super().data_received(data)

    def eof_received(self) -> None:
        if self._lingering and self._raw is not None:
            self._raw.close()  # the client sent all it had: done
            return
        super().eof_received()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.timeout_send, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _arm_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
        self._request_timer = self.loop.call_later(self.timeout_request, self._request_timed_out)

    def _request_timed_out(self) -> None:
        self._request_timer = None
        cycle = self.cycle
        waiting_for_head = cycle is None or cycle.response_complete
        if waiting_for_head or cycle.more_body:
            # The app, if it was reading the body, sees the client disconnect.
            self.logger.info("closing a connection that sent no whole request in %gs", self.timeout_request)
            assert self._raw is not None
            self._raw.close()

    def _send_timed_out(self) -> None:
        self._send_timer = None
        self.logger.info("closing a connection that read none of its answer in %gs", self.timeout_send)
        assert self._raw is not None
        self._raw.abort()  # close() would wait for the buffer to drain, which it does not
