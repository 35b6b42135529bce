"""rank-dataset: load meta files of 10M to 1B samples in PyTorch distributed training, each rank
holding only its own shard in compact numpy buffers.

The public API is this module's ``__all__``; the layers below it are sub-packages
(``core`` < ``plan`` < ``files`` < ``shards`` | ``server`` < ``training``, see the development guide).
Every name but the errors is imported on first use: ``import rank_dataset`` costs a process (a spawned
DataLoader worker too) only what it touches, and the index tools and the meta server run without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rank_dataset.errors import (
    CollectiveError,
    CorruptMetaFileError,
    MetaFileChangedError,
    PassAuditError,
    PassAuditWarning,
    PayloadError,
    ProtocolError,
    RanksDisagreeError,
    TooManyFailuresError,
)

if TYPE_CHECKING:
    from rank_dataset.files.group.grouping import group_by
    from rank_dataset.files.group.ids import ids_of
    from rank_dataset.files.group.recipes import class_balanced, repeat_factor
    from rank_dataset.files.group.sizes import Sizes, sizes_of
    from rank_dataset.files.index.scan import build_index
    from rank_dataset.files.read.metafile import MetaFile
    from rank_dataset.plan.config import ReloadConfig
    from rank_dataset.plan.resume import ResumeState
    from rank_dataset.plan.shapes import SDXL_RESOLUTIONS, aspect_ratio_groups, nearest_resolution
    from rank_dataset.plan.sources import Source
    from rank_dataset.shards.audit import PassCount
    from rank_dataset.shards.provenance import samples_of
    from rank_dataset.training.dataset import RankDataset
    from rank_dataset.training.monitor import monitor
    from rank_dataset.training.payloads import Payloads
    from rank_dataset.training.sampler import RandomSampler, ResumableSampler, find_resume_state
    from rank_dataset.training.server_datasets import RankServerDataset, ServerDataset
    from rank_dataset.training.shape_sampler import BucketBatchSampler
    from rank_dataset.training.shared_batches import SharedBatches, shared_batches
    from rank_dataset.training.steps import StepSampler
    from rank_dataset.training.topology import get_rank_world_size

__all__ = [
    "SDXL_RESOLUTIONS",
    "BucketBatchSampler",
    "CollectiveError",
    "CorruptMetaFileError",
    "MetaFile",
    "MetaFileChangedError",
    "PassAuditError",
    "PassAuditWarning",
    "PassCount",
    "PayloadError",
    "Payloads",
    "ProtocolError",
    "RandomSampler",
    "RankDataset",
    "RankServerDataset",
    "RanksDisagreeError",
    "ReloadConfig",
    "ResumableSampler",
    "ResumeState",
    "ServerDataset",
    "SharedBatches",
    "Sizes",
    "Source",
    "StepSampler",
    "TooManyFailuresError",
    "aspect_ratio_groups",
    "build_index",
    "class_balanced",
    "find_resume_state",
    "get_rank_world_size",
    "group_by",
    "ids_of",
    "monitor",
    "nearest_resolution",
    "repeat_factor",
    "samples_of",
    "shared_batches",
    "sizes_of",
]

# Where each lazily imported name lives.
_LAZY = {
    "group_by": "rank_dataset.files.group.grouping",
    "ids_of": "rank_dataset.files.group.ids",
    "MetaFile": "rank_dataset.files.read.metafile",
    "class_balanced": "rank_dataset.files.group.recipes",
    "repeat_factor": "rank_dataset.files.group.recipes",
    "Sizes": "rank_dataset.files.group.sizes",
    "sizes_of": "rank_dataset.files.group.sizes",
    "build_index": "rank_dataset.files.index.scan",
    "ReloadConfig": "rank_dataset.plan.config",
    "ResumeState": "rank_dataset.plan.resume",
    "SDXL_RESOLUTIONS": "rank_dataset.plan.shapes",
    "aspect_ratio_groups": "rank_dataset.plan.shapes",
    "nearest_resolution": "rank_dataset.plan.shapes",
    "Source": "rank_dataset.plan.sources",
    "PassCount": "rank_dataset.shards.audit",
    "samples_of": "rank_dataset.shards.provenance",
    "get_rank_world_size": "rank_dataset.training.topology",
    "RandomSampler": "rank_dataset.training.sampler",
    "ResumableSampler": "rank_dataset.training.sampler",
    "find_resume_state": "rank_dataset.training.sampler",
    "BucketBatchSampler": "rank_dataset.training.shape_sampler",
    "RankDataset": "rank_dataset.training.dataset",
    "monitor": "rank_dataset.training.monitor",
    "RankServerDataset": "rank_dataset.training.server_datasets",
    "ServerDataset": "rank_dataset.training.server_datasets",
    "StepSampler": "rank_dataset.training.steps",
    "SharedBatches": "rank_dataset.training.shared_batches",
    "shared_batches": "rank_dataset.training.shared_batches",
    "Payloads": "rank_dataset.training.payloads",
}


def _version() -> str:
    # on first use: importlib.metadata imports email, zipfile and csv
    from importlib import metadata

    try:
        return metadata.version("rank-dataset")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = version = _version()
        return version
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rank_dataset' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
