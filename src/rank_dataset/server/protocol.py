"""The wire protocol between the meta server and its clients: one home for both sides.

- Paths: ``GET /healthz``, ``GET /len``, ``GET /files`` (each served file by name, with its sample
  count and fingerprint), ``GET /sample/{index}``, ``POST /samples`` (a body of little-endian int64
  indices), ``GET /shard?<ShardSpec as query>``.
- Names: a served file is named by its file name (no directory); a server refuses to start on two
  files of one name. A ``/shard`` query for a mix names each source's files (``mix_files``, JSON),
  with the sample counts the client expects of them (``mix_sizes``) and what an epoch takes of each
  (``mix_counts``; with schedules, the counts from later epochs on in ``mix_changes``, JSON), so
  that the server computes exactly the client's plan.
- Auth: ``Authorization: Bearer <token>`` on every path but ``/healthz``.
- Pinning: a client sends the fingerprint of the files it started with in ``X-Rank-Dataset-Fingerprint``;
  a server on other files answers 409 (kind ``files``).
- Errors: a client's mistake is a 4xx answer with a JSON body ``{"error": message, "kind": kind}``,
  decoded here into IndexError (``index``), PermissionError (401) or ValueError (anything else).
- Frames: many samples as one binary body, a 24-byte header (magic ``RDS1``, the offsets' item size,
  the sample count, the number of data bytes) followed by four little-endian arrays: the sample
  numbers (int64), the line starts and ends (uint32 or int64), and the data bytes they point into.
  A frame lists its samples in the shard's order; its lines may lie in the data in another order.
  A shard read alone is framed as it lies (starts and ends are views of its one offsets array,
  the lines back to back) and the client's Shard uses the frame's bytes where they are. A shard cut
  from a pass shared by many ranks is framed with its lines in file order (what the pass writes
  fastest) and the client packs them into shard order, one copy of its own lines.

A client and server that do not understand each other raise :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.residency import anonymous_map
from rank_dataset.core.shard import Shard, ShardWriter
from rank_dataset.errors import ProtocolError
from rank_dataset.plan.mix import MixPlan
from rank_dataset.plan.spec import ShardSpec

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "FINGERPRINT_HEADER",
    "TOKEN_ENV",
    "FilesMismatch",
    "FrameError",
    "ProtocolError",
    "ServedFile",
    "decode_frame",
    "encode_frame",
    "error_body",
    "files_body",
    "files_from_body",
    "frame_size",
    "parse_int",
    "raise_for_error",
    "receive_frame",
    "served_names",
    "shard_request_from_query",
    "spec_to_query",
]

DEFAULT_PORT = 28889
#: Environment variable holding the server's token, so that it stays out of process listings.
TOKEN_ENV = "RANK_DATASET_TOKEN"
FINGERPRINT_HEADER = "X-Rank-Dataset-Fingerprint"
CONTENT_TYPE = "application/x-rank-dataset-shard"

HEALTHZ, LEN, FILES, SAMPLES, SHARD = "/healthz", "/len", "/files", "/samples", "/shard"


def sample_path(index: int | str) -> str:
    """The path of one sample."""
    return f"/sample/{index}"


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


# -- served files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedFile:
    """One file a server serves: its name (the file name), sample count and fingerprint."""

    name: str
    num_samples: int
    fingerprint: str


def served_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The names files are served by (their file names), in order.

    Raises:
        ValueError: two files share a name (the message names both paths).
    """
    names: dict[str, str] = {}
    for path in paths:
        name = os.path.basename(os.fspath(path))
        if name in names:
            raise ValueError(
                f"two served files share the name {name!r} ({names[name]} and {os.fspath(path)}): a client names "
                "served files by file name, so give each file a distinct name"
            )
        names[name] = os.fspath(path)
    return list(names)


def files_body(files: Sequence[ServedFile]) -> dict[str, Any]:
    """The JSON body of ``GET /files``."""
    return {"files": [dataclasses.asdict(f) for f in files]}


