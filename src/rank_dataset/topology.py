"""Rank and world size discovery, in one place."""

from __future__ import annotations

import os

from rank_dataset._checks import check_int

__all__ = ["get_rank_world_size"]


def _from_process_group() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # the server and index tools run without torch
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_env() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        raise ValueError(f"RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None


def get_rank_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the explicit arguments, else an initialised torch.distributed process
    group, else the RANK and WORLD_SIZE environment variables, else ``(0, 1)``.

    An argument left as None is taken from the first source that has it.

    Raises:
        ValueError: world_size < 1, or rank outside [0, world_size).

    Examples:
        >>> get_rank_world_size(rank=2, world_size=4)
        (2, 4)
    """
    found = None
    if rank is None or world_size is None:
        found = _from_process_group() or _from_env() or (0, 1)
    r = rank if rank is not None else found[0]  # type: ignore[index]
    w = world_size if world_size is not None else found[1]  # type: ignore[index]
    check_int("world_size", w, low=1)
    check_int("rank", r, low=0, high=w, high_name="world_size")
    return int(r), int(w)
