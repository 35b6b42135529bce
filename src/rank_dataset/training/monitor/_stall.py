"""Stall dumps: a watchdog thread in the rank that names a stuck DataLoader worker and shows its stack.

The monitor sets ``waiting_since`` while its loop waits for a batch. The watchdog wakes a few times per
``stall_after`` and, when one wait has lasted longer, dumps once for that wait:

- the rank's own threads' stacks (``sys._current_frames``: the main thread is in the loader's ``next``, or,
  without workers, in the transform itself);
- each DataLoader worker's: the workers registered :func:`faulthandler.register` for ``SIGUSR2`` when they
  claimed their row of the dataset's stage table (:mod:`rank_dataset.core.stages`), then published their pid
  there. The rank signals those pids that are also the running loader's workers (torch's iterator lists
  them), never another process, and reads what each wrote to its file;
- for each worker, the item it is making: its shard index, the sample, the sample's ``file:line``, the path
  or URL of its payload when the dataset reads payloads (the item whose payload a batch waits for), the
  item stage it is in, and how long ago its batch started;
- the stage the stall is in (``stage``): that of the worker busy the longest, else the item stage the rank
  runs itself (no workers), else the rank stage its loop is in (``read``, ``build``...), else ``"other"``
  (the summary's word for a wait no stage explains).

``step`` is the loop's step whose batch it waits for, numbered as the summaries number them (from 0).

It is logged as a warning by the stalled rank itself (logger ``rank_dataset.monitor``), written to ``out``,
and given to the exporters: a stall shows where it happens, not later as another rank's collective timeout.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Protocol

from rank_dataset.core import stages as _st

__all__ = ["Watchdog"]

logger = logging.getLogger("rank_dataset.monitor")
_DUMP_WAIT = 2.0  # seconds to wait for the workers' faulthandler output


class Watched(Protocol):
    """What the watchdog reads of the monitor it watches."""

    rank: int
    step: int
    stalls: int
    stall_after: float | None
    waiting_since: int
    stages: _st.StageTable
    iterator: Any
    dataset: Any

    def record_event(self, event: dict[str, Any]) -> None: ...


class Watchdog:
    """A daemon thread watching one iteration of a monitor; :meth:`stop` ends it."""

    def __init__(self, monitor: Watched, stall_after: float) -> None:
        self.monitor = monitor
        self.stall_after_ns = int(stall_after * 1e9)
        self._interval = min(max(stall_after / 4, 0.05), 1.0)
        self._stop = threading.Event()
        self._dumped = 0  # the wait (its start) last dumped: once per stall
        self._loop = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="rank_dataset-monitor-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            since = self.monitor.waiting_since
            if since and since != self._dumped and time.monotonic_ns() - since > self.stall_after_ns:
                self._dumped = since
                try:
                    self.dump(since)
                except Exception:  # pragma: no cover - a dump must never break training
                    logger.exception("rank_dataset monitor: the stall dump failed")

    def dump(self, since: int) -> dict[str, Any]:
        """Dump the stacks of the rank and its workers; return the event (also logged and written)."""
        m = self.monitor
        m.stalls += 1
        waited = (time.monotonic_ns() - since) / 1e9
        workers = self._workers()
        stage = self._stage(workers)
        event: dict[str, Any] = {
            "kind": "stall",
            "rank": m.rank,
            "step": m.step,
            "stage": stage,
            "time": time.time(),
            "waited_s": round(waited, 3),
            "stalls": m.stalls,
            "main": self._own_stack(),
            "workers": workers,
        }
        lines = [
            f"rank_dataset monitor: rank {m.rank} has waited {waited:.1f} s for the batch of step {m.step}, in "
            f"{stage} (stall_after={m.stall_after} s). Its loop's stack:",
            event["main"].rstrip(),
        ]
        for w in workers:
            lines.append(
                f"DataLoader worker {w['worker']} (pid {w['pid']}) of rank {m.rank}: "
                + (
                    f"on sample {w['sample']} ({w['where']}, shard index {w['index']}"
                    + (f", payload {w['payload']}" if w["payload"] else "")
                    + f"), in {w['stage']}, its batch started {w['busy_s']:.1f} s ago"
                    if w["index"] is not None
                    else "making no item"
                )
                + ":"
            )
            lines.append((w["stack"] or "(no stack: the worker did not answer)").rstrip())
        logger.warning("\n".join(lines))
        m.record_event(event)
        return event

    def _stage(self, workers: list[dict[str, Any]]) -> str:
        """The stage the stall is in (see the module)."""
        busy = [w for w in workers if w["index"] is not None and w["stage"] is not None]
        if busy:
            return str(max(busy, key=lambda w: w["busy_s"] or 0.0)["stage"])
        own = self.monitor.stages.rows()[0]
        if own[_st.CURRENT] >= 0 and _st.item_stage(own) is not None:
            return str(_st.item_stage(own))
        return _st.stage_of_thread(self._loop) or "other"

    def _own_stack(self) -> str:
        frame = sys._current_frames().get(self._loop)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def _workers(self) -> list[dict[str, Any]]:
        """Each worker that published its pid: signalled for its stack, with the item it is making."""
        m = self.monitor
        running = {int(p.pid) for p in getattr(m.iterator, "_workers", None) or () if p.pid is not None}
        rows = m.stages.rows()
        directory = m.stages.dump_dir()
        found: list[dict[str, Any]] = []
        for reader, row in enumerate(rows[1:], start=1):
            pid = row[_st.PID]
            if not pid or pid not in running:
                continue
            path = None if directory is None else os.path.join(directory, f"worker-{reader - 1}-{pid}.txt")
            before = _size(path)
            signalled = False
            if path is not None and _st.DUMP_SIGNAL is not None and before is not None:
                try:
                    os.kill(pid, _st.DUMP_SIGNAL)
                    signalled = True
                except OSError:
                    pass
            found.append({"reader": reader, "pid": pid, "path": path, "before": before, "signalled": signalled})
        deadline = time.monotonic() + _DUMP_WAIT
        for w in found:  # faulthandler writes at once from the signal handler; give it a moment
            while w["signalled"] and _size(w["path"]) == w["before"] and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(0.05)
        now = time.monotonic_ns()
        out = []
        for w in found:
            row = m.stages.rows()[w["reader"]]
            index = row[_st.CURRENT] if row[_st.CURRENT] >= 0 else None
            sample, where = self._sample_of(index)
            payload = self._payload_of(index)
            out.append(
                {
                    "worker": w["reader"] - 1,
                    "pid": w["pid"],
                    "index": index,
                    "sample": sample,
                    "where": where,
                    "stage": _st.item_stage(row) if index is not None else None,
                    "payload": payload,
                    "busy_s": round((now - row[_st.SINCE]) / 1e9, 3) if index is not None else None,
                    "stack": _read_from(w["path"], w["before"]) if w["signalled"] else "",
                }
            )
        return out

    def _payload_of(self, index: int | None) -> str | None:
        """The path or URL the item's payload is read from (a dataset with ``payloads``), else None."""
        payload_of = getattr(self.monitor.dataset, "payload_of", None)
        if index is None or payload_of is None:
            return None
        try:
            found = payload_of(index)
        except Exception:
            return None
        return None if found is None else str(found)

    def _sample_of(self, index: int | None) -> tuple[int | None, str | None]:
        if index is None:
            return None, None
        ds = self.monitor.dataset
        try:
            sample = int(ds.indices[index])
        except Exception:
            return None, None
        try:
            return sample, str(ds.reader.where(sample))
        except Exception:
            return sample, None


def _size(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _read_from(path: str | None, offset: int | None) -> str:
    if path is None or offset is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
