"""The wire protocol between the meta server and its clients: one home for both sides. No torch.

- Paths: ``GET /healthz``, ``GET /len``, ``GET /sample/{index}``, ``POST /samples`` (a body of
  little-endian int64 indices), ``GET /shard?<ShardSpec as query>``.
- Auth: ``Authorization: Bearer <token>`` on every path but ``/healthz``.
- Pinning: a client sends the fingerprint of the files it started with in ``X-Rank-Dataset-Fingerprint``;
  a server on other files answers 409 (kind ``files``).
- Errors: a client's mistake is a 4xx answer with a JSON body ``{"error": message, "kind": kind}``,
  decoded here into IndexError (``index``), PermissionError (401) or ValueError (anything else).
- Frames: many samples as one binary body, a 24-byte header (magic ``RDS1``, the offsets' item size,
  the sample count, the number of data bytes) followed by four little-endian arrays: the sample
  numbers (int64), the line starts and ends (uint32 or int64), and the data bytes they point into.
  Starts and ends are views of the Shard's one offsets array (its lines lie back to back), so
  neither side converts anything: the client's Shard uses the frame's bytes where they are.

A client and server that do not understand each other raise :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rank_dataset.plan import ResumePoint, ShardSpec
from rank_dataset.shard import Shard

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "FINGERPRINT_HEADER",
    "TOKEN_ENV",
    "FilesMismatch",
    "FrameError",
    "ProtocolError",
    "decode_frame",
    "encode_frame",
    "error_body",
    "frame_size",
    "raise_for_error",
    "spec_from_query",
    "spec_to_query",
]

DEFAULT_PORT = 28889
#: Environment variable holding the server's token, so that it stays out of process listings.
TOKEN_ENV = "RANK_DATASET_TOKEN"
FINGERPRINT_HEADER = "X-Rank-Dataset-Fingerprint"
CONTENT_TYPE = "application/x-rank-dataset-shard"

HEALTHZ, LEN, SAMPLES, SHARD = "/healthz", "/len", "/samples", "/shard"


def sample_path(index: int | str) -> str:
    """The path of one sample."""
    return f"/sample/{index}"


class ProtocolError(ConnectionError):
    """Client and server do not understand each other (different versions, or not a meta server)."""


class FrameError(ValueError):
    """A body that is not a whole, well-formed frame."""


class FilesMismatch(LookupError):
    """A request meant for other files than the server's (answered 409, kind ``files``)."""


# -- errors -----------------------------------------------------------------------------------------


def error_body(message: str, kind: str = "request") -> dict[str, str]:
    """The JSON body of a 4xx answer."""
    return {"error": message, "kind": kind}


def raise_for_error(url: str, status: int, body: bytes) -> None:
    """Raise the error a 4xx answer stands for: IndexError, PermissionError or ValueError."""
    try:
        answer = json.loads(body)
        message, kind = answer.get("error", body.decode(errors="replace")), answer.get("kind")
    except (ValueError, AttributeError):
        message, kind = body.decode(errors="replace"), None
    if status == 401:
        raise PermissionError(f"{url}: {message}")
    if kind == "index":
        raise IndexError(message)
    if kind == "files":
        raise ValueError(f"{url} serves other meta files than this client started with: {message}")
    raise ValueError(f"{url}: HTTP {status}: {message}")


# -- ShardSpec <-> query ----------------------------------------------------------------------------

_RESUME = {
    "plan_world_size": "resume_plan_world_size",
    "mini_epoch_idx": "resume_mini_epoch_idx",
    "offset": "resume_offset",
}
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ShardSpec) if f.name not in ("num_samples", "resume")}


def spec_to_query(spec: ShardSpec) -> dict[str, str]:
    """The query parameters of ``GET /shard`` for ``spec``."""
    query = {name: _encode(getattr(spec, name)) for name in _SPEC_FIELDS}
    query["num_samples"] = str(spec.num_samples)
    if spec.resume is not None:
        query.update({q: str(getattr(spec.resume, f)) for f, q in _RESUME.items()})
    return query


