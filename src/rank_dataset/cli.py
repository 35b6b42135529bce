"""The ``rank-dataset`` command line: ``index``, ``serve``, ``demo``, ``report`` and ``samples``."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import click

from rank_dataset.server.limits import ServerLimits, limit_fields
from rank_dataset.server.protocol import DEFAULT_PORT, TOKEN_ENV

__all__ = ["cli", "main"]

# The optional dependencies a command may need, each with what a user installs to get it: the
# package's extra (from PyPI), and the same from a clone of the repository (an editable install).
_SERVER = "pip install 'rank-dataset[server]' (from a clone: pip install -e '.[server]')"
_REPORT = "pip install 'rank-dataset[report]' (from a clone: pip install -e '.[report]')"
_INSTALL = {
    "starlette": _SERVER,
    "uvicorn": _SERVER,
    "h11": _SERVER,
    "torch": "pip install torch",
    "matplotlib": _REPORT,
}


def _missing(exc: ModuleNotFoundError) -> click.ClickException | None:
    """A one-line error naming what to install, if ``exc`` is an optional dependency missing."""
    top = (exc.name or "").partition(".")[0]
    if top not in _INSTALL:
        return None
    return click.ClickException(f"this command needs {top}, which is not installed: {_INSTALL[top]}")


def _require(*modules: str) -> None:
    """Import ``modules`` now, so that a missing one is named before any work starts."""
    with _optional_dependencies():
        for name in modules:
            importlib.import_module(name)


@contextlib.contextmanager
def _optional_dependencies() -> Iterator[None]:
    """Turn a missing optional dependency into one line saying what to install, not a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        error = _missing(exc)
        if error is None:
            raise
        raise error from None


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """Print the version and which path the per-line kernels take (native or numpy), and exit."""
    if not value or ctx.resilient_parsing:
        return
    from rank_dataset import __version__
    from rank_dataset.core.native import describe

    click.echo(f"rank-dataset, version {__version__}\nkernels: {describe()}")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Show the version and the kernels' path (native or numpy), and exit.",
)
def cli() -> None:
    """Rank-sharded loading of very large meta files for PyTorch distributed training."""


def _split_columns(value: str | None) -> list[str] | None:
    return None if value is None else [c.strip() for c in value.split(",")]


_COLUMNS_HELP = "For Parquet meta files: the columns (comma-separated, in order) whose values make a line; default all."


@cli.command("index")
@click.argument("meta_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--columns", default=None, help=_COLUMNS_HELP)
def index_cmd(meta_files: tuple[str, ...], columns: str | None) -> None:
    """Build (or check) the line-offset index of META_FILES and print their sample counts.

    A meta file may be an object's URL (s3://, gs://, az://, https://): its index is cached on this node.

    A gzip or zstd file is indexed over its decompressed lines; a Parquet file's index (its rows) is
    read from its footer.
    """
    from rank_dataset.core.checks import UrlPath
    from rank_dataset.files.formats import detect_path, one_frame_advice
    from rank_dataset.files.index.load import load_index, read_checkpoints
    from rank_dataset.files.read.metafile import MetaFile

    total = 0
    for path in meta_files:
        try:
            mf = MetaFile(path, columns=_split_columns(columns))
        except (OSError, ValueError, ImportError) as exc:  # an object's: not found, denied (URL and status)
            raise click.ClickException(str(exc)) from None
        click.echo(f"{len(mf)}\t{path}")
        total += len(mf)
        resolved = mf.paths[0]
        if isinstance(resolved, UrlPath) or not detect_path(resolved).compressed:
            continue
        index = load_index(resolved)  # the cache MetaFile has just made or checked
        advice = one_frame_advice(resolved, read_checkpoints(index))
        if advice is not None:
            click.echo(f"note: {advice}", err=True)
    if len(meta_files) > 1:
        click.echo(f"{total}\ttotal")


