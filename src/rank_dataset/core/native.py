"""The per-line kernels behind one interface: the native library (``_kernels.c``, loaded with ctypes)
where it loads, else their numpy reference (:mod:`rank_dataset.core._reference`).

``RANK_DATASET_NATIVE`` picks the path, read once, at the first call:

- ``auto`` (the default): the native library if it loads; else numpy, saying so once (a
  :class:`RuntimeWarning` naming why: no compiler at install, a library that does not load);
- ``0``: numpy;
- ``require``: the native library, or an :class:`ImportError` saying why it cannot load.

``RANK_DATASET_NATIVE_LIB`` names another build of the library to load (the sanitizer build of
``make test-asan``). Each function has the signature and results of its numpy reference; the native
path checks every span against its buffer (a span outside it is a ValueError, never a read).
:func:`describe` says which path is in use (``rank-dataset --version`` prints it).

Examples:
    >>> import numpy as np
    >>> count_newlines(np.frombuffer(b"a\\nb\\n", np.uint8))
    2
    >>> path() in ("native", "numpy")
    True
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core import _reference
from rank_dataset.core._reference import BLANK, BOM, CR, MARK, NEWLINE, LineScan, mix32

if TYPE_CHECKING:
    from rank_dataset.core._native_lib import Kernels

__all__ = [
    "BLANK",
    "BOM",
    "CR",
    "MARK",
    "MODE_ENV",
    "NEWLINE",
    "LineScan",
    "bucket_order",
    "check_lines",
    "copy_rows",
    "count_newlines",
    "describe",
    "find_newlines",
    "gather_lines",
    "lines_bad",
    "mix32",
    "pack_requests",
    "pack_rows",
    "path",
    "permute_cells",
    "place_lines",
    "route_items",
    "scan_lines",
    "scatter_bounds",
    "utf8_first_invalid",
    "verify_lines",
]

#: The environment variable that picks the path: ``auto``, ``0`` or ``require``.
MODE_ENV = "RANK_DATASET_NATIVE"
_MODES = ("auto", "0", "require")


_STATE: tuple[Kernels | None, str] | None = None
_LOCK = threading.Lock()


def _state() -> tuple[Kernels | None, str]:
    """``(kernels or None, description)``, decided once per process (under a lock: the first calls
    may come from several threads at once, and the warning is given once)."""
    global _STATE
    state = _STATE
    if state is None:
        with _LOCK:
            if _STATE is None:
                _STATE = _decide()
            state = _STATE
    return state


def _decide() -> tuple[Kernels | None, str]:
    mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{MODE_ENV} must be one of {', '.join(_MODES)}, got {mode!r}")
    if mode == "0":
        return None, f"numpy ({MODE_ENV}=0)"
    from rank_dataset.core import _native_lib  # ctypes is imported only where the library is wanted

    try:
        kernels = _native_lib.load()
    except (OSError, RuntimeError) as exc:
        why = f"the native kernels did not load: {exc}"
        if mode == "require":
            raise ImportError(
                f"{MODE_ENV}=require, but {why}. Build them with a C compiler (pip install again, or `make native` "
                f"in a clone), or set {MODE_ENV}=auto to run on numpy."
            ) from exc
        warnings.warn(f"rank-dataset runs on numpy: {why}", RuntimeWarning, stacklevel=4)
        return None, f"numpy ({why})"
    source = kernels.path.with_name("_kernels.c")  # a clone's (a wheel ships the library alone)
    if source.is_file() and source.stat().st_mtime > kernels.path.stat().st_mtime:
        warnings.warn(
            f"{kernels.path} is older than {source.name}: rebuild it (`make native`, or pip install -e . again)",
            RuntimeWarning,
            stacklevel=4,
        )
    return kernels, f"native ({kernels.path})"


def path() -> str:
    """``"native"`` or ``"numpy"``: the path the kernels take in this process."""
    return "numpy" if _state()[0] is None else "native"


def describe() -> str:
    """The path in use and why, in a line: ``native (<library>)`` or ``numpy (<reason>)``."""
    return _state()[1]


def count_newlines(buf: npt.NDArray[np.uint8]) -> int:
    """The number of ``\\n`` bytes in ``buf``."""
    k = _state()[0]
    return _reference.count_byte(buf, NEWLINE) if k is None else int(k.count_byte(buf, NEWLINE))


def find_newlines(buf: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """Where the ``\\n`` bytes of ``buf`` are, ascending (int64)."""
    k = _state()[0]
    return _reference.find_byte(buf, NEWLINE) if k is None else k.find_byte(buf, NEWLINE)


def scan_lines(buf: npt.NDArray[np.uint8], offset: int, last: bool, mark: int = MARK) -> LineScan:
    """The samples of the whole lines of ``buf`` (bytes ``offset`` onwards of a file): the chunk scan
    of :func:`rank_dataset.files.scan.scan_buffer`. See :func:`rank_dataset.core._reference.scan_lines`."""
    k = _state()[0]
    return _reference.scan_lines(buf, offset, last, mark) if k is None else k.scan_lines(buf, offset, last, mark)


def copy_rows(src: Any, src_starts: Any, lengths: Any, dst: npt.NDArray[np.uint8], dst_starts: Any) -> None:
    """``dst[dst_starts[k]:][:lengths[k]] = src[src_starts[k]:][:lengths[k]]`` for every ``k``, exactly
    (:func:`rank_dataset.core.shard.copy_rows`)."""
    k = _state()[0]
    if k is None or not (dst.flags.c_contiguous and dst.flags.writeable):  # (a strided dst: numpy's scatter)
        _reference.copy_rows(src, src_starts, lengths, dst, dst_starts)
    else:
        k.copy_rows(src, src_starts, lengths, dst, dst_starts)


def pack_rows(src: Any, starts: Any, lengths: Any, dst: npt.NDArray[np.uint8], offsets: npt.NDArray[Any]) -> None:
    """Rows ``src[starts[k]:][:lengths[k]]`` back to back into ``dst``, and their ``n + 1`` offsets
    (uint32 or int64, see :func:`rank_dataset.core.shard.offset_dtype`) into ``offsets``."""
    k = _state()[0]
    if k is None:
        _reference.pack_rows(src, starts, lengths, dst, offsets)
    else:
        k.pack_rows(src, starts, lengths, dst, offsets)


def utf8_first_invalid(data: npt.NDArray[np.uint8], bounds: npt.NDArray[Any]) -> int:
    """The first row ``data[bounds[i]:bounds[i + 1]]`` that is not valid UTF-8, or -1."""
    k = _state()[0]
    return _reference.utf8_first_invalid(data, bounds) if k is None else int(k.utf8_first_invalid(data, bounds))


def lines_bad(buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> int:
    """The first row ``buf[starts[k]:ends[k]]`` that holds a newline or only whitespace, or -1."""
    k = _state()[0]
    return _reference.lines_bad(buf, starts, ends) if k is None else int(k.lines_bad(buf, starts, ends))


def permute_cells(
    n: int, rows: int, col_bits: int, keys: Sequence[int], positions: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The keyed permutation of ``[0, n)`` at ``positions`` given its grid and round keys (what
    :func:`rank_dataset.plan.permutation.permute` computes from ``(n, seed, epoch)``), int64, flat."""
    k = _state()[0]
    if k is None:
        return _reference.permute_cells(n, rows, col_bits, keys, positions)
    return k.permute_cells(n, rows, col_bits, keys, positions)


