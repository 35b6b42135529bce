"""The ctypes binding of ``_kernels.c``: where the library is, how it is loaded, and each kernel's call.

ctypes releases the GIL for the length of a call (a ``CDLL``'s functions do), so threads that call
kernels run in parallel. Arguments are handed over as C-contiguous arrays of the dtypes the kernels
take (index arrays as int64, uint32 or int32; others are converted); each kernel checks every offset
against its buffer's size, and an error code becomes a ValueError here.
"""

from __future__ import annotations

import array
import ctypes
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rank_dataset.core import _reference
from rank_dataset.core._reference import MARK, NEWLINE, LineScan
from rank_dataset.core.arrays import Int64Array, UInt8Array, UInt32Array

__all__ = ["ABI", "LIB_ENV", "Kernels", "library_path", "load"]

#: The kernels' interface version: a library built from another ``_kernels.c`` is not used.
ABI = 2
#: A library to load instead of the one installed beside this module (e.g. a sanitizer build).
LIB_ENV = "RANK_DATASET_NATIVE_LIB"

_OK, _EARG, _ERANGE, _ECAP, _EOVERFLOW, _EREPEAT = 0, -1, -2, -3, -4, -5
_I64, _U32, _I32 = 1, 2, 3
_KINDS = {np.dtype(np.int64): _I64, np.dtype(np.uint32): _U32, np.dtype(np.int32): _I32}
_P, _I64T, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SAMPLE = 256 << 10  # bytes whose lines size a scan's arrays
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rd_abi_version": (_INT, []),
    "rd_count_byte": (_I64T, [_P, _I64T, _INT]),
    "rd_find_byte": (_I64T, [_P, _I64T, _INT, _P, _I64T]),
    "rd_scan_lines": (_INT, [_P, _I64T, _I64T, _INT, _I64T, _P, _P, _I64T, _P, _I64T, _P]),
    "rd_copy_rows": (_INT, [_P, _I64T, _P, _INT, _P, _INT, _I64T, _P, _I64T, _P, _INT, _P]),
    "rd_pack_rows": (_INT, [_P, _I64T, _P, _INT, _P, _INT, _I64T, _P, _I64T, _P, _INT, _P]),
    "rd_utf8_first_invalid": (_INT, [_P, _I64T, _P, _INT, _I64T, _P]),
    "rd_lines_bad": (_INT, [_P, _I64T, _P, _P, _I64T, _P]),
    "rd_permute": (_INT, [_I64T, _I64T, _INT, _P, _INT, _P, _I64T, _P, _P]),
    "rd_check_lines": (_INT, [_P, _I64T, _P, _P, _P, _I64T, _I64T, _INT, _P]),
    "rd_bucket_order": (_INT, [_P, _I64T, _I64T, _P, _INT, _P, _P]),
    "rd_pack_runs": (_INT, [_P, _I64T, _P, _I64T, _I64T, _P, _P, _P, _P]),
    "rd_split_costs": (_INT, [_P, _I64T, _P, _I64T, _I64T, _P, _I64T, _P, _P, _P]),
    "rd_gather_lines": (
        _INT,
        [_P, _I64T, _I64T, _P, _P, _INT, _I64T, _P, _INT, _I64T, _P, _I64T, _I64T, _INT, _P],
    ),
    "rd_route": (_INT, [_P, _I64T, _P, _I64T, _I64T, _I64T, _P, _I64T, _P, _P, _INT, _P, _INT, _P]),
    "rd_scatter_bounds": (_INT, [_P, _INT, _P, _INT, _I64T, _P, _I64T, _P, _INT, _P, _P]),
    "rd_pack_requests": (
        _INT,
        [_P, _I64T, _I64T, _P, _INT, _P, _INT, _I64T, _P, _INT, _I64T, _P, _P, _I64T, _I64T, _INT, _P, _I64T, _P, _P],
    ),
    "rd_verify_lines": (_INT, [_P, _I64T, _I64T, _INT, _P, _INT, _I64T, _P, _INT, _I64T, _P, _P]),
    "rd_place_lines": (
        _INT,
        [_P, _I64T, _P, _P, _INT, _I64T, _P, _P, _I64T, _I64T, _P, _INT, _I64T, _P, _I64T, _P],
    ),
    "rd_line_fields": (_INT, [_P, _I64T, _I64T, _I64T, _P, _P, _I64T, _P]),
    "rd_copy_lines": (
        _INT,
        [_P, _I64T, _I64T, _P, _INT, _I64T, _P, _INT, _P, _INT, _I64T, _P, _INT, _I64T, _P, _I64T, _P],
    ),
}
_OUT_KINDS = {np.dtype(np.uint32): _U32, np.dtype(np.int64): _I64}  # offsets and requests a kernel writes
# Kernels a library may lack (one built from an older _kernels.c of the same ABI): None on the Kernels then.
_OPTIONAL: dict[str, tuple[Any, list[Any]]] = {
    "rd_open_files": (_INT, [_INT, ctypes.c_char_p, _I64T, _I64T, _I64T, _P, _I64T]),
}
_ENOSYS = -6


