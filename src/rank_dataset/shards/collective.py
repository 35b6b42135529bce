"""The collective reader: one read of the meta files per job, whatever the world size.

Each rank of a process group reads one contiguous 1/W of the bytes of the files (taken as one, in
order), cut at line boundaries, sequentially, ``_READ`` bytes at a time. Line numbers come from an
all-gather of each slice's sample and newline counts per file (a few numbers per file and rank, nothing
per line): no index is read or written. At each build every rank computes its plan's sample numbers
(as the file reader does), asks each slice owner for those it holds, and receives their lines, with
``all_to_all_single`` on a gloo group over the same ranks: one round of requests, then (once every
owner said it read its slice as counted) one of lengths and one of bytes. The lines are packed in plan
order straight into the rank's shareable segment: the shard is the file reader's, byte for byte.

Every collective runs on the reader's own gloo group (created over the ranks of the group given, with
``timeout``), named with the epoch in the error a failed or timed-out collective raises on each rank.
A file changed under any slice (:class:`~rank_dataset.errors.MetaFileChangedError`) and a line that is
not UTF-8 (a ValueError naming ``file:line``) travel as a status word ahead of the lines, so every rank
raises the same error and no rank packs a line of a changed file.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import meta_path
from rank_dataset.core.shard import Shard, ShardWriter, copy_rows
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.index import FileKey
from rank_dataset.files.scan import NEWLINE, scan_buffer
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.exclude import Exclusion
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards.reader import Sampling

__all__ = ["CollectiveError", "CollectiveReader"]

_READ = 16 << 20  # bytes per sequential read of a slice
_PROBE = 4096  # bytes first looked at to find where a slice starts (doubled until a newline is found)
_FINGERPRINT_BYTES = 1 << 16  # as MetaFile's fingerprint: each file's first and last 64 KiB
_OK, _CHANGED, _NOT_UTF8 = 0, 1, 2

Agree = Callable[[Mapping[str, object], Any], None]


class CollectiveError(RuntimeError):
    """A collective of the collective reader failed or timed out: a rank died, or did not reach it (did
    not call ``set_epoch`` or ``load_state_dict`` with the others) within the timeout. Raised on every
    rank that reached it, with the same message; the process group's own error is its ``__cause__``."""


