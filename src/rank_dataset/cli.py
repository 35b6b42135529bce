"""The ``rank-dataset`` command line: ``index``, ``serve``, ``demo`` and ``report``."""

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


def main() -> None:
    """Entry point of the ``rank-dataset`` script and of ``python -m rank_dataset``."""
    cli(prog_name="rank-dataset")


if __name__ == "__main__":  # pragma: no cover
    main()
