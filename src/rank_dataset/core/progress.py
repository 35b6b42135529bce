"""Progress bars on stderr that stay out of the logs of multi-rank jobs."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm.auto import tqdm  # imported on first use: a DataLoader worker never draws a bar

#: Work smaller than this (in the bar's unit) finishes too fast to need a bar.
MIN_TOTAL = 64 << 20


def _is_first_local_process() -> bool:
    for var in ("LOCAL_RANK", "RANK"):
        value = os.environ.get(var)
        if value is not None:
            return value.strip() == "0"
    return True


def progress_bar(total: int, desc: str, *, unit: str = "B", min_total: int = MIN_TOTAL) -> tqdm:
    """A tqdm bar shown only on a terminal, for large work, in the first process of a node.

    Only one process per node draws, so eight ranks indexing the same file never interleave their
    bars; when stderr is not a terminal (a log file), nothing is drawn at all.
    """
    from tqdm.auto import tqdm

    show = total >= min_total and sys.stderr.isatty() and _is_first_local_process()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        unit_divisor=1024 if unit == "B" else 1000,
        disable=not show,
        leave=False,
        file=sys.stderr,
    )