def library_name() -> str:
    """The file name the build gives the library on this platform."""
    if sys.platform == "win32":
        return "_kernels.dll"
    return "_kernels.dylib" if sys.platform == "darwin" else "_kernels.so"


def library_path() -> Path:
    """Where the library is looked for: ``$RANK_DATASET_NATIVE_LIB``, else beside this module."""
    override = os.environ.get(LIB_ENV)
    return Path(override) if override else Path(__file__).with_name(library_name())


def load() -> Kernels:
    """The kernels of the library at :func:`library_path`.

    Raises:
        OSError: there is no library there, or it does not load.
        RuntimeError: it is not one this package can use (another interface version, a kernel missing).
    """
    path = library_path()
    if not path.is_file():
        raise OSError(f"no native library at {path}")
    lib = ctypes.CDLL(str(path))
    try:
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except AttributeError as exc:
        raise RuntimeError(f"{path} lacks a kernel: {exc}") from None
    for name, (restype, argtypes) in _OPTIONAL.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes
    if lib.rd_abi_version() != ABI:
        raise RuntimeError(f"{path} was built from another version of _kernels.c (rebuild it)")
    source = path.with_name("_kernels.c")  # a clone's (a wheel ships the library alone)
    if source.is_file() and source.stat().st_mtime > path.stat().st_mtime:
        msg = f"{path} is older than {source.name}: rebuild it (`make native`, or pip install -e . again)"
        warnings.warn(msg, RuntimeWarning, stacklevel=5)  # at the first kernel's caller
    return Kernels(lib, path)


def _bytes_in(buf: Any) -> UInt8Array:
    """``buf`` as a C-contiguous 1-D uint8 array (read-only buffers too; copied only if strided)."""
    a = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
    if a.dtype != np.uint8 or a.ndim != 1:
        raise TypeError(f"expected a 1-D uint8 array, got {a.dtype} with shape {a.shape}")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _bytes_out(buf: UInt8Array) -> UInt8Array:
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError("the destination must be a 1-D uint8 array")
    if not (buf.flags.c_contiguous and buf.flags.writeable):
        raise ValueError("the destination must be a writeable contiguous array")
    return buf


def _index(a: Any) -> tuple[np.ndarray, int]:
    """``a`` as a contiguous 1-D index array a kernel takes, and its kind."""
    arr = np.asarray(a)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"offsets must be integers, got dtype {arr.dtype}")
    kind = _KINDS.get(arr.dtype)
    if kind is None:
        arr, kind = arr.astype(np.int64), _I64
    return (arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)), kind


