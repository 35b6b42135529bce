"""Check, with one small collective, that every rank plans its shard from the same inputs.

Ranks compute their shards with no communication, so two ranks that see different files (one
started before an append, one after) or different settings would silently plan over different
epochs: samples lost, others duplicated. :func:`check_ranks_agree` catches that when a process group
is initialised, and raises the same :class:`RanksDisagreeError` on every rank (so no rank hangs in
a later collective while another has failed).

The collective: each rank hashes its fields into a fixed-size int64 tensor (32 slots) and one ``all_gather``
collects them (a fixed size, so that ranks running different code still meet in the same collective; gathered,
so that the error names the ranks that differ). The tensor is on the CPU where the group has a CPU backend, else
on the current device of its first backend, as torch's object collectives do. Only when the hashes differ (on
every rank together) does an ``all_gather_object`` fetch the values themselves, to name them in the error.

torch is imported lazily: this module imports without it, and without torch there is no process
group, hence nothing to check.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from rank_dataset.core.threads import wait_released
from rank_dataset.errors import RanksDisagreeError
from rank_dataset.plan.spec import ShardSpec

__all__ = [
    "RanksDisagreeError",
    "agreement_fields",
    "agreement_needed",
    "check_ranks_agree",
    "collective_device",
    "disagreement",
]

_SLOTS = 32  # the gathered tensor's length: the field names, one slot per field, and the rank last
_SHOWN_VALUES = 8  # distinct values named in a message; more are counted
_SHOWN_RUNS = 16  # runs of consecutive ranks listed for a value; more are counted

# Set to False by benchmarks/bench_build.py only, to time builds without the check.
_ENABLED = True

_FILES_HINT = (
    "every rank must read the same meta files, with the same contents (did one change while the ranks were "
    "starting, or does a rank read another copy?)"
)
# The fields that describe the files: a disagreement on one of them names the files each rank reads.
_FILE_FIELDS = ("num_samples", "fingerprint", "files", "sizes", "formats", "columns")
_HINTS = {
    **dict.fromkeys(_FILE_FIELDS, _FILES_HINT),
    "reader": "every rank must pass the same reader=",
    "dataset": "every rank must build the same dataset class",
    "world_size": "leave world_size=None to take it from the process group",
    "is_test": "every rank must pass the same is_test",
    "resume": "every rank must load the same state_dict",
    "mix": "every rank must mix the same sources, with the same rules, in the same order, and the same epoch_size",
    "(field names)": "every rank must run the same version of rank_dataset",
}
_PLAN_HINT = "every rank must pass the same reload_cfg and call set_epoch / load_state_dict with the same arguments"


def agreement_fields(spec: ShardSpec, fingerprint: str | None, dataset: str) -> dict[str, object]:
    """What every rank must agree on before building ``spec``: the files (their fingerprint), the
    kind of dataset, and the plan but the rank."""
    plan = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "rank"}
    return {"num_samples": spec.num_samples, "fingerprint": fingerprint, **plan, "dataset": dataset}


def check_ranks_agree(
    fields: Mapping[str, object],
    rank: int | None = None,
    group: Any = None,
    context: Mapping[str, object] | None = None,
) -> None:
    """Raise :class:`RanksDisagreeError` on every rank unless all ranks passed equal ``fields``.

    ``group``: the process group whose ranks are compared (default: the whole world). ``context``: what
    the message names beside a field of the files that differs (``{"paths": [...]}``, the files this rank
    reads), not compared: ranks may read the same files under other paths.

    A no-op unless torch.distributed is available and its default process group initialised (and
    in a DataLoader worker, which must not join the group's collectives). Every rank of the group
    must call it, the same number of times: it is a collective. Values are compared by their
    ``repr`` (so they must have a deterministic one: ints, strs, None, tuples, dataclasses...). A
    field named ``world_size`` must divide the size of the process group, and with ``rank`` (this
    process's rank among ``world_size``) every rank in ``[0, world_size)`` must be held by the same
    number of processes: one each when the world is the group, ``group / world_size`` each when
    data-parallel ranks span several processes (tensor or pipeline parallelism).

    Raises:
        RanksDisagreeError: some field differs between ranks (the message names the first one,
            each of its values and the ranks holding it), or ``world_size`` is not the group's size.
        ValueError: more than 30 fields.

    Examples:
        >>> check_ranks_agree({"num_samples": 1000, "seed": 0})  # no process group: nothing to check
    """
    if len(fields) >= _SLOTS - 1:
        raise ValueError(f"at most {_SLOTS - 2} fields can be checked, got {len(fields)}")
    if not agreement_needed():
        return
    import torch
    import torch.distributed as dist

    reprs = {str(name): repr(value) for name, value in fields.items()}
    local = _hashes(reprs)
    local[-1] = -1 if rank is None else int(rank)  # not compared: the ranks' coverage is checked below
    device = collective_device(group)
    mine = torch.tensor(local, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    if device.type == "cpu":  # gloo's thread lets go of them before this returns (see wait_released)
        wait_released([mine, *gathered])
    rows = [[int(x) for x in t.tolist()] for t in gathered]
    ranks = [row.pop() for row in rows]
    group_size = len(rows)
    if any(row != rows[0] for row in rows):
        # Every rank saw the same rows, so every rank is here: the second collective cannot hang.
        everyone: list[Any] = [None] * group_size
        dist.all_gather_object(everyone, (reprs, {str(k): repr(v) for k, v in (context or {}).items()}), group=group)
        raise disagreement([e[0] for e in everyone], group_size, [e[1] for e in everyone])
    world = fields.get("world_size")
    if isinstance(world, int) and group_size % world:
        raise RanksDisagreeError(
            f"ranks disagree with the process group on world_size: {world} on every rank, but the "
            f"process group has {group_size} ranks — {_HINTS['world_size']}",
            "world_size",
            {repr(world): list(range(group_size))},
        )
    if isinstance(world, int) and rank is not None:
        holders: dict[str, list[int]] = {}
        for process, r in enumerate(ranks):
            holders.setdefault(repr(r), []).append(process)
        each = group_size // world
        if len(holders) != world or any(len(p) != each for p in holders.values()):
            shown = ", ".join(f"rank {r} on processes {_ranks_text(p)}" for r, p in sorted(holders.items()))
            raise RanksDisagreeError(
                f"ranks disagree on rank: {shown} — each rank in [0, {world}) must be held by {each} of the "
                f"process group's {group_size} processes (leave rank=None to take it from the process group)",
                "rank",
                holders,
            )


def disagreement(
    per_rank: Sequence[Mapping[str, str]],
    group_size: int | None = None,
    contexts: Sequence[Mapping[str, str]] | None = None,
) -> RanksDisagreeError:
    """The error for the fields (name -> repr) of every rank, in rank order; they must differ. ``contexts``:
    each rank's context (name -> repr, e.g. its files' paths), named when a field of the files differs.

    Pure: what :func:`check_ranks_agree` raises once it has gathered the fields of every rank.

    Examples:
        >>> str(disagreement([{"num_samples": "1000"}, {"num_samples": "1100"}])).split(" — ")[0]
        'ranks disagree on num_samples: 1000 on ranks [0], 1100 on ranks [1]'
    """
    names = [tuple(fields) for fields in per_rank]
    if len(set(names)) > 1:
        field = "(field names)"
        values = [", ".join(n) for n in names]
        differing: list[str] = []
    else:
        differ = [name for name in names[0] if len({fields[name] for fields in per_rank}) > 1]
        if not differ:
            raise ValueError("the fields of every rank are equal: there is no disagreement to report")
        field, differing = differ[0], differ[1:]
        values = [fields[field] for fields in per_rank]
    holders: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        holders.setdefault(value, []).append(rank)
    message = f"ranks disagree on {field}: {_held_by(holders, 'more values')}"
    if differing:
        message += f" (also differ: {', '.join(differing)})"
    if field == "world_size" and group_size is not None:
        message += f"; the process group has {group_size} ranks"
    if field in _FILE_FIELDS and contexts:
        message += _files_text(contexts)
    message += f" — {_HINTS.get(field, _PLAN_HINT)}"
    return RanksDisagreeError(message, field, holders)


def _files_text(contexts: Sequence[Mapping[str, str]]) -> str:
    """``; the files: paths ['a'] on ranks [0], paths ['b'] on ranks [1]``: what each rank reads."""
    holders: dict[str, list[int]] = {}
    for rank, context in enumerate(contexts):
        shown = ", ".join(f"{name} {value}" for name, value in context.items())
        if shown:
            holders.setdefault(shown, []).append(rank)
    if not holders:
        return ""
    if len(holders) == 1:
        return f"; every rank reads {next(iter(holders))}: the same paths, other contents"
    return f"; the files: {_held_by(holders, 'more')}"


def _held_by(holders: Mapping[str, list[int]], more: str) -> str:
    """``a on ranks [0], b on ranks [1-3]``: the first values and their ranks, then how many ``more``."""
    parts = [f"{value} on ranks {_ranks_text(ranks)}" for value, ranks in list(holders.items())[:_SHOWN_VALUES]]
    if len(holders) > _SHOWN_VALUES:
        parts.append(f"and {len(holders) - _SHOWN_VALUES} {more}")
    return ", ".join(parts)


def _ranks_text(ranks: Sequence[int]) -> str:
    """``[0, 2-5, 9]``: ascending ranks, consecutive runs collapsed, at most 16 runs listed (messages of
    1000 ranks stay short)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:_SHOWN_RUNS]]
    if len(runs) > _SHOWN_RUNS:
        shown.append(f"... ({len(ranks)} ranks)")
    return "[" + ", ".join(shown) + "]"


