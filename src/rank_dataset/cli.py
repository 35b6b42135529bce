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


def main() -> None:
    """Entry point of the ``rank-dataset`` script and of ``python -m rank_dataset``."""
    cli(prog_name="rank-dataset")


if __name__ == "__main__":  # pragma: no cover
    main()
