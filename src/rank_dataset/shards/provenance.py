"""What a run trained on: a manifest (:mod:`rank_dataset.plan.manifest`) opened, and the samples of any global
batch, loop step or shard of it, with their lines.

The plan is run for the one window asked (:meth:`StepLayout.batch`, or one shard's
:meth:`~rank_dataset.plan.spec.ShardSpec.indices`), its numbers are mapped to the files' sample numbers as the
dataset's reader maps them (:class:`~rank_dataset.shards.reader.Sampling`), and the lines are read through a
:class:`~rank_dataset.files.read.metafile.MetaFile`, each file checked against the fingerprint the manifest
recorded: a file that changed is a :class:`~rank_dataset.errors.MetaFileChangedError`, never other lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.core.checks import check_int, is_url, with_storage
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.read.metafile import MetaFile
from rank_dataset.plan.manifest import MANIFEST_EDITED, MANIFEST_KEY, ArrayRef, check_manifest
from rank_dataset.plan.remix import RemixChain
from rank_dataset.plan.schedule import BatchSchedule
from rank_dataset.plan.skips import Skips
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.plan.steps import StepLayout
from rank_dataset.shards.reader import Sampling

if TYPE_CHECKING:
    from rank_dataset.plan.mix import MixPlan

__all__ = ["RunPlan", "samples_of"]


class RunPlan:
    """A manifest opened for queries: its files (checked against their fingerprints), the arrays it references
    (checked against their digests) and its plan.

    Args:
        manifest: the path of a manifest's JSON file, or the dict.
        root: the folder the arrays' relative paths are relative to (default: the JSON file's folder, or the
            current directory for a dict).
        storage_options: for meta files in object storage, obstore's settings (a manifest records none).

    Raises:
        MetaFileChangedError: a meta file is not the one the manifest recorded (its fingerprint or its samples).
        FileNotFoundError: a meta file or an array's file is gone.
        ValueError: not a manifest, or an array that is not the one recorded (naming it).
    """

    def __init__(
        self,
        manifest: str | os.PathLike[str] | Mapping[str, Any],
        *,
        root: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(manifest, (str, os.PathLike)):
            where = Path(manifest)
            try:
                data = json.loads(where.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not a manifest: not JSON ({exc})") from None
            root = where.parent if root is None else root
        else:
            data = manifest
        m = check_manifest(data)
        self.root = Path.cwd() if root is None else Path(root)
        cfg = m["reload_cfg"]
        self.seed = check_int("manifest reload_cfg seed", cfg["seed"])
        self.mini_epoch = check_int("manifest reload_cfg mini_epoch", cfg["mini_epoch"], low=1)
        self.aug_repeats = check_int("manifest reload_cfg aug_repeats", cfg["aug_repeats"], low=1)
        self.num_samples: int = m["num_samples"]
        self._storage = storage_options
        self.meta = self._open(m["files"], storage_options)
        self.paths = [str(f["path"]) for f in m["files"]]
        sources = None
        if m["sources"] is not None:
            from rank_dataset.plan.sources import Source

            sources = [
                Source(
                    [with_storage(p, storage_options) for p in s["paths"]],
                    ids=self._array(s["ids"], f"sources[{i}] ids"),
                    exclude=self._array(s["exclude"], f"sources[{i}] exclude"),
                    name=s["name"],
                    columns=s["columns"],
                )
                for i, s in enumerate(m["sources"])
            ]
        self.source_names = None if sources is None else [s.name for s in sources]
        self.sampling = Sampling(len(self.meta), self.meta.file_bounds, sources)
        excluded = self._array(m["exclude"], "exclude")
        exclusion = None
        if excluded is not None:
            from rank_dataset.plan.exclude import Exclusion

            exclusion = Exclusion.of(excluded, "the manifest's exclude")
        self.sampling.exclude(exclusion)
        self.mix: MixPlan | None = None
        if m["mix"] is not None:
            from rank_dataset.plan.mix import MixPlan

            self.mix = MixPlan.from_dict(m["mix"])
            if self.sampling.sizes != self.mix.sizes:
                raise ValueError(
                    f"invalid manifest: its sources hold {self.sampling.sizes} samples, its mix plans {self.mix.sizes}"
                )
        elif self.sampling.plan_size != self.num_samples:
            raise ValueError(
                f"invalid manifest: its files less exclude hold {self.sampling.plan_size} samples, it plans "
                f"{self.num_samples}"
            )
        steps = m["steps"]
        self.layout: StepLayout | None = None
        self.skips = Skips()
        self.chain: RemixChain | None = None
        if steps is not None:
            self.layout = self._layout(steps)
            self.skips = Skips.of(steps.get("skip", []), "the manifest's skip")
        edited = steps is not None and steps.get("segments") is not None
        if edited != (m[MANIFEST_KEY] == MANIFEST_EDITED):
            raise ValueError(
                f"invalid manifest: format {MANIFEST_EDITED} is that of a run with mixture edits (steps.segments), "
                f"got format {m[MANIFEST_KEY]} {'with' if edited else 'without'} them"
            )
        if edited:
            assert self.layout is not None
            self.chain = RemixChain.from_dict(
                steps["segments"], seed=self.seed, aug_repeats=self.aug_repeats, schedule=self.layout.schedule
            )
            self._segments: list[Any] = list(steps["segments"])
            self._views: dict[int, _View] = {}
            last = self.chain.last
            sizes = self.mix.sizes if self.mix is not None else (self.sampling.plan_size,)
            if tuple(s.size for s in last.sources) != tuple(sizes):
                raise ValueError(
                    f"invalid manifest: its last mix holds {[s.size for s in last.sources]} samples a source, its "
                    f"files {list(sizes)}"
                )
        self._top = _View(self.meta, self.paths, self.sampling, self.mix, self.source_names)

    def _open(self, files: list[Mapping[str, Any]], storage_options: Mapping[str, Any] | None) -> MetaFile:
        paths = [with_storage(f["path"], storage_options) for f in files]
        columns = [None if f.get("columns") is None else tuple(f["columns"]) for f in files]
        meta = MetaFile.from_files(paths, columns)
        counts = np.diff(meta.file_bounds)
        for f, now, n in zip(files, meta.file_fingerprints, counts.tolist()):
            if now != f["fingerprint"] or n != f["samples"]:
                raise MetaFileChangedError(
                    f["path"],
                    f"it holds {n:,} samples with fingerprint {now}; the run's manifest recorded {f['samples']:,} "
                    f"with fingerprint {f['fingerprint']} (its size, its first or last bytes or its samples differ)",
                )
        return meta

    def _array(self, ref: Any, name: str) -> npt.NDArray[np.int64] | None:
        found = ArrayRef.from_dict(ref, name)
        if found is None:
            return None
        path = Path(found.path)
        if not path.is_absolute() and not is_url(found.path):
            path = self.root / path
        return found.check(np.load(path, mmap_mode="r"), name)

    def _layout(self, steps: Mapping[str, Any]) -> StepLayout:
        shapes = steps.get("shapes")
        if shapes is None:
            from rank_dataset.plan.step_mix import StepMix

            rules = steps.get("mix")
            return StepLayout(
                BatchSchedule.of(steps["global_batch_size"], "the manifest's global_batch_size"),
                None if rules is None else StepMix.from_dict(rules),
            )
        from rank_dataset.plan.shapes import ShapeLayout, ShapeStream

        stream = ShapeStream(
            self.num_samples,
            self.seed,
            self._array(shapes.get("buckets"), "steps shapes buckets"),
            batch_size=shapes.get("batch_size"),
            max_cost=shapes.get("max_cost"),
            cost=self._array(shapes.get("cost"), "steps shapes cost"),
        )
        return ShapeLayout(stream)

    # -- queries ----------------------------------------------------------------------------------

    def _steps(self) -> StepLayout:
        if self.layout is None:
            raise ValueError(
                "this manifest is a dataset's (an epoch layout): query a shard with epoch=, mini_epoch=, rank= "
                "and world_size=, or write the StepSampler's manifest (sampler.manifest()) for steps"
            )
        return self.layout

    def batch(self, batch: int, rank: int | None = None, world_size: int | None = None) -> list[dict[str, Any]]:
        """Data batch ``batch``'s samples in global-batch order (rank 0's block first), or rank ``rank`` of
        ``world_size``'s block of it; each with ``"skipped"``: whether the run skipped it."""
        layout = self._steps()
        batch = check_int("batch", batch, low=0)
        world = 1 if world_size is None else check_int("world_size", world_size, low=1)
        if rank is not None and world_size is None:
            raise ValueError("rank= needs world_size= (a rank's block depends on the world size)")
        if self.chain is not None:  # the draws, each read by the mix in force at it
            layout.schedule.check(world, self.aug_repeats)
            numbers = layout.draws(batch, self.aug_repeats)
            bounds = np.arange(world + 1, dtype=np.int64) * (numbers.size // world)
        else:
            numbers, bounds = layout.batch(batch, self.num_samples, self.seed, self.aug_repeats, self.mix, world)
        if rank is not None:
            r = check_int("rank", rank, low=0, high=world, high_name="world_size")
            numbers = numbers[int(bounds[r]) : int(bounds[r + 1])]
        skipped = self.skips.skipped(batch)
        rows = self.rows(numbers) if self.chain is None else self._edited_rows(numbers)
        return [{**row, "skipped": skipped} for row in rows]

    def step(self, step: int, rank: int | None = None, world_size: int | None = None) -> list[dict[str, Any]]:
        """Loop step ``step``'s samples (the data batch it received: see :mod:`rank_dataset.plan.skips`)."""
        self._steps()
        batch = self.skips.batch_of(check_int("step", step, low=0))
        return [{k: v for k, v in row.items() if k != "skipped"} for row in self.batch(batch, rank, world_size)]

    def shard(self, epoch: int, mini_epoch: int, rank: int, world_size: int) -> list[dict[str, Any]]:
        """Rank ``rank`` of ``world_size``'s shard of ``(epoch, mini_epoch)`` of the epoch layout, in the order it
        reads them (an epoch started on that world size, not resumed)."""
        if self.layout is not None:
            raise ValueError("this run reads by steps (the manifest has steps): query step= or batch=")
        spec = ShardSpec(
            num_samples=self.num_samples,
            world_size=world_size,
            rank=rank,
            mini_epoch=self.mini_epoch,
            mini_epoch_idx=mini_epoch,
            seed=self.seed,
            epoch=epoch,
            mix=self.mix,
            aug_repeats=self.aug_repeats,
        )
        return self.rows(spec.indices())

    def rows(self, numbers: npt.NDArray[np.int64]) -> list[dict[str, Any]]:
        """The plan's ``numbers`` as ``{"source", "file", "sample", "line"}`` each: the source's name (None
        without a mix), the meta file's path, the sample's number (as a dataset's ``indices`` numbers it) and
        its line without its newline."""
        return self._top.rows(numbers)

    def _edited_rows(self, draws: npt.NDArray[np.int64]) -> list[dict[str, Any]]:
        """The rows of run draws ``draws`` of a run with mixture edits: each read from the mix in force at it,
        its sample numbered as that mix's dataset numbers it, its source named as the edits name it."""
        assert self.chain is not None
        seg, src, local = self.chain.locate(draws)
        out: list[dict[str, Any]] = [{}] * draws.size
        last = len(self.chain.segments) - 1
        for i in np.unique(seg).tolist():
            where = np.flatnonzero(seg == i)
            segment = self.chain.segments[i]
            offsets = prefix_sums([s.size for s in segment.sources])[:-1]
            numbers = offsets[src[where]] + local[where]
            rows = (self._top if i == last else self._view(i)).rows(numbers)
            if i == last and segment.kind == "plain":
                rows = [{**row, "source": segment.sources[0].name} for row in rows]
            for at, row in zip(where.tolist(), rows):
                out[at] = row
        return out

    def _view(self, i: int) -> _View:
        """The files of segment ``i`` (not the last), opened once and checked against its sources'
        fingerprints."""
        view = self._views.get(i)
        if view is not None:
            return view
        from rank_dataset.plan.mix import MixPlan
        from rank_dataset.plan.sources import Source
        from rank_dataset.shards.reader import columns_of, files_of

        at = f"steps.segments[{i}]"
        entries = self._segments[i].get("sources")
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) and "paths" in e for e in entries):
            raise ValueError(f"invalid manifest: {at} sources must each hold its paths, got {entries!r}")
        sources = [
            Source(
                [with_storage(p, self._storage) for p in e["paths"]],
                ids=self._array(e.get("ids"), f"{at} {e['name']} ids"),
                exclude=self._array(e.get("exclude"), f"{at} {e['name']} exclude"),
                name=str(e["name"]),
                columns=e.get("columns"),
            )
            for e in entries
        ]
        paths = files_of(sources)
        meta = MetaFile.from_files(paths, columns_of(sources))
        sampling = Sampling(len(meta), meta.file_bounds, sources)
        sampling.exclude(None)
        assert sampling.sizes is not None
        segment = self.chain.segments[i] if self.chain is not None else None
        assert segment is not None
        if segment.kind == "plain":
            found: tuple[str | None, ...] = (meta.fingerprint,)
        else:
            found = sampling.source_fingerprints(meta.file_fingerprints)
        for entry, size, now in zip(segment.sources, sampling.sizes, found):
            if size != entry.size or (entry.fingerprint is not None and entry.fingerprint != now):
                raise MetaFileChangedError(
                    (entry.paths or ("?",))[0],
                    f"source {entry.name!r} (read from data batch {segment.step}) holds {size:,} samples with "
                    f"fingerprint {now}; the run's manifest recorded {entry.size:,} with {entry.fingerprint}",
                )
        sizes = tuple(sampling.sizes)
        view = _View(
            meta, [str(p) for p in paths], sampling, MixPlan(sizes, sizes, sum(sizes)), [e.name for e in sources]
        )
        self._views[i] = view
        return view


