"""A dataset's and a StepSampler's manifest (:mod:`rank_dataset.plan.manifest`): the plan's inputs, gathered from
them and written out, with the arrays they depend on written beside the manifest's file.

Arrays: a manifest references an array by path and digest, never inlines it. With ``path`` (the manifest's JSON
file), each array is written beside it as ``<name>.<array>.npy`` (int64) and referenced by that file name,
relative to the manifest's folder, so that the folder is the run's record whatever becomes of the arrays given
(a ``.npy`` a user overwrites later). Without ``path``, a plan that depends on an array is a ValueError naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import is_url
from rank_dataset.plan.manifest import MANIFEST_EDITED, MANIFEST_KEY, MANIFEST_VERSION, ArrayRef

if TYPE_CHECKING:
    from rank_dataset.files.read.metafile import MetaFile
    from rank_dataset.plan.remix import RemixChain, SourceEntry
    from rank_dataset.plan.skips import Skips
    from rank_dataset.plan.sources import Source
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.plan.steps import StepLayout
    from rank_dataset.training._failures import FailureBook

__all__ = ["dataset_manifest", "path_text"]


class _Arrays:
    """The arrays a manifest references, by name, written beside its file at the end."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else Path(path)
        self.values: dict[str, npt.NDArray[Any]] = {}

    def ref(self, name: str, values: npt.ArrayLike) -> dict[str, Any]:
        array = np.asarray(values)
        self.values[name] = array
        stem = "manifest" if self.path is None else self.path.name.removesuffix(".json")
        return ArrayRef.of(f"{stem}.{name}.npy", array).to_dict()

    def write(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.path is None:
            if self.values:
                raise ValueError(
                    f"this run's plan depends on arrays ({', '.join(sorted(self.values))}), which a manifest "
                    "references by file and digest: pass manifest(path='run.json') to write them beside it"
                )
            return manifest
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        stem = self.path.name.removesuffix(".json")
        for name, values in self.values.items():
            np.save(folder / f"{stem}.{name}.npy", np.ascontiguousarray(values, np.int64))
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, self.path)
        return manifest


def path_text(path: Any) -> str:
    """A meta file's path as a manifest records it: an object's URL whole, a local path absolute."""
    return str(path) if is_url(path) else os.path.abspath(os.fspath(path))


def _rule(source: Source) -> Any:
    """A source's rule as JSON: its value, or its schedule with the keys as strings."""
    rule = getattr(source, source.kind) if source.step_rule is None else source.step_rule
    return {str(k): v for k, v in rule.items()} if isinstance(rule, Mapping) else rule


def _dataset_part(
    spec: ShardSpec, book: FailureBook, meta: MetaFile | None, epoch_size: int | None, arrays: _Arrays
) -> dict[str, Any]:
    if spec.is_test:
        raise ValueError("a manifest describes a training stream: this dataset is an eval one (is_test=True)")
    if meta is None:
        raise ValueError(
            "a manifest records each meta file with its fingerprint, which the file reader (reader='file') keeps: "
            "build the dataset with reader='file' to write one (the collective reader reads no index)"
        )
    if book.policy.exclude_failures:
        raise ValueError(
            "exclude_failures=True changes the plan each epoch by what failed: a manifest cannot describe it; "
            "leave the failing samples out with exclude= (ds.failures lists them)"
        )
    files = [
        {"path": path_text(p), "fingerprint": f, "samples": int(n), "columns": None if c is None else list(c)}
        for p, f, n, c in zip(meta.paths, meta.file_fingerprints, np.diff(meta.file_bounds), meta.columns)
    ]
    exclusion = book.exclusion
    sources = None
    mixture = book.mixture
    if mixture is not None:
        sources = []
        for i, (s, n) in enumerate(zip(mixture.sources, mixture.plan.sizes)):
            sources.append(
                {
                    "name": s.name,
                    "paths": [path_text(p) for p in s.paths],
                    "columns": None if s.columns is None else list(s.columns),
                    "kind": s.kind,
                    "rule": _rule(s),
                    "by": "epoch" if s.step_rule is None else "step",
                    "samples": int(n),
                    "ids": None if s.ids is None else arrays.ref(f"source{i}.ids", s.ids.view()),
                    "exclude": None if s.exclude is None else arrays.ref(f"source{i}.exclude", s.exclude.values),
                }
            )
    return {
        MANIFEST_KEY: MANIFEST_VERSION,
        "files": files,
        "num_samples": spec.num_samples,
        "reload_cfg": {
            "seed": spec.seed,
            "mini_epoch": spec.mini_epoch,
            "aug_repeats": spec.aug_repeats,
            "epoch_size": epoch_size,
        },
        "exclude": None if exclusion is None or not len(exclusion) else arrays.ref("exclude", exclusion.values),
        "sources": sources,
        "mix": None if mixture is None else mixture.plan.to_dict(),
        "steps": None,
    }


