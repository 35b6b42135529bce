"""The bed's fixture: a multi-host bed for the module (``RANK_DATASET_BED=KxL``: K hosts of L ranks, 2x2 by
default), skipped with the reason where this machine cannot make one."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from multihost.bed import Bed, Size, Unavailable, check_available


@pytest.fixture(scope="module")
def size() -> Size:
    text = os.environ.get("RANK_DATASET_BED", "2x2")
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None or min(int(m.group(1)), int(m.group(2))) < 1:
        raise ValueError(f"RANK_DATASET_BED must be HOSTSxRANKS (e.g. 4x2), got {text!r}")
    return Size(int(m.group(1)), int(m.group(2)))


@pytest.fixture(scope="module")
def bed(size: Size) -> Iterator[Bed]:
    """A bed of ``size.hosts`` hosts and a store host, removed after the module's tests."""
    pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")
    try:
        check_available()
        made = Bed(size.hosts)
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield made
    finally:
        made.close()
