"""The main job: a real distributed run that checks the shards and shows what they save.

``rank-dataset demo`` writes a synthetic ImageNet-shaped meta file, launches ``world_size`` ranks under
torch.distributed (gloo), the way torchrun does, each iterating its RankDataset through a DataLoader
for every epoch and mini-epoch; it checks over torch.distributed that each epoch covered every sample
with equal per-rank lengths, and prints a table beside the same run with the naive loader.

With ``mix=True`` (``--mix``) it writes three synthetic sources instead (a weighted one, one with
``repeat`` < 1 and one with ``choose``), checks each epoch's exact per-source counts, and prints each
source's share of the epoch next to its target.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rank_dataset.demo.synthetic import write_imagenet_meta, write_mix

if TYPE_CHECKING:
    from rank_dataset.server.local import LocalServer

__all__ = ["DemoError", "DemoResult", "format_table", "launch_ranks", "run_demo"]


class DemoError(RuntimeError):
    """A rank failed, or the coverage check did not pass."""


@dataclass
class DemoResult:
    """The figures of one loader's run: one dict per rank, and the coverage verdict."""

    loader: str
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def covered(self) -> bool:
        return bool(self.ranks) and self.ranks[0]["covered"]

    @property
    def memory(self) -> int:
        """Meta memory of all ranks and workers together: PSS after minus PSS before, in bytes."""
        return sum(r["memory"] for r in self.ranks)

    @property
    def noise(self) -> int:
        """How far the baseline moves with no metas at all, in bytes: the spread (largest minus
        smallest) of its measurements, each summed over all ranks and workers (the ranks measure at
        once). A memory figure within it cannot be told from zero."""
        totals = [sum(samples) for samples in zip(*(r.get("baseline_memory", [0]) for r in self.ranks))]
        return max(totals) - min(totals) if totals else 0


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the rank and its DataLoader workers
    for proc in procs:
        proc.wait()


def launch_ranks(cfg: dict[str, Any], world_size: int, work: Path) -> DemoResult:
    """Run the ranks of one loader, as torchrun would: one process each, rendezvous over TCP.

    ``cfg``: ``loader`` (``rank_dataset``, ``server`` with ``url``, ``naive`` or ``original``),
    ``meta``, ``workers``, ``epochs``, ``mini_epochs``, ``batch_size``; ``work``: a scratch directory.
    """
    if cfg["loader"] == "rank_dataset":
        from rank_dataset.files.read.metafile import MetaFile

        # Index before the job, as `rank-dataset index` would: the ranks load a warm index, and the
        # memory figures are those of a training run, not of indexing.
        MetaFile(cfg["meta"])
    out = work / f"result_{cfg['loader']}"
    cfg = {**cfg, "out": str(out)}
    config = work / f"config_{cfg['loader']}.json"
    config.write_text(json.dumps(cfg))
    # Imported here: the ranks and their spawned workers import this package, and the memory baseline
    # is of torch alone.
    from rank_dataset.server.local import free_port

    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
        cmd = [sys.executable, "-m", "rank_dataset.demo.rank", str(config)]
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    try:
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                raise DemoError(_failure(out, failed[0], procs[failed[0]].returncode))
            time.sleep(0.05)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise DemoError(_failure(out, failed[0], procs[failed[0]].returncode))
    except KeyboardInterrupt:
        _kill(procs)
        raise DemoError("interrupted: stopped every rank and its workers") from None
    finally:
        _kill(procs)
    ranks = [json.loads(out.with_name(f"{out.name}.{r}.json").read_text()) for r in range(world_size)]
    return DemoResult(cfg["loader"], ranks)


def _failure(out: Path, rank: int, code: int | None) -> str:
    error = out.with_name(f"{out.name}.{rank}.error")
    why = error.read_text().strip() if error.exists() else f"it exited with status {code}"
    return f"rank {rank} failed ({out.name.removeprefix('result_')} loader): {why}"


