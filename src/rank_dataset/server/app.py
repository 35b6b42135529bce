"""The meta server: a Starlette application, served by uvicorn, holding the meta files and answering
samples and whole rank shards (the endpoints, wire format and error bodies are
:mod:`rank_dataset.server.protocol`'s). It is stateless: every request carries all it needs (seed,
epoch, world size, mini-epoch, rank, eval or train), so any number of jobs, epochs and server replicas
can share files and processes.

Every path but ``/healthz`` needs ``Authorization: Bearer TOKEN`` when the server has a token. The
limits on what one client can cost are :class:`~rank_dataset.server.limits.ServerLimits` (see
:func:`serve`); concurrent ``/shard`` requests of one plan share their reads
(:mod:`rank_dataset.server._passes`).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import signal
import socket
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rank_dataset.files.read.metafile import MetaFile, MetaFileChangedError
from rank_dataset.server import protocol
from rank_dataset.server._connection import TrackRequests
from rank_dataset.server._frames import FrameResponse
from rank_dataset.server._passes import BuildSlots, Busy, SharedPasses
from rank_dataset.server.limits import DEFAULT_LIMITS, LIMITS_ENV, ServerLimits
from rank_dataset.server.protocol import DEFAULT_PORT, FINGERPRINT_HEADER, TOKEN_ENV

__all__ = ["LIMITS_ENV", "create_app", "serve"]

_PATHS_ENV = "RANK_DATASET_SERVE_PATHS"
_COLUMNS_ENV = "RANK_DATASET_SERVE_COLUMNS"
_MAX_BATCH = 1 << 22  # indices in one /samples request


def _error(
    status: int, message: str, kind: str = "request", *, close: bool = False, headers: dict[str, str] | None = None
) -> JSONResponse:
    headers = {**(headers or {}), **({"Connection": "close"} if close else {})}
    return JSONResponse(protocol.error_body(message, kind), status_code=status, headers=headers)


_BUILD_WAIT = 1.0  # seconds a build request waits for a free slot before it is answered 503
_RETRY_AFTER = 1  # seconds, in that 503's Retry-After header


class _Admission:
    """ASGI middleware: what a request passes before the app runs, in order.

    - Token (with ``token``): every path but /healthz needs ``Authorization: Bearer <token>`` (401,
      and the connection closed, so that the server never reads a body it did not want).
    - Pinning: a request pinned to other files (``FINGERPRINT_HEADER``) is answered 409.
    - Body: at most ``max_body`` bytes, read whole before the app (and a build slot) is involved, so
      that a slow upload holds nothing but its connection, which the request timeout closes. A
      declared Content-Length over the limit is answered 413 before any byte of the body is read; a
      body without one (chunked) is counted as it streams and answered 413 once over the limit; both
      close the connection. A client gone mid-body gets no answer.
    """

    def __init__(self, app: ASGIApp, token: str | None, fingerprint: str, max_body: int) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.fingerprint = fingerprint.encode()
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        if self.expected and scope["path"] != protocol.HEALTHZ and not hmac.compare_digest(given, self.expected):
            refusal = "missing or wrong token: send 'Authorization: Bearer <token>'"
            await _error(401, refusal, "auth", close=True)(scope, receive, send)
            return
        pinned = headers.get(FINGERPRINT_HEADER.lower().encode())
        if pinned is not None and not hmac.compare_digest(pinned, self.fingerprint):
            refusal = (
                f"the request is for files with fingerprint {pinned.decode(errors='replace')!r}, "
                f"this server's files have {self.fingerprint.decode()!r}: it was restarted on other files"
            )
            await _error(409, refusal, "files")(scope, receive, send)
            return
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_body:
            refusal = f"a request body of {declared.decode(errors='replace')} bytes; at most {self.max_body}"
            await _error(413, refusal, close=True)(scope, receive, send)
            return
        if int(declared) == 0 and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left, or the request timeout closed the connection
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                refusal = f"a request body of more than {self.max_body} bytes"
                await _error(413, refusal, close=True)(scope, receive, send)
                return
            more = message.get("more_body", False)
        first: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        del chunks

        async def replay() -> Message:
            nonlocal first
            if first is None:
                return await receive()  # what follows the body: a disconnect
            message, first = first, None
            return message

        await self.app(scope, replay, send)


def _busy() -> JSONResponse:
    message = f"the server is building as many shards as it may at once; retry in {_RETRY_AFTER}s"
    return _error(503, message, "busy", headers={"Retry-After": str(_RETRY_AFTER)})


class _AsgiRoute:
    """A route's endpoint that is an ASGI app (Starlette calls a function with a Request and sends
    what it returns), so that it can act once its answer is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def create_app(
    meta: MetaFile,
    *,
    token: str | None = None,
    max_body_size: int = DEFAULT_LIMITS.max_body_size,
    max_builds: int = DEFAULT_LIMITS.max_builds,
    max_pass_samples: int = DEFAULT_LIMITS.max_pass_samples,
) -> ASGIApp:
    """The ASGI application serving ``meta``; with ``token``, requests must carry it.

    Request bodies are capped at ``max_body_size`` bytes (413), at most ``max_builds`` shard
    builds are in progress at once (503 with Retry-After beyond), and concurrent ``/shard`` requests
    of one plan share passes of at most ``max_pass_samples`` samples; see ``serve``.

    Examples:
        >>> import tempfile, os
        >>> from starlette.testclient import TestClient
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("a 1\\nb 2\\n")
        >>> TestClient(create_app(MetaFile(p))).get("/len").json()["num_samples"]
        2
    """
    n = len(meta)
    fingerprint = meta.fingerprint
    names = protocol.served_names(meta.paths)  # ValueError if two files share a name
    bounds = meta.file_bounds
    served = [
        protocol.ServedFile(name, int(bounds[i + 1] - bounds[i]), fp)
        for i, (name, fp) in enumerate(zip(names, meta.file_fingerprints))
    ]
    file_number = {name: i for i, name in enumerate(names)}
    sizes = {f.name: f.num_samples for f in served}
    slots = BuildSlots(max_builds, _BUILD_WAIT)
    passes = SharedPasses(slots, max_pass_samples)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def length(request: Request) -> Response:
        return JSONResponse({"num_samples": n, "fingerprint": fingerprint})

    async def files(request: Request) -> Response:
        return JSONResponse(protocol.files_body(served))

    async def sample(request: Request) -> Response:
        raw = request.path_params["index"]
        index = protocol.parse_int("index", raw)
        if not 0 <= index < n:
            return _error(404, f"sample index {index} is out of range for {n} samples", "index")
        return Response(meta.raw(index), media_type="text/plain; charset=utf-8")

    async def samples(scope: Scope, receive: Receive, send: Send) -> None:
        # A build slot from the request until the last byte of its answer is sent (the shard is held
        # until then); a request that finds none free within _BUILD_WAIT seconds is answered 503.
        # Building a shard and cutting its frame are CPU work: off the event loop.
        if not await slots.acquire():
            await _busy()(scope, receive, send)
            return
        try:
            answer = await run_in_threadpool(_samples, await Request(scope, receive).body())
            await answer(scope, receive, send)
        finally:
            slots.release()

    def _samples(body: bytes) -> Response | FrameResponse:
        if len(body) % 8:
            message = f"the body must be little-endian int64 indices; got {len(body)} bytes, not a multiple of 8"
            return _error(400, message)
        indices = np.frombuffer(body, "<i8").astype(np.int64)
        if indices.size > _MAX_BATCH:
            return _error(413, f"{indices.size} indices in one request; at most {_MAX_BATCH}")
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
            bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
            return _error(404, f"sample index {bad} is out of range for {n} samples", "index")
        return FrameResponse(meta.read(indices, shared=False))  # framed and sent: never shared

    def plan_shard(request: Request) -> Response | tuple[str, MetaFile, npt.NDArray[np.int64], int]:
        """The request's plan key (every field but the rank), source, indices and number of ranks,
        or the answer to a request that cannot be planned."""
        query = request.query_params
        if len(query.multi_items()) != len(query):
            twice = sorted({k for k, _ in query.multi_items() if len(query.getlist(k)) > 1})
            return _error(400, f"the shard parameter {twice[0]!r} is given more than once")
        try:
            spec, source_files = protocol.shard_request_from_query(dict(query), n, sizes)
        except protocol.FilesMismatch as exc:
            return _error(409, str(exc), "files")
        source = meta if source_files is None else meta.select([file_number[f] for fs in source_files for f in fs])
        key = json.dumps([{**spec.to_dict(), "rank": None}, source_files], sort_keys=True)
        return key, source, spec.indices(), spec.world_size

    async def shard(scope: Scope, receive: Receive, send: Send) -> None:
        # Planning (the permutation) is CPU work: off the event loop. A pass holds a build slot.
        planned = await run_in_threadpool(plan_shard, Request(scope, receive))
        if isinstance(planned, Response):
            await planned(scope, receive, send)
            return
        try:
            async with passes.shard(*planned) as part:
                answer = await run_in_threadpool(FrameResponse, part.shard, part.order, part.ids)
                await answer(scope, receive, send)
        except Busy:
            await _busy()(scope, receive, send)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    async def files_changed(request: Request, exc: Exception) -> Response:
        # The files changed under the server: the client's request is fine, this server's files
        # are not the ones it indexed. It keeps running (and answering this) until restarted.
        return _error(409, str(exc), "files")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = exc.detail
        if exc.status_code == 404:
            endpoints = "/healthz, /len, /files, /sample/<i>, /samples, /shard"
            message = f"no such endpoint {request.url.path!r}; see {endpoints}"
        return _error(exc.status_code, message)

    app = Starlette(
        routes=[
            Route(protocol.HEALTHZ, healthz),
            Route(protocol.LEN, length),
            Route(protocol.FILES, files),
            Route(protocol.sample_path("{index}"), sample),
            Route(protocol.SAMPLES, _AsgiRoute(samples), methods=["POST"]),
            Route(protocol.SHARD, _AsgiRoute(shard), methods=["GET"]),
        ],
        exception_handlers={
            MetaFileChangedError: files_changed,
            ValueError: bad_request,
            TypeError: bad_request,
            HTTPException: http_error,
        },
    )
    return _Admission(app, token, fingerprint, max_body_size)


