"""The loaders the demo compares against: the naive one and the original rank_dataset approach."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset

__all__ = ["NaiveDataset", "OriginalDataset"]


class NaiveDataset(Dataset[str]):
    """The usual loader: every line of the file in a Python list, in every process."""

    def __init__(self, path: str) -> None:
        with open(path, encoding="utf-8") as f:
            self.metas = [line.strip() for line in f if line.strip()]

    def __len__(self) -> int:
        return len(self.metas)

    def __getitem__(self, i: int) -> str:
        return self.metas[i]


class OriginalDataset(NaiveDataset):
    """The original rank_dataset approach, re-implemented: every rank draws the whole permutation,
    scans every line of the file, and keeps its own lines as a Python list."""

    def __init__(self, path: str, rank: int, world: int, mini_epoch: int, seed: int) -> None:
        self.path, self.rank, self.world, self.mini_epoch, self.seed = path, rank, world, mini_epoch, seed
        with open(path, encoding="utf-8") as f:
            self.num_samples = sum(1 for line in f if line.strip())
        self.set_epoch(0, 0)

    def set_epoch(self, epoch: int, mini_epoch_idx: int = 0) -> None:
        n, per_rank = self.num_samples, -(-self.num_samples // (self.world * self.mini_epoch))
        perm = np.random.default_rng(self.seed + epoch).permutation(n)  # N-sized, in every rank
        lo = (mini_epoch_idx * self.world + self.rank) * per_rank
        mine = perm[np.arange(lo, lo + per_rank) % n]
        wanted = set(mine.tolist())
        lines: dict[int, str] = {}
        with open(self.path, encoding="utf-8") as f:
            i = 0
            for line in f:
                line = line.strip()
                if line:
                    if i in wanted:
                        lines[i] = line
                    i += 1
        self.metas = [lines[int(j)] for j in mine]
        self.indices = mine