def files_from_body(body: bytes) -> list[ServedFile]:
    """The served files in a ``GET /files`` answer.

    Raises:
        ProtocolError: not such an answer (a server of another version, or not a meta server).
    """
    try:
        entries = json.loads(body)["files"]
        return [ServedFile(str(e["name"]), int(e["num_samples"]), str(e["fingerprint"])) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"{FILES} did not answer as a meta server does: {exc!r}") from None


# -- ShardSpec <-> query ----------------------------------------------------------------------------

_RESUME = {
    "plan_world_size": "resume_plan_world_size",
    "mini_epoch_idx": "resume_mini_epoch_idx",
    "offset": "resume_offset",
}
_MIX = ("mix_files", "mix_sizes", "mix_counts")
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ShardSpec) if f.name not in ("num_samples", "resume", "mix")}


def spec_to_query(spec: ShardSpec, source_files: Sequence[Sequence[str]] | None = None) -> dict[str, str]:
    """The query parameters of ``GET /shard`` for ``spec``; for a mix, ``source_files`` are the names
    of each source's served files. Fields at their defaults where servers may not know them
    (``aug_repeats``) are left out."""
    fields = spec.to_dict()
    resume, mix = fields.pop("resume"), fields.pop("mix")
    if fields["aug_repeats"] == 1:
        del fields["aug_repeats"]
    query = {name: _encode(value) for name, value in fields.items()}
    if resume is not None:
        query.update({q: str(resume[f]) for f, q in _RESUME.items()})
    if mix is not None:
        if source_files is None or len(source_files) != len(mix["sizes"]):
            raise ValueError("a mix's shard query needs the names of each source's files")
        query["mix_files"] = json.dumps([list(names) for names in source_files], separators=(",", ":"))
        query["mix_sizes"] = ",".join(map(str, mix["sizes"]))
        query["mix_counts"] = ",".join(map(str, mix["counts"]))
        if "changes" in mix:
            query["mix_changes"] = json.dumps(mix["changes"], separators=(",", ":"))
    return query


def shard_request_from_query(
    query: Mapping[str, str], num_samples: int, files: Mapping[str, int] | None = None
) -> tuple[ShardSpec, list[list[str]] | None]:
    """The ShardSpec a ``/shard`` query asks for, on a server holding ``num_samples`` samples in
    files of these names and sample counts (``files``); for a mix, also the names of each source's
    files (whose samples, in that order, the mix's sample numbers count).

    Raises:
        FilesMismatch: the query expects other files: another ``num_samples``, or for a mix other
            sample counts of the named files.
        ValueError: an unknown parameter or file name, a malformed or out-of-range value, a missing one.
    """
    mix, source_files = _mix_from_query(query, files or {})
    layout = num_samples if mix is None else mix.epoch_size
    values: dict[str, Any] = {}
    resume: dict[str, int] = {}
    resume_params = {q: f for f, q in _RESUME.items()}
    for name, raw in query.items():
        if name in _MIX or name == "mix_changes":
            continue
        if name == "num_samples":
            if parse_int(name, raw) == layout:
                continue
            if mix is not None:
                raise ValueError(f"num_samples={raw} must be the mix's epoch size, the sum of mix_counts ({layout})")
            raise FilesMismatch(f"num_samples={raw} was expected, but this server's files hold {num_samples}")
        elif name in resume_params:
            resume[resume_params[name]] = parse_int(name, raw)
        elif name in _SPEC_FIELDS:
            values[name] = _parse_bool(name, raw) if _SPEC_FIELDS[name].type in ("bool", bool) else parse_int(name, raw)
        else:
            valid = ", ".join([*_SPEC_FIELDS, *resume_params, "num_samples", *_MIX, "mix_changes"])
            raise ValueError(f"unknown shard parameter {name!r}; valid parameters are {valid}")
    for required in ("world_size", "rank"):
        if required not in values:
            raise ValueError(f"the shard parameter {required!r} is required")
    if resume:
        missing = [q for f, q in _RESUME.items() if f not in resume]
        if missing:
            raise ValueError(f"the resume parameters come together: {', '.join(missing)} missing")
    fields = {**values, "num_samples": layout, "resume": resume or None, "mix": mix.to_dict() if mix else None}
    return ShardSpec.from_dict(fields), source_files


