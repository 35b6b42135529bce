"""The per-line kernels: the native library (``_kernels.c``, loaded with ctypes) where it loads, else its
numpy reference (:mod:`rank_dataset.core._reference`), with the same functions, arguments and results.

``RANK_DATASET_NATIVE`` picks them, once, at the first use of a kernel: ``auto`` (the default: the library,
else numpy with a :class:`RuntimeWarning` saying why), ``0`` (numpy) or ``require`` (the library, or an
:class:`ImportError` saying why it cannot load). ``RANK_DATASET_NATIVE_LIB`` names another build of the
library (the sanitizer build). ``FUSED``: whether :func:`check_lines` and :func:`gather_lines` check a
window's rows in one pass, newlines inside rows included. :func:`describe` says which kernels run.

Examples:
    >>> import numpy as np
    >>> from rank_dataset.core import native
    >>> native.count_newlines(np.frombuffer(b"a\\nb\\n", np.uint8))
    2
"""

from __future__ import annotations

import array
import os
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rank_dataset.core import _reference
from rank_dataset.core._reference import BLANK, BOM, CR, MARK, NEWLINE, LineScan, mix32

if TYPE_CHECKING:  # the names each kernel object has, with its reference's signature
    from rank_dataset.core._reference import (
        FUSED,
        bucket_order,
        check_lines,
        copy_lines,
        copy_rows,
        gather_lines,
        line_fields,
        lines_bad,
        pack_requests,
        pack_rows,
        pack_runs,
        permute_cells,
        place_lines,
        route_items,
        scan_lines,
        scatter_bounds,
        split_costs,
        utf8_first_invalid,
        verify_lines,
    )
    from rank_dataset.core._reference import count_byte as count_newlines
    from rank_dataset.core._reference import find_byte as find_newlines

__all__ = [
    "BLANK",
    "BOM",
    "CR",
    "FUSED",
    "MARK",
    "MODE_ENV",
    "NEWLINE",
    "OPEN_HIT",
    "OPEN_MISS",
    "OPEN_NOT_FILE",
    "LineScan",
    "bucket_order",
    "check_lines",
    "copy_lines",
    "copy_rows",
    "count_newlines",
    "describe",
    "find_newlines",
    "gather_lines",
    "line_fields",
    "lines_bad",
    "mix32",
    "open_files",
    "pack_requests",
    "pack_rows",
    "pack_runs",
    "permute_cells",
    "place_lines",
    "route_items",
    "scan_lines",
    "scatter_bounds",
    "split_costs",
    "utf8_first_invalid",
    "verify_lines",
]

#: The environment variable that picks the kernels: ``auto``, ``0`` or ``require``.
MODE_ENV = "RANK_DATASET_NATIVE"
_MODES = ("auto", "0", "require")
#: This module's name of each kernel -> the kernel objects' (whose byte searches look for a newline by default).
_KERNELS = {name: name for name in __all__ if name[0].islower() and name not in ("describe", "mix32", "open_files")}
_KERNELS |= {"FUSED": "FUSED", "count_newlines": "count_byte", "find_newlines": "find_byte"}

_STATE: tuple[Any, str] | None = None
_LOCK = threading.Lock()


def _state() -> tuple[Any, str]:
    """``(kernels, description)``, decided once per process (under a lock: the first uses may come
    from several threads at once, and the warning is given once)."""
    global _STATE
    if _STATE is None:
        with _LOCK:
            if _STATE is None:
                _STATE = _decide()
    return _STATE


def _decide() -> tuple[Any, str]:
    mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{MODE_ENV} must be one of {', '.join(_MODES)}, got {mode!r}")
    if mode == "0":
        return _reference, f"numpy ({MODE_ENV}=0)"
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
        return _reference, f"numpy ({why})"
    source = kernels.path.with_name("_kernels.c")  # a clone's (a wheel ships the library alone)
    if source.is_file() and source.stat().st_mtime > kernels.path.stat().st_mtime:
        warnings.warn(
            f"{kernels.path} is older than {source.name}: rebuild it (`make native`, or pip install -e . again)",
            RuntimeWarning,
            stacklevel=4,
        )
    return kernels, f"native ({kernels.path})"


#: :func:`open_files`' status of a file: open and its pages in the page cache; open (not known to be); not a
#: regular file (closed). Any other status is ``-errno`` of the open (nothing left open).
OPEN_HIT, OPEN_MISS, OPEN_NOT_FILE = 0, 1, 2


def open_files(dirfd: int, names: Sequence[str], probe_max: int) -> array.array[int] | None:
    """Open each of ``names`` (relative paths) beneath the directory ``dirfd`` in one call of the native
    library: a symlink that stays under the directory is followed, one that leaves it, an absolute one, a
    ``..`` above it or a magic link is refused (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS``;
    the last component is never a symlink); a regular file of at most ``probe_max`` bytes (< 0: none) has its
    last byte read without waiting for a disk (``RWF_NOWAIT``), which tells a page-cache hit. An int64 array
    ``out`` of ``3 * len(names)``: file ``i``'s descriptor at ``out[i]`` (-1: none; the others are the caller's
    to close), its size at ``out[n + i]`` and its status at ``out[2n + i]`` (:data:`OPEN_HIT`, ...). None where
    it cannot (the kernels run on numpy, the library lacks it, not Linux, no ``openat2``): nothing was opened,
    and the caller opens the files itself.

    Raises:
        ValueError: a name is empty or holds a NUL byte.
    """
    kernels = _state()[0]
    if kernels is _reference:  # (the numpy reference has no such kernel: the caller's own walk is the reference)
        return None
    found: array.array[int] | None = kernels.open_files(dirfd, names, probe_max)
    return found


def describe() -> str:
    """The kernels in use and why, in a line: ``native (<library>)`` or ``numpy (<reason>)``."""
    return _state()[1]


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """A kernel of the object :func:`describe` names (looked up once: a name of this module from then on)."""
        kernel = _KERNELS.get(name)
        if kernel is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        found = globals()[name] = getattr(_state()[0], kernel)
        return found
