"""The meta server: one process holds the meta files and serves samples and whole rank shards.

A Starlette application served by uvicorn. It is stateless: every request carries all it needs
(seed, epoch, world size, mini-epoch, rank, eval or train), so any number of jobs, epochs and
server replicas can share files and processes. No torch.

Endpoints (all but ``/healthz`` need ``Authorization: Bearer TOKEN`` when the server has a token):

- ``GET /healthz``: 200 once the index is loaded.
- ``GET /len``: ``{"num_samples": N, "fingerprint": ...}``.
- ``GET /files``: each served file by name (its file name), with its sample count and fingerprint.
- ``GET /sample/{index}``: one sample, the line as UTF-8 text.
- ``POST /samples``: many samples; the body is the indices as little-endian int64; the answer a frame.
- ``GET /shard?world_size=&rank=&...``: a whole rank shard (the ShardSpec as query parameters,
  see :func:`rank_dataset.protocol.spec_to_query`), streamed as one frame; for a mix of served files
  (``mix_files``, ``mix_sizes``, ``mix_counts``), the sample numbers count the named files' samples.

The wire format, the pinning of files and the error bodies are :mod:`rank_dataset.protocol`'s.
"""

from __future__ import annotations

import hmac
import json
import os
import signal
from collections.abc import Sequence

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rank_dataset import protocol
from rank_dataset.metafile import MetaFile
from rank_dataset.protocol import DEFAULT_PORT, FINGERPRINT_HEADER, TOKEN_ENV
from rank_dataset.shard import Shard

__all__ = ["create_app", "serve"]

_PATHS_ENV = "RANK_DATASET_SERVE_PATHS"
_MAX_BATCH = 1 << 22  # indices in one /samples request


def _error(status: int, message: str, kind: str = "request") -> JSONResponse:
    return JSONResponse(protocol.error_body(message, kind), status_code=status)


class _BearerToken:
    """ASGI middleware: every path but /healthz needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != protocol.HEALTHZ:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error(401, "missing or wrong token: send 'Authorization: Bearer <token>'", "auth")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _PinnedFiles:
    """ASGI middleware: a request pinned to other files (by fingerprint) is answered 409."""

    def __init__(self, app: ASGIApp, fingerprint: str) -> None:
        self.app = app
        self.fingerprint = fingerprint.encode()
        self.header = FINGERPRINT_HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            pinned = dict(scope["headers"]).get(self.header)
            if pinned is not None and not hmac.compare_digest(pinned, self.fingerprint):
                message = (
                    f"the request is for files with fingerprint {pinned.decode(errors='replace')!r}, "
                    f"this server's files have {self.fingerprint.decode()!r}: it was restarted on other files"
                )
                await _error(409, message, "files")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _frame_response(shard: Shard) -> StreamingResponse:
    return StreamingResponse(
        protocol.encode_frame(shard),
        media_type=protocol.CONTENT_TYPE,
        headers={"Content-Length": str(protocol.frame_size(shard)), "X-Sample-Count": str(len(shard))},
    )


def create_app(meta: MetaFile, *, token: str | None = None) -> ASGIApp:
    """The ASGI application serving ``meta``; with ``token``, requests must carry it.

    Example:
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

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def length(request: Request) -> Response:
        return JSONResponse({"num_samples": n, "fingerprint": fingerprint})

    async def files(request: Request) -> Response:
        return JSONResponse(protocol.files_body(served))

    async def sample(request: Request) -> Response:
        raw = request.path_params["index"]
        index = _parse_int("index", raw)
        if not 0 <= index < n:
            return _error(404, f"sample index {index} is out of range for {n} samples", "index")
        return Response(meta.raw(index), media_type="text/plain; charset=utf-8")

    async def samples(request: Request) -> Response:
        # Building a shard is CPU work: off the event loop, like the sync endpoints.
        return await run_in_threadpool(_samples, await request.body())

    def _samples(body: bytes) -> Response:
        if len(body) % 8:
            message = f"the body must be little-endian int64 indices; got {len(body)} bytes, not a multiple of 8"
            return _error(400, message)
        indices = np.frombuffer(body, "<i8").astype(np.int64)
        if indices.size > _MAX_BATCH:
            return _error(413, f"{indices.size} indices in one request; at most {_MAX_BATCH}")
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
            bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
            return _error(404, f"sample index {bad} is out of range for {n} samples", "index")
        return _frame_response(meta.read(indices))

    def shard(request: Request) -> Response:
        try:
            spec, source_files = protocol.shard_request_from_query(dict(request.query_params), n, sizes)
        except protocol.FilesMismatch as exc:
            return _error(409, str(exc), "files")
        source = meta if source_files is None else meta.select([file_number[f] for fs in source_files for f in fs])
        return _frame_response(source.read(spec.indices()))

    async def bad_request(request: Request, exc: Exception) -> Response:
        return _error(400, str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = exc.detail
        if exc.status_code == 404:
            message = f"no such endpoint {request.url.path!r}; see /healthz, /len, /sample/<i>, /samples, /shard"
        return _error(exc.status_code, message)

    app = Starlette(
        routes=[
            Route(protocol.HEALTHZ, healthz),
            Route(protocol.LEN, length),
            Route(protocol.FILES, files),
            Route(protocol.sample_path("{index}"), sample),
            Route(protocol.SAMPLES, samples, methods=["POST"]),
            Route(protocol.SHARD, shard),
        ],
        exception_handlers={ValueError: bad_request, TypeError: bad_request, HTTPException: http_error},
    )
    pinned = _PinnedFiles(app, fingerprint)
    return _BearerToken(pinned, token) if token else pinned


def _app_from_env() -> ASGIApp:
    """The app for each uvicorn worker process: files and token come through the environment."""
    paths = json.loads(os.environ[_PATHS_ENV])
    return create_app(MetaFile(paths), token=os.environ.get(TOKEN_ENV) or None)


def _exit_cleanly(signum: int, frame: object) -> None:
    print(f"rank-dataset: stopped by {signal.Signals(signum).name}", flush=True)
    raise SystemExit(0)


def serve(
    paths: Sequence[str | os.PathLike[str]],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    workers: int = 1,
    log_level: str = "warning",
) -> None:
    """Index ``paths`` (if not cached yet), then serve them until SIGTERM or SIGINT.

    With ``workers > 1``, that many server processes share the port (and the index cache).
    """
    import uvicorn

    meta = MetaFile(list(paths))  # index once here, before any worker starts
    protocol.served_names(meta.paths)  # two files of one name: refuse to start
    os.environ[_PATHS_ENV] = json.dumps([str(p) for p in meta.paths])
    if token:
        os.environ[TOKEN_ENV] = token
    print(f"rank-dataset: serving {len(meta)} samples on http://{host}:{port}", flush=True)
    # uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again with the
    # handlers it found: let those end the process with status 0 instead of death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    uvicorn.run(
        "rank_dataset.server:_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=False,
    )
