"""The per-line kernels, one dispatch: the native library (``_kernels.c``, by ctypes) where it loads, else its
numpy reference (:mod:`rank_dataset.core._reference`), with the same functions, arguments and results.

``RANK_DATASET_NATIVE`` picks them once, at the first use: ``auto`` (the library, else numpy with a
:class:`RuntimeWarning` saying why), ``0`` (numpy) or ``require`` (the library, else an :class:`ImportError`
saying why); ``RANK_DATASET_NATIVE_LIB`` names another build (the sanitizer's). ``FUSED``: whether
:func:`check_lines` and :func:`gather_lines` check a window's rows, newlines inside them included, in one pass.

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
        open_files,
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

#: :func:`open_files`' statuses of a file (see the reference's).
OPEN_HIT, OPEN_MISS, OPEN_NOT_FILE = _reference.OPEN_HIT, _reference.OPEN_MISS, _reference.OPEN_NOT_FILE
#: The environment variable that picks the kernels: ``auto``, ``0`` or ``require``.
MODE_ENV = "RANK_DATASET_NATIVE"
_MODES = ("auto", "0", "require")
#: This module's name of each kernel -> the kernel objects' (whose byte searches look for a newline by default).
_KERNELS = {name: name for name in __all__ if name[0].islower() and name not in ("describe", "mix32")}
_KERNELS |= {"FUSED": "FUSED", "count_newlines": "count_byte", "find_newlines": "find_byte"}

_STATE: tuple[Any, str] | None = None
_LOCK = threading.Lock()


def _state() -> tuple[Any, str]:
    """``(kernels, description)``, decided once per process (locked: first uses may come from many threads)."""
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
