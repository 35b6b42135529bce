"""Every torch.distributed call of the collective reader: its gloo group, the collectives on it, and the
words of :class:`CollectiveError`, which a failed or timed-out one raises.

The one module of :mod:`rank_dataset.shards` that imports torch (excepted by name in the no-torch
contract of pyproject.toml), and only inside its functions: importing the collective reader imports no
torch; making one (which needs an initialised process group) does.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CollectiveError

__all__ = ["CollectiveError", "Collectives", "require_process_group"]


def require_process_group() -> None:
    """Raise ValueError unless torch.distributed has an initialised process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "reader='collective' needs an initialised torch.distributed process group (the ranks read the "
            "files together): call torch.distributed.init_process_group first, or use reader='file'"
        )


class Collectives:
    """The collectives of one reader, on a gloo group over the ranks of ``group`` (default: the world),
    each named: its failure or timeout raises :class:`CollectiveError` naming it and :attr:`epoch`.

    Args:
        group: the process group whose ranks share the reading.
        timeout: how long a collective waits for every rank (None: torch's default).
    """

    def __init__(self, group: Any, timeout: datetime.timedelta | None) -> None:
        import torch.distributed as dist

        self.timeout = timeout
        #: The epoch being built, named in a collective's error (None: the reader is being made).
        self.epoch: int | None = None
        self.group, self._owns_group = _gloo_group(group, timeout)
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)

    @contextlib.contextmanager
    def named(self, name: str) -> Iterator[None]:
        """Collectives run on :attr:`group` inside: their failure raises :class:`CollectiveError` naming ``name``."""
        try:
            yield
        except RuntimeError as exc:
            epoch = "while the dataset was being made" if self.epoch is None else f"of epoch {self.epoch}"
            timeout = "torch's default" if self.timeout is None else str(self.timeout)
            raise CollectiveError(
                f"the collective reader's exchange of {name} {epoch} did not complete on every one of the "
                f"{self.world_size} ranks of its group: a rank died, or did not call set_epoch (or "
                f"load_state_dict) with the others within the timeout ({timeout})"
            ) from exc

    def all_gather(self, values: npt.NDArray[np.int64], name: str) -> npt.NDArray[np.int64]:
        """``(world_size, len(values))``: every rank's ``values`` (of one length on every rank)."""
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.ascontiguousarray(values, np.int64))
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        with self.named(name):
            dist.all_gather(out, mine, group=self.group)
        return torch.stack(out).numpy()

    def all_to_all(
        self,
        values: npt.NDArray[Any],
        splits: npt.NDArray[np.int64],
        name: str,
        out_splits: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[Any]:
        """``values`` cut by ``splits`` sent one part to each rank; what each rank sent here, in rank
        order (``out_splits`` of it; default: ``splits``)."""
        import torch
        import torch.distributed as dist

        out_splits = splits if out_splits is None else out_splits
        values = np.ascontiguousarray(values)
        kind = values.dtype
        if kind.kind == "u" and kind.itemsize > 1:  # gloo carries signed integers: the same bits
            values = values.view(f"i{kind.itemsize}")
        mine = torch.from_numpy(values)
        out = torch.empty(int(out_splits.sum()), dtype=mine.dtype)
        with self.named(name):
            dist.all_to_all_single(out, mine, out_splits.tolist(), splits.tolist(), group=self.group)
        got: npt.NDArray[Any] = out.numpy().view(kind)
        return got

    def all_gather_object(self, mine: Any, name: str) -> list[Any]:
        """Every rank's ``mine`` (any picklable object), in rank order."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        with self.named(name):
            dist.all_gather_object(gathered, mine, group=self.group)
        return gathered

    def broadcast(self, objects: list[Any], name: str) -> None:
        """Replace ``objects`` (picklable, as many on every rank) with rank 0's, in place."""
        import torch.distributed as dist

        with self.named(name):
            dist.broadcast_object_list(objects, group_src=0, group=self.group)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (in a DataLoader worker) runs no collective: the group cannot be pickled.
        return {**self.__dict__, "group": None}

    def close(self) -> None:
        """Let go of the gloo group (freed where this made it for itself); the reader then cannot build."""
        group, self.group = self.group, None
        if group is not None and self._owns_group:
            import torch.distributed as dist

            with contextlib.suppress(Exception):  # the default group may be gone already
                dist.destroy_process_group(group)


_SUBGROUPS: dict[tuple[tuple[int, ...], datetime.timedelta | None], Any] = {}


def _gloo_group(group: Any, timeout: datetime.timedelta | None) -> tuple[Any, bool]:
    """A gloo group over the ranks of ``group`` (default: the world), and whether the caller owns it
    (frees it at close). ``group`` itself where it has a CPU gloo backend and no other timeout is
    asked for. Otherwise a new one: over the whole world, with ``new_group`` (which every rank calls,
    as every rank makes the dataset); over a subgroup, with local synchronisation (only its ranks
    call it), kept for the life of the process and shared by the datasets over the same ranks (torch
    names such a group after its ranks, so one made again over them would meet the old one's
    addresses in the store)."""
    import torch.distributed as dist

    parent = group if group is not None else dist.group.WORLD
    if timeout is None and "cpu:gloo" in _backend_config(dist, parent):
        return parent, False
    ranks = tuple(dist.get_process_group_ranks(parent))
    if len(ranks) == dist.get_world_size():
        return dist.new_group(list(ranks), timeout=timeout, backend="gloo"), True
    key = (ranks, timeout)
    if key not in _SUBGROUPS:
        _SUBGROUPS[key] = dist.new_group(list(ranks), timeout=timeout, backend="gloo", use_local_synchronization=True)
    return _SUBGROUPS[key], False


def _backend_config(dist: Any, group: Any) -> str:
    """``"cpu:gloo"``, ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl"``...: the backends of ``group``."""
    config = str(dist.get_backend_config(group))
    return config if ":" in config else {"gloo": "cpu:gloo,cuda:gloo"}.get(config, "cuda:" + config)