def _app_from_env() -> ASGIApp:
    """The app for each uvicorn worker process: files and token come through the environment."""
    paths = json.loads(os.environ[_PATHS_ENV])
    columns = json.loads(os.environ.get(_COLUMNS_ENV, "null"))
    limits = ServerLimits.from_env()
    app = create_app(
        MetaFile(paths, columns=columns),
        token=os.environ.get(TOKEN_ENV) or None,
        max_body_size=limits.max_body_size,
        max_builds=limits.max_builds,
        max_pass_samples=limits.max_pass_samples,
    )
    return TrackRequests(app)  # the connections' guards (see serve's loop) learn its requests' phases


def _exit_cleanly(signum: int, frame: object) -> None:
    print(f"rank-dataset: stopped by {signal.Signals(signum).name}", flush=True)
    raise SystemExit(0)


def _raise_fd_limit(connections: int) -> None:
    """Let the process hold at least ``connections`` sockets if the hard limit allows.

    Past the soft limit on open files (often 1024) the server cannot accept a connection at all,
    so ``limit_concurrency`` would never get to answer 503.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256  # the meta files, the index, the listening socket, logs
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
        if new < want:
            print(f"rank-dataset: only {new} open files allowed (ulimit -n); --limit-concurrency is {connections}")


def _port_to_listen_on(host: str, port: int) -> int:
    """``port``, or for 0 a free one, checked free on ``host`` the way uvicorn binds it
    (SO_REUSEADDR): a server that cannot listen there says so before it says it serves.

    Raises:
        ValueError: the address is taken (another server?) or not this machine's.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                "(another server there? --port 0 takes a free port)"
            ) from None
        return int(sock.getsockname()[1])


