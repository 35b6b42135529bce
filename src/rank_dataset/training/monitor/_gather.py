"""The summary's one collective: an all-gather of each rank's row on the dataset's gloo group.

The group: the collective reader's own gloo group when the dataset reads with it; else the dataset's process
group (``group=``, default the world) when it has a CPU backend (gloo, or ``"cpu:gloo,cuda:nccl"``); else a
gloo group over the same ranks, made here (every rank makes its monitor together) and destroyed at
:meth:`Gatherer.close`. A row is a fixed number of float64 (``len(FIELDS)``), so ranks meet in one
all-gather of a few hundred bytes each; without a process group the table is this rank's row alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.training._agree import agreement_needed

__all__ = ["Gatherer"]


class Gatherer:
    """Gathers the rows of every rank of the dataset's group, in rank order."""

    def __init__(self, dataset: Any) -> None:
        self.group: Any = None
        self._owned = False
        self.rank, self.world_size = 0, 1
        if not agreement_needed():  # no process group (or a DataLoader worker): this rank alone
            return
        import torch.distributed as dist

        group = getattr(dataset.reader, "group", None)  # the collective reader's gloo group
        if group is None:
            group = getattr(dataset, "_process_group", None)
            if not _has_cpu_backend(dist, group):
                ranks = None if group is None else dist.get_process_group_ranks(group)
                group, self._owned = dist.new_group(ranks=ranks, backend="gloo"), True
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def __call__(self, row: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The rows of every rank (shape ``(world_size, len(row))``): a collective under a process group."""
        if self.world_size == 1 and self.group is None:
            return row.reshape(1, -1)
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.ascontiguousarray(row, dtype=np.float64))
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self.group)
        return torch.stack(out).numpy()

    def close(self) -> None:
        if self._owned and self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
        self.group, self._owned = None, False


def _has_cpu_backend(dist: Any, group: Any) -> bool:
    try:
        config = str(dist.get_backend_config(group))
    except AttributeError:  # torch < 2.2: the bare backend name
        config = str(dist.get_backend(group))
    return "gloo" in config
