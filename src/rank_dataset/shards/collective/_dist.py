"""Every torch.distributed call of the collective reader: its gloo group, the collectives on it, and the
words of :class:`CollectiveError`, which a failed or timed-out one raises.

The one module of :mod:`rank_dataset.shards` that imports torch (excepted by name in the no-torch
contract of pyproject.toml), and only inside its functions: importing the collective reader imports no
torch; making one (which needs an initialised process group) does.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.threads import wait_released
from rank_dataset.errors import CollectiveError

__all__ = ["CollectiveError", "Collectives", "from_rank0", "require_process_group"]


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
        # Every tensor handed to gloo, weakly: none may outlive the call that made it (see _settle).
        self._handed: list[weakref.ref[Any]] = []

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
        return self._all_gather(np.ascontiguousarray(values, np.int64), name)

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
        self._settle([mine, out])
        got: npt.NDArray[Any] = out.numpy().view(kind)
        return got

    def all_gather_object(self, mine: Any, name: str) -> list[Any]:
        """Every rank's ``mine`` (any picklable object), in rank order: its pickle's size, then its
        bytes, each an all-gather of tensors this reader made (not torch's object collectives, whose
        tensors this reader could not see let go: see :meth:`_settle`)."""
        data = np.frombuffer(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = self.all_gather(np.array([data.size], np.int64), name)[:, 0]
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        every = self._all_gather(padded, name)
        return [pickle.loads(every[r, : int(sizes[r])].tobytes()) for r in range(self.world_size)]

    def broadcast(self, objects: list[Any], name: str) -> None:
        """Replace ``objects`` (picklable, as many on every rank) with rank 0's, in place: their
        pickle's size, then its bytes, each a broadcast of tensors this reader made."""
        import torch

        data = np.frombuffer(pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        size = torch.tensor([data.size], dtype=torch.int64)
        self._broadcast(size, name)
        got = torch.from_numpy(data.copy()) if self.rank == 0 else torch.empty(int(size[0]), dtype=torch.uint8)
        self._broadcast(got, name)
        if self.rank != 0:
            objects[:] = pickle.loads(got.numpy().tobytes())

    def _broadcast(self, tensor: Any, name: str) -> None:
        import torch.distributed as dist

        with self.named(name):
            dist.broadcast(tensor, group_src=0, group=self.group)
        self._settle([tensor])

    def _all_gather(self, values: npt.NDArray[Any], name: str) -> npt.NDArray[Any]:
        """``(world_size, len(values))``: every rank's contiguous ``values`` (one dtype and length on every rank)."""
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(values)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        with self.named(name):
            dist.all_gather(out, mine, group=self.group)
        self._settle([mine, *out])
        return torch.stack(out).numpy()

    def _settle(self, tensors: list[Any]) -> None:
        """Return once gloo has let go of ``tensors`` (handed to a collective that has returned), so that
        no gloo thread frees them, which at a rank's exit aborts the process (see
        :func:`~rank_dataset.core.threads.wait_released`); noted, weakly, for :meth:`pending`."""
        wait_released(tensors)
        self._handed = [ref for ref in self._handed if ref() is not None]
        self._handed.extend(weakref.ref(t) for t in tensors)

    def pending(self) -> int:
        """Tensors this reader handed to gloo that are still alive (0 once no caller holds what a
        collective returned: then no gloo thread holds anything of this reader's)."""
        self._handed = [ref for ref in self._handed if ref() is not None]
        return len(self._handed)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (in a DataLoader worker) runs no collective: the group cannot be pickled.
        return {**self.__dict__, "group": None, "_handed": []}

    def close(self) -> None:
        """Let go of the gloo group: where this made it for itself, it is destroyed and this holds no
        reference to it, so that its threads are joined here, in this thread, while the interpreter
        runs (not at the interpreter's exit); the reader then cannot build. Nothing is in flight: every
        collective has returned and gloo has let go of its tensors before it returned."""
        group, self.group = self.group, None
        if group is not None and self._owns_group:
            import torch.distributed as dist

            # destroy_process_group() (every group) may have destroyed it already: then dropping this
            # reference is what frees it
            with contextlib.suppress(ValueError, RuntimeError):
                dist.destroy_process_group(group)
        del group


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


def from_rank0(
    net: Collectives, make: Callable[[], Any], name: str, errors: tuple[type[BaseException], ...] = ()
) -> Any:
    """``make()`` run on rank 0 and its value sent to every rank of ``net``; an error of ``errors`` it raises
    is sent instead and raised on every rank."""
    found: list[Any] = [None]
    if net.rank == 0:
        try:
            found[0] = make()
        except errors as exc:
            found[0] = exc
    net.broadcast(found, name)
    if isinstance(found[0], BaseException):
        raise found[0]
    return found[0]
