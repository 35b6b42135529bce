"""Deprecation shims for the names and modules that moved into sub-packages in 0.2: they keep working
for one release, with a ``DeprecationWarning`` that says where each one lives now."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["MOVED_MODULES", "MOVED_NAMES", "install_module_shims", "moved_name"]

# old public module -> the modules its names live in now (searched in order)
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "rank_dataset.balance": ("rank_dataset.plan.balance",),
    "rank_dataset.client": ("rank_dataset.server.transport", "rank_dataset.training.server_datasets"),
    "rank_dataset.config": ("rank_dataset.plan.config",),
    "rank_dataset.dataset": ("rank_dataset.training.dataset",),
    "rank_dataset.grouping": ("rank_dataset.files.group.grouping",),
    "rank_dataset.index": ("rank_dataset.files.index.load",),
    "rank_dataset.lightning": ("rank_dataset.training.lightning",),
    "rank_dataset.metafile": ("rank_dataset.files.read.metafile",),
    "rank_dataset.mix": ("rank_dataset.plan.sources", "rank_dataset.plan.counts", "rank_dataset.plan.mix"),
    "rank_dataset.parsers": ("rank_dataset.core.parsers",),
    "rank_dataset.permutation": ("rank_dataset.plan.permutation",),
    "rank_dataset.protocol": ("rank_dataset.server.protocol",),
    "rank_dataset.reader": ("rank_dataset.shards.reader",),
    "rank_dataset.recipes": ("rank_dataset.files.group.recipes",),
    "rank_dataset.resume": ("rank_dataset.plan.resume",),
    "rank_dataset.sampler": ("rank_dataset.training.sampler",),
    "rank_dataset.scan": ("rank_dataset.files.index.scan",),
    "rank_dataset.shard": ("rank_dataset.core.shard",),
    "rank_dataset.topology": ("rank_dataset.training.topology",),
}

# old top-level name -> (module, name) it is now
MOVED_NAMES: dict[str, tuple[str, str]] = {
    "ResumePoint": ("rank_dataset.plan", "ResumePoint"),
    "Shard": ("rank_dataset.core.shard", "Shard"),
    "ShardSpec": ("rank_dataset.plan", "ShardSpec"),
    "eval_range": ("rank_dataset.plan", "eval_range"),
    "permute": ("rank_dataset.plan", "permute"),
    "resume_state": ("rank_dataset", "find_resume_state"),
    "spread_positions": ("rank_dataset.plan", "spread_positions"),
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} and will be removed in rank-dataset 0.3", DeprecationWarning, stacklevel=3)


def moved_name(name: str) -> Any:
    """The value of a top-level name that moved, with a DeprecationWarning naming its new place."""
    module, attr = MOVED_NAMES[name]
    _warn(f"rank_dataset.{name}", f"{module}.{attr}")
    return getattr(importlib.import_module(module), attr)


class _Shim(types.ModuleType):
    _targets: Sequence[str]

    def __getattr__(self, name: str) -> Any:
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({n for t in self._targets for n in dir(importlib.import_module(t))})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Shim(spec.name)
        module._targets = MOVED_MODULES[spec.name]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _warn(module.__name__, " and ".join(MOVED_MODULES[module.__name__]))


def install_module_shims() -> None:
    """Let the old module paths import (once per process), each with a DeprecationWarning."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