def _hashes(reprs: Mapping[str, str]) -> list[int]:
    """The field names' hash, then each value's: signed 64-bit ints, zero-padded to ``_SLOTS``."""
    texts = ["\0".join(reprs), *reprs.values()]
    out = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little", signed=True) for t in texts]
    return out + [0] * (_SLOTS - len(out))


def agreement_needed() -> bool:
    """Whether :func:`check_ranks_agree` has ranks to compare: torch.distributed's default process
    group is initialised and this is not a DataLoader worker (callers skip computing the fields
    otherwise).

    Examples:
        >>> agreement_needed()  # no process group here
        False
    """
    if not _ENABLED:
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # the server and index tools run without torch
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    from torch.utils.data import get_worker_info

    # A forked DataLoader worker inherits the group's state, not a seat in its collectives.
    return get_worker_info() is None


def collective_device(group: Any = None) -> Any:
    """The device a group's tensors travel on: the CPU if the group (default: the default group) has a CPU
    backend, else the current device of its first backend."""
    import torch
    import torch.distributed as dist

    try:
        config = str(dist.get_backend_config(group))  # e.g. "cpu:gloo,cuda:gloo", "cuda:nccl", "cpu:gloo,cuda:nccl"
    except AttributeError:  # torch < 2.2: the bare backend name
        config = str(dist.get_backend(group))
    types = [p.split(":", 1)[0] for p in config.split(",") if ":" in p]
    if not types:  # a bare backend name
        types = ["cuda"] if config == "nccl" else ["cpu"]
    if "cpu" in types:
        return torch.device("cpu")
    kind = types[0]
    module = getattr(torch, kind, None)
    if module is not None and hasattr(module, "current_device"):
        return torch.device(kind, module.current_device())
    return torch.device(kind)
