"""The monitor's exporters: Prometheus, TensorBoard and torch.profiler ranges. Each needs an optional extra.

An exporter is an object with ``start(rank, world_size)``, ``export(summary)`` (each summary, the same dict on
every rank), ``event(event)`` (this rank's stalls) and ``close()``.

- :class:`Prometheus` (``pip install 'rank-dataset[monitor-prometheus]'``): every rank sets its own gauges
  (label ``rank``) in prometheus_client's multiprocess mode, in a directory the processes of a node share;
  one rank per node (``LOCAL_RANK`` 0 by default) serves the node's metrics on a port, or writes them to a
  textfile (node_exporter's textfile collector) at each summary. Over a StepSampler, rank 0 also counts each
  source's samples trained on, ``rank_dataset_source_samples_total{source}`` (a counter).
- :class:`TensorBoard` (``pip install 'rank-dataset[monitor-tensorboard]'``): each rank writes its scalars
  with ``torch.utils.tensorboard.SummaryWriter`` to ``log_dir/rank-<r>`` (one run a rank: TensorBoard draws
  the ranks over each other), rank 0 also the slowest rank and each source's samples.
- :class:`ProfilerRanges` (torch alone): ``torch.profiler.record_function`` ranges named
  ``rank_dataset.<stage>`` around the rank's stages, the loop's wait (``rank_dataset.wait``) and, when
  items are made in the rank (no workers), ``rank_dataset.parse`` and ``rank_dataset.transform``.
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, Protocol

from rank_dataset.core import stages as _st

__all__ = ["Exporter", "ProfilerRanges", "Prometheus", "TensorBoard"]

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Exporter(Protocol):
    def start(self, rank: int, world_size: int) -> None: ...
    def export(self, summary: dict[str, Any]) -> None: ...
    def event(self, event: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _need(module: str, extra: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"this exporter needs {exc.name}, which is not installed: pip install 'rank-dataset[{extra}]'",
            name=exc.name,
        ) from None


class Prometheus:
    """Prometheus metrics in prometheus_client's multiprocess mode.

    Args:
        directory: the multiprocess directory shared by the ranks of a node (default: the environment's
            ``PROMETHEUS_MULTIPROC_DIR``; one of them is needed). The exporter sets the variable and, if
            prometheus_client was imported without it, switches it to multiprocess mode (it holds every metric
            made after that in the directory); a directory of a previous run should be emptied.
        port: serve the node's metrics on this port (``http://addr:port/metrics``) from ``serving`` rank.
        textfile: write the node's metrics to this file at each summary, from the ``serving`` rank.
        addr: the address to serve on.
        serving: the local rank that serves or writes (default 0: ``LOCAL_RANK``, else the rank).

    Metrics (label ``rank``): ``rank_dataset_data_wait_seconds`` (label ``quantile``: 0.5, 0.99),
    ``rank_dataset_data_seconds_per_step``, ``rank_dataset_stage_seconds_per_step`` (label ``stage``),
    ``rank_dataset_step``, ``rank_dataset_stalls``; and ``rank_dataset_slowest_rank`` (-1: none). Over a
    StepSampler, rank 0 counts ``rank_dataset_source_samples_total`` (label ``source``): each source's samples
    in the steps before the summary's next one, from the plan; a resumed run's counter starts at the
    resumed step's count (the run's, not the process's).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        textfile: str | os.PathLike[str] | None = None,
        addr: str = "127.0.0.1",
        serving: int = 0,
    ) -> None:
        found = directory if directory is not None else os.environ.get(_MULTIPROC_ENV)
        if not found:
            raise ValueError(f"Prometheus needs a multiprocess directory: give directory= or set {_MULTIPROC_ENV}")
        self.directory = Path(found)
        self.port, self.textfile, self.addr, self.serving = port, textfile, addr, serving
        self._server: Any = None
        self._rank = 0
        self._owns_mode = False

    def start(self, rank: int, world_size: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._owns_mode = _MULTIPROC_ENV not in os.environ  # multiprocess mode is ours: close its files at the end
        os.environ[_MULTIPROC_ENV] = str(self.directory)
        prom = _need("prometheus_client", "monitor-prometheus")
        values: Any = sys.modules["prometheus_client.values"]
        if not getattr(values.ValueClass, "_multiprocess", False):  # prometheus_client was imported before
            values.ValueClass = values.MultiProcessValue()
        self._rank = rank
        self._prom = prom
        self.registry = prom.CollectorRegistry()  # this rank's metrics, kept out of the default registry
        mode = "mostrecent"
        g = prom.Gauge
        self._wait = g("rank_dataset_data_wait_seconds", "The training loop's wait for a batch", ["rank", "quantile"],
                       registry=self.registry, multiprocess_mode=mode)  # fmt: skip
        self._data = g("rank_dataset_data_seconds_per_step", "Data wait plus the rank's dataset stages, a step",
                       ["rank"], registry=self.registry, multiprocess_mode=mode)  # fmt: skip
        self._stage = g("rank_dataset_stage_seconds_per_step", "A dataset stage's time a step (a worker's mean)",
                        ["rank", "stage"], registry=self.registry, multiprocess_mode=mode)  # fmt: skip
        self._step = g("rank_dataset_step", "The step of the latest summary", ["rank"], registry=self.registry,
                       multiprocess_mode=mode)  # fmt: skip
        self._stalls = g("rank_dataset_stalls", "Stalls this rank dumped", ["rank"], registry=self.registry,
                         multiprocess_mode=mode)  # fmt: skip
        self._slowest = g("rank_dataset_slowest_rank", "The slowest rank beyond the threshold (-1: none)",
                          registry=self.registry, multiprocess_mode=mode)  # fmt: skip
        # A counter summed over the node's processes: rank 0 alone counts (the numbers are the same on every rank).
        self._sources = prom.Counter("rank_dataset_source_samples", "Samples trained on, by source (from the plan)",
                                     ["source"], registry=self.registry)  # fmt: skip
        self._counted: dict[str, int] = {}
        local = int(os.environ.get("LOCAL_RANK", rank))
        self._serves = local == self.serving
        if self._serves and self.port is not None:
            from prometheus_client import multiprocess

            node = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(node, path=str(self.directory))  # type: ignore[no-untyped-call]
            self._server = prom.start_http_server(self.port, addr=self.addr, registry=node)

    def export(self, summary: dict[str, Any]) -> None:
        me = summary["ranks"][self._rank]
        r = str(self._rank)
        self._wait.labels(r, "0.5").set(me["wait_ms"]["p50"] / 1e3)
        self._wait.labels(r, "0.99").set(me["wait_ms"]["p99"] / 1e3)
        self._data.labels(r).set(me["data_ms"] / 1e3)
        for stage, ms in me["stages_ms"].items():
            self._stage.labels(r, stage).set(ms / 1e3)
        self._step.labels(r).set(summary["step"])
        self._stalls.labels(r).set(me["stalls"])
        if self._rank == 0:
            slow = summary["slowest"]["rank"]
            self._slowest.set(-1 if slow is None else slow)
            for source, n in summary.get("sources", {}).get("samples", {}).items():
                grown = n - self._counted.get(source, 0)
                if grown > 0:  # a counter only grows (a loop restarted at an earlier step keeps its count)
                    self._sources.labels(source).inc(grown)
                    self._counted[source] = n
        if self._serves and self.textfile is not None:
            self.write_textfile()

    def write_textfile(self) -> None:
        """Write the node's metrics (every process's in the directory) to ``textfile``."""
        from prometheus_client import multiprocess

        node = self._prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(node, path=str(self.directory))  # type: ignore[no-untyped-call]
        self._prom.write_to_textfile(str(self.textfile), node)

    def event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "stall":
            self._stalls.labels(str(self._rank)).set(event["stalls"])

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None
        values: Any = sys.modules.get("prometheus_client.values")
        close_files = getattr(values, "close_all_multiprocess_files", None)  # prometheus_client >= 0.21
        if close_files is not None and self._owns_mode:
            close_files()  # this process's metric files: the values live on in them for the node's scraper


class TensorBoard:
    """Scalars for TensorBoard: each rank writes ``log_dir/rank-<r>`` (needs the tensorboard package).

    Tags: ``rank_dataset/wait_p50_ms``, ``rank_dataset/wait_p99_ms``, ``rank_dataset/data_ms``,
    ``rank_dataset/stage_ms/<stage>``, ``rank_dataset/stalls``; rank 0 also ``rank_dataset/slowest_rank``
    (-1: none) and, over a StepSampler, ``rank_dataset/source_samples/<source>``. The step is the summary's
    last step (numbered from 0).
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self._rank = 0

    def start(self, rank: int, world_size: int) -> None:
        _need("tensorboard", "monitor-tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._rank = rank
        self._writer = SummaryWriter(log_dir=str(self.log_dir / f"rank-{rank}"))

    def export(self, summary: dict[str, Any]) -> None:
        w, step = self._writer, summary["step"]
        me = summary["ranks"][self._rank]
        w.add_scalar("rank_dataset/wait_p50_ms", me["wait_ms"]["p50"], step)
        w.add_scalar("rank_dataset/wait_p99_ms", me["wait_ms"]["p99"], step)
        w.add_scalar("rank_dataset/data_ms", me["data_ms"], step)
        for stage, ms in me["stages_ms"].items():
            w.add_scalar(f"rank_dataset/stage_ms/{stage}", ms, step)
        w.add_scalar("rank_dataset/stalls", me["stalls"], step)
        if self._rank == 0:
            slow = summary["slowest"]["rank"]
            w.add_scalar("rank_dataset/slowest_rank", -1 if slow is None else slow, step)
            for source, n in summary.get("sources", {}).get("samples", {}).items():
                w.add_scalar(f"rank_dataset/source_samples/{source}", n, step)
        w.flush()

    def event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "stall" and self._writer is not None:
            self._writer.add_text("rank_dataset/stall", _stall_text(event), event.get("step", 0))
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ProfilerRanges:
    """``torch.profiler.record_function`` ranges ``rank_dataset.<stage>``, seen in a profiler's trace."""

    def __init__(self) -> None:
        self._on = False

    def range(self, name: str) -> ContextManager[Any]:
        from torch.profiler import record_function

        return record_function(name)

    def start(self, rank: int, world_size: int) -> None:
        if not self._on:
            _st.add_hook(self.range)
            self._on = True

    def export(self, summary: dict[str, Any]) -> None:
        pass

    def event(self, event: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        if self._on:
            _st.remove_hook(self.range)
            self._on = False


def _stall_text(event: dict[str, Any]) -> str:
    parts = [
        f"rank {event.get('rank')} waited {event.get('waited_s')} s for the batch of step {event.get('step')}, "
        f"in {event.get('stage')}"
    ]
    parts += [f"worker {w['worker']} on sample {w['sample']} ({w['where']})" for w in event.get("workers", ())]
    return "; ".join(parts)
