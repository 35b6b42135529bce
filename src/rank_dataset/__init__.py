"""rank-dataset: load meta files of 10M to 1B samples in PyTorch distributed training, each rank
holding only its own shard in compact numpy buffers.

The names that need torch (the datasets and the sampler) are imported on first use, so the index
tools and the meta server import and run without torch.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from rank_dataset._channel import PassCount
from rank_dataset.config import ReloadConfig
from rank_dataset.errors import (
    MetaFileChangedError,
    PassAuditError,
    PassAuditWarning,
    ProtocolError,
    RanksDisagreeError,
)
from rank_dataset.grouping import group_by
from rank_dataset.metafile import MetaFile
from rank_dataset.mix import Source
from rank_dataset.permutation import permute
from rank_dataset.plan import ResumePoint, ShardSpec, eval_range, spread_positions
from rank_dataset.recipes import class_balanced, repeat_factor
from rank_dataset.resume import ResumeState
from rank_dataset.scan import build_index
from rank_dataset.shard import Shard
from rank_dataset.topology import get_rank_world_size

try:
    __version__ = metadata.version("rank-dataset")
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from rank_dataset.client import RankServerDataset, ServerDataset
    from rank_dataset.dataset import RankDataset
    from rank_dataset.sampler import RandomSampler, ResumableSampler, find_resume_state, resume_state

__all__ = [
    "MetaFile",
    "MetaFileChangedError",
    "PassAuditError",
    "PassAuditWarning",
    "PassCount",
    "ProtocolError",
    "RandomSampler",
    "RankDataset",
    "RankServerDataset",
    "RanksDisagreeError",
    "ReloadConfig",
    "ResumableSampler",
    "ResumePoint",
    "ResumeState",
    "ServerDataset",
    "Shard",
    "ShardSpec",
    "Source",
    "build_index",
    "class_balanced",
    "eval_range",
    "find_resume_state",
    "get_rank_world_size",
    "group_by",
    "permute",
    "repeat_factor",
    "resume_state",
    "spread_positions",
]

_LAZY = {
    "RandomSampler": "rank_dataset.sampler",
    "ResumableSampler": "rank_dataset.sampler",
    "resume_state": "rank_dataset.sampler",
    "find_resume_state": "rank_dataset.sampler",
    "RankDataset": "rank_dataset.dataset",
    "RankServerDataset": "rank_dataset.client",
    "ServerDataset": "rank_dataset.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rank_dataset' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
