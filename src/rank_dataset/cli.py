"""The ``rank-dataset`` command line: ``index``, ``serve`` and ``demo``."""

from __future__ import annotations

import click

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Rank-sharded loading of very large meta files for PyTorch distributed training."""


@cli.command("index")
@click.argument("meta_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def index_cmd(meta_files: tuple[str, ...]) -> None:
    """Build (or check) the line-offset index of META_FILES and print their sample counts."""
    from rank_dataset.index import MetaFile

    total = 0
    for path in meta_files:
        try:
            mf = MetaFile(path)
        except (FileNotFoundError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{len(mf)}\t{path}")
        total += len(mf)
    if len(meta_files) > 1:
        click.echo(f"{total}\ttotal")


@cli.command("serve")
@click.argument("meta_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind; 0.0.0.0 for other nodes.")
@click.option("--port", default=28889, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar="RANK_DATASET_TOKEN",
    default=None,
    help="Require 'Authorization: Bearer TOKEN' (also from $RANK_DATASET_TOKEN, which keeps it out of ps).",
)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Server processes.")
def serve_cmd(meta_files: tuple[str, ...], host: str, port: int, token: str | None, workers: int) -> None:
    """Serve META_FILES (taken as one, in order) to RankServerDataset and ServerDataset clients."""
    from rank_dataset.server import serve

    try:
        serve(meta_files, host=host, port=port, token=token, workers=workers)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def main() -> None:
    """Entry point of the ``rank-dataset`` script and of ``python -m rank_dataset``."""
    cli(prog_name="rank-dataset")


if __name__ == "__main__":  # pragma: no cover
    main()
