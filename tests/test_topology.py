from __future__ import annotations

import pytest

from rank_dataset.topology import get_rank_world_size


def test_order_of_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert get_rank_world_size() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert get_rank_world_size() == (2, 4)
    assert get_rank_world_size(rank=1) == (1, 4)
    assert get_rank_world_size(rank=0, world_size=1) == (0, 1)


def test_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="RANK='x' and WORLD_SIZE='4' must be integers"):
        get_rank_world_size()
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        get_rank_world_size(2, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        get_rank_world_size(0, 0)
