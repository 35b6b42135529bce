"""``python -m rank_dataset``: the command line."""

from rank_dataset.cli import main

main()
