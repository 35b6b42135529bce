"""A run's manifest: what the plan takes as input, written out, so that any window of the run can be planned
again (:func:`rank_dataset.samples_of`).

A manifest is a small JSON dict, the same on every rank (it names no rank nor world size)::

    {"rank_dataset_manifest": 1,
     "files": [{"path", "fingerprint", "samples", "columns"}, ...],   # the meta files, in the plan's order
     "num_samples": N,                                                # the plan's (a mix: its epoch size T0)
     "reload_cfg": {"seed", "mini_epoch", "aug_repeats", "epoch_size"},
     "exclude": ARRAY or null,                                        # samples left out (exclude=)
     "sources": null or [{"name", "paths", "columns", "kind", "rule", "by", "samples",
                          "ids": ARRAY or null, "exclude": ARRAY or null}, ...],
     "mix": null or the MixPlan's numbers (sizes, counts, epoch_size, changes),
     "steps": null or {"global_batch_size": {first_step: size}, "mix": rules by step or null,
                       "shapes": null or {"batch_size", "max_cost", "buckets": ARRAY or null, "cost": ARRAY or null},
                       "skip": [[a, b], ...]}}

An ``ARRAY`` is a reference, never the numbers: ``{"path", "sha256", "length"}``, a ``.npy`` file of int64 (a
relative path is relative to the manifest's folder) and the digest of its values (:func:`array_digest`), which a
reader checks. The plan's numbers (``mix``, ``steps``) are what the plan computes with; the sources' rules are
there for a reader of the manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_int, check_record

__all__ = [
    "MANIFEST_EDITED",
    "MANIFEST_KEY",
    "MANIFEST_VERSION",
    "MANIFEST_VERSIONS",
    "ArrayRef",
    "array_digest",
    "check_manifest",
]

#: The key that marks a manifest; its value is the format version.
MANIFEST_KEY = "rank_dataset_manifest"
MANIFEST_VERSION = 1
#: The format of a manifest with mixture edits (``steps.segments``): a reader of format 1 alone refuses it rather
#: than answer with the unedited stream.
MANIFEST_EDITED = 2
MANIFEST_VERSIONS = (MANIFEST_VERSION, MANIFEST_EDITED)
_CHUNK = 1 << 22  # values hashed at a time: a memory-mapped array is read in pieces


def array_digest(values: npt.ArrayLike) -> str:
    """The sha256 of ``values`` as little-endian int64, in order (the same for the same numbers anywhere).

    Example:
        >>> array_digest([1, 2, 3]) == array_digest(np.array([1, 2, 3], np.int32))
        True
    """
    array = np.asarray(values).reshape(-1)
    digest = hashlib.sha256()
    for lo in range(0, array.size, _CHUNK):
        digest.update(np.ascontiguousarray(array[lo : lo + _CHUNK], "<i8").tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ArrayRef:
    """An array a manifest depends on: the ``.npy`` file that holds it, its values' digest and its length."""

    path: str
    sha256: str
    length: int

    @classmethod
    def of(cls, path: str, values: npt.ArrayLike) -> ArrayRef:
        """The reference of ``values``, to be found at ``path``."""
        array = np.asarray(values)
        return cls(path, array_digest(array), int(array.size))

    @classmethod
    def from_dict(cls, data: Any, name: str) -> ArrayRef | None:
        """The reference in ``data`` (None: none); TypeError or ValueError naming ``name``."""
        if data is None:
            return None
        if not isinstance(data, Mapping) or set(data) != {"path", "sha256", "length"}:
            raise ValueError(f"manifest {name} must be null or {{'path', 'sha256', 'length'}}, got {data!r}")
        if not isinstance(data["path"], str) or not isinstance(data["sha256"], str):
            raise TypeError(f"manifest {name}: path and sha256 must be strings, got {data!r}")
        return cls(data["path"], data["sha256"], check_int(f"manifest {name} length", data["length"], low=0))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "length": self.length}

    def check(self, values: npt.NDArray[Any], name: str) -> npt.NDArray[np.int64]:
        """``values`` (read from :attr:`path`) as int64, if they are the array referenced.

        Raises:
            ValueError: another length or digest (naming ``name`` and the file).
        """
        array = np.asarray(values)
        if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
            raise ValueError(
                f"manifest {name}: {self.path} must hold a 1-D integer array, got {array.dtype} {array.shape}"
            )
        if array.size != self.length or array_digest(array) != self.sha256:
            raise ValueError(
                f"manifest {name}: {self.path} is not the array the manifest was written with (its length or "
                "sha256 differs): the run's plan depended on the array as it was"
            )
        return np.asarray(array, np.int64)


_KEYS = ("files", "num_samples", "reload_cfg", "exclude", "sources", "mix", "steps")


def check_manifest(data: Any) -> dict[str, Any]:
    """``data`` if it is a manifest of this format (its keys and the types of its top level checked).

    Raises:
        TypeError: not a dict.
        ValueError: not a manifest, another format version, or a key missing (named).
    """
    check_record(
        data,
        MANIFEST_KEY,
        MANIFEST_VERSIONS,
        what="rank_dataset manifest",
        given="a dict (or the path of its JSON file)",
        required=_KEYS,
    )
    files = data["files"]
    if not isinstance(files, list) or not files:
        raise ValueError(f"invalid manifest: files must be a non-empty list, got {files!r}")
    for i, f in enumerate(files):
        if not isinstance(f, Mapping) or not {"path", "fingerprint", "samples"} <= set(f):
            raise ValueError(f"invalid manifest: files[{i}] must hold path, fingerprint and samples, got {f!r}")
    cfg = data["reload_cfg"]
    if not isinstance(cfg, Mapping) or not {"seed", "mini_epoch", "aug_repeats"} <= set(cfg):
        raise ValueError(f"invalid manifest: reload_cfg must hold seed, mini_epoch and aug_repeats, got {cfg!r}")
    check_int("manifest num_samples", data["num_samples"], low=1)
    return dict(data)
