"""Rank and world size discovery, in one place."""

from __future__ import annotations

import os

from rank_dataset.core.checks import check_int

__all__ = ["get_rank_world_size"]

# Environment variables naming (rank, world size), in the order they are consulted: torchrun's (and
# every launcher that imitates it), then SLURM's, for jobs started by ``srun python train.py``.
_ENV_PAIRS = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def _from_process_group() -> tuple[int, int, str] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # the server and index tools run without torch
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "the initialised process group"
    return None


def _from_env(rank_var: str, world_var: str) -> tuple[int, int, str] | None:
    rank, world = os.environ.get(rank_var), os.environ.get(world_var)
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world), f"the environment ({rank_var}={rank}, {world_var}={world})"
    except ValueError:
        raise ValueError(f"{rank_var}={rank!r} and {world_var}={world!r} must be integers") from None


_DEFAULT = (0, 1, "the default: no process group and none of " + ", ".join("/".join(pair) for pair in _ENV_PAIRS))


def get_rank_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the explicit arguments, else an initialised torch.distributed process
    group, else the ``RANK`` and ``WORLD_SIZE`` environment variables (torchrun), else
    ``SLURM_PROCID`` and ``SLURM_NTASKS`` (``srun``), else ``(0, 1)``.

    An argument left as None is taken from the first source that has it. An environment source
    counts only when both of its variables are set.

    Raises:
        ValueError: world_size < 1, rank outside [0, world_size), or a variable that is not an integer
            (the message names it).

    Examples:
        >>> get_rank_world_size(rank=2, world_size=4)
        (2, 4)
    """
    if rank is not None and world_size is not None:
        check_int("world_size", world_size, low=1)
        check_int("rank", rank, low=0, high=world_size, high_name="world_size")
        return int(rank), int(world_size)
    found = _from_process_group()
    for rank_var, world_var in _ENV_PAIRS:
        found = found or _from_env(rank_var, world_var)
    found_rank, found_world, source = found or _DEFAULT
    r = rank if rank is not None else found_rank
    w = world_size if world_size is not None else found_world
    try:
        check_int("world_size", w, low=1)
        check_int("rank", r, low=0, high=w, high_name="world_size")
    except ValueError as exc:
        taken = " and ".join(name for name, given in (("rank", rank), ("world_size", world_size)) if given is None)
        raise ValueError(f"{exc} ({taken} from {source})") from None
    return int(r), int(w)
