"""The kernel tests' two fixtures: the native library, and either path called the same way.

With ``RANK_DATASET_NATIVE=require`` (``make test-asan``) a library that does not load fails the tests that
ask for it instead of skipping them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from rank_dataset.core import _reference as ref
from rank_dataset.core._native_lib import Kernels, load


def _native() -> Kernels:
    try:
        return load()
    except (OSError, RuntimeError) as exc:
        if os.environ.get("RANK_DATASET_NATIVE") == "require":
            raise
        pytest.skip(f"the native kernels are not built: {exc}")


@pytest.fixture(scope="module")
def kernels() -> Kernels:
    """The native library's kernels; skips where it is not built (fails under ``require``)."""
    return _native()


@pytest.fixture(params=[pytest.param("numpy", marks=pytest.mark.no_library), "native"])
def impl(request: pytest.FixtureRequest) -> Any:
    """Either path, called the same way: the reference module or the library's kernels (the sanitizer run,
    make test-asan, takes the library's side only)."""
    return ref if request.param == "numpy" else _native()