class _View:
    """One mix's files as rows are read from them: its MetaFile, the Sampling of its sources, the plan whose
    numbers it maps (None: plain files) and its sources' names."""

    def __init__(
        self, meta: MetaFile, paths: list[str], sampling: Sampling, mix: MixPlan | None, names: list[str] | None
    ) -> None:
        self.meta, self.paths, self.sampling, self.mix, self.names = meta, paths, sampling, mix, names

    def rows(self, numbers: npt.NDArray[np.int64]) -> list[dict[str, Any]]:
        if not numbers.size:
            return []
        samples = self.sampling.global_of(numbers, self.mix)
        files = np.searchsorted(self.meta.file_bounds, samples, side="right") - 1
        shard = self.meta.read(samples, ids=False, shared=False)
        lines = shard.texts(range(len(shard)))
        names: list[str | None] = [None] * samples.size
        if self.mix is not None and self.names is not None:
            names = [self.names[s] for s in self.mix.source_of(numbers).tolist()]
        return [
            {"source": name, "file": self.paths[f], "sample": s, "line": line}
            for name, f, s, line in zip(names, files.tolist(), samples.tolist(), lines)
        ]


def samples_of(
    manifest: str | os.PathLike[str] | Mapping[str, Any],
    step: int | None = None,
    *,
    batch: int | None = None,
    epoch: int | None = None,
    mini_epoch: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """The samples a run (its manifest: ``sampler.manifest(path)`` or ``dataset.manifest(path)``) read at one
    point, each ``{"source", "file", "sample", "line"}``: the source's name (None without a mix), the meta file,
    the sample's number (as the dataset's ``indices`` numbers it) and its line without its newline.

    - ``step=t``: the global batch loop step ``t`` trained on, in global-batch order (rank 0's block first); with
      ``rank`` and ``world_size``, that rank's block. Skipped ranges are followed: ``t`` is a loop step.
    - ``batch=d``: data batch ``d`` itself, each dict with ``"skipped"``: whether the run skipped it.
    - ``epoch=e`` (``mini_epoch``, ``rank``, ``world_size``): a dataset manifest's shard of the epoch layout.

    Only that window is planned and read, whatever the step. Opens the manifest each call: for many queries,
    use :class:`RunPlan`.

    Raises:
        MetaFileChangedError: a meta file changed since the manifest was written.
        ValueError: not one of ``step``, ``batch`` and ``epoch``; a query the manifest does not hold (steps of a
            dataset's manifest, or a shard of a run by steps); an array that is not the one recorded.

    Example:
        >>> import os, tempfile
        >>> from rank_dataset import RankDataset, StepSampler
        >>> p = os.path.join(tempfile.mkdtemp(), "meta.txt")
        >>> _ = open(p, "w").write("".join(f"img_{i}.jpg {i}\\n" for i in range(10)))
        >>> sampler = StepSampler(RankDataset(p, rank=0, world_size=1), 4)
        >>> rows = samples_of(sampler.manifest(), step=3)
        >>> [r["line"] for r in rows] == [f"img_{s}.jpg {s}" for s in (r["sample"] for r in rows)]
        True
    """
    given = [name for name, value in (("step", step), ("batch", batch), ("epoch", epoch)) if value is not None]
    if len(given) != 1:
        raise ValueError(f"give one of step=, batch= and epoch=, got {' and '.join(given) or 'none'}")
    plan = RunPlan(manifest, root=root, storage_options=storage_options)
    if step is not None:
        return plan.step(step, rank, world_size)
    if batch is not None:
        return plan.batch(batch, rank, world_size)
    assert epoch is not None
    if rank is None or world_size is None:
        raise ValueError("a shard of the epoch layout needs rank= and world_size=")
    return plan.shard(epoch, mini_epoch, rank, world_size)
