"""One loader per tensor-parallel group: the group's first rank iterates it, every rank of the group gets
its batches.

:func:`shared_batches` broadcasts each batch from the group's first rank: first its layout (the nested
dicts, lists and tuples, each tensor's shape and dtype, and every other leaf, pickled), then each tensor with
``broadcast``. Every tensor handed to the group is let go by gloo before the call that handed it returns
(:func:`~rank_dataset.core.threads.wait_released`). The end of the loader, or an error it raises, ends every
rank's iteration together: no rank is left waiting for a batch that never comes.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rank_dataset.core.threads import wait_released
from rank_dataset.training._agree import collective_device

__all__ = ["SharedBatches", "shared_batches"]


class _Tensor:
    """Where a tensor stood in a batch's layout: its shape and dtype; its data follows by broadcast."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Tensor, (self.shape, self.dtype))


_BATCH, _END, _ERROR = "batch", "end", "error"


class SharedBatches:
    """The batches of a loader iterated on the first rank of ``group``, on every rank of it (see
    :func:`shared_batches`, which makes one). Iterating it is a collective of the group: every rank of the
    group iterates it together, as many times."""

    def __init__(self, loader: Any, group: Any) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("shared_batches needs an initialised torch.distributed process group")
        self.group = _process_group(group)
        rank = dist.get_rank(self.group)
        if rank < 0:
            raise ValueError("this process is not a member of the group given (group=): give its own group")
        #: This rank's number in the group; rank 0 iterates the loader.
        self.rank = rank
        #: The rank (in the world) that iterates the loader.
        self.source = dist.get_global_rank(self.group, 0)
        if rank == 0 and loader is None:
            raise ValueError(
                "loader is None on the first rank of the group (group rank 0), which iterates it: give it the loader"
            )
        # Elsewhere the loader is never touched: no iterator, so no DataLoader worker starts.
        self.loader: Any = loader if rank == 0 else None
        self._device = collective_device(self.group)

    def __iter__(self) -> Iterator[Any]:
        return self._lead() if self.rank == 0 else self._follow()

    def __len__(self) -> int:
        """The loader's length, as the first rank finds it (a collective of the group)."""
        return int(self._first(lambda: len(self.loader)))

    def _lead(self) -> Iterator[Any]:
        batches = iter(self.loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as exc:  # told to the other ranks, which raise too
                self._share((_ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            tensors: list[Any] = []
            layout = _layout(batch, tensors)
            self._share((_BATCH, layout))
            if self._device.type != "cpu":
                tensors = [t.to(self._device) for t in tensors]
            for t in tensors:
                self._broadcast_data(t)
            yield batch if self._device.type == "cpu" else _rebuild(layout, iter(tensors))
        self._share((_END, None))

    def _follow(self) -> Iterator[Any]:
        while True:
            kind, what = self._share(None)
            if kind == _END:
                return
            if kind == _ERROR:
                raise RuntimeError(
                    f"the loader on rank {self.source} (the first of this tensor-parallel group) raised {what}"
                )
            yield _map_leaves(what, _Tensor, self._receive)

    def _receive(self, place: _Tensor) -> Any:
        import torch

        t = torch.empty(place.shape, dtype=place.dtype, device=self._device)
        self._broadcast_data(t)
        return t

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The first rank's resume state, the same dict on every rank of the group (a collective of the
        group): its loader's ``state_dict(*args, **kwargs)`` if it has one (torchdata's
        StatefulDataLoader), else its batch sampler's (``StepSampler.state_dict(step)``), else its
        sampler's (``ResumableSampler``). The arguments must be the same on every rank.

        Raises:
            ValueError: on every rank, if the first rank's loader has no state to save (or what its
                ``state_dict`` raised there, on every rank).
        """
        return dict(self._first(lambda: _state_holder(self.loader).state_dict(*args, **kwargs)))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the first rank's loader from ``state`` (one of :meth:`state_dict`'s, saved by any rank
        of the group), before iterating: a collective of the group, which every rank calls (the other
        ranks' ``state`` is not used).

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: on every rank, if the first rank's loader has no ``load_state_dict`` (as for
                :meth:`state_dict`), or what its ``load_state_dict`` raised there (a state of another run).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        self._first(lambda: _state_holder(self.loader).load_state_dict(state))

    def _first(self, work: Callable[[], Any]) -> Any:
        """``work()``, run on the group's first rank, its result on every rank of the group (a collective).
        What it raises there is raised on every rank: the error itself on the first, the same type (a
        ValueError or TypeError; else a RuntimeError) naming it on the others."""
        outcome: Any = None
        error: Exception | None = None
        if self.rank == 0:
            try:
                outcome = (True, work())
            except Exception as exc:  # told to the other ranks, which raise too
                error, outcome = exc, (False, (type(exc).__name__, str(exc)))
        ok, value = self._share(outcome)
        if error is not None:
            raise error
        if not ok:
            name, message = value
            kind = {"ValueError": ValueError, "TypeError": TypeError}.get(name, RuntimeError)
            raise kind(f"on rank {self.source} (the first of this tensor-parallel group): {name}: {message}")
        return value

    def _share(self, obj: Any) -> Any:
        """The first rank's ``obj`` (picklable), on every rank of the group: as ``broadcast_object_list``
        does (its pickle's size, then its bytes), but on tensors made here, which :meth:`_broadcast` sees
        gloo let go of."""
        import torch

        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self._device)
        self._broadcast(size)
        if self.rank == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._device)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self._device)
        self._broadcast(buf)
        return obj if self.rank == 0 else pickle.loads(buf.cpu().numpy().tobytes())

    def _broadcast_data(self, tensor: Any) -> None:
        """Broadcast a contiguous tensor's bytes (gloo carries few dtypes; every dtype is bytes)."""
        if tensor.numel():
            self._broadcast(tensor.reshape(-1).view(_uint8()))

    def _broadcast(self, tensor: Any) -> None:
        """Broadcast ``tensor`` from the first rank; returns once gloo has let go of it (see
        :func:`~rank_dataset.core.threads.wait_released`: at exit, a tensor freed by gloo's thread aborts
        the process)."""
        import torch.distributed as dist

        dist.broadcast(tensor, group_src=0, group=self.group)
        if tensor.device.type == "cpu":
            wait_released([tensor])


def shared_batches(loader: Any, group: Any) -> SharedBatches:
    """The batches of ``loader``, iterated on the first rank of ``group`` only, on every rank of the group.

    Every rank of ``group`` calls it and iterates the result together; each gets the same batches in the
    same order: tensors (inside dicts, lists and tuples, nested) by broadcast, other objects pickled. On
    the group's first rank (group rank 0) ``loader`` is what is iterated; on the others it is never
    touched and may be None (then that rank needs no dataset at all: no shard, no DataLoader workers, no
    file read) or the same kind of loader. Under a NCCL group (no CPU backend) the tensors travel on, and
    arrive on, the current CUDA device.

    Args:
        loader: an iterable of batches (a DataLoader); required on the group's first rank.
        group: a torch.distributed ProcessGroup (e.g. a tensor-parallel group) or a 1-D DeviceMesh
            (``mesh["tp"]``). Build the dataset on each group's first rank over the data-parallel ranks,
            ``RankDataset(..., group=mesh["dp"].get_group())`` on the ranks where ``mesh["tp"]`` is 0.

    Raises:
        ValueError: no initialised process group; a DeviceMesh of more than one dimension; this rank is
            not in ``group``; ``loader`` is None on the group's first rank.
        TypeError: ``group`` is neither a ProcessGroup nor a DeviceMesh.

    Examples:
        >>> shared_batches([1, 2], None)  # no process group: nothing to share
        Traceback (most recent call last):
        ...
        ValueError: shared_batches needs an initialised torch.distributed process group
    """
    return SharedBatches(loader, group)


def _uint8() -> Any:
    """``torch.uint8`` (torch imported on first use)."""
    import torch

    return torch.uint8


def _process_group(group: Any) -> Any:
    """The ProcessGroup of ``group`` (a ProcessGroup, or a 1-D DeviceMesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            names = group.mesh_dim_names
            raise ValueError(
                f"group must be a 1-D DeviceMesh (e.g. mesh['tp']), got one of {group.ndim} dimensions {names}"
            )
        return group.get_group()
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup or a 1-D DeviceMesh (mesh['tp']), got {type(group).__name__}")
    return group


def _state_holder(loader: Any) -> Any:
    """What holds the loader's resume state: the loader, its batch sampler or its sampler.

    Raises:
        ValueError: none of them has a ``state_dict``.
    """
    for holder in (loader, getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if holder is not None and callable(getattr(holder, "state_dict", None)):
            return holder
    raise ValueError(
        "the loader of the group's first rank has no resume state: give it a state_dict (torchdata's "
        "StatefulDataLoader), a StepSampler as batch_sampler or a ResumableSampler as sampler"
    )


def _layout(batch: Any, tensors: list[Any]) -> Any:
    """``batch`` with each tensor replaced by its :class:`_Tensor` (the tensors appended to ``tensors``, in
    order); dicts, lists and tuples (named ones too) rebuilt; any other leaf as it is (pickled)."""
    import torch

    def place(t: Any) -> _Tensor:
        t = t.detach().contiguous()
        tensors.append(t)
        return _Tensor(tuple(t.shape), t.dtype)

    return _map_leaves(batch, torch.Tensor, place)


def _map_leaves(tree: Any, leaf: type, f: Callable[[Any], Any]) -> Any:
    """``tree`` with each ``leaf`` instance replaced by ``f`` of it, visited in one order (the one both sides of
    a broadcast follow); dicts, lists and tuples (named ones too) rebuilt, anything else as it is."""
    if isinstance(tree, leaf):
        return f(tree)
    if isinstance(tree, dict):
        return type(tree)((k, _map_leaves(v, leaf, f)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple
        return type(tree)(*(_map_leaves(v, leaf, f) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_leaves(v, leaf, f) for v in tree)
    return tree


def _rebuild(layout: Any, tensors: Iterator[Any]) -> Any:
    """``layout`` with each :class:`_Tensor` replaced by the next of ``tensors``."""
    return _map_leaves(layout, _Tensor, lambda _: next(tensors))
