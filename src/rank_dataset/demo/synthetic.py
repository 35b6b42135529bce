"""Synthetic meta files shaped like ImageNet's, for the demo, the benchmarks and tests. No torch."""

from __future__ import annotations

from pathlib import Path

from rank_dataset._progress import progress_bar

_WNID_BASE = 1_440_764  # ImageNet's first wnid is n01440764


def imagenet_line(i: int) -> str:
    """Line ``i``: ``train/<wnid>/<wnid>_<i>.JPEG <label>``, the label spread over 1000 classes."""
    label = (i * 7919) % 1000
    wnid = f"n{_WNID_BASE + label:08d}"
    return f"train/{wnid}/{wnid}_{i}.JPEG {label}"


def sample_number(line: str) -> int:
    """The ``i`` of a line made by :func:`imagenet_line`."""
    return int(line.rsplit("_", 1)[1].split(".", 1)[0])


def write_imagenet_meta(path: Path, n: int, chunk: int = 200_000) -> Path:
    """Write ``n`` lines made by :func:`imagenet_line` to ``path``, with a progress bar on a terminal."""
    with open(path, "w") as f, progress_bar(n, f"writing {path.name}", unit="line", min_total=chunk) as bar:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            f.write("".join(f"{imagenet_line(i)}\n" for i in range(lo, hi)))
            bar.update(hi - lo)
    return path