def _server(meta: Path | list[str]) -> LocalServer:
    """A meta server the demo starts (and stops) itself."""
    from rank_dataset.server.local import LocalServer

    paths = [str(p) for p in meta] if isinstance(meta, list) else [str(meta)]
    try:
        return LocalServer(paths, stdout=subprocess.DEVNULL, timeout=300)
    except RuntimeError as exc:
        raise DemoError(f"the meta server did not start: {exc}") from None


def run_demo(
    *,
    meta_file: str | os.PathLike[str] | None = None,
    world_size: int = 4,
    workers: int = 2,
    epochs: int = 2,
    mini_epochs: int = 2,
    lines: int = 2_000_000,
    server: bool = False,
    baseline: bool = True,
    batch_size: int = 256,
    mix: bool = False,
    schedule: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[DemoResult]:
    """Run the demo and return one DemoResult per loader (rank_dataset or server, then naive).

    With ``mix``, the data is three synthetic sources of ``lines`` samples in all, mixed into epochs
    of ``lines`` samples (no naive baseline: it cannot mix). With ``schedule`` too, the mix changes
    from epoch 1 on (``books.txt`` goes from ``repeat=0.5`` to ``repeat=1``; ``web.txt``, weighted,
    takes up the change). ``progress`` is called with a line as each step starts (the CLI prints it).

    Raises:
        DemoError: a rank failed (the message names it and why), or an epoch was not covered.
        ValueError: a bad argument.
    """
    for name, value, low in [
        ("world_size", world_size, 1),
        ("workers", workers, 0),
        ("epochs", epochs, 1),
        ("mini_epochs", mini_epochs, 1),
        ("lines", lines, 1),
    ]:
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if mix and meta_file is not None:
        raise ValueError("the mix demo writes its own three sources: give --mix or --meta-file, not both")
    if schedule and not mix:
        raise ValueError("--schedule changes the mix demo's rules from epoch 1 on: give it with --mix")
    if mix and lines < 10:
        raise ValueError(f"the mix demo needs lines >= 10, got {lines}")
    say = progress or (lambda line: None)
    with tempfile.TemporaryDirectory(prefix="rank_dataset_demo_") as tmp:
        work = Path(tmp)
        mix_cfg: dict[str, Any] = {}
        served: Path | list[str]
        if mix:
            say(f"writing three synthetic sources of {lines:,} lines in all")
            paths, rules = write_mix(work, lines, schedule)
            sources = [{"path": str(p), "name": p.name, **rule} for p, rule in zip(paths, rules)]
            mix_cfg = {"mix": sources, "epoch_size": lines}
            served = [str(p) for p in paths]
            baseline = False
        elif meta_file is None:
            say(f"writing a synthetic meta file of {lines:,} lines")
            meta = served = write_imagenet_meta(work / "train_meta.txt", lines)
        else:
            meta = Path(meta_file)
            if not meta.is_file():
                raise FileNotFoundError(f"meta file not found: {os.fspath(meta_file)!r}")
            served = meta
        cfg: dict[str, Any] = {
            "meta": served if isinstance(served, list) else str(served),
            "workers": workers,
            "epochs": epochs,
            "mini_epochs": mini_epochs,
            "batch_size": batch_size,
            **mix_cfg,
        }
        os.environ.setdefault("RANK_DATASET_CACHE_DIR", str(work / "cache"))
        results = []
        passes = f"{epochs} epochs x {mini_epochs} mini-epochs"
        if server:
            say("starting a meta server on a loopback port (it indexes the files)")
            srv = _server(served)
            try:
                say(
                    f"{world_size} ranks reading through the server: {passes}, beside two passes of the memory baseline"
                )
                results.append(launch_ranks({**cfg, "loader": "server", "url": srv.url}, world_size, work))
            finally:
                srv.stop()
        else:
            say(f"{world_size} ranks with RankDataset: {passes}, beside two passes of the memory baseline")
            results.append(launch_ranks({**cfg, "loader": "rank_dataset"}, world_size, work))
        if baseline:
            say(f"{world_size} ranks with the naive loader (a list in every rank): {epochs} epochs")
            results.append(launch_ranks({**cfg, "loader": "naive"}, world_size, work))
    for result in results:
        if not result.covered:
            raise DemoError(
                f"coverage check FAILED for the {result.loader} loader: " + "; ".join(result.ranks[0]["coverage"])
            )
    return results


def format_table(results: list[DemoResult], *, world_size: int, workers: int) -> str:
    """The demo's report: per-rank figures and the meta memory of all processes together."""
    rows = [
        "| loader | rank | samples / pass | shard build (s) | samples/s through DataLoader |",
        "|---|---:|---:|---:|---:|",
    ]
    for result in results:
        for r in result.ranks:
            rows.append(
                f"| {result.loader} | {r['rank']} | {r['samples']:,} | {r['build_seconds']:.2f} |"
                f" {r['samples_per_second']:,.0f} |"
            )
    rows += [
        "",
        f"| loader | meta memory, {world_size} ranks x (1 + {workers} workers), PSS (MiB) | vs naive |",
        "|---|---:|---:|",
    ]
    # A baseline figure within its own noise measures nothing: no ratio to it (a tiny demo's naive
    # list can be smaller than the spread of the processes' baseline).
    naive = next((r.memory for r in results if r.loader == "naive" and r.memory > r.noise), None)
    for result in results:
        rows.append(f"| {result.loader} | {_memory_cells(result, naive, result.loader == 'naive')} |")
    rows.append("")
    mix = results[0].ranks[0].get("mix") if results and results[0].ranks else None
    if mix:
        rows += [*_mix_table(mix), ""]
    for result in results:
        rows.append(f"coverage ({result.loader}): OK - " + "; ".join(result.ranks[0]["coverage"]))
    return "\n".join(rows)


def _memory_cells(result: DemoResult, naive: int | None, is_naive: bool) -> str:
    """The memory and "vs naive" cells of a loader's row. A figure no larger than the baseline's noise
    is not a measurement of the metas (it can even be negative): say so, and bound the ratio with it."""
    mib = 1 << 20
    memory, noise = result.memory, result.noise
    if memory > noise:
        figure, ratio = f"{memory / mib:,.1f}", f"{naive / memory:.1f}x less" if naive else "-"
    else:
        # The metas' memory is at most the figure plus the noise.
        bound = max(memory, 0) + noise
        figure = f"below noise (±{noise / mib:,.1f} MiB)"
        ratio = f"at least {naive / bound:.1f}x less" if naive and bound > 0 else "-"
    return f"{figure} | {'-' if is_naive else ratio}"


def _mix_table(mix: dict[str, Any]) -> list[str]:
    """Each source's share of the epoch, read, next to the share its rule asks for (with a schedule,
    the planned counts and targets of each epoch, joined by arrows where they change)."""
    total = mix["epoch_size"]
    epochs = range(len(mix["read"]))

    def per_epoch(values: list[Any], shown: Any) -> str:
        texts = [shown(v) for v in values]
        return texts[0] if len(set(texts)) == 1 else " -> ".join(texts)

    rows = [
        f"mix of {len(mix['names'])} sources, epochs of {total:,} samples (shares: of the epoch; read: over all ranks,"
        " padding left out)",
        "| source | samples | rule | target / epoch | planned | "
        + " | ".join(f"read, epoch {e}" for e in epochs)
        + " | target share | "
        + " | ".join(f"share, epoch {e}" for e in epochs)
        + " |",
        "|---|---:|---|" + "---:|" * (2 + 2 * len(epochs) + 1),
    ]
    for s, name in enumerate(mix["names"]):
        read = [mix["read"][e][s] for e in epochs]
        targets = [mix["targets"][e][s] for e in epochs]
        planned = per_epoch([mix["planned"][e][s] for e in epochs], lambda v: f"{v:,}")
        rows.append(
            f"| {name} | {mix['sizes'][s]:,} | {mix['rules'][s]} | {per_epoch(targets, lambda v: f'{v:,.1f}')} | "
            f"{planned} | "
            + " | ".join(f"{r:,}" for r in read)
            + f" | {per_epoch(targets, lambda v: f'{v / total:.2%}')} | "
            + " | ".join(f"{r / total:.2%}" for r in read)
            + " |"
        )
    return rows
