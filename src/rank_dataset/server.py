"""The meta server: one process holds the meta files and serves samples and whole rank shards.

A Starlette application served by uvicorn. It is stateless: every request carries all it needs
(seed, epoch, world size, mini-epoch, rank, eval or train), so any number of jobs, epochs and
server replicas can share files and processes. No torch.

Endpoints (all but ``/healthz`` need ``Authorization: Bearer TOKEN`` when the server has a token):

- ``GET /healthz``: 200 once the index is loaded.
- ``GET /len``: ``{"num_samples": N, "fingerprint": ...}``.
- ``GET /sample/{index}``: one sample, the line as UTF-8 text.
- ``POST /samples``: many samples; the body is the indices as little-endian int64; the answer a frame.
- ``GET /shard?world_size=&rank=&...``: a whole rank shard (any field of ShardSpec but
  ``num_samples``; ``num_samples`` may be given to check that the server serves the files expected),
  streamed as one frame.

A client's mistake is a 4xx answer with a JSON body ``{"error": message, "kind": kind}``.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rank_dataset import _wire
from rank_dataset.index import MetaFile
from rank_dataset.plan import ShardSpec
from rank_dataset.shard import Shard

__all__ = ["DEFAULT_PORT", "TOKEN_ENV", "create_app", "serve"]

DEFAULT_PORT = 28889
#: Environment variable holding the token, so that it stays out of process listings.
TOKEN_ENV = "RANK_DATASET_TOKEN"
_PATHS_ENV = "RANK_DATASET_SERVE_PATHS"
_MAX_BATCH = 1 << 22  # indices in one /samples request

_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ShardSpec)}


def _error(status: int, message: str, kind: str = "request") -> JSONResponse:
    return JSONResponse({"error": message, "kind": kind}, status_code=status)


class _BearerToken:
    """ASGI middleware: every path but /healthz needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error(401, "missing or wrong token: send 'Authorization: Bearer <token>'", "auth")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _spec_from_query(meta: MetaFile, query: dict[str, str]) -> ShardSpec:
    """A ShardSpec from query parameters, field by field, so fields added to it flow through."""
    n = len(meta)
    values: dict[str, Any] = {}
    for name, raw in query.items():
        if name == "num_samples":
            if _parse_int(name, raw) != n:
                raise LookupError(f"num_samples={raw} was expected, but this server's files hold {n} samples")
            continue
        field = _SPEC_FIELDS.get(name)
        if field is None:
            valid = ", ".join(f for f in _SPEC_FIELDS if f != "num_samples")
            raise ValueError(f"unknown shard parameter {name!r}; valid parameters are {valid}")
        if field.type in ("bool", bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name} must be true or false, got {raw!r}")
            values[name] = raw.lower() in ("true", "1")
        else:
            values[name] = _parse_int(name, raw)
    for required in ("world_size", "rank"):
        if required not in values:
            raise ValueError(f"the shard parameter {required!r} is required")
    return ShardSpec(num_samples=n, **values)


def _frame_response(shard: Shard) -> StreamingResponse:
    return StreamingResponse(
        _wire.encode(shard),
        media_type=_wire.CONTENT_TYPE,
        headers={"Content-Length": str(_wire.frame_size(shard)), "X-Sample-Count": str(len(shard))},
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
    fingerprint = getattr(meta, "fingerprint", None)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def length(request: Request) -> Response:
        return JSONResponse({"num_samples": n, "fingerprint": fingerprint})

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
        return _frame_response(Shard.from_meta(meta, indices))

    def shard(request: Request) -> Response:
        try:
            spec = _spec_from_query(meta, dict(request.query_params))
        except LookupError as exc:
            return _error(409, str(exc), "files")
        return _frame_response(Shard.from_meta(meta, spec.indices()))

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
            Route("/healthz", healthz),
            Route("/len", length),
            Route("/sample/{index}", sample),
            Route("/samples", samples, methods=["POST"]),
            Route("/shard", shard),
        ],
        exception_handlers={ValueError: bad_request, TypeError: bad_request, HTTPException: http_error},
    )
    return _BearerToken(app, token) if token else app


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
