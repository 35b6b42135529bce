"""Item access in one process: RankDataset beside a plain Python list of str, and the parsers' cost.

Usage:
    python benchmarks/bench_getitem.py                     # N = 1M lines, W = 1
    python benchmarks/bench_getitem.py --lines 20000 --out /tmp/results
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine_info, plotting, save_results, write_imagenet_meta  # noqa: E402


class ListDataset:
    """The naive loader's dataset: a list of str behind __getitem__."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __getitem__(self, i: int) -> str:
        return self.lines[i]


def rate(fn: Callable[[], Any], items: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return items / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from rank_dataset import RankDataset

    with tempfile.TemporaryDirectory(prefix="bench_getitem_") as tmp:
        work = Path(tmp)
        meta = write_imagenet_meta(work / "meta.txt", args.lines)
        jsonl = work / "meta.jsonl"
        with open(meta) as src, open(jsonl, "w") as dst:
            for line in src:
                path, label = line.split()
                dst.write(json.dumps({"path": path, "label": int(label)}) + "\n")
        n = args.lines
        lines = meta.read_text().splitlines()
        order = list(range(0, n, 7)) + list(range(3, n, 7))  # a scattered order, the same for all
        k = len(order)
        plain, listed = lines, ListDataset(lines)
        ds = RankDataset(meta, rank=0, world_size=1)
        labels = RankDataset(meta, rank=0, world_size=1, parser="label")
        jsons = RankDataset(jsonl, rank=0, world_size=1, parser="json")
        rates = {
            "plain list: lines[i]": rate(lambda: [plain[i] for i in order], k),
            "list-backed Dataset: ds[i]": rate(lambda: [listed[i] for i in order], k),
            "RankDataset: ds[i]": rate(lambda: [ds[i] for i in order], k),
            "RankDataset: ds.__getitems__(batch of 256)": rate(
                lambda: [ds.__getitems__(order[j : j + 256]) for j in range(0, k, 256)], k
            ),
            'RankDataset, parser="label": ds[i]': rate(lambda: [labels[i] for i in order], k),
            'RankDataset, parser="json": ds[i]': rate(lambda: [jsons[i] for i in order], k),
        }
    base_list, base_ds = rates["plain list: lines[i]"], rates["list-backed Dataset: ds[i]"]
    ours = rates["RankDataset: ds[i]"]
    rows = [
        f"# Item access in one process, N = {n:,}",
        "",
        "| access | items/s | ns/item | vs plain list | vs list-backed Dataset |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rates.items():
        rows.append(f"| {name} | {r:,.0f} | {1e9 / r:,.0f} | {r / base_list:.2f} | {r / base_ds:.2f} |")
    label_cost = 1e9 / rates['RankDataset, parser="label": ds[i]'] - 1e9 / ours
    json_cost = 1e9 / rates['RankDataset, parser="json": ds[i]'] - 1e9 / ours
    rows += [
        "",
        f'Parser cost per sample: "label" {label_cost:,.0f} ns, "json" {json_cost:,.0f} ns '
        "(beyond the plain str item; the JSON lines are longer).",
        "Best of 3 passes over the same scattered order of every 7th item.",
        "",
        f"Command: `python benchmarks/bench_getitem.py --lines {n}`",
        "",
        machine_info(),
    ]
    save_results(args.out, "getitem", rows, rates, lambda path: _plot(rates, path))
    return 0


def _plot(rates: dict[str, float], path: Path) -> None:
    plt = plotting()

    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(rates)
    ax.barh(names[::-1], [rates[k] / 1e6 for k in names[::-1]])
    ax.set_xlabel("million items/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