def _limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """An option for each server limit (``--max-body-size`` for ``max_body_size``), its default and help
    taken from :class:`ServerLimits`: the limits are listed in one place."""
    for limit in reversed(limit_fields()):
        kind = click.FloatRange(0, min_open=True) if limit.type in (float, "float") else click.IntRange(1)
        name = "--" + limit.name.replace("_", "-")
        command = click.option(name, default=limit.default, show_default=True, type=kind, help=limit.metadata["help"])(
            command
        )
    return command


@cli.command("serve")
@click.argument("meta_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind; 0.0.0.0 for other nodes.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    help=f"Require 'Authorization: Bearer TOKEN' (also from ${TOKEN_ENV}, which keeps it out of ps).",
)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Server processes.")
@click.option("--columns", default=None, help=_COLUMNS_HELP)
@_limit_options
def serve_cmd(
    meta_files: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    workers: int,
    columns: str | None,
    **limits: Any,
) -> None:
    """Serve META_FILES (taken as one, in order) to RankServerDataset and ServerDataset clients."""
    _require("starlette", "uvicorn", "h11")
    with _optional_dependencies():
        from rank_dataset.server.app import serve

    try:
        serve(
            meta_files,
            host=host,
            port=port,
            token=token,
            workers=workers,
            limits=ServerLimits(**limits),
            columns=_split_columns(columns),
        )
    except (OSError, ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None


@cli.command("demo")
@click.option(
    "--meta-file", type=click.Path(dir_okay=False), default=None, help="A real meta file instead of a synthetic one."
)
@click.option("--world-size", default=4, show_default=True, type=click.IntRange(1), help="Ranks to launch.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(0), help="DataLoader workers per rank.")
@click.option("--epochs", default=2, show_default=True, type=click.IntRange(1))
@click.option("--mini-epochs", default=2, show_default=True, type=click.IntRange(1))
@click.option("--lines", default=2_000_000, show_default=True, type=click.IntRange(1), help="Synthetic file size.")
@click.option("--server", is_flag=True, help="Read through a meta server the demo starts and stops.")
@click.option("--no-baseline", is_flag=True, help="Skip the naive loader's run.")
@click.option(
    "--mix",
    is_flag=True,
    help="Mix three synthetic sources (weight, repeat 0.5, choose 2x) into epochs of --lines samples; no baseline.",
)
@click.option(
    "--schedule", is_flag=True, help="With --mix: books.txt goes from repeat 0.5 to 1 at epoch 1 (a schedule)."
)
def demo_cmd(
    meta_file: str | None,
    world_size: int,
    workers: int,
    epochs: int,
    mini_epochs: int,
    lines: int,
    server: bool,
    no_baseline: bool,
    mix: bool,
    schedule: bool,
) -> None:
    """Run W ranks under torch.distributed, check every epoch's coverage, and compare memory with the naive loader."""
    _require("torch", *(("starlette", "uvicorn", "h11") if server else ()))
    from rank_dataset.demo import DemoError, format_table, run_demo

    baseline = not (no_baseline or mix)
    click.echo(
        f"rank-dataset demo: {world_size} ranks x {workers} DataLoader workers, {epochs} epochs x {mini_epochs} "
        f"mini-epochs, {'meta server' if server else 'RankDataset'}{' and the naive loader' if baseline else ''}"
        f"{', a mix of three sources' if mix else ''}{' with a schedule' if schedule else ''}"
    )
    try:
        results = run_demo(
            meta_file=meta_file,
            world_size=world_size,
            workers=workers,
            epochs=epochs,
            mini_epochs=mini_epochs,
            lines=lines,
            server=server,
            baseline=baseline,
            mix=mix,
            schedule=schedule,
            progress=lambda line: click.echo(f"  {line} ...", err=True),
        )
    except (DemoError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_table(results, world_size=world_size, workers=workers))


@cli.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--png", type=click.Path(dir_okay=False), default=None, help="Where to write the plot [DIR/report.png].")
def report_cmd(run_dir: str, png: str | None) -> None:
    """Plot a monitored run (rank_dataset.monitor(..., out=DIR)) and print a short summary of it."""
    _require("matplotlib")
    from rank_dataset.training.monitor.report import write_report

    try:
        click.echo(write_report(run_dir, png))
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _step_range(value: str | None) -> range | None:
    """``A:B`` as the loop steps ``[A, B)``."""
    if value is None:
        return None
    first, colon, stop = value.partition(":")
    if not (colon and first.isdigit() and stop.isdigit() and int(first) < int(stop)):
        raise click.BadParameter(f"give the loop steps as FIRST:STOP with FIRST < STOP, got {value!r}")
    return range(int(first), int(stop))


@cli.command("samples")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
@click.option("--step", type=click.IntRange(0), default=None, help="A loop step of a run by steps.")
@click.option("--steps", "steps", default=None, help="Loop steps FIRST:STOP (half-open).")
@click.option("--batch", type=click.IntRange(0), default=None, help="A data batch, skipped or not.")
@click.option("--epoch", type=click.IntRange(0), default=None, help="An epoch of a dataset's manifest (a shard).")
@click.option("--mini-epoch", type=click.IntRange(0), default=0, show_default=True, help="With --epoch.")
@click.option("--rank", type=click.IntRange(0), default=None, help="This rank's block (or shard) only.")
@click.option("--world-size", type=click.IntRange(1), default=None, help="With --rank (and --epoch).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
def samples_cmd(
    manifest: str,
    step: int | None,
    steps: str | None,
    batch: int | None,
    epoch: int | None,
    mini_epoch: int,
    rank: int | None,
    world_size: int | None,
    fmt: str,
) -> None:
    """Print the samples a run read, from its MANIFEST (sampler.manifest(path) or dataset.manifest(path)): a
    row a sample, with its source, meta file, sample number and line."""
    import csv
    import json
    import sys

    from rank_dataset.errors import MetaFileChangedError
    from rank_dataset.shards.provenance import RunPlan

    loops = _step_range(steps)
    asked = (("--step", step), ("--steps", loops), ("--batch", batch), ("--epoch", epoch))
    given = [name for name, value in asked if value is not None]
    if len(given) != 1:
        raise click.UsageError(f"give one of --step, --steps, --batch and --epoch, got {' and '.join(given) or 'none'}")
    if (rank is None) != (world_size is None) or (epoch is not None and rank is None):
        raise click.UsageError("--rank and --world-size go together (and --epoch needs both)")
    head = ["step", "batch"] if batch is None else ["batch", "skipped"]
    if epoch is not None:
        head = ["epoch", "mini_epoch"]
    if rank is not None:
        head.append("rank")
    fields = [*head, "source", "file", "sample", "line"]
    writer: Any = csv.DictWriter(sys.stdout, fields) if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()

    def emit(rows: list[dict[str, Any]], **where: Any) -> None:
        for row in rows:
            out = {**where, **row}
            if writer is not None:
                writer.writerow({k: out.get(k) for k in fields})
            else:
                click.echo(json.dumps({k: out.get(k) for k in fields}))

    try:
        plan = RunPlan(manifest)
        mine = {} if rank is None else {"rank": rank}
        if epoch is not None:
            assert rank is not None and world_size is not None
            emit(plan.shard(epoch, mini_epoch, rank, world_size), epoch=epoch, mini_epoch=mini_epoch, **mine)
        elif batch is not None:
            emit(plan.batch(batch, rank, world_size), batch=batch, **mine)
        else:
            for t in loops if loops is not None else [step]:
                assert t is not None
                emit(plan.step(t, rank, world_size), step=t, batch=plan.skips.batch_of(t), **mine)
    except (MetaFileChangedError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def main() -> None:
    """Entry point of the ``rank-dataset`` script and of ``python -m rank_dataset``."""
    cli(prog_name="rank-dataset")


if __name__ == "__main__":  # pragma: no cover
    main()