def _mix_from_query(
    query: Mapping[str, str], files: Mapping[str, int]
) -> tuple[MixPlan | None, list[list[str]] | None]:
    given = [name for name in _MIX if name in query]
    if not given:
        if "mix_changes" in query:
            raise ValueError("mix_changes comes with the mix parameters: mix_files, mix_sizes and mix_counts missing")
        return None, None
    if len(given) != len(_MIX):
        missing = [name for name in _MIX if name not in query]
        raise ValueError(f"the mix parameters come together: {', '.join(missing)} missing")
    try:
        source_files = json.loads(query["mix_files"])
    except ValueError:
        raise ValueError(f"mix_files must be a JSON list of lists of file names, got {query['mix_files']!r}") from None
    if not (
        isinstance(source_files, list)
        and source_files
        and all(isinstance(names, list) and names and all(isinstance(n, str) for n in names) for names in source_files)
    ):
        raise ValueError(
            f"mix_files must be a non-empty JSON list of non-empty lists of file names, got {source_files!r}"
        )
    sizes, counts = _parse_ints("mix_sizes", query["mix_sizes"]), _parse_ints("mix_counts", query["mix_counts"])
    if not len(source_files) == len(sizes) == len(counts):
        raise ValueError(
            f"mix_files, mix_sizes and mix_counts must name as many sources, got {len(source_files)}, {len(sizes)} "
            f"and {len(counts)}"
        )
    for names in source_files:
        for name in names:
            if name not in files:
                raise ValueError(f"no served file is named {name!r}; this server serves {', '.join(files) or 'none'}")
    for i, (names, size) in enumerate(zip(source_files, sizes)):
        held = sum(files[name] for name in names)
        if held != size:
            raise FilesMismatch(f"source {i} ({', '.join(names)}) was expected to hold {size} samples, it holds {held}")
    changes: Any = ()
    if "mix_changes" in query:
        try:
            changes = json.loads(query["mix_changes"])
        except ValueError:
            changes = None
        if not (isinstance(changes, list) and all(isinstance(c, list) and len(c) == 2 for c in changes)):
            raise ValueError(
                f"mix_changes must be a JSON list of [first_epoch, [counts]], got {query['mix_changes']!r}"
            )
        changes = tuple((first, tuple(c) if isinstance(c, list) else c) for first, c in changes)
    try:
        return MixPlan(tuple(sizes), tuple(counts), sum(counts), changes), source_files
    except TypeError as exc:  # a malformed value in mix_changes: the client's mistake, not the server's
        raise ValueError(str(exc)) from None