def check_lines(
    buf: npt.NDArray[np.uint8],
    at: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    file_size: int,
    bom: bool,
) -> int:
    """The first of the rows a gather read into ``buf`` that is not a sample of its file, or -1 (see
    :func:`rank_dataset.core._reference.check_lines`): bounds, stray newlines and blank rows in one pass."""
    k = _state()[0]
    if k is None:
        return _reference.check_lines(buf, at, starts, lengths, file_size, bom)
    return k.check_lines(buf, at, starts, lengths, file_size, bom)


def bucket_order(
    keys: npt.NDArray[np.uint16], buckets: int, dtype: Any = np.int64
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """``(order, counts)``: the items of ``keys`` (uint16, each below ``buckets``) in ascending key
    order, stably (``np.argsort(keys, kind="stable")`` as ``dtype``, uint32 or int64), and how many
    items hold each key (``np.bincount(keys, minlength=buckets)``): one counting sort."""
    k = _state()[0]
    return _reference.bucket_order(keys, buckets, dtype) if k is None else k.bucket_order(keys, buckets, dtype)


def gather_lines(
    buf: npt.NDArray[np.uint8],
    shift: int,
    starts: npt.NDArray[np.int64],
    rows: npt.NDArray[Any],
    bounds: npt.NDArray[Any],
    dst: npt.NDArray[np.uint8],
    file_size: int,
    bom: bool,
) -> int:
    """Check rows read into ``buf`` as :func:`check_lines` does and copy each to its place in a
    shard's ``dst`` (``bounds[rows[k]]`` on), in one pass: the first row that is not a sample, or -1.
    See :func:`rank_dataset.core._reference.gather_lines`."""
    k = _state()[0]
    if k is None:
        return _reference.gather_lines(buf, shift, starts, rows, bounds, dst, file_size, bom)
    return k.gather_lines(buf, shift, starts, rows, bounds, dst, file_size, bom)


# -- the collective reader's exchange: see the references in rank_dataset.core._reference -------------


def route_items(
    items: npt.NDArray[np.int64], owned: npt.NDArray[np.int64], rounds: int, per_round: int, check: bool, req: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any], npt.NDArray[Any]] | None:
    """A build's requests grouped by owner and round, ``(counts, order, request)``; None where
    ``check`` and some sample occurs twice (:func:`rank_dataset.core._reference.route_items`)."""
    k = _state()[0]
    if k is None:
        return _reference.route_items(items, owned, rounds, per_round, check, req)
    return k.route_items(items, owned, rounds, per_round, check, req)