def spec_from_query(query: Mapping[str, str], num_samples: int) -> ShardSpec:
    """The ShardSpec a ``/shard`` query asks for, on a server holding ``num_samples`` samples.

    Raises:
        FilesMismatch: the query names another ``num_samples``.
        ValueError: an unknown parameter, a malformed or out-of-range value, a missing one.
    """
    values: dict[str, Any] = {}
    resume: dict[str, int] = {}
    resume_params = {q: f for f, q in _RESUME.items()}
    for name, raw in query.items():
        if name == "num_samples":
            if _parse_int(name, raw) != num_samples:
                raise FilesMismatch(f"num_samples={raw} was expected, but this server's files hold {num_samples}")
        elif name in resume_params:
            resume[resume_params[name]] = _parse_int(name, raw)
        elif name in _SPEC_FIELDS:
            values[name] = (
                _parse_bool(name, raw) if _SPEC_FIELDS[name].type in ("bool", bool) else _parse_int(name, raw)
            )
        else:
            valid = ", ".join([*_SPEC_FIELDS, *resume_params, "num_samples"])
            raise ValueError(f"unknown shard parameter {name!r}; valid parameters are {valid}")
    for required in ("world_size", "rank"):
        if required not in values:
            raise ValueError(f"the shard parameter {required!r} is required")
    if resume:
        missing = [q for f, q in _RESUME.items() if f not in resume]
        if missing:
            raise ValueError(f"the resume parameters come together: {', '.join(missing)} missing")
        values["resume"] = ResumePoint(**resume)
    return ShardSpec(num_samples=num_samples, **values)


def _encode(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _parse_bool(name: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"{name} must be true or false, got {raw!r}")
    return raw.lower() in ("true", "1")


# -- frames -----------------------------------------------------------------------------------------

_HEADER = struct.Struct("<4sIQQ")
_MAGIC = b"RDS1"
_CHUNK = 4 << 20


def frame_size(shard: Shard) -> int:
    """The number of bytes :func:`encode_frame` yields for ``shard``."""
    n = len(shard)
    return _HEADER.size + 8 * n + 2 * shard.starts.dtype.itemsize * n + shard.data.nbytes


def encode_frame(shard: Shard) -> Iterator[bytes]:
    """The frame of ``shard`` (which must carry ids), in chunks of at most a few MiB."""
    if shard.ids is None:
        raise ValueError("a shard sent over the wire must carry its sample numbers")
    size = shard.starts.dtype.itemsize
    yield _HEADER.pack(_MAGIC, size, len(shard), shard.data.nbytes)
    for array in (
        shard.ids.astype("<i8"),
        shard.starts.astype(f"<u{size}" if size == 4 else "<i8"),
        shard.ends.astype(f"<u{size}" if size == 4 else "<i8"),
        shard.data,
    ):
        raw = np.ascontiguousarray(array).data.cast("B")
        for lo in range(0, len(raw), _CHUNK):
            yield bytes(raw[lo : lo + _CHUNK])


def decode_frame(body: bytes) -> Shard:
    """The Shard in a whole frame.

    Raises:
        ProtocolError: not a frame of this protocol (another version, or not a meta server).
        FrameError: a frame that is short, long or malformed (e.g. cut off by a server that died).
    """
    if len(body) < _HEADER.size:
        raise FrameError(f"a frame of {len(body)} bytes is shorter than its header")
    magic, size, count, nbytes = _HEADER.unpack_from(body)
    if magic != _MAGIC or size not in (4, 8):
        raise ProtocolError(f"not a rank-dataset frame (magic {magic!r}, offset size {size}): different versions?")
    expect = _HEADER.size + 8 * count + 2 * size * count + nbytes
    if len(body) != expect:
        raise FrameError(f"incomplete frame: got {len(body)} bytes of {expect} ({count} samples)")
    offset = _HEADER.size
    ids = np.frombuffer(body, "<i8", count, offset)
    offset += 8 * count
    dtype = np.dtype("<u4" if size == 4 else "<i8")
    starts = np.frombuffer(body, dtype, count, offset)
    offset += size * count
    ends = np.frombuffer(body, dtype, count, offset)
    offset += size * count
    data = np.frombuffer(body, np.uint8, nbytes, offset)
    try:
        return Shard(data, starts, ends, ids=ids)
    except ValueError as exc:
        raise FrameError(f"malformed frame: {exc}") from None
