"""The mixes the remix tests edit: five small files, random mixes over them and their datasets
(tests/training/test_steps_remix.py, test_provenance_remix.py), and the two mixes of the gloo jobs that stop and
resume under another mix (tests/remix_worker.py, provenance_remix_worker.py)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rank_dataset import RankDataset, Source

SIZES = {"a": 7, "b": 12, "c": 5, "d": 20, "e": 9}  # each file's lines, ``{name}_{i}``
SEED = 5

Mix = tuple[str, list[Source], int | None]  # kind, sources (plain: one), epoch size


def write_files(folder: Path) -> Path:
    """``folder`` with one ``{name}.txt`` of ``SIZES[name]`` lines per name."""
    for name, n in SIZES.items():
        (folder / f"{name}.txt").write_text("".join(f"{name}_{i}\n" for i in range(n)))
    return folder


def random_mix(
    rng: random.Random,
    files: Path,
    rules: Sequence[str] = ("weight", "repeat", "choose"),
    repeats: Sequence[float] = (0.5, 1, 2),
) -> Mix:
    """A plain file, or 1 to 3 sources by epochs or by step, each with a rule drawn from ``rules`` (a repeat's
    value from ``repeats``); an epoch size where a source is weighted."""
    kind = rng.choice(["plain", "epochs", "epochs", "steps"])
    if kind == "plain":
        return kind, [Source(str(files / f"{rng.choice(sorted(SIZES))}.txt"))], None
    sources = []
    for name in rng.sample(sorted(SIZES), rng.randint(1, 3)):
        rule = rng.choice(list(rules))
        value: Any = rng.choice({"weight": [1, 2, 3], "repeat": list(repeats), "choose": [3, 6, 15]}[rule])
        if kind == "steps":
            value = {0: value, rng.randrange(1, 30): rng.choice([1, 2, 3])} if rule != "repeat" else {0: value}
            sources.append(Source(str(files / f"{name}.txt"), by="step", **{rule: value}))
        else:
            sources.append(Source(str(files / f"{name}.txt"), **{rule: value}))
    weighted = any(s.kind == "weight" for s in sources)
    return kind, sources, (100 if kind == "steps" else 60) if weighted else None


def dataset(mix: Mix, rank: int, world: int, mini_epoch: int) -> RankDataset:
    """Rank ``rank`` of ``world``'s dataset of ``mix`` (seed ``SEED``)."""
    kind, sources, epoch_size = mix
    cfg: dict[str, Any] = {"mini_epoch": mini_epoch, "seed": SEED}
    if epoch_size is not None:
        cfg["epoch_size"] = epoch_size
    meta: Any = sources[0].paths[0] if kind == "plain" else sources
    return RankDataset(meta, reload_cfg=cfg, rank=rank, world_size=world)


def edited_dataset(mix: str, folder: str, cfg: dict[str, Any]) -> RankDataset:
    """``before``: a.txt and b.txt by epochs; ``after``: a.txt kept and reweighted, b.txt removed, c.txt added
    by step (``folder`` holds the three files)."""
    if mix == "before":
        sources = [Source(f"{folder}/a.txt", repeat=1), Source(f"{folder}/b.txt", weight=2)]
        return RankDataset(sources, reload_cfg={**cfg, "epoch_size": 40})
    sources = [Source(f"{folder}/c.txt", weight={0: 1, 9: 3}, by="step"), Source(f"{folder}/a.txt", weight=2)]
    return RankDataset(sources, reload_cfg={**cfg, "epoch_size": 30})
