"""See the data path while it trains: ``for batch in rank_dataset.monitor(loader): ...``.

:func:`monitor` wraps a DataLoader over a rank-dataset dataset and yields its batches unchanged. Per rank it
measures the training loop's wait for each batch and the dataset's own stages (:mod:`rank_dataset.core.stages`:
plan, read or exchange, build and ``set_epoch`` in the rank; fetch, parse, ``transform`` and failures replaced
in the DataLoader workers, which write them into a shared table the rank reads). Every ``every`` steps one
all-gather makes a summary that is the same on every rank (the slowest rank and the stage that makes it slow);
rank 0 logs it (logger ``rank_dataset.monitor``, at INFO: configure logging to see it), every rank appends it
to ``out/rank-<r>.jsonl``, and the exporters get it. Over a
:class:`~rank_dataset.training.steps.StepSampler`, the summary also holds each source's samples trained on
(:meth:`StepSampler.consumed`), and steps are the sampler's (a resumed run goes on from its step); else the
monitor counts the loop's steps from 0. ``stall_after``: a watchdog thread dumps the stacks of the rank and
of its workers when the loop has waited that long for one batch.

Every rank of the group must iterate its monitor for the same number of steps (as DDP needs anyway): the
summary is a collective at each ``every``-th step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rank_dataset.core.checks import check_int
from rank_dataset.core.stages import ITEM_STAGES, ITEMS, RANK_STAGES, STAGES, StageTable, rank_totals
from rank_dataset.training.monitor._export import Exporter, ProfilerRanges, Prometheus, TensorBoard
from rank_dataset.training.monitor._gather import Gatherer
from rank_dataset.training.monitor._stall import Watchdog
from rank_dataset.training.monitor._summary import SLOW_MS, SLOW_RATIO, line_of, row_of, summarize

__all__ = ["SLOW_MS", "SLOW_RATIO", "Exporter", "Monitor", "ProfilerRanges", "Prometheus", "TensorBoard", "monitor"]

logger = logging.getLogger("rank_dataset.monitor")
_RANK_AT = [2 * STAGES.index(s) for s in RANK_STAGES]  # the rank stages' ns in rank_totals()
_ITEM_AT = [4 + 2 * k for k in range(len(ITEM_STAGES))]  # the item stages' ns in a table row


def monitor(
    loader: Iterable[Any],
    *,
    every: int = 100,
    out: str | os.PathLike[str] | None = None,
    stall_after: float | None = None,
    exporters: Iterable[Exporter] = (),
) -> Monitor:
    """Wrap ``loader`` (a DataLoader over a RankDataset or RankServerDataset): iterate the result instead.

    Args:
        loader: the DataLoader (its ``dataset`` is a rank-dataset dataset, or wraps one as ``.dataset``).
        every: steps between summaries (each one all-gather under a process group).
        out: a directory: every rank appends its summaries and events (stalls) to ``rank-<r>.jsonl`` there,
            and workers write their stack dumps under ``stacks/`` (read by ``rank-dataset report DIR``).
        stall_after: seconds: when the loop has waited that long for one batch, the rank logs (and writes
            to ``out``) the stacks of its main thread and of each DataLoader worker, with the sample each
            worker is making, once per stall. None: no watchdog.
        exporters: :class:`Prometheus`, :class:`TensorBoard`, :class:`ProfilerRanges` objects.

    Returns:
        a :class:`Monitor`: iterate it (once per epoch, or more), read :meth:`Monitor.summary`, close it
        (or use it as a context manager) to turn the timers off.
    """
    return Monitor(loader, every=every, out=out, stall_after=stall_after, exporters=exporters)


class Monitor:
    """What :func:`monitor` returns: an iterable over the loader's batches that measures the data path."""

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        every: int = 100,
        out: str | os.PathLike[str] | None = None,
        stall_after: float | None = None,
        exporters: Iterable[Exporter] = (),
    ) -> None:
        self.every = check_int("every", every, low=1)
        if stall_after is not None and (isinstance(stall_after, bool) or not isinstance(stall_after, (int, float))):
            raise TypeError(f"stall_after must be a number of seconds or None, got {stall_after!r}")
        if stall_after is not None and not stall_after > 0:
            raise ValueError(f"stall_after must be > 0 seconds, got {stall_after!r}")
        self.exporters = list(exporters)
        for e in self.exporters:
            if not all(callable(getattr(e, m, None)) for m in ("start", "export", "event", "close")):
                raise TypeError(f"an exporter has start, export, event and close methods, got {e!r}")
        self.loader = loader
        self.dataset = _dataset_of(loader)
        self.stages: StageTable = self.dataset.stages
        self.stall_after = stall_after
        self._gather = Gatherer(self.dataset)
        self.rank, self.world_size = self._gather.rank, self._gather.world_size
        self.out = None if out is None else Path(out)
        self._file = None
        self._temp_dir: str | None = None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self._file = open(self.out / f"rank-{self.rank}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.sampler = _step_sampler_of(loader)
        self.step = 0  # the loop's next step (numbered from 0): the batch it waits for, or will
        self._items = [row[ITEMS] for row in self.stages.rows()]  # each reader's items made, at the last summary
        self.stalls = 0
        self._waits = np.zeros(self.every, np.int64)
        self._k = 0  # steps in the current window
        self.waiting_since = 0  # monotonic ns when the loop started waiting for a batch; 0: not waiting
        self.iterator: Any = None  # the loader's iterator while one runs (the watchdog finds workers there)
        self._last = self._totals()
        self._summary: dict[str, Any] | None = None
        self._profile: ProfilerRanges | None = None
        if stall_after is not None:
            if self.out is not None:
                dump = self.out / "stacks"
                dump.mkdir(exist_ok=True)
                dump_dir = str(dump)
            else:
                dump_dir = self._temp_dir = tempfile.mkdtemp(prefix="rank_dataset_stacks_")
            self.stages.set_dump_dir(dump_dir)
        self.stages.switch(True)
        for e in self.exporters:
            e.start(self.rank, self.world_size)
            if isinstance(e, ProfilerRanges):
                self._profile = e
        self._closed = False

    # -- iteration --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this monitor was closed: make another with rank_dataset.monitor(loader)")
        sampler = self.sampler
        if sampler is not None:
            self.step = sampler.step  # its next step (a StatefulDataLoader's state is loaded by iter(): see below)
        it = self.iterator = iter(self.loader)
        watchdog = None if self.stall_after is None else Watchdog(self, self.stall_after)
        clock = time.monotonic_ns
        waits, every, profile = self._waits, self.every, self._profile
        first = True
        try:
            while True:
                t0 = clock()
                self.waiting_since = t0
                try:
                    if profile is None:
                        batch = next(it)
                    else:
                        with profile.range("rank_dataset.wait"):
                            batch = next(it)
                except StopIteration:
                    break
                t1 = clock()
                self.waiting_since = 0
                k = self._k
                waits[k] = t1 - t0
                if first and sampler is not None and sampler.started_at is not None:
                    self.step = sampler.started_at  # the step this iteration's first batch is
                first = False
                self.step += 1
                self._k = k = k + 1
                if k == every:
                    self._summarize()
                yield batch
        finally:
            self.waiting_since = 0
            if watchdog is not None:
                watchdog.stop()
            self.iterator = None

    # -- the summary ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any] | None:
        """The latest summary (None before the first): ``step``, ``slowest`` (``{"rank", "stage", ...}``,
        rank and stage None when no rank stands out: see :data:`SLOW_RATIO`, :data:`SLOW_MS`) and ``ranks``
        (each rank's ``wait_ms`` mean/p50/p99/max, ``data_ms``, ``stages_ms`` a step, ``items_made``,
        ``workers``, ``stalls``); over a StepSampler, ``sources``: ``{"step", "samples"}``, each source's samples
        in steps ``[0, step)``."""
        return self._summary

    def _totals(self) -> list[int]:
        """Nanoseconds of each stage so far (the rank's, then its readers' summed), and items made."""
        rank = rank_totals()
        rows = self.stages.rows()
        items = [sum(row[at] for row in rows) for at in _ITEM_AT]
        return [*(rank[at] for at in _RANK_AT), *items, sum(row[ITEMS] for row in rows)]

    def _readers(self) -> int:
        """The readers (the rank, its DataLoader workers) that made items since the last summary."""
        now = [row[ITEMS] for row in self.stages.rows()]
        busy = sum(1 for a, b in zip(now, self._items) if a > b)
        self._items = now
        return busy

    def _summarize(self) -> None:
        now = self._totals()
        delta = [a - b for a, b in zip(now, self._last)]
        self._last = now
        row = row_of(
            self._waits[: self._k],
            delta[: len(STAGES)],
            self.stalls,
            delta[-1],
            self.step - 1,
            time.time(),
            self._readers(),
        )
        self._k = 0
        table = self._gather(row)
        summary = summarize(table, every=self.every)
        if self.sampler is not None:  # from the plan: the same on every rank (across mixture edits too)
            summary["sources"] = {"step": self.step, "samples": self.sampler.consumed(step=self.step)["sources"]}
        self._summary = summary
        if self.rank == 0:
            logger.info(line_of(summary))
        self._write(summary)
        for e in self.exporters:
            e.export(summary)

    def record_event(self, event: dict[str, Any]) -> None:
        """(The watchdog) an event of this rank: written to ``out`` and given to the exporters."""
        self._write(event)
        for e in self.exporters:
            e.event(event)

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    # -- the end ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Turn the timers off, close ``out``'s file and the exporters, free a gloo group made here."""
        if self._closed:
            return
        self._closed = True
        self.stages.switch(False)
        if self.stall_after is not None:
            self.stages.set_dump_dir(None)
        for e in self.exporters:
            e.close()
        if self._file is not None:
            self._file.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        self._gather.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Monitor(rank={self.rank}/{self.world_size}, step={self.step}, every={self.every})"


def _step_sampler_of(loader: Any) -> Any:
    """The loader's batch sampler if it is a StepSampler (it counts its sources), else None."""
    from rank_dataset.training.steps import StepSampler

    sampler = getattr(loader, "batch_sampler", None)
    return sampler if isinstance(sampler, StepSampler) else None


def _dataset_of(loader: Any) -> Any:
    """The rank-dataset dataset under ``loader`` (its ``dataset``, unwrapping ``.dataset`` attributes)."""
    ds = getattr(loader, "dataset", None)
    for _ in range(8):
        if isinstance(getattr(ds, "stages", None), StageTable):
            return ds
        ds = getattr(ds, "dataset", None)
    raise TypeError(
        f"monitor() wraps a DataLoader over a RankDataset or RankServerDataset (its .dataset), got {loader!r}"
    )
