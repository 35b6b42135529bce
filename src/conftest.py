"""The doctests of the package's docstrings (collected from src/, not shipped in the wheel).

Each runs with its own temporary directory as ``tempfile``'s default and its own index cache, so the files its
example writes (``tempfile.mkdtemp()``) go with pytest's temporary directories instead of piling up in /tmp.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _doctest_files_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))