def scatter_bounds(lengths: Any, order: Any, counts: Any, bounds: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """A shard's offsets from the lengths of the items ``order`` in place, and the bytes of each group
    of ``counts`` (:func:`rank_dataset.core._reference.scatter_bounds`)."""
    k = _state()[0]
    return (
        _reference.scatter_bounds(lengths, order, counts, bounds)
        if k is None
        else k.scatter_bounds(lengths, order, counts, bounds)
    )


def pack_requests(
    src: Any,
    lo: int,
    starts: Any,
    lengths: Any,
    rows: Any,
    at: Any,
    counts: Any,
    head: int,
    status: int,
    send: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.int64]:
    """An owner's round: the bytes for each requester, and with ``send`` its heads and lines packed
    (``lengths`` as ``rows``: :func:`rank_dataset.core._reference.pack_requests`)."""
    k = _state()[0]
    impl = _reference.pack_requests if k is None else k.pack_requests
    return impl(src, lo, starts, lengths, rows, at, counts, head, status, send)


def place_lines(
    got: Any, parts: Any, order: Any, at: Any, counts: Any, head: int, bounds: Any, data: npt.NDArray[np.uint8]
) -> None:
    """A requester's round copied into its shard (:func:`rank_dataset.core._reference.place_lines`)."""
    k = _state()[0]
    impl = _reference.place_lines if k is None else k.place_lines
    impl(got, parts, order, at, counts, head, bounds, data)


def verify_lines(
    buf: npt.NDArray[np.uint8], offset: int, last: bool, starts: Any, base: int, lengths: Any
) -> tuple[int, int, bool]:
    """``(bad, newlines, ascii)``: whether ``buf`` holds exactly the samples ``starts - base`` of
    ``lengths`` as :func:`scan_lines` finds them (``bad`` -1, else the first that differs), checked
    where they are said to be (:func:`rank_dataset.core._reference.verify_lines`)."""
    k = _state()[0]
    impl = _reference.verify_lines if k is None else k.verify_lines
    return impl(buf, offset, last, starts, base, lengths)
