"""The client side of the meta server's HTTP: :class:`MetaServer` asks a server (with retries on 5xx,
503 with Retry-After, and broken connections) and decodes its frames; the datasets that use it are in
:mod:`rank_dataset.training.server_datasets`.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import random
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

import numpy as np
import urllib3
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_before_delay,
    wait_exponential,
)

from rank_dataset.core.checks import check_int
from rank_dataset.core.shard import Shard
from rank_dataset.server import protocol
from rank_dataset.server.protocol import ProtocolError

__all__ = ["SAMPLES_PER_REQUEST", "MetaServer", "served_file", "server_url"]


T = TypeVar("T")


class _Retryable(Exception):
    """A failure worth another try: the server answered 5xx, or sent an incomplete frame."""


class _Busy(_Retryable):
    """The server answered 503: it is at a limit, and may say in how many seconds to come back."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delay-seconds or an HTTP date; None if absent or malformed."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


SAMPLES_PER_REQUEST = 1 << 17  # 1 MiB of indices: within a server's default body limit

_backoff = wait_exponential(multiplier=0.05, max=2.0)


def _wait(state: RetryCallState) -> float:
    """Exponential backoff, but never sooner than a busy server's Retry-After (plus a little jitter,
    so that the clients it turned away do not all come back at once)."""
    seconds = float(_backoff(state))
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, _Busy) and error.retry_after is not None:
        seconds = max(seconds, error.retry_after) + random.uniform(0, 0.1)
    return seconds


class MetaServer:
    """HTTP access to a meta server: a keep-alive pool per process, retries with backoff.

    Args:
        url: the server's base URL, e.g. ``http://10.0.0.1:28889``.
        token: the server's token, if it has one.
        timeout: seconds for one request, and for all the retries of one call together.
        retries: further attempts after a connection error, a timeout or a 5xx answer; a 503 (the
            server at one of its limits) is retried, after its Retry-After, until ``timeout`` without
            using these up. Other 4xx answers are never retried.

    Once :meth:`num_samples` has been called, every request carries the fingerprint of the files
    the server held then, and a server on other files answers 409 (a ValueError here).
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0, retries: int = 5) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = float(timeout)
        self.retries = check_int("retries", retries, low=0)
        self.fingerprint: str | None = None
        self._pool: urllib3.PoolManager | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        # A pool's sockets belong to the process that opened them.
        return {**self.__dict__, "_pool": None, "_pid": -1}

    def _get_pool(self) -> urllib3.PoolManager:
        if self._pool is None or self._pid != os.getpid():
            # A new pool in each process: a forked DataLoader worker must not share sockets.
            self._pool = urllib3.PoolManager(retries=False, timeout=self.timeout)
            self._pid = os.getpid()
        return self._pool

    def _call(
        self, method: str, path: str, parse: Callable[[bytes], T], read: Callable[[Any], T] | None = None, **kwargs: Any
    ) -> T:
        """One call, retried on connection errors, timeouts, 5xx and incomplete frames; 4xx raise at once.
        A success's body goes to ``parse``, or, with ``read``, the response itself, to read as it comes.

        A 503 (a server at one of its limits) is retried no sooner than its Retry-After says and
        does not use up ``retries``; every retry ends when the next would start past ``timeout``.
        """
        url = f"{self.url}{path}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.fingerprint:
            headers[protocol.FINGERPRINT_HEADER] = self.fingerprint
        failures = 0
        out_of_time = stop_before_delay(self.timeout)

        def stop(state: RetryCallState) -> bool:
            nonlocal failures
            error = state.outcome.exception() if state.outcome is not None else None
            failures += not isinstance(error, _Busy)
            return failures > self.retries or out_of_time(state)

        retrying = Retrying(
            stop=stop,
            wait=_wait,
            retry=retry_if_exception_type((urllib3.exceptions.HTTPError, _Retryable)),
        )
        try:
            for attempt in retrying:
                with attempt:
                    response = self._get_pool().request(
                        method, url, headers=headers, preload_content=read is None, **kwargs
                    )
                    if response.status == 503:
                        retry_after = _retry_after(response.headers.get("Retry-After"))
                        raise _Busy(f"HTTP 503: {response.data[:200]!r}", retry_after)
                    if response.status >= 500:
                        raise _Retryable(f"HTTP {response.status}: {response.data[:200]!r}")
                    if response.status >= 400:
                        protocol.raise_for_error(url, response.status, response.data)
                    if read is None:
                        return parse(response.data)
                    try:
                        got = read(response)
                    except BaseException:
                        response.close()  # a body cut short or refused: its connection is not reused
                        raise
                    response.release_conn()  # read to its end: the connection is reused
                    return got
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            attempts = exc.last_attempt.attempt_number
            what = "was still busy with" if isinstance(cause, _Busy) else "did not answer"
            raise ConnectionError(
                f"meta server at {self.url} {what} {method} {path} after {attempts} attempts "
                f"within {self.timeout:g}s: {cause}"
            ) from cause
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, path: str) -> bytes:
        """The body of the answer to ``GET path``, with retries."""
        return self._call("GET", path, lambda body: body)

    def shard(
        self,
        path: str,
        planned: np.ndarray[Any, np.dtype[np.int64]] | Callable[[], np.ndarray[Any, np.dtype[np.int64]]] | None = None,
        **kwargs: Any,
    ) -> Shard:
        """The shard framed in the answer to ``path`` (POST when ``body`` is given, else GET); with
        ``planned`` (the sample numbers, or a function giving them, called once the frame is in),
        checked to hold those samples and kept in a shareable segment without them (see
        :func:`~rank_dataset.server.protocol.receive_frame`)."""

        def framed(read: Callable[[], Shard], socket_errors: tuple[type[Exception], ...] = ()) -> Shard:
            try:
                return read()
            except protocol.FrameError as exc:  # cut short, e.g. by a server that died mid-answer
                raise _Retryable(str(exc)) from exc
            except ProtocolError as exc:  # not a frame, or not of the plan: different versions?
                raise ProtocolError(f"{self.url}{path}: {exc}") from None  # (a ConnectionError: before OSError)
            except socket_errors as exc:  # the socket's own errors (urllib3 wraps its own)
                raise _Retryable(f"the frame could not be read: {exc!r}") from exc

        def decode(body: bytes) -> Shard:  # no plan: the frame as it came, with its sample numbers
            return framed(lambda: protocol.decode_frame(body))

        def receive(response: Any) -> Shard:  # a plan: read into the shareable segment as it comes
            assert planned is not None
            declared = response.headers.get("content-length")
            length = int(declared) if declared is not None and declared.isdigit() else None
            read = _read_into(response)
            return framed(lambda: protocol.receive_frame(read, planned, length), (OSError, http.client.HTTPException))

        method = "POST" if "body" in kwargs else "GET"
        return self._call(method, path, decode, None if planned is None else receive, **kwargs)

    def samples(self, wanted: np.ndarray[Any, np.dtype[np.int64]]) -> Shard:
        """The samples ``wanted`` (little-endian int64 sample numbers) in one ``POST /samples``, checked to be
        those."""
        shard = self.shard(protocol.SAMPLES, body=wanted.tobytes())
        if shard.ids is None or not np.array_equal(shard.ids, wanted):
            raise ProtocolError(f"{self.url} answered other samples than the {wanted.size} asked for")
        return shard

    def num_samples(self) -> tuple[int, str | None]:
        """The number of samples the server serves, and the fingerprint of its files (which later
        requests then carry)."""
        body = self.get(protocol.LEN)
        try:
            info = json.loads(body)
            num_samples, fingerprint = int(info["num_samples"]), info.get("fingerprint")
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"{self.url}{protocol.LEN} did not answer as a meta server does: {exc}") from None
        if self.fingerprint is None:
            self.fingerprint = fingerprint
        return num_samples, fingerprint

    def files(self) -> list[protocol.ServedFile]:
        """The files the server serves, by name, with their sample counts and fingerprints."""
        return protocol.files_from_body(self.get(protocol.FILES))


def _read_into(response: Any) -> Callable[[memoryview], int]:
    """A ``readinto`` of ``response``'s body that reads into the buffer given: the http.client response
    under urllib3's, which reads the socket into the buffer (urllib3's reads a bytes object and copies
    it), where urllib3 has nothing to undo (no content encoding) and keeps one; else urllib3's own."""
    raw = getattr(response, "_fp", None)
    if isinstance(raw, http.client.HTTPResponse) and not response.headers.get("content-encoding"):
        return cast(Callable[[memoryview], int], raw.readinto)
    return cast(Callable[[memoryview], int], response.readinto)