def _i64(a: Any) -> Int64Array:
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def _check(code: int, what: str, bad: int = -1) -> None:
    if code == _OK:
        return
    if code == _ERANGE:
        row = f" (row {bad})" if bad >= 0 else ""
        raise ValueError(f"{what}: a span lies outside its buffer{row}")
    if code == _ECAP:
        raise ValueError(f"{what}: the destination is too small")
    if code == _EOVERFLOW:
        raise ValueError(f"{what}: the offsets overflow their dtype")
    raise ValueError(f"{what}: invalid arguments (error {code})")


class Kernels:
    """The library's kernels, each with the signature and results of its numpy reference in
    :mod:`rank_dataset.core._reference`."""

    #: :meth:`check_lines` and :meth:`gather_lines` check a window's rows in one pass over its bytes,
    #: newlines inside rows included.
    FUSED = True

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self._lib, self.path = lib, path
        self._open_files = getattr(lib, "rd_open_files", None)

    def open_files(self, dirfd: int, names: Sequence[str], probe_max: int) -> array.array[int] | None:
        """Open each of ``names`` (relative paths, no NUL byte) beneath the directory ``dirfd``: symlinks that
        stay under it followed, others refused (``openat2`` with ``RESOLVE_BENEATH``; the last component never
        a symlink), and a regular file of at most ``probe_max`` bytes (< 0: none) probed for its pages in the
        page cache. An int64 array ``out`` of ``3 * len(names)``: for file ``i``, ``out[i]`` its descriptor (-1:
        none; those >= 0 are the caller's to close), ``out[n + i]`` its size, ``out[2n + i]`` its status
        (:data:`~rank_dataset.core.native.OPEN_HIT`, ``OPEN_MISS``, ``OPEN_NOT_FILE`` or ``-errno``). None
        where the library or the system cannot (no ``rd_open_files``, not Linux, a kernel without
        ``openat2``): nothing was opened.

        Raises:
            ValueError: a name is empty or holds a NUL byte.
        """
        fn = self._open_files
        if fn is None:
            return None
        n = len(names)
        buf = os.fsencode("\0".join(names) + "\0") if n else b""
        out = array.array("q", bytes(24 * n))
        code = int(fn(dirfd, buf, len(buf), n, probe_max, out.buffer_info()[0] if n else None, 3 * n))
        if code == _ENOSYS:
            return None
        if code == _ERANGE:
            raise ValueError("open_files: a name is empty or holds a NUL byte")
        _check(code, "open_files")
        return out

    def count_byte(self, buf: Any, byte: int = NEWLINE) -> int:
        a = _bytes_in(buf)
        got = int(self._lib.rd_count_byte(a.ctypes.data, a.size, byte))
        _check(min(got, 0), "count_byte")
        return got

    def find_byte(self, buf: Any, byte: int = NEWLINE) -> Int64Array:
        a = _bytes_in(buf)
        cap = self.count_byte(a, byte)
        out = np.empty(cap, np.int64)
        got = int(self._lib.rd_find_byte(a.ctypes.data, a.size, byte, out.ctypes.data, cap))
        _check(min(got, 0), "find_byte")
        return out[:got]

    def scan_lines(self, buf: Any, offset: int, last: bool, mark: int = MARK) -> LineScan:
        a = _bytes_in(buf)
        if offset < 0 or mark <= 0:
            raise ValueError(f"offset must be >= 0 and mark > 0, got {offset} and {mark}")
        # A sample per line at most. The arrays are sized by the lines of the first 256 KiB, with room to
        # spare (rather than counting them all), and scanned again at the exact size in the rare buffer
        # whose later lines are much shorter; then trimmed in place.
        head = a[:_SAMPLE]
        guess = (self.count_byte(head, NEWLINE) + 1) * a.size // max(head.size, 1)
        cap = min(guess + guess // 2 + 64, a.size + 1)
        marks_cap = a.size // mark + 2
        marks = np.empty((marks_cap, 2), np.int64)
        result = np.zeros(4, np.int64)
        while True:
            starts, lengths = np.empty(cap, np.int64), np.empty(cap, np.int64)
            code = self._lib.rd_scan_lines(
                a.ctypes.data, a.size, offset, int(bool(last)), mark, starts.ctypes.data, lengths.ctypes.data, cap,
                marks.ctypes.data, marks_cap, result.ctypes.data,
            )  # fmt: skip
            if code != _ECAP or cap == a.size + 1:
                break
            cap = self.count_byte(a, NEWLINE) + 1
        _check(code, "scan_lines")
        n, newlines, ascii_, n_marks = result.tolist()
        starts.resize(n, refcheck=False)  # in place (a shrinking realloc): no copy
        lengths.resize(n, refcheck=False)
        return LineScan(starts, lengths, bool(ascii_), newlines, marks[:n_marks].copy())

    def copy_rows(self, src: Any, src_starts: Any, lengths: Any, dst: UInt8Array, dst_starts: Any) -> None:
        if not (dst.flags.c_contiguous and dst.flags.writeable):  # a strided destination: numpy's scatter
            _reference.copy_rows(src, src_starts, lengths, dst, dst_starts)
            return
        s, d = _bytes_in(src), _bytes_out(dst)
        (ss, sk), (ln, lk), (ds, dk) = _index(src_starts), _index(lengths), _index(dst_starts)
        if not ss.size == ln.size == ds.size:
            raise ValueError(f"{ss.size} starts, {ln.size} lengths and {ds.size} destinations")
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_copy_rows(
            s.ctypes.data, s.size, ss.ctypes.data, sk, ln.ctypes.data, lk, ln.size, d.ctypes.data, d.size,
            ds.ctypes.data, dk, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "copy_rows", bad.value)

    def pack_rows(self, src: Any, starts: Any, lengths: Any, dst: UInt8Array, offsets: np.ndarray) -> None:
        s, d = _bytes_in(src), _bytes_out(dst)
        (ss, sk), (ln, lk) = _index(starts), _index(lengths)
        if ss.size != ln.size or offsets.shape != (ln.size + 1,):
            raise ValueError(f"{ss.size} starts, {ln.size} lengths and {offsets.shape} offsets")
        kind = _OUT_KINDS.get(offsets.dtype)
        if kind is None or not (offsets.flags.c_contiguous and offsets.flags.writeable):
            raise TypeError(f"offsets must be a writeable contiguous uint32 or int64 array, got {offsets.dtype}")
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_pack_rows(
            s.ctypes.data, s.size, ss.ctypes.data, sk, ln.ctypes.data, lk, ln.size, d.ctypes.data, d.size,
            offsets.ctypes.data, kind, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "pack_rows", bad.value)

    def utf8_first_invalid(self, data: Any, bounds: Any) -> int:
        a = _bytes_in(data)
        b, kind = _index(bounds)
        if not b.size:
            raise ValueError("bounds must hold n + 1 offsets")
        row = ctypes.c_int64(-1)
        n = b.size - 1
        code = self._lib.rd_utf8_first_invalid(a.ctypes.data, a.size, b.ctypes.data, kind, n, ctypes.byref(row))
        _check(code, "utf8_first_invalid")
        return int(row.value)

    def lines_bad(self, buf: Any, starts: Any, ends: Any) -> int:
        a, s, e = _bytes_in(buf), _i64(starts), _i64(ends)
        if s.size != e.size:
            raise ValueError(f"{s.size} starts and {e.size} ends")
        row = ctypes.c_int64(-1)
        code = self._lib.rd_lines_bad(a.ctypes.data, a.size, s.ctypes.data, e.ctypes.data, s.size, ctypes.byref(row))
        _check(code, "lines_bad", row.value)
        return int(row.value)

    def permute_cells(self, n: int, rows: int, col_bits: int, keys: Sequence[int], positions: Any) -> Int64Array:
        pos = _i64(positions)
        k = np.asarray(keys, np.uint32)
        out = np.empty(pos.size, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_permute(
            n, rows, col_bits, k.ctypes.data, k.size, pos.ctypes.data, pos.size, out.ctypes.data, ctypes.byref(bad)
        )
        if code == _ERANGE:
            raise ValueError(f"position {int(pos[bad.value])} is outside [0, {n})")
        _check(code, "permute_cells")
        return out

    def check_lines(self, buf: Any, at: Any, starts: Any, lengths: Any, file_size: int, bom: bool) -> int:
        a, r, s, ln = _bytes_in(buf), _i64(at), _i64(starts), _i64(lengths)
        if not r.size == s.size == ln.size:
            raise ValueError(f"{r.size} places, {s.size} starts and {ln.size} lengths")
        row = ctypes.c_int64(-1)
        code = self._lib.rd_check_lines(
            a.ctypes.data, a.size, r.ctypes.data, s.ctypes.data, ln.ctypes.data, s.size, file_size, int(bom),
            ctypes.byref(row),
        )  # fmt: skip
        _check(code, "check_lines", row.value)
        return int(row.value)

    def bucket_order(self, keys: Any, buckets: int, dtype: Any = np.int64) -> tuple[np.ndarray, Int64Array]:
        k = np.ascontiguousarray(_reference.checked_keys(keys, buckets, dtype))
        kind = _OUT_KINDS[np.dtype(dtype)]
        out, counts = np.empty(k.size, dtype), np.empty(buckets, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_bucket_order(
            k.ctypes.data, k.size, buckets, out.ctypes.data, kind, counts.ctypes.data, ctypes.byref(bad)
        )
        if code == _ERANGE:
            raise ValueError(f"key {int(k[bad.value])} (item {bad.value}) is not below buckets ({buckets})")
        _check(code, "bucket_order")
        return out, counts

    def pack_runs(self, costs: Any, bounds: Any, limit: int, fill: Any) -> tuple[UInt8Array, Int64Array]:
        c, b, limit, f = _reference.packed_args(costs, bounds, limit, fill)
        starts, totals = np.empty(c.size, np.uint8), np.empty(f.size, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_pack_runs(
            c.ctypes.data, c.size, b.ctypes.data, f.size, limit, f.ctypes.data, starts.ctypes.data,
            totals.ctypes.data, ctypes.byref(bad),
        )  # fmt: skip
        if code == _ERANGE:
            raise ValueError(f"cost {int(c[bad.value])} of item {bad.value} is outside [0, {limit}]")
        _check(code, "pack_runs")
        return starts, totals

    def split_costs(self, costs: Any, offsets: Any, world: int) -> Int64Array:
        c, off, world = _reference.split_args(costs, offsets, world)
        longest = int(np.diff(off).max()) if off.size > 1 else 0
        scratch, totals, order = np.empty(4 * longest, np.int64), np.empty(world, np.int64), np.empty(world, np.int64)
        out = np.empty(c.size, np.int64)
        code = self._lib.rd_split_costs(
            c.ctypes.data, c.size, off.ctypes.data, off.size - 1, world, scratch.ctypes.data, scratch.size,
            totals.ctypes.data, order.ctypes.data, out.ctypes.data,
        )  # fmt: skip
        _check(code, "split_costs")
        return out

    def gather_lines(
        self,
        buf: Any,
        shift: int,
        starts: Any,
        rows: Any,
        bounds: Any,
        dst: UInt8Array,
        file_size: int,
        bom: bool,
    ) -> int:
        a, d, st = _bytes_in(buf), _bytes_out(dst), _i64(starts)
        (r, rk), (b, bk) = _index(rows), _index(bounds)
        if st.size != r.size:
            raise ValueError(f"{st.size} starts and {r.size} rows")
        if shift < 0:
            raise ValueError(f"shift must be >= 0, got {shift}")
        row = ctypes.c_int64(-1)
        code = self._lib.rd_gather_lines(
            a.ctypes.data, a.size, shift, st.ctypes.data, r.ctypes.data, rk, r.size, b.ctypes.data, bk, b.size,
            d.ctypes.data, d.size, file_size, int(bom), ctypes.byref(row),
        )  # fmt: skip
        _check(code, "gather_lines", row.value)
        return int(row.value)

    def route_items(
        self, items: Any, owned: Any, rounds: int, per_round: int, check: bool, req: Any
    ) -> tuple[Int64Array, np.ndarray, np.ndarray] | None:
        it, own = _i64(items), _i64(owned)
        w, n = own.size - 1, it.size
        if w < 1:
            raise ValueError("owned must hold at least two offsets")
        total = int(own[-1])
        # A bit a sample of a round of a slice (the kernel checks a group of requests at a time), where
        # that is no more than 8 bytes an item; else numpy's sort finds a repeat.
        seen = np.zeros(0, np.uint8)
        if check and n > 1:
            span = min(per_round, int(np.diff(own).max()))
            if span <= 64 * n:
                seen = np.zeros(-(-span // 8), np.uint8)
            elif np.unique(it).size < n:
                return None
        counts = np.empty(w * rounds, np.int64)
        order = np.empty(n, np.int32 if n < 1 << 31 else np.int64)
        request = np.empty(n, req)
        req_kind = _OUT_KINDS.get(request.dtype)
        if req_kind is None:
            raise TypeError(f"requests must be uint32 or int64, got {request.dtype}")
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_route(
            it.ctypes.data, n, own.ctypes.data, w, rounds, per_round, seen.ctypes.data if seen.size else None,
            seen.size, counts.ctypes.data, order.ctypes.data, _KINDS[order.dtype], request.ctypes.data, req_kind,
            ctypes.byref(bad),
        )  # fmt: skip
        if code == _EREPEAT:
            return None
        if code == _ERANGE:
            raise ValueError(f"route_items: sample {int(it[bad.value])} is outside [0, {total}) or its rounds")
        _check(code, "route_items")
        return counts, order, request

    def scatter_bounds(self, lengths: Any, order: Any, counts: Any, bounds: np.ndarray) -> Int64Array:
        (ln, lk), (od, ok), c = _index(lengths), _index(order), _i64(counts)
        kind = _OUT_KINDS.get(bounds.dtype)
        if kind is None or bounds.ndim != 1 or not (bounds.flags.c_contiguous and bounds.flags.writeable):
            raise TypeError(f"bounds must be a writeable contiguous uint32 or int64 array, got {bounds.dtype}")
        if ln.size != od.size or bounds.size != od.size + 1:
            raise ValueError(f"{ln.size} lengths, {od.size} items and {bounds.size} bounds")
        sums = np.empty(c.size, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_scatter_bounds(
            ln.ctypes.data, lk, od.ctypes.data, ok, od.size, c.ctypes.data, c.size, bounds.ctypes.data, kind,
            sums.ctypes.data, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "scatter_bounds", bad.value)
        return sums

    def pack_requests(
        self,
        src: Any,
        lo: int,
        starts: Any,
        lengths: Any,
        rows: Any,
        at: Any,
        counts: Any,
        head: int,
        status: int,
        send: UInt8Array | None = None,
    ) -> Int64Array:
        s = _bytes_in(src)
        (st, sk), (ln, lk), (rw, rk), a, c = _index(starts), _index(lengths), _index(rows), _i64(at), _i64(counts)
        if rw.size != ln.size or a.size != c.size:
            raise ValueError(f"{rw.size} rows and {ln.size} lengths; {a.size} ranges and {c.size} counts")
        d = None if send is None else _bytes_out(send)
        sizes = np.empty(c.size, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_pack_requests(
            s.ctypes.data, s.size, lo, st.ctypes.data, sk, ln.ctypes.data, lk, st.size, rw.ctypes.data, rk, rw.size,
            a.ctypes.data, c.ctypes.data, c.size, head, status, None if d is None else d.ctypes.data,
            0 if d is None else d.size, sizes.ctypes.data, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "pack_requests", bad.value)
        return sizes

    def place_lines(
        self,
        got: Any,
        parts: Any,
        order: Any,
        at: Any,
        counts: Any,
        head: int,
        bounds: Any,
        data: UInt8Array,
    ) -> None:
        g, d = _bytes_in(got), _bytes_out(data)
        p, (od, ok), a, c, (b, bk) = _i64(parts), _index(order), _i64(at), _i64(counts), _index(bounds)
        if not p.size == a.size == c.size or not b.size:
            raise ValueError(f"{p.size} parts, {a.size} ranges and {c.size} counts; {b.size} bounds")
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_place_lines(
            g.ctypes.data, g.size, p.ctypes.data, od.ctypes.data, ok, od.size, a.ctypes.data, c.ctypes.data, c.size,
            head, b.ctypes.data, bk, b.size - 1, d.ctypes.data, d.size, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "place_lines", bad.value)

    def copy_lines(
        self, src: Any, lo: int, starts: Any, request: Any, rows: Any, bounds: Any, data: UInt8Array
    ) -> None:
        s, d = _bytes_in(src), _bytes_out(data)
        (st, sk), (rq, qk), (rw, rk), (b, bk) = _index(starts), _index(request), _index(rows), _index(bounds)
        if rq.size != rw.size or not b.size:
            raise ValueError(f"{rq.size} requests and {rw.size} rows; {b.size} bounds")
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_copy_lines(
            s.ctypes.data, s.size, lo, st.ctypes.data, sk, st.size, rq.ctypes.data, qk, rw.ctypes.data, rk, rw.size,
            b.ctypes.data, bk, b.size - 1, d.ctypes.data, d.size, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "copy_lines", bad.value)

    def verify_lines(
        self, buf: Any, offset: int, last: bool, starts: Any, base: int, lengths: Any
    ) -> tuple[int, int, bool]:
        a, (st, sk), (ln, lk) = _bytes_in(buf), _index(starts), _index(lengths)
        if st.size != ln.size:
            raise ValueError(f"{st.size} starts and {ln.size} lengths")
        result = np.zeros(2, np.int64)
        bad = ctypes.c_int64(-1)
        code = self._lib.rd_verify_lines(
            a.ctypes.data, a.size, offset, int(bool(last)), st.ctypes.data, sk, base, ln.ctypes.data, lk, st.size,
            result.ctypes.data, ctypes.byref(bad),
        )  # fmt: skip
        _check(code, "verify_lines")
        return int(bad.value), int(result[0]), bool(result[1])

    def line_fields(
        self,
        buf: Any,
        first: int,
        second: int,
        out_first: UInt32Array,
        out_second: UInt32Array,
    ) -> tuple[int, int]:
        a = _bytes_in(buf)
        for out in (out_first, out_second):
            if not isinstance(out, np.ndarray) or out.dtype != np.uint32 or out.ndim != 1:
                raise TypeError("the outputs must be 1-D uint32 arrays")
            if not (out.flags.c_contiguous and out.flags.writeable):
                raise ValueError("the outputs must be writeable contiguous arrays")
        if out_first.size != out_second.size:
            raise ValueError(f"{out_first.size} and {out_second.size} outputs")
        if first < 0 or second < 0:
            raise ValueError(f"field positions must be >= 0, got {first} and {second}")
        result = np.zeros(2, np.int64)
        code = self._lib.rd_line_fields(
            a.ctypes.data, a.size, first, second, out_first.ctypes.data, out_second.ctypes.data, out_first.size,
            result.ctypes.data,
        )  # fmt: skip
        _check(code, "line_fields")
        return int(result[0]), int(result[1])
