"""The summary's collective: an all-gather of each rank's row on the dataset's gloo group.

The group: the collective reader's own gloo group when the dataset reads with it; else the dataset's process
group (``group=``, default the world) when it has a CPU backend (gloo, or ``"cpu:gloo,cuda:nccl"``); else a
gloo group over the same ranks, made here (every rank makes its monitor together) and destroyed at
:meth:`Gatherer.close`. Without a process group the table is this rank's row alone.

The all-gather is gloo's ``gather`` to the group's first rank and a ``broadcast`` of the table: two rounds of
messages whatever the world size, where gloo's ``all_gather`` is a ring of ``W - 1`` rounds (``ring=True``
keeps the ring, for comparison).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.training._agree import agreement_needed, collective_device

__all__ = ["Gatherer"]


class Gatherer:
    """Gathers the rows of every rank of the dataset's group, in rank order."""

    def __init__(self, dataset: Any, *, ring: bool = False) -> None:
        self.ring = ring
        self.group: Any = None
        self._owned = False
        self.rank, self.world_size = 0, 1
        if not agreement_needed():  # no process group (or a DataLoader worker): this rank alone
            return
        import torch.distributed as dist

        group = getattr(dataset.reader, "group", None)  # the collective reader's gloo group
        if group is None:
            group = getattr(dataset, "process_group", None)  # the group the dataset's ranks plan in
            if collective_device(group).type != "cpu":  # the rows are gathered on the CPU
                ranks = None if group is None else dist.get_process_group_ranks(group)
                group, self._owned = dist.new_group(ranks=ranks, backend="gloo"), True
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self._root = 0 if group is None else dist.get_global_rank(group, 0)  # the group's first, as a global rank

    def __call__(self, row: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The rows of every rank (shape ``(world_size, len(row))``): a collective under a process group."""
        if self.world_size == 1 and self.group is None:
            return row.reshape(1, -1)
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.ascontiguousarray(row, dtype=np.float64))
        if self.ring:
            out = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(out, mine, group=self.group)
            return torch.stack(out).numpy()
        table = torch.empty((self.world_size, mine.numel()), dtype=torch.float64)
        rows = list(table.unbind(0)) if self.rank == 0 else None
        dist.gather(mine, rows, dst=self._root, group=self.group)
        dist.broadcast(table, src=self._root, group=self.group)
        return table.numpy()

    def close(self) -> None:
        if self._owned and self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
        self.group, self._owned = None, False