def _encode(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


def parse_int(name: str, raw: str) -> int:
    """A decimal integer in ASCII digits (no spaces, underscores or other scripts' digits; at most
    100 of them), else a ValueError naming ``name``."""
    if not _INTEGER.fullmatch(raw):
        raise ValueError(f"{name} must be an integer, got {_shown(raw)!r}")
    if len(raw.lstrip("+-")) > 100:
        raise ValueError(f"{name} must have at most 100 digits, got {_shown(raw)}")
    return int(raw)


def _shown(raw: str) -> str:
    return raw if len(raw) <= 40 else f"{raw[:40]}..."


def _parse_ints(name: str, raw: str) -> list[int]:
    try:
        return [parse_int(name, x) for x in raw.split(",")]
    except ValueError:
        raise ValueError(f"{name} must be integers separated by commas, got {_shown(raw)!r}") from None


def _parse_bool(name: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"{name} must be true or false, got {raw!r}")
    return raw.lower() in ("true", "1")


# -- frames -----------------------------------------------------------------------------------------

_HEADER = struct.Struct("<4sIQQ")
_MAGIC = b"RDS1"
_CHUNK = 4 << 20


def frame_size(shard: Shard) -> int:
    """The number of bytes :func:`encode_frame` yields for ``shard`` (in any ``order``)."""
    n = len(shard)
    return _HEADER.size + 8 * n + 2 * shard.starts.dtype.itemsize * n + shard.data.nbytes


def encode_frame(
    shard: Shard, order: npt.NDArray[np.integer[Any]] | None = None, ids: npt.NDArray[np.int64] | None = None
) -> Iterator[bytes | memoryview]:
    """The frame of ``shard``, in chunks of at most a few MiB.

    With ``order`` (a permutation of the shard's rows), the frame's sample ``i`` is the shard's row
    ``order[i]``: the data goes as it lies and the client packs it (a shard cut from a shared pass
    lies in file order). The sample numbers are the shard's (in the frame's order), or ``ids``, in
    the frame's order, for a shard that carries none. Chunks of the data are views of ``shard``'s
    memory: send each before letting go of the shard.

    Examples:
        >>> s = Shard(b"b 1a 0", np.array([0, 3]), np.array([3, 6]), ids=np.array([1, 0]))
        >>> decode_frame(b"".join(encode_frame(s, np.array([1, 0])))).texts([0, 1])
        ['a 0', 'b 1']
    """
    n = len(shard)
    if ids is None:
        if shard.ids is None:
            raise ValueError("a shard sent over the wire must carry its sample numbers, or be given them (ids)")
        ids = shard.ids if order is None else shard.ids[order]
    elif np.shape(ids) != (n,):
        raise ValueError(f"ids must have one entry per row ({n}), got shape {np.shape(ids)}")
    size = shard.starts.dtype.itemsize
    offsets = f"<u{size}" if size == 4 else "<i8"
    if order is None:
        starts, ends = shard.starts, shard.ends
    else:
        if np.shape(order) != (n,):
            raise ValueError(f"order must have one entry per row ({n}), got shape {np.shape(order)}")
        starts, ends = shard.bounds[order], shard.bounds[order + 1]
    yield _HEADER.pack(_MAGIC, size, n, shard.data.nbytes)
    for array in (ids.astype("<i8", copy=False), starts.astype(offsets, copy=False), ends.astype(offsets, copy=False)):
        yield from _chunks(array)
    yield from _chunks(shard.data)


def _chunks(array: npt.NDArray[Any]) -> Iterator[memoryview]:
    """``array``'s bytes as views (no copy) of at most ``_CHUNK`` bytes each."""
    raw = np.ascontiguousarray(array).data.cast("B")
    for lo in range(0, len(raw), _CHUNK):
        yield raw[lo : lo + _CHUNK]


def decode_frame(body: bytes, *, planned: npt.NDArray[np.int64] | None = None) -> Shard:
    """The Shard in a whole frame.

    With ``planned``, the frame must hold exactly those samples, in that order, and the shard is
    packed straight into a shareable segment without them (what a rank keeps: one copy of its
    lines less than decoding, checking and then :meth:`~rank_dataset.core.shard.Shard.shared`).

    Raises:
        ProtocolError: not a frame of this protocol (another version, or not a meta server), or not
            of the ``planned`` samples.
        FrameError: a frame that is short, long or malformed (e.g. cut off by a server that died).
    """
    if len(body) < _HEADER.size:
        raise FrameError(f"a frame of {len(body)} bytes is shorter than its header")
    size, count, nbytes, expect = _header(body)
    if len(body) != expect:
        raise FrameError(f"incomplete frame: got {len(body)} bytes of {expect} ({count} samples)")
    ids = np.frombuffer(body, "<i8", count, _HEADER.size)
    offsets = np.frombuffer(body, "<u4" if size == 4 else "<i8", 2 * count, _HEADER.size + 8 * count)
    starts, ends = offsets[:count], offsets[count:]
    data = np.frombuffer(body, np.uint8, nbytes, expect - nbytes)
    if planned is not None:
        _check_planned(ids, planned)
    try:
        return Shard(data, starts, ends, ids=ids) if planned is None else Shard.shared_from(data, starts, ends)
    except ValueError as exc:
        raise FrameError(f"malformed frame: {exc}") from None


def receive_frame(
    read_into: Callable[[memoryview], int],
    planned: npt.NDArray[np.int64] | Callable[[], npt.NDArray[np.int64]],
    length: int | None = None,
) -> Shard:
    """The shard of a frame read a piece at a time with ``read_into`` (a response's ``readinto``): what
    :func:`decode_frame` gives with ``planned`` (or with ``planned()``, called once the frame's sample
    numbers are in), without the whole frame in memory first. Lines that come back to back (a shard
    read alone) are read straight into the shareable segment the shard keeps; others (a shard cut
    from a shared pass) into a private map, then packed. ``length``: the body's declared length, if
    any, checked against the header's before anything is allocated.

    Raises:
        As :func:`decode_frame`.
    """
    head = np.empty(_HEADER.size, np.uint8)
    got = _fill(read_into, head, 0, None)
    size, count, nbytes, expect = _header(head.tobytes())
    if length is not None and length != expect:
        raise FrameError(f"malformed frame: its header says {expect} bytes ({count} samples), its body {length}")
    meta = np.empty(8 * count + 2 * size * count, np.uint8)
    got = _fill(read_into, meta, got, expect)
    dtype = np.dtype("<u4" if size == 4 else "<i8")
    ids, offsets = meta[: 8 * count].view("<i8"), meta[8 * count :].view(dtype)
    starts, ends = offsets[:count], offsets[count:]
    _check_planned(ids, planned() if callable(planned) else planned)
    in_order = count == 0 or (int(starts[0]) == 0 and int(ends[-1]) == nbytes and bool((starts[1:] == ends[:-1]).all()))
    if in_order and bool((ends >= starts).all()):
        writer = ShardWriter(count, nbytes)
        writer.bounds[:-1] = starts
        writer.bounds[-1] = nbytes
        got = _fill(read_into, writer.data, got, expect)
        shard = writer.finish()
    else:
        data = np.frombuffer(anonymous_map(nbytes), np.uint8, nbytes) if nbytes else np.empty(0, np.uint8)
        got = _fill(read_into, data, got, expect)
        try:
            shard = Shard.shared_from(data, starts, ends)
        except ValueError as exc:
            raise FrameError(f"malformed frame: {exc}") from None
    if read_into(memoryview(bytearray(1))):
        raise FrameError(f"the frame runs past its {expect} bytes ({count} samples)")
    return shard


def _header(head: bytes) -> tuple[int, int, int, int]:
    """A frame header's offset size, sample count and data bytes, and the frame's size (else ProtocolError)."""
    magic, size, count, nbytes = _HEADER.unpack_from(head)
    if magic != _MAGIC or size not in (4, 8):
        raise ProtocolError(f"not a rank-dataset frame (magic {magic!r}, offset size {size}): different versions?")
    return size, count, nbytes, _HEADER.size + 8 * count + 2 * size * count + nbytes


def _check_planned(ids: npt.NDArray[np.int64], planned: npt.NDArray[np.int64]) -> None:
    if not np.array_equal(ids, planned):
        raise ProtocolError(
            f"the frame holds {len(ids)} samples that are not the {len(planned)} planned: are client and server "
            "of different versions?"
        )


def _fill(read_into: Callable[[memoryview], int], out: npt.NDArray[np.uint8], got: int, expect: int | None) -> int:
    """Fill ``out`` with what ``read_into`` reads; ``got`` bytes of the frame (of ``expect``) read before it.

    Raises:
        FrameError: the frame ends first.
    """
    view, done = out.data.cast("B"), 0
    while done < len(view):
        n = read_into(view[done:])
        if not n:
            total = "its header" if expect is None else f"{expect}"
            raise FrameError(f"incomplete frame: got {got + done} bytes of {total}")
        done += n
    return got + done
