"""Stage timers: where a dataset's time goes, cheap enough to leave in the code.

Two kinds of stages, read by the monitor (:mod:`rank_dataset.training.monitor`):

- the rank's stages (``plan``, ``read``, ``exchange``, ``build``, ``set_epoch``): rare and long, run by the
  process that owns the dataset. :func:`timed` adds their nanoseconds to this process's totals
  (:func:`rank_totals`); a stage timed inside another is subtracted from it (exclusive times), so the
  stages add up to the wall time they cover.
- the item stages (``fetch``: the lines out of the shard and, with payloads, the wait for their files' bytes;
  ``parse``, ``transform``, ``replaced``), run per item in the DataLoader
  workers: a :class:`StageTable`, a small shareable segment made with each dataset, has one row per reader
  (the rank: row 0; worker ``k``: row ``k + 1``), written only by that reader and read by the rank
  whenever it wants, like the pass audit's tally in the shard channel's control block. A row holds the
  reader's pid, the shard index of the item it is making and since when, its items, and nanoseconds and
  counts per stage. The table is off (word 0 is 0) until a monitor turns it on: unmonitored, an item costs
  one word read.

Stalls: when a monitor gives the table a directory (:meth:`StageTable.set_dump_dir`), each worker, as it
claims its row, registers :func:`faulthandler.register` for ``SIGUSR2`` writing its threads' stacks to
``<dir>/worker-<k>-<pid>.txt``, then publishes its pid; the rank sends the signal only to pids published so.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import IO, Any, TypeVar

from rank_dataset.core import shm as _shm

__all__ = [
    "ITEM_STAGES",
    "RANK_STAGES",
    "STAGES",
    "StageTable",
    "add_hook",
    "add_transformed",
    "item_hook",
    "item_stage",
    "rank_totals",
    "remove_hook",
    "stage_of_thread",
    "timed",
    "timed_result",
    "worker_id",
]

_T = TypeVar("_T")

RANK_STAGES = ("plan", "read", "exchange", "build", "set_epoch")
ITEM_STAGES = ("fetch", "parse", "transform", "replaced")
STAGES = RANK_STAGES + ITEM_STAGES
#: The signal a worker dumps its stacks on (SIGUSR1 is Lightning's SLURM requeue signal).
DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)

# -- the rank's stages ----------------------------------------------------------------------------

_INDEX = {name: k for k, name in enumerate(STAGES)}
_totals = [0] * (2 * len(STAGES))  # nanoseconds and count of each stage, in this process
_local = threading.local()
_hooks: list[Callable[[str], ContextManager[Any]]] = []
_stacks: dict[int, list[list[int]]] = {}  # each thread's stack of timed stages, read by a stall dump's thread


def add_hook(hook: Callable[[str], ContextManager[Any]]) -> None:
    """Enter ``hook("rank_dataset.<stage>")`` around every timed stage (the profiler's ranges)."""
    _hooks.append(hook)


def remove_hook(hook: Callable[[str], ContextManager[Any]]) -> None:
    with contextlib.suppress(ValueError):
        _hooks.remove(hook)


def item_hook() -> Callable[[str], ContextManager[Any]] | None:
    """The first hook, for the item stages made in the rank (None: no profiler ranges wanted)."""
    return _hooks[0] if _hooks else None


def stage_of_thread(ident: int) -> str | None:
    """The rank stage thread ``ident`` is in (the innermost timed one), or None."""
    stack = _stacks.get(ident)
    return STAGES[stack[-1][0] // 2] if stack else None


def item_stage(row: list[int]) -> str | None:
    """The item stage a reader's row (:meth:`StageTable.rows`) says it is running, or None."""
    k = row[STAGE] - 1
    return ITEM_STAGES[k] if 0 <= k < len(ITEM_STAGES) else None


def rank_totals() -> list[int]:
    """This process's totals so far: ``[ns, count]`` for each of :data:`STAGES`, flattened."""
    return list(_totals)


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Time ``stage`` (one of :data:`RANK_STAGES`) in this process, exclusive of stages timed inside it."""
    k = 2 * _INDEX[stage]
    stack: list[list[int]] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = _stacks[threading.get_ident()] = []
    now = time.monotonic_ns()
    if stack:  # the outer stage pauses
        outer = stack[-1]
        _totals[outer[0]] += now - outer[1]
    frame = [k, now]
    stack.append(frame)
    hooks = None
    if _hooks:
        hooks = contextlib.ExitStack()
        for hook in list(_hooks):
            hooks.enter_context(hook(f"rank_dataset.{stage}"))
    try:
        yield
    finally:
        if hooks is not None:
            hooks.close()
        now = time.monotonic_ns()
        _totals[k] += now - frame[1]
        _totals[k + 1] += 1
        stack.pop()
        if stack:
            stack[-1][1] = now


# -- the item stages ------------------------------------------------------------------------------

ON, DUMP_GEN = 0, 1  # header words: the table is on; the dump directory's generation
_HEADER_WORDS = 8
_DIR_BYTES = 1024  # the dump directory's path, after the header
#: The columns of a row: pid, the shard index of the item being made (-1: none), since when (monotonic
#: ns), items made, then (ns, count) for each item stage, and the item stage being run (``1 + its index in
#: ITEM_STAGES``; 0: none), which a stall dump names.
PID, CURRENT, SINCE, ITEMS = range(4)
FETCH, PARSE, TRANSFORM, REPLACED = (4 + 2 * k for k in range(len(ITEM_STAGES)))
STAGE = 4 + 2 * len(ITEM_STAGES)
COLUMNS = STAGE + 1
#: Rows: the rank, and DataLoader workers 0..ROWS-2.
ROWS = 65
_ROWS_AT = _HEADER_WORDS * 8 + _DIR_BYTES
SIZE = _ROWS_AT + ROWS * COLUMNS * 8


def add_transformed(words: Any, row: int, spent: int, n: int, replaced: int, substitutes: int) -> None:
    """Add a batch's transform time (``spent`` ns) and its ``n`` items to ``row``, and its ``replaced``
    substitutes' time (``substitutes`` ns) apart; mark the row idle."""
    words[row + TRANSFORM] += spent
    words[row + TRANSFORM + 1] += n
    if replaced:
        words[row + REPLACED] += substitutes
        words[row + REPLACED + 1] += replaced
    words[row + CURRENT] = words[row + STAGE] = -1


_forks = 0  # bumped in every forked child: a row claimed before the fork is the parent's


def _after_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_after_fork)
_dump_files: list[IO[bytes]] = []  # kept open for faulthandler (it writes to their descriptors)


def worker_id() -> int | None:
    """This process's DataLoader worker id, or None outside a worker (torch is there in a worker)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return None if info is None else int(info.id)


class StageTable(_shm.Table):
    """A dataset's item-stage table: :meth:`create` in the rank; pickles to a handle for spawned workers."""

    SIZE, NAME = SIZE, "rank_dataset_stages"

    def __init__(self, mm: mmap.mmap, handle: _shm.Handle, segment: _shm.Segment | None) -> None:
        super().__init__(mm, handle, segment)
        self.words = memoryview(mm).cast("q")  # word ON: read per item by the dataset
        self._claimed: tuple[int, int] | None = None  # (forks, dump generation) when this process claimed
        self.row = 0  # the first word of this process's row

    # -- the rank's side ---------------------------------------------------------------------------

    def switch(self, on: bool) -> None:
        """(Rank) turn the item timers on or off."""
        self.words[ON] = 1 if on else 0

    def set_dump_dir(self, directory: str | None) -> None:
        """(Rank) where workers write their stacks on :data:`DUMP_SIGNAL` (None: they register nothing)."""
        raw = b"" if directory is None else os.fsencode(directory)
        if len(raw) >= _DIR_BYTES:
            raise ValueError(f"the stack dump directory's path is over {_DIR_BYTES - 1} bytes: {directory!r}")
        at = _HEADER_WORDS * 8
        self._mm[at : at + _DIR_BYTES] = raw.ljust(_DIR_BYTES, b"\0")
        self.words[DUMP_GEN] += 1

    def dump_dir(self) -> str | None:
        at = _HEADER_WORDS * 8
        raw = bytes(self._mm[at : at + _DIR_BYTES]).rstrip(b"\0")
        return os.fsdecode(raw) if raw else None

    def rows(self) -> list[list[int]]:
        """A copy of every row (each written by its reader alone: a word may be a moment old)."""
        w = self.words
        base = _ROWS_AT // 8
        return [list(w[base + r * COLUMNS : base + (r + 1) * COLUMNS]) for r in range(ROWS)]

    # -- each reader's side ------------------------------------------------------------------------

    def claim(self) -> int:
        """The first word of this process's row, claimed on first use in each process (and again when the
        dump directory changes): a worker registers its stack dump there, then publishes its pid."""
        state = (_forks, int(self.words[DUMP_GEN]))
        if self._claimed == state:
            return self.row
        worker = worker_id()
        reader = 0 if worker is None else worker + 1
        if reader >= ROWS:
            reader = ROWS - 1  # workers past the table share its last row (their times still count)
        self.row = _ROWS_AT // 8 + reader * COLUMNS
        if worker is not None:
            self._register_dump(worker)
        self.words[self.row + PID] = os.getpid()
        self._claimed = state
        return self.row

    def _register_dump(self, worker: int) -> None:
        directory = self.dump_dir()
        if directory is None or DUMP_SIGNAL is None:
            return
        path = os.path.join(directory, f"worker-{worker}-{os.getpid()}.txt")
        try:
            f = open(path, "ab", buffering=0)  # noqa: SIM115 - kept open: faulthandler writes to it
        except OSError:
            return
        _dump_files.append(f)
        faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)


def timed_result(stage: str) -> Callable[[Callable[..., Callable[[], _T]]], Callable[..., Callable[[], _T]]]:
    """Decorate a function that returns a thunk (a plan's maker): each call of the thunk is timed as ``stage``."""

    def decorate(make: Callable[..., Callable[[], _T]]) -> Callable[..., Callable[[], _T]]:
        @functools.wraps(make)
        def wrapper(*args: Any, **kwargs: Any) -> Callable[[], _T]:
            thunk = make(*args, **kwargs)

            def timed_thunk() -> _T:
                with timed(stage):
                    return thunk()

            return timed_thunk

        return wrapper

    return decorate