class _Failure(Exception):
    """What a rank found wrong serving its slice: ``kind`` (a status word) and the error's arguments."""

    def __init__(self, kind: int, args: tuple[str, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.what = kind, args


def _error(kind: int, args: Sequence[str]) -> Exception:
    if kind == _CHANGED:
        return MetaFileChangedError(args[0], args[1])
    return ValueError(args[0])


class CollectiveReader:
    """Shards exchanged between the ranks of a process group, each rank reading 1/W of the files.

    Args:
        paths: the meta files (for a mix, the distinct files of the sources in order of first appearance).
        sources: for a mix, the Sources; None: no mix.
        group: the process group whose ranks share the reading (default: the whole world). Its rank and
            size are this reader's; the exchange runs on a gloo group over the same ranks, made here.
        timeout: how long a collective waits for every rank (default: torch's).
        agree: called as ``agree(fields, gloo_group)`` before the first collective that depends on the
            files: the ranks' agreement check (it raises the same error on every rank if they differ).

    Raises:
        ValueError: no initialised process group; the files hold no sample.
        FileNotFoundError: a file does not exist.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        sources: Sequence[Source] | None = None,
        *,
        group: Any = None,
        timeout: datetime.timedelta | None = None,
        agree: Agree | None = None,
    ) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "reader='collective' needs an initialised torch.distributed process group (the ranks read the "
                "files together): call torch.distributed.init_process_group first, or use reader='file'"
            )
        if timeout is not None and not isinstance(timeout, datetime.timedelta):
            raise TypeError(f"timeout must be a datetime.timedelta or None, got {timeout!r}")
        self.paths = tuple(meta_path(p) for p in paths)
        if not self.paths:
            raise ValueError("no meta files given: give at least one")
        self._timeout = timeout
        self._epoch: int | None = None  # named in a collective's error
        #: What the last build (or the making, before one) cost this rank: bytes of the files read, and
        #: bytes sent and received in its exchange (requests, lengths, lines).
        self.stats = {"read": 0, "sent": 0, "received": 0}
        self.group: Any
        self.group, self._owns_group = _gloo_group(group, timeout)
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)
        try:
            self._setup(sources, agree)
        except BaseException:
            self.close()
            raise

    def _setup(self, sources: Sequence[Source] | None, agree: Agree | None) -> None:
        keys = [FileKey.of(os.stat(p)) for p in self.paths]
        if agree is not None:
            with self._collective("the agreement check"):
                agree({"reader": "collective", "files": len(keys), "sizes": tuple(k.size for k in keys)}, self.group)
        self._keys = keys
        sizes = np.array([k.size for k in keys], np.int64)
        self._file_offsets = np.concatenate([[0], np.cumsum(sizes)])  # global byte offset of each file
        total, w = int(self._file_offsets[-1]), self.world_size
        lo, hi = (self._cut(total * r // w) for r in (self.rank, self.rank + 1))
        counts = self._count(lo, hi)
        self.stats["read"] = hi - lo
        # One all-gather: each rank's slice [lo, hi) and its samples and newlines in each file.
        table = self._all_gather(np.concatenate([[lo, hi], counts.reshape(-1)]), "the count of lines")
        self._cuts = np.concatenate([table[:, 0], table[-1:, 1]])
        per = table[:, 2:].reshape(w, 2, len(keys))
        self._samples, self._newlines = per[:, 0, :], per[:, 1, :]  # (rank, file)
        file_samples = self._samples.sum(axis=0)
        self._bounds = Bounds(file_samples)
        # Rank r holds global samples [_owned[r], _owned[r + 1]): slices are in file order.
        self._owned = np.concatenate([[0], np.cumsum(self._samples.sum(axis=1))])
        if self._bounds.total == 0:
            names = ", ".join(str(p) for p in self.paths)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")
        self._fingerprint, self._file_fingerprints = self._fingerprints(file_samples)
        self._sampling: Sampling | None = Sampling(self._bounds.total, self._bounds.starts, sources)
        self._is_mix = sources is not None
        self.keeps_ids = False
        self.set_exclusion(None)

    # -- the ShardReader protocol ------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        return self._bounds.total

    @property
    def fingerprint(self) -> str | None:
        """The files' fingerprint, as :attr:`MetaFile.fingerprint <rank_dataset.files.metafile.MetaFile.fingerprint>`
        computes it (a resume state saved with either reader loads with the other)."""
        return self._fingerprint

    @property
    def source_sizes(self) -> tuple[int, ...] | None:
        return self._sizes if self._is_mix else None

    def source_fingerprints(self) -> tuple[str, ...]:
        """Each source's: its files', and for a subset the hash of its ids (as the file reader's)."""
        assert self._sampling is not None
        return self._sampling.source_fingerprints(self._file_fingerprints)

    def set_exclusion(self, exclusion: Exclusion | None) -> None:
        """See :meth:`~rank_dataset.shards.reader.Sampling.exclude`."""
        assert self._sampling is not None
        self._sampling.exclude(exclusion)
        self.keeps_ids = self._sampling.keeps_ids
        self._plan_size, self._sizes = self._sampling.plan_size, self._sampling.sizes

    @property
    def plan_size(self) -> int:
        return self._plan_size

    def build(self, spec: ShardSpec) -> Shard:
        """The shard of ``spec``: every rank of the group must call it together (a collective)."""
        if self.group is None:
            raise ValueError("this collective reader was closed (or is a copy in a DataLoader worker): it cannot build")
        self._epoch = spec.epoch
        assert self._sampling is not None
        plan = self._sampling.samples_of(spec)()
        wanted, inverse = _distinct(plan)
        ids = plan if self.keeps_ids else None
        del plan
        # Round 1: each owner gets the (ascending) sample numbers it holds that this rank needs.
        ask = np.diff(np.searchsorted(wanted, self._owned)).astype(np.int64)
        asked = self._all_to_all(ask, np.ones(self.world_size, np.int64), "the request sizes")
        requests = self._all_to_all(wanted, ask, "the requests", out_splits=asked)
        del wanted
        mine = _distinct(requests)[0]  # each line asked for, once
        failure: _Failure | None = None
        parts: list[_Part] = []
        try:
            lengths = self._serve(mine, parts)
        except _Failure as exc:
            failure, lengths, parts = exc, np.zeros(0, np.int64), []
        self._check_status(failure)
        # Round 2: the lengths of the lines asked for, in the order asked, then their bytes.
        at = np.searchsorted(mine, requests)
        del mine, requests
        send_lengths = lengths[at]
        del lengths
        send = _gather_parts(parts, at, send_lengths)
        del at
        got_lengths = self._all_to_all(send_lengths, asked, "the line lengths", out_splits=ask)
        send_bytes = _split_sums(send_lengths, asked)
        got_bytes = _split_sums(got_lengths, ask)
        got = self._all_to_all(send, send_bytes, "the lines", out_splits=got_bytes)
        self.stats = {
            "read": int(self._cuts[self.rank + 1] - self._cuts[self.rank]),
            "sent": 8 * (int(ask.sum()) + int(asked.sum())) + int(send.size),
            "received": 8 * (int(asked.sum()) + int(ask.sum())) + int(got.size),
        }
        del send, send_lengths
        # The lines arrived in ascending sample order (owners hold ascending ranges): pack them in plan order.
        row_lengths = got_lengths[inverse]
        writer = ShardWriter(inverse.size, int(row_lengths.sum()), ids=ids is not None)
        writer.bounds[0] = 0
        np.cumsum(row_lengths, out=writer.bounds[1:], dtype=writer.bounds.dtype)
        got_starts = np.concatenate([[0], np.cumsum(got_lengths)[:-1]]).astype(np.int64)
        copy_rows(got, got_starts[inverse], row_lengths, writer.data, writer.bounds[:-1])
        if writer.ids is not None and ids is not None:
            writer.ids[:] = ids
        return writer.finish()

    def where(self, sample: int) -> str:
        """``path:line`` of global sample ``sample`` (found by reading the slice that holds it)."""
        file, local = self._bounds.locate(sample)
        path = self.paths[file]
        owner = int(np.searchsorted(self._owned, sample, side="right")) - 1
        k = local - int(self._samples[:owner, file].sum())  # its number within the owner's piece
        line = int(self._newlines[:owner, file].sum())
        lo, hi = self._piece(owner, file)
        try:
            with _open(path, self._keys[file]) as fd:
                for buf, offset, last in _chunks(fd, path, lo, hi, self._keys[file].size):
                    chunk = scan_buffer(buf, offset, last)
                    if k < chunk.starts.size:
                        start = int(chunk.starts[k]) - offset
                        return f"{path}:{line + int(np.count_nonzero(buf[:start] == NEWLINE)) + 1}"
                    k -= chunk.starts.size
                    line += chunk.newlines
        except (OSError, MetaFileChangedError):
            pass
        return f"{path}, sample {local} of the file"

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the reader's gloo group (every rank should close; a closed reader cannot build)."""
        group, self.group = self.group, None
        if group is not None and self._owns_group:
            import torch.distributed as dist

            with contextlib.suppress(Exception):  # the default group may be gone already
                dist.destroy_process_group(group)

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: no group (it cannot be pickled), no ids.
        return {**self.__dict__, "group": None, "_sampling": None}

    # -- the slices --------------------------------------------------------------------------------

    def _cut(self, x: int) -> int:
        """The first global offset at or after ``x`` where a line starts (a file's start, or after a
        newline), or the end of the files."""
        offsets = self._file_offsets
        if x >= offsets[-1]:
            return int(offsets[-1])
        f = int(np.searchsorted(offsets, x, side="right")) - 1
        local = x - int(offsets[f])
        if local == 0:
            return x
        size, path = self._keys[f].size, self.paths[f]
        pos, step = local - 1, _PROBE
        with _open(path, self._keys[f]) as fd:
            while pos < size:
                piece = os.pread(fd, min(step, size - pos), pos)
                if not piece:
                    raise MetaFileChangedError(path, "it shrank while being read")
                hit = piece.find(b"\n")
                if hit >= 0:
                    return int(offsets[f]) + pos + hit + 1
                pos += len(piece)
                step = min(2 * step, _READ)
        return int(offsets[f + 1])

    def _piece(self, rank: int, file: int) -> tuple[int, int]:
        """``(lo, hi)``: the bytes of ``file`` in ``rank``'s slice (empty: lo == hi)."""
        start = int(self._file_offsets[file])
        size = self._keys[file].size
        lo = min(max(int(self._cuts[rank]) - start, 0), size)
        hi = min(max(int(self._cuts[rank + 1]) - start, 0), size)
        return lo, max(lo, hi)

    def _my_pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """``(file, a, b)`` of each file's bytes ``[a, b)`` in the global range ``[lo, hi)``."""
        for f in range(len(self.paths)):
            start = int(self._file_offsets[f])
            a, b = max(lo - start, 0), min(hi - start, self._keys[f].size)
            if a < b:
                yield f, a, b

    def _count(self, lo: int, hi: int) -> npt.NDArray[np.int64]:
        """``(2, files)``: the samples and the newlines of each file in the global range ``[lo, hi)``."""
        counts = np.zeros((2, len(self.paths)), np.int64)
        for f, a, b in self._my_pieces(lo, hi):
            path, key = self.paths[f], self._keys[f]
            with _open(path, key) as fd:
                for buf, offset, last in _chunks(fd, path, a, b, key.size):
                    chunk = scan_buffer(buf, offset, last)
                    counts[0, f] += chunk.starts.size
                    counts[1, f] += chunk.newlines
        return counts

    def _fingerprints(self, file_samples: npt.NDArray[np.int64]) -> tuple[str, tuple[str, ...]]:
        """MetaFile's fingerprints of the files (together, each alone): read by rank 0, sent to all."""
        if self.rank == 0:
            whole, each = hashlib.sha256(), []
            for path, key, count in zip(self.paths, self._keys, file_samples.tolist()):
                part = struct.pack("<qq", count, key.size)
                if key.size:
                    n = min(key.size, _FINGERPRINT_BYTES)
                    with _open(path, key) as fd:
                        part += _pread(fd, path, 0, n) + _pread(fd, path, key.size - n, n)
                whole.update(part)
                each.append(hashlib.sha256(part).hexdigest()[:32])
            found: list[Any] = [whole.hexdigest()[:32], tuple(each)]
        else:
            found = [None, None]
        import torch.distributed as dist

        with self._collective("the fingerprint"):
            dist.broadcast_object_list(found, group_src=0, group=self.group)
        return found[0], tuple(found[1])

    # -- serving -----------------------------------------------------------------------------------

    def _serve(self, wanted: npt.NDArray[np.int64], parts: list[_Part]) -> npt.NDArray[np.int64]:
        """The lengths of global samples ``wanted`` (ascending, all in this rank's slice), their bytes
        appended to ``parts`` (a part a read), from one sequential read of the slice, which is checked
        against the counts.

        Raises:
            _Failure: a file changed, or a wanted line is not valid UTF-8 (naming file and line).
        """
        lengths = np.zeros(wanted.size, np.int64)
        local = wanted - int(self._owned[self.rank])
        done, first = 0, 0  # wanted lines found; the slice's number of the current chunk's first sample
        try:
            for f in range(len(self.paths)):
                a, b = self._piece(self.rank, f)
                if a >= b:
                    continue
                path, key = self.paths[f], self._keys[f]
                line = int(self._newlines[: self.rank, f].sum())  # newlines before this piece
                found = 0
                with _open(path, key) as fd:
                    for buf, offset, last in _chunks(fd, path, a, b, key.size):
                        chunk = scan_buffer(buf, offset, last)
                        m = chunk.starts.size
                        end = int(np.searchsorted(local, first + m))
                        if end > done:
                            rows = local[done:end] - first
                            s, n = chunk.starts[rows] - offset, chunk.lengths[rows]
                            packed = np.empty(int(n.sum()), np.uint8)
                            at = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
                            copy_rows(buf, s, n, packed, at)
                            if not chunk.ascii:
                                _check_utf8(packed, at, n, lambda r: _line_of(buf, s, r, line, path))  # noqa: B023
                            parts.append(_Part(done, packed, at))
                            lengths[done:end] = n
                            done = end
                        first += m
                        found += m
                        line += chunk.newlines
                counted = int(self._samples[self.rank, f])
                if found != counted:
                    what = f"it holds {found:,} samples in bytes [{a:,}, {b:,}) now, not {counted:,}"
                    raise MetaFileChangedError(path, what)
        except MetaFileChangedError as exc:
            raise _Failure(_CHANGED, (str(exc.path), exc.what)) from None
        except ValueError as exc:
            raise _Failure(_NOT_UTF8, (str(exc),)) from None
        return lengths

    def _check_status(self, failure: _Failure | None) -> None:
        """Every rank learns whether every slice was served as counted: if not, every rank raises the
        error of the first rank that failed (the lines are never exchanged)."""
        import torch.distributed as dist

        status = self._all_gather(np.array([0 if failure is None else failure.kind], np.int64), "the status")
        if not status.any():
            return
        gathered: list[Any] = [None] * self.world_size
        with self._collective("the error report"):
            mine = None if failure is None else (failure.kind, failure.what)
            dist.all_gather_object(gathered, mine, group=self.group)
        kind, what = next(g for g in gathered if g is not None)
        raise _error(kind, what)

    # -- collectives -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def collective(self, name: str, epoch: int | None) -> Iterator[None]:
        """Run a collective on :attr:`group` (e.g. the ranks' agreement check before the build of
        ``epoch``): its failure or timeout raises :class:`CollectiveError` naming ``name`` and the epoch."""
        self._epoch = epoch
        with self._collective(name):
            yield

    @contextlib.contextmanager
    def _collective(self, name: str) -> Iterator[None]:
        try:
            yield
        except RuntimeError as exc:
            epoch = "while the dataset was being made" if self._epoch is None else f"of epoch {self._epoch}"
            timeout = "torch's default" if self._timeout is None else str(self._timeout)
            raise CollectiveError(
                f"the collective reader's exchange of {name} {epoch} did not complete on every one of the "
                f"{self.world_size} ranks of its group: a rank died, or did not call set_epoch (or "
                f"load_state_dict) with the others within the timeout ({timeout})"
            ) from exc

    def _all_gather(self, values: npt.NDArray[np.int64], name: str) -> npt.NDArray[np.int64]:
        """``(world_size, len(values))``: every rank's ``values`` (of one length on every rank)."""
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.ascontiguousarray(values, np.int64))
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        with self._collective(name):
            dist.all_gather(out, mine, group=self.group)
        return torch.stack(out).numpy()

    def _all_to_all(
        self,
        values: npt.NDArray[Any],
        splits: npt.NDArray[np.int64],
        name: str,
        out_splits: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[Any]:
        """``values`` cut by ``splits`` sent one part to each rank; what each rank sent here, in rank
        order (``out_splits`` of it; default: ``splits``)."""
        import torch
        import torch.distributed as dist

        out_splits = splits if out_splits is None else out_splits
        mine = torch.from_numpy(np.ascontiguousarray(values))
        out = torch.empty(int(out_splits.sum()), dtype=mine.dtype)
        with self._collective(name):
            dist.all_to_all_single(out, mine, out_splits.tolist(), splits.tolist(), group=self.group)
        return out.numpy()


_SUBGROUPS: dict[tuple[tuple[int, ...], datetime.timedelta | None], Any] = {}


def _gloo_group(group: Any, timeout: datetime.timedelta | None) -> tuple[Any, bool]:
    """A gloo group over the ranks of ``group`` (default: the world), and whether the caller owns it
    (frees it at close). ``group`` itself where it has a CPU gloo backend and no other timeout is
    asked for. Otherwise a new one: over the whole world, with ``new_group`` (which every rank calls,
    as every rank makes the dataset); over a subgroup, with local synchronisation (only its ranks
    call it), kept for the life of the process and shared by the datasets over the same ranks (torch
    names such a group after its ranks, so one made again over them would meet the old one's
    addresses in the store)."""
    import torch.distributed as dist

    parent = group if group is not None else dist.group.WORLD
    if timeout is None and "cpu:gloo" in _backend_config(dist, parent):
        return parent, False
    ranks = tuple(dist.get_process_group_ranks(parent))
    if len(ranks) == dist.get_world_size():
        return dist.new_group(list(ranks), timeout=timeout, backend="gloo"), True
    key = (ranks, timeout)
    if key not in _SUBGROUPS:
        _SUBGROUPS[key] = dist.new_group(list(ranks), timeout=timeout, backend="gloo", use_local_synchronization=True)
    return _SUBGROUPS[key], False


def _backend_config(dist: Any, group: Any) -> str:
    """``"cpu:gloo"``, ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl"``...: the backends of ``group``."""
    config = str(dist.get_backend_config(group))
    return config if ":" in config else {"gloo": "cpu:gloo,cuda:gloo"}.get(config, "cuda:" + config)


@dataclass
class _Part:
    """Lines served from one read: rows ``first`` onwards of what the owner serves, back to back in
    ``data`` (row ``first + k`` at ``starts[k]``)."""

    first: int
    data: npt.NDArray[np.uint8]
    starts: npt.NDArray[np.int64]


def _gather_parts(
    parts: list[_Part], at: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]:
    """The lines of rows ``at`` (of ``lengths`` bytes) back to back, copied from ``parts``, each part
    let go of once copied (so that the lines are held about once, not twice)."""
    out = np.empty(int(lengths.sum()), np.uint8)
    dst = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    order = np.argsort(at, kind="stable")
    ordered = at[order]
    while parts:
        part = parts.pop(0)
        lo, hi = np.searchsorted(ordered, [part.first, part.first + part.starts.size])
        rows = order[lo:hi]
        copy_rows(part.data, part.starts[at[rows] - part.first], lengths[rows], out, dst[rows])
        del part
    return out


def _distinct(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``np.unique(values, return_inverse=True)`` by one sort (numpy's own takes a hash path several
    times slower on a plan's numbers)."""
    order = np.argsort(values)
    ordered = values[order]
    first = np.ones(ordered.size, bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(values.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _split_sums(lengths: npt.NDArray[np.int64], splits: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The sum of each consecutive part of ``lengths`` cut by ``splits``."""
    ends = np.cumsum(np.concatenate([[0], lengths])).astype(np.int64)
    cuts = np.concatenate([[0], np.cumsum(splits)]).astype(np.int64)
    sums: npt.NDArray[np.int64] = ends[cuts[1:]] - ends[cuts[:-1]]
    return sums


@contextlib.contextmanager
def _open(path: Path, key: FileKey) -> Iterator[int]:
    """A descriptor of ``path``, checked against ``key`` on entry and once the reading is done."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MetaFileChangedError(path, "it was deleted or moved") from None
    try:
        _check(path, key, os.fstat(fd))
        yield fd
        _check(path, key, os.fstat(fd))
        try:
            now = os.stat(path)
        except FileNotFoundError:
            raise MetaFileChangedError(path, "it was deleted or moved") from None
        _check(path, key, now)
    finally:
        os.close(fd)


def _check(path: Path, key: FileKey, st: os.stat_result) -> None:
    if not key.matches(st):
        what = key.change(FileKey.of(st))
        if what is not None:
            raise MetaFileChangedError(path, what)


def _pread(fd: int, path: Path, offset: int, count: int) -> bytes:
    raw = os.pread(fd, count, offset)
    if len(raw) < count:
        raise MetaFileChangedError(path, "it shrank while being read")
    return raw


def _chunks(fd: int, path: Path, lo: int, hi: int, size: int) -> Iterator[tuple[npt.NDArray[np.uint8], int, bool]]:
    """``(buf, offset, last)``: bytes ``[lo, hi)`` of the file, ``_READ`` bytes a read, in pieces that
    each end at a line boundary (``last``: the piece ends the file, so bytes after its final newline
    form a line). ``lo`` starts a line; ``hi`` ends one or the file."""
    carry = np.zeros(0, np.uint8)
    pos = lo
    while pos < hi:
        n = min(_READ, hi - pos)
        buf = np.empty(carry.size + n, np.uint8)
        buf[: carry.size] = carry
        view = buf.data[carry.size :]
        done = 0
        while done < n:
            got = os.preadv(fd, [view[done:]], pos + done)
            if got == 0:
                raise MetaFileChangedError(path, "it shrank while being read")
            done += got
        start, pos = pos - carry.size, pos + n
        if pos >= hi:
            yield buf, start, hi == size
            return
        cut = _last_newline(buf)
        if cut < 0:  # a line longer than a read: read on
            carry = buf
            continue
        yield buf[: cut + 1], start, False
        carry = buf[cut + 1 :].copy()


def _last_newline(buf: npt.NDArray[np.uint8]) -> int:
    for tail in (1 << 16, buf.size):
        hits = np.flatnonzero(buf[-tail:] == NEWLINE)
        if hits.size:
            return int(buf.size - min(tail, buf.size) + hits[-1])
    return -1


def _line_of(buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], row: int, line: int, path: Path) -> str:
    """``path:line`` of the row starting at ``buf[starts[row]]``; ``line`` newlines precede ``buf``."""
    return f"{path}:{line + int(np.count_nonzero(buf[: int(starts[row])] == NEWLINE)) + 1}"


def _check_utf8(
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    where: Callable[[int], str],
) -> None:
    """Raise ValueError naming ``where(row)`` for the first row of ``data`` that is not valid UTF-8 (as
    the file reader words it)."""
    try:
        # A line cannot start with a continuation byte; with none such, a sequence cut at a line
        # boundary cannot pass as valid, so the rows decode as one.
        heads = data[starts[lengths > 0]]
        if bool(((heads >= 0x80) & (heads < 0xC0)).any()):
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "")
        data.tobytes().decode("utf-8")
        return
    except UnicodeDecodeError:
        pass
    for row, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        try:
            data[s : s + n].tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where(row)}: line is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