def serve(
    paths: Sequence[str | os.PathLike[str]],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    workers: int = 1,
    log_level: str = "warning",
    limits: ServerLimits = DEFAULT_LIMITS,
    columns: Sequence[str] | None = None,
    **old_limits: Any,
) -> None:
    """Index ``paths`` (if not cached yet), then serve them until SIGTERM or SIGINT.

    ``columns``: for Parquet meta files, the columns whose values make a line (see :class:`MetaFile`).
    With ``workers > 1``, that many server processes share the port (and the index cache).

    ``limits``, each per server process (what a client sees when it is exceeded):

    - ``max_body_size``: bytes in a request body (413, before the body is read if it is declared).
    - ``max_header_size``: bytes in a request line and headers (h11's ``max_incomplete_event_size``: 400).
    - ``max_builds``: shard builds (/shard, /samples) in progress at once, each until its answer is
      sent; a request waits up to 1 s for one, then gets 503 with ``Retry-After: 1``.
    - ``max_pass_samples``: samples read in one pass shared by concurrent ``/shard`` requests of one
      plan (every parameter alike but the rank), which holds one build until its last shard is sent.
      1: each request is read alone. Passes are shared within a server process only.
    - ``limit_concurrency``: connections and requests at once (uvicorn's own: 503).
    - ``timeout_request``: seconds for a whole request (head and body) to arrive, counted from the
      connection's start or its previous answer (the connection is closed).
    - ``timeout_send``: seconds an answer may wait for a client that reads none of it (closed).
    - ``timeout_keep_alive``: seconds an idle connection is kept after an answer (uvicorn's: closed).
    - ``backlog``: connections waiting to be accepted (uvicorn's ``backlog``).
    """
    import uvicorn

    if old_limits:  # each limit a keyword argument of its own: deprecated
        warnings.warn(
            "serve(max_body_size=..., ...) is deprecated: pass limits=ServerLimits(...) "
            "(from rank_dataset.server.limits); the keywords go in rank-dataset 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        limits = dataclasses.replace(limits, **old_limits)

    meta = MetaFile(list(paths), columns=columns)  # index once here, before any worker starts
    protocol.served_names(meta.paths)  # two files of one name: refuse to start
    os.environ[_PATHS_ENV] = json.dumps([str(p) for p in meta.paths])
    os.environ[_COLUMNS_ENV] = json.dumps(None if columns is None else list(columns))
    if token:
        os.environ[TOKEN_ENV] = token
    limits.to_env()
    _raise_fd_limit(limits.limit_concurrency)
    port = _port_to_listen_on(host, port)
    print(f"rank-dataset: serving {len(meta)} samples on http://{host}:{port}", flush=True)
    # uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again with the
    # handlers it found: let those end the process with status 0 instead of death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    uvicorn.run(
        "rank_dataset.server.app:_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=False,
        # h11, not httptools: h11 bounds the request head (httptools reads headers of any size).
        http="h11",
        h11_max_incomplete_event_size=limits.max_header_size,
        # The event loop guards each connection (request and send timeouts, descriptors, lingering
        # close: see _connection.py), which finds its requests by the scope's client: the peer's own
        # address, not one a proxy header names. No websockets: an upgraded connection leaves the guard.
        loop="rank_dataset.server._connection:new_event_loop",
        proxy_headers=False,
        ws="none",
        limit_concurrency=limits.limit_concurrency,
        timeout_keep_alive=limits.timeout_keep_alive,
        backlog=limits.backlog,
    )
