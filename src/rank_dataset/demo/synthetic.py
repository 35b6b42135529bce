"""Synthetic meta files shaped like ImageNet's, for the demo, the benchmarks and tests."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import numpy as np

from rank_dataset.core.progress import progress_bar

_WNID_BASE = 1_440_764  # ImageNet's first wnid is n01440764
_I = TypeVar("_I", int, np.ndarray)


def label_of(i: _I) -> _I:
    """The label of line ``i`` (or of each of an array of line numbers): spread over 1000 classes."""
    return (i * 7919) % 1000


def wnid(label: int) -> str:
    """The ImageNet-style class id of ``label``: ``n01440764`` for 0."""
    return f"n{_WNID_BASE + label:08d}"


def imagenet_line(i: int) -> str:
    """Line ``i``: ``train/<wnid>/<wnid>_<i>.JPEG <label>``, the label from :func:`label_of`."""
    label = label_of(i)
    w = wnid(label)
    return f"train/{w}/{w}_{i}.JPEG {label}"


def write_imagenet_meta(path: Path, n: int, chunk: int = 200_000, *, first: int = 0) -> Path:
    """Write ``n`` lines made by :func:`imagenet_line` (``first`` to ``first + n - 1``) to ``path``,
    with a progress bar on a terminal."""
    with open(path, "w") as f, progress_bar(n, f"writing {path.name}", unit="line", min_total=chunk) as bar:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            f.write("".join(f"{imagenet_line(i)}\n" for i in range(first + lo, first + hi)))
            bar.update(hi - lo)
    return path


#: The demo's mix (``--mix``): a share of ``--lines`` for each file, and its rule. The epoch size is
#: ``--lines``: ``code`` is up-sampled (choose twice its size), ``books`` down-sampled (repeat 0.5),
#: and ``web`` (weight) fills the rest of the epoch, a little more than once through.
MIX = (("web.txt", 0.6, {"weight": 1.0}), ("books.txt", 0.3, {"repeat": 0.5}), ("code.txt", 0.1, {"choose": 0.2}))
#: ``--mix --schedule``: from epoch 1 on, all of the books each epoch (``web`` takes up the change).
SCHEDULE = {"books.txt": {"repeat": {0: 0.5, 1: 1.0}}}


def write_mix(
    directory: Path, lines: int, schedule: bool = False
) -> tuple[list[Path], list[dict[str, float | dict[int, float]]]]:
    """Write the demo's three sources under ``directory``: their paths, and each one's Source keyword
    arguments (``choose`` in samples; with ``schedule``, the rules of :data:`SCHEDULE`)."""
    paths: list[Path] = []
    rules: list[dict[str, float | dict[int, float]]] = []
    first = 0
    for name, share, rule in MIX:
        n = max(1, round(lines * share))
        paths.append(write_imagenet_meta(directory / name, n, first=first))
        first += n
        rules.append({k: (max(1, round(v * lines)) if k == "choose" else v) for k, v in rule.items()})
        if schedule and name in SCHEDULE:
            rules[-1] = dict(SCHEDULE[name])
    return paths, rules
