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

h11 is also the implementation that bounds a request's head (``h11_max_incomplete_event_size``,
answered 400); httptools reads headers of any size. uvicorn loads this class by name
(``http="rank_dataset._connection:TimeoutH11Protocol"``) in each worker process, which reads the
timeouts from the environment that ``serve`` set.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from rank_dataset._limits import ServerLimits

__all__ = ["TimeoutH11Protocol"]


@functools.cache
def _timeouts() -> tuple[float, float]:
    limits = ServerLimits.from_env()
    return float(limits.timeout_request), float(limits.timeout_send)


class TimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a request timeout and a send timeout (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_request, self.timeout_send = _timeouts()
        self._request_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_request_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_request_timer()  # the next request has timeout_request seconds to arrive

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._request_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._request_timer = self._send_timer = None
        super().connection_lost(exc)

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
            self.transport.close()

    def _send_timed_out(self) -> None:
        self._send_timer = None
        self.logger.info("closing a connection that read none of its answer in %gs", self.timeout_send)
        self.transport.abort()  # close() would wait for the buffer to drain, which it does not