def server_url(
    first: str | os.PathLike[str], server_ip: str | None, server_port: int | str | None
) -> tuple[str, str | None]:
    """The server's URL and, in the original project's form ``(meta_file, server_ip=, server_port=)``,
    the name of the file the caller expects it to serve (else None: ``first`` is the URL).

    Raises:
        ValueError: one of server_ip and server_port without the other, a port that is not an
            integer in [1, 65535], a URL given together with them, or a URL that is not one.
    """
    if server_ip is None and server_port is None:
        if not isinstance(first, str):
            raise TypeError(f"url must be a str such as 'http://127.0.0.1:28889', got {type(first).__name__}")
        return first, None
    if server_ip is None or server_port is None:
        missing = "server_ip" if server_ip is None else "server_port"
        raise ValueError(
            f"give both server_ip and server_port (the original keywords), or a URL alone; {missing} is missing"
        )
    if isinstance(first, str) and first.startswith(("http://", "https://")):
        raise ValueError(f"give either a URL ({first!r}) or a meta file name with server_ip and server_port, not both")
    if not isinstance(server_ip, str) or not server_ip.strip():
        raise ValueError(f"server_ip must be a host name or address such as '10.0.0.1', got {server_ip!r}")
    text = str(server_port).strip() if isinstance(server_port, (int, str)) and not isinstance(server_port, bool) else ""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(
            f"server_port must be an integer in [1, 65535] (an int or a str of digits), got {server_port!r}"
        )
    host = f"[{server_ip}]" if ":" in server_ip and not server_ip.startswith("[") else server_ip  # IPv6
    return f"http://{host}:{int(text)}", os.path.basename(os.fspath(first))


def served_file(server: MetaServer, name: str) -> tuple[list[protocol.ServedFile], protocol.ServedFile]:
    """The server's files and the one called ``name``.

    Raises:
        ValueError: the server serves no file of that name (the message lists the ones it serves).
    """
    served = server.files()
    for f in served:
        if f.name == name:
            return served, f
    raise ValueError(
        f"{server.url} serves no file named {name!r} (it serves {', '.join(f.name for f in served)}): "
        "meta_file must name a file the server was started on (its file name is compared)"
    )