def dataset_manifest(
    spec: ShardSpec,
    book: FailureBook,
    meta: MetaFile | None,
    epoch_size: int | None,
    path: str | os.PathLike[str] | None,
    steps: tuple[StepLayout, Skips] | None = None,
) -> dict[str, Any]:
    """The manifest of a dataset's plan (:meth:`RankDataset.manifest`: its ``spec``, failure ``book``, MetaFile
    ``meta`` and mix ``epoch_size``), and with ``steps`` (a StepSampler's layout and skips) of its stream by steps
    (:meth:`StepSampler.manifest`); written to ``path`` if given."""
    arrays = _Arrays(path)
    manifest = _dataset_part(spec, book, meta, epoch_size, arrays)
    if steps is not None:
        manifest["steps"] = _steps_part(*steps, arrays)
        if steps[0].remix is not None:  # a reader of format 1 alone would answer with the unedited stream
            manifest["steps"].update(_segments_part(steps[0].remix, book, arrays))
            manifest[MANIFEST_KEY] = MANIFEST_EDITED
    return arrays.write(manifest)


def _steps_part(layout: StepLayout, skips: Skips, arrays: _Arrays) -> dict[str, Any]:
    from rank_dataset.plan.shapes import ShapeLayout

    shapes = None
    if isinstance(layout, ShapeLayout):
        stream = layout.stream
        several = stream.sizes.size > 1
        shapes = {
            "batch_size": stream.batch_size,
            "max_cost": stream.max_cost,
            "buckets": arrays.ref("buckets", stream.buckets) if several else None,
            "cost": None if stream.cost is None else arrays.ref("cost", stream.cost),
        }
    return {
        "global_batch_size": layout.schedule.to_dict(),
        "mix": None if layout.mix is None else layout.mix.to_dict(),
        "shapes": shapes,
        "skip": skips.to_list(),
    }


def _segments_part(chain: RemixChain, book: FailureBook, arrays: _Arrays) -> dict[str, Any]:
    """A run's mixes with its edits: every segment (the last is the manifest's top level), each earlier one's
    sources with their files (and the arrays of a listing, from the dataset if it still holds the source), and
    what each edit left each source."""
    segments = []
    for i, segment in enumerate(chain.segments):
        entry = segment.to_dict()
        if i < len(chain.segments) - 1:
            entry["sources"] = [
                _source_files(segment.step, j, s, segment.kind, book, arrays) for j, s in enumerate(segment.sources)
            ]
        segments.append(entry)
    return {"segments": segments, "edits": [e.to_dict() for e in chain.edits]}


def _source_files(
    step: int, j: int, source: SourceEntry, kind: str, book: FailureBook, arrays: _Arrays
) -> dict[str, Any]:
    """Source ``j`` of the mix in force from data batch ``step`` as a manifest reads its lines: its files and,
    for a listing of them (``ids=``, ``exclude=``), the arrays, which only a dataset that still holds the source
    (same name and fingerprint) has."""
    if source.paths is None:
        raise ValueError(
            f"manifest(): source {source.name!r} of the mix in force from data batch {step} was recorded without "
            "its files (a step state saved by an earlier rank_dataset): a manifest cannot name its lines"
        )
    entry = {**source.to_dict(), "ids": None, "exclude": None}
    del entry["listed"]
    if not source.listed:
        return entry
    mixture = book.mixture
    if mixture is not None and kind != "plain" and (book.exclusion is None or not len(book.exclusion)):
        for s, fingerprint in zip(mixture.sources, mixture.fingerprints):
            if s.name == source.name and fingerprint == source.fingerprint:  # the same source, the same listing
                if s.ids is not None:
                    entry["ids"] = arrays.ref(f"batch{step}.source{j}.ids", s.ids.view())
                if s.exclude is not None:
                    entry["exclude"] = arrays.ref(f"batch{step}.source{j}.exclude", s.exclude.values)
                return entry
    raise ValueError(
        f"manifest(): source {source.name!r} of an earlier mix read a listing of its files (ids= or exclude=) and "
        "this dataset no longer holds it with the same listing: a manifest references such arrays, which this "
        "process does not have (write the manifest before the edit too, to keep that part of the run's record)"
    )
