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

import os
import threading
import warnings
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
_KERNELS = {name: name for name in __all__ if name[0].islower() and name not in ("describe", "mix32")}
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
