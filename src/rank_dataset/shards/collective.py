"""The collective reader: one read of the meta files per job, whatever the world size.

Each rank of a process group reads one contiguous 1/W of the bytes of the files (taken as one, in
order), cut at line boundaries, sequentially, ``_READ`` bytes at a time, and keeps where each of its
samples starts and its length. Line numbers come from an all-gather of each slice's sample and newline
counts per file (a few numbers per file and rank): no index is read or written. At each build every
rank computes its plan's sample numbers (as the file reader does), groups them by owner and round (one
radix sort), and exchanges with ``all_to_all_single`` on a gloo group over the same ranks: the requests,
then their lengths (which lay out the shard), then the lines in rounds. In round k each owner reads
the k-th part of its slice (about ``_ROUND`` bytes of lines), checks it against the count and sends
each rank the lines it asked for, headed by a status byte; each rank checks every owner's status, then copies
what it received straight into its shareable segment: the shard is the file reader's, byte for byte.

A Parquet file's text is its rows' lines (:mod:`rank_dataset.shards._rows`): its slices are cut at row
groups by their sizes in the footer, before the count, and the all-gather of what each rank rendered
places them; a row is a sample whatever it holds.

Every collective runs on the reader's own gloo group (created over the ranks of the group given, with
``timeout``), named with the epoch in the error a failed or timed-out collective raises on each rank.
A file changed under any slice (:class:`~rank_dataset.errors.MetaFileChangedError`) and a line that is
not UTF-8 (a ValueError naming ``file:line``) travel as a status word ahead of each round's lines, so
every rank raises the same error and no rank returns a shard holding a line of a changed file.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import meta_path
from rank_dataset.core.shard import Shard, ShardWriter, copy_rows, offset_dtype
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.formats import Checkpoints, Format, detect_path
from rank_dataset.files.index import FileKey, check_columns, load_index, read_checkpoints, refuse_cut_parquet
from rank_dataset.files.scan import NEWLINE, scan_buffer
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.sources import Source
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.shards._rows import RowsReading, RowsText
from rank_dataset.shards._text import Reading, Text, chunks, open_checked
from rank_dataset.shards.reader import SampledReader

__all__ = ["CollectiveError", "CollectiveReader"]

_ROUND = 4 << 20  # bytes of lines an owner reads and serves in a round of the exchange
_FINGERPRINT_BYTES = 1 << 16  # as MetaFile's fingerprint: each file's first and last 64 KiB
_OK, _CHANGED, _NOT_UTF8, _CORRUPT = 0, 1, 2, 3
_HEAD = 1  # bytes of status ahead of each owner's lines to each rank, in every round

Agree = Callable[[Mapping[str, object], Any], None]


from rank_dataset.errors import CollectiveError  # noqa: E402  (its home; importable from here too)


class _Failure(Exception):
    """What a rank found wrong serving its slice: ``kind`` (a status word) and the error's arguments."""

    def __init__(self, kind: int, args: tuple[str, ...]) -> None:
        super().__init__(kind, args)
        self.kind, self.what = kind, args


def _error(kind: int, args: Sequence[str]) -> Exception:
    if kind == _CHANGED:
        return MetaFileChangedError(args[0], args[1])
    if kind == _CORRUPT:
        return CorruptMetaFileError(args[0], int(args[1]), args[2])
    return ValueError(args[0])


def _failure(exc: Exception) -> _Failure | None:
    """What a rank tells the others of an error met reading its slice (None: not one to tell)."""
    if isinstance(exc, MetaFileChangedError):
        return _Failure(_CHANGED, (str(exc.path), exc.what))
    if isinstance(exc, CorruptMetaFileError):
        return _Failure(_CORRUPT, (str(exc.path), str(exc.offset), exc.what))
    if isinstance(exc, ValueError):
        return _Failure(_NOT_UTF8, (str(exc),))
    return None


class CollectiveReader(SampledReader):
    """Shards exchanged between the ranks of a process group, each rank reading 1/W of the files.

    Args:
        paths: the meta files (for a mix, the distinct files of the sources in order of first appearance).
        sources: for a mix, the Sources; None: no mix.
        group: the process group whose ranks share the reading (default: the whole world). Its rank and
            size are this reader's; the exchange runs on a gloo group over the same ranks, made here.
        timeout: how long a collective waits for every rank (default: torch's).
        agree: called as ``agree(fields, gloo_group)`` before the first collective that depends on the
            files: the ranks' agreement check (it raises the same error on every rank if they differ).
        columns: for each file, a Parquet file's chosen columns (None: all); None for every file.

    Raises:
        ValueError: no initialised process group; the files hold no sample; ``columns`` for a file
            that is not Parquet, or a missing, nested or binary column (as the file reader words it).
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
        columns: Sequence[Sequence[str] | None] | None = None,
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
        chosen = [None if c is None else tuple(c) for c in (columns or [None] * len(self.paths))]
        if len(chosen) != len(self.paths):
            raise ValueError(f"give one columns entry a file: {len(self.paths)} paths, {len(chosen)} entries")
        self._timeout = timeout
        self._epoch: int | None = None  # named in a collective's error
        self._readings: dict[int, Reading | RowsReading] = {}  # a build's, by file
        #: What the last build (or the making, before one) cost this rank: bytes of the files read, and
        #: bytes sent and received in its exchange (requests, lengths, lines).
        self.stats = {"read": 0, "sent": 0, "received": 0}
        self.group: Any
        self.group, self._owns_group = _gloo_group(group, timeout)
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)
        try:
            self._setup(sources, agree, chosen)
        except BaseException:
            self.close()
            raise

    def _setup(
        self, sources: Sequence[Source] | None, agree: Agree | None, columns: list[tuple[str, ...] | None]
    ) -> None:
        keys = [FileKey.of(os.stat(p)) for p in self.paths]
        formats = [detect_path(p) for p in self.paths]
        for path, key, fmt, cols in zip(self.paths, keys, formats, columns):
            check_columns(path, fmt, cols)
            if fmt is Format.TEXT:  # a Parquet file cut short is not text: its bytes are no lines
                with open_checked(path, key) as fd:
                    refuse_cut_parquet(path, fd, fmt)
        if agree is not None:
            with self._collective("the agreement check"):
                fields = {"reader": "collective", "files": len(keys), "sizes": tuple(k.size for k in keys)}
                if any(c is not None for c in columns):
                    fields["columns"] = tuple(columns)
                agree({**fields, "formats": tuple(f.value for f in formats)}, self.group)
        self._keys = keys
        checkpoints = self._checkpoints(keys, formats)
        w, files = self.world_size, len(keys)
        failure = None
        try:
            # A Parquet file's footer is read here, by every rank (its slices are cut at its row groups).
            self._texts: list[Text | RowsText] = [
                RowsText(p, k, c) if f is Format.PARQUET else Text(p, k, ck)
                for p, k, f, c, ck in zip(self.paths, keys, formats, columns, checkpoints)
            ]
            # The slices are cut in planned bytes (a Parquet file's are its row groups' sizes in the
            # footer: its text is known once rendered), then placed in bytes of text by the count.
            self._file_offsets = np.concatenate([[0], np.cumsum([t.planned for t in self._texts])]).astype(np.int64)
            planned = int(self._file_offsets[-1])
            lo, hi = (self._cut(planned * r // w) for r in (self.rank, self.rank + 1))
            counts, starts, lengths = self._count(lo, hi)
        except Exception as exc:  # told to every rank by the all-gather, then raised on each
            failure = _failure(exc)
            if failure is None:
                raise
            counts = np.zeros((3, files), np.int64)
            starts = lengths = np.zeros(0, np.int64)
        # One all-gather: each rank's samples, newlines and bytes of text in each file, and whether it
        # could count them.
        mine = np.concatenate([counts.reshape(-1), [failure is not None]])
        table = self._all_gather(mine, "the count of lines")
        self._check_status(table[:, -1], failure)
        per = table[:, :-1].reshape(w, 3, files)
        self._samples, self._newlines, text = per[:, 0, :], per[:, 1, :], per[:, 2, :]  # (rank, file)
        # The slices in bytes of text: rank r's is [_cuts[r], _cuts[r + 1]) of the files taken as one.
        self._file_offsets = np.concatenate([[0], np.cumsum(text.sum(axis=0))]).astype(np.int64)
        self._cuts = np.concatenate([[0], np.cumsum(text.sum(axis=1))]).astype(np.int64)
        for f, t in enumerate(self._texts):
            if isinstance(t, RowsText):
                t.place(int(text[: self.rank, f].sum()), int(text[:, f].sum()))
        total = int(self._file_offsets[-1])
        self.stats["read"] = self._read_bytes(int(self._cuts[self.rank]), int(self._cuts[self.rank + 1]))
        file_samples = self._samples.sum(axis=0)
        self._bounds = Bounds(file_samples)
        # Rank r holds global samples [_owned[r], _owned[r + 1]): slices are in file order.
        held = self._samples.sum(axis=1)
        self._owned = np.concatenate([[0], np.cumsum(held)])
        if self._bounds.total == 0:
            names = ", ".join(str(p) for p in self.paths)
            raise ValueError(f"no samples in {names}: every line is empty or whitespace")
        # What this rank serves: where each sample of its slice starts (from the slice's start) and its
        # length, 4 bytes each where the slices are under 4 GiB. Lengths and requests travel in one
        # dtype on every rank.
        self._len_dtype = offset_dtype(int(np.diff(self._cuts).max()))
        self._req_dtype = offset_dtype(int(held.max()))
        self._starts, self._lengths = starts, lengths.astype(self._len_dtype, copy=False)
        # The exchange runs in rounds: in round k each owner reads and serves its samples
        # [k * per_round, (k + 1) * per_round), about _ROUND bytes of lines.
        self._per_round = max(1, _ROUND * self._bounds.total // max(total, 1))
        self._rounds = max(1, -(-int(held.max()) // self._per_round))
        self._fingerprint, self._file_fingerprints = self._fingerprints(file_samples)
        self._sample(self._bounds.total, self._bounds.starts, sources, None)

    def _checkpoints(self, keys: list[FileKey], formats: list[Format]) -> list[Checkpoints | None]:
        """The checkpoints of each gzip and zstd file (None for another): rank 0 loads them from each
        file's index (which it makes if there is none: one decompression of the file per job) and
        sends them to every rank, or the error it met."""
        if not any(f.compressed for f in formats):
            return [None] * len(formats)
        found: list[Any] = [None]
        if self.rank == 0:
            try:
                found[0] = [
                    _checkpoints(p, k).to_bytes() if f.compressed else None
                    for p, k, f in zip(self.paths, keys, formats)
                ]
            except (OSError, ValueError) as exc:
                found[0] = exc
        import torch.distributed as dist

        with self._collective("the checkpoints"):
            dist.broadcast_object_list(found, group_src=0, group=self.group)
        if isinstance(found[0], BaseException):
            raise found[0]
        got: list[bytes | None] = found[0]
        return [None if raw is None else Checkpoints.from_bytes(raw) for raw in got]

    def _read_bytes(self, lo: int, hi: int) -> int:
        """Bytes of the files (compressed ones of a compressed file) that reading text ``[lo, hi)`` takes."""
        return sum(self._texts[f].compressed(a, b) for f, a, b in self._my_pieces(lo, hi))

    # -- the ShardReader protocol ------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        return self._bounds.total

    @property
    def fingerprint(self) -> str | None:
        """The files' fingerprint, as :attr:`MetaFile.fingerprint <rank_dataset.files.metafile.MetaFile.fingerprint>`
        computes it (a resume state saved with either reader loads with the other)."""
        return self._fingerprint

    def source_fingerprints(self) -> tuple[str, ...]:
        """Each source's: its files', and for a subset the hash of its ids (as the file reader's)."""
        assert self._sampling is not None
        return self._sampling.source_fingerprints(self._file_fingerprints)

    def build(self, spec: ShardSpec) -> Shard:
        """The shard of ``spec``: every rank of the group must call it together (a collective)."""
        if self.group is None:
            raise ValueError("this collective reader was closed (or is a copy in a DataLoader worker): it cannot build")
        self._epoch = spec.epoch
        assert self._sampling is not None
        plan = self._sampling.samples_of(spec)()
        n, ids = plan.size, (plan if self.keeps_ids else None)
        # What is asked for: the plan's samples, or where the plan repeats some, each once.
        items, inverse = _distinct(plan) if _repeats(plan, self.num_samples) else (plan, None)
        del plan
        w, rounds, per = self.world_size, self._rounds, self._per_round
        # Each item's owner and round; the items grouped by (owner, round) by one radix sort.
        # (In place where it can be, and the order in 4 bytes where it fits: at W = 4 a rank's
        # temporaries of 8 bytes a row are as large as its shard.)
        key = np.searchsorted(self._owned[1:], items, side="right")  # the owner, for now
        local = items - self._owned[key]
        del items
        key *= rounds
        key += local // per
        counts = np.bincount(key, minlength=w * rounds).astype(np.int64)
        order = np.argsort(key.astype(_key_dtype(w * rounds)), kind="stable")
        del key
        if n < 1 << 31:
            order = order.astype(np.int32)
        request = local[order].astype(self._req_dtype)
        del local
        # Requests: the number of each owner's samples asked for in each round, then the samples.
        asked = self._all_to_all(counts, np.full(w, rounds, np.int64), "the request sizes").reshape(w, rounds)
        counts = counts.reshape(w, rounds)
        ask, asks = counts.sum(axis=1), asked.sum(axis=1)
        requests = self._all_to_all(request, ask, "the requests", out_splits=asks)
        # Lengths (from what the count of lines found): the shard's offsets, before any line moves.
        send_lengths = self._lengths[requests]
        got_lengths = self._all_to_all(send_lengths, asks, "the line lengths", out_splits=ask)
        sent = counts.nbytes + request.nbytes + send_lengths.nbytes
        received = asked.nbytes + requests.nbytes + got_lengths.nbytes
        del request, send_lengths
        item_lengths = np.empty(got_lengths.size, self._len_dtype)
        item_lengths[order] = got_lengths
        del got_lengths
        row_lengths = item_lengths if inverse is None else item_lengths[inverse]
        writer = ShardWriter(n, int(row_lengths.sum(dtype=np.int64)), ids=ids is not None)
        writer.bounds[0] = 0
        np.cumsum(row_lengths, out=writer.bounds[1:], dtype=writer.bounds.dtype)
        if inverse is not None:
            # The plan's rows by the round their line arrives in.
            item_round = np.empty(item_lengths.size, np.uint16 if rounds < 1 << 16 else np.int64)
            item_round[order] = np.tile(np.arange(rounds, dtype=item_round.dtype), w).repeat(counts.reshape(-1))
            row_round = item_round[inverse]
            del item_round
            by_round = np.argsort(row_round, kind="stable")
            round_cuts = np.concatenate([[0], np.cumsum(np.bincount(row_round, minlength=rounds))])
            del row_round
            item_at = np.empty(item_lengths.size, np.int64)  # where each item is in its round's lines
        asked_at, counts_at = _starts_of(asked), _starts_of(counts)
        self._seen = np.zeros(len(self.paths), np.int64)
        try:
            for k in range(rounds):
                # The owners read and serve the samples of round k, each part of what it sends headed by
                # its status: every rank learns from the lines themselves whether every owner served
                # them as counted, before it packs any.
                send, send_bytes, failure = self._serve(k, requests[_ranges(asked_at[:, k], asked[:, k])], asked[:, k])
                idx = order[_ranges(counts_at[:, k], counts[:, k])]
                lengths = item_lengths[idx].astype(np.int64)
                got_bytes = _split_sums(lengths, counts[:, k]) + _HEAD
                got = self._all_to_all(send, send_bytes, "the lines", out_splits=got_bytes)
                sent, received = sent + send.nbytes, received + got.nbytes
                del send
                self._check_status(got[_exclusive(got_bytes)], failure)
                # Where each line is in what arrived: back to back after its owner's header.
                at = _exclusive(lengths) + _HEAD * np.repeat(np.arange(1, w + 1, dtype=np.int64), counts[:, k])
                if inverse is None:  # item i is row i
                    copy_rows(got, at, lengths, writer.data, writer.bounds[idx])
                else:
                    item_at[idx] = at
                    rows = by_round[round_cuts[k] : round_cuts[k + 1]]
                    copy_rows(got, item_at[inverse[rows]], row_lengths[rows], writer.data, writer.bounds[rows])
                del got, idx, lengths, at
        finally:
            self._close_readings()
        self.stats = {
            "read": self._read_bytes(int(self._cuts[self.rank]), int(self._cuts[self.rank + 1])),
            "sent": int(sent),
            "received": int(received),
        }
        if writer.ids is not None and ids is not None:
            writer.ids[:] = ids
        return writer.finish()

    def _reading(self, f: int) -> Reading | RowsReading:
        """File ``f``'s reading for this build: opened at its first use, closed as the build ends (a
        compressed file's decoder goes on from round to round)."""
        reading = self._readings.get(f)
        if reading is None:
            reading = self._readings[f] = self._texts[f].reading()
        return reading

    def _close_readings(self) -> None:
        readings, self._readings = self._readings, {}
        for reading in readings.values():
            reading.close()

    def where(self, sample: int) -> str:
        """``path:line`` of global sample ``sample`` (found by reading the slice that holds it)."""
        file, local = self._bounds.locate(sample)
        path = self.paths[file]
        text = self._texts[file]
        if not isinstance(text, Text):  # as the file reader names a Parquet file's row
            return f"{path}, row {local}"
        owner = int(np.searchsorted(self._owned, sample, side="right")) - 1
        k = local - int(self._samples[:owner, file].sum())  # its number within the owner's piece
        line = int(self._newlines[:owner, file].sum())
        lo, hi = self._piece(owner, file)
        try:
            with text.open() as reading:
                for buf, offset, last in chunks(reading, lo, hi):
                    chunk = scan_buffer(buf, offset, last)
                    if k < chunk.starts.size:
                        start = int(chunk.starts[k]) - offset
                        return f"{path}:{line + int(np.count_nonzero(buf[:start] == NEWLINE)) + 1}"
                    k -= chunk.starts.size
                    line += chunk.newlines
        except (OSError, MetaFileChangedError, CorruptMetaFileError):
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
        return {**self.__dict__, "group": None, "_sampling": None, "_starts": None, "_lengths": None}

    # -- the slices --------------------------------------------------------------------------------

    def _cut(self, x: int) -> int:
        """The first offset at or after ``x`` (in the planned bytes of the files taken as one) where a
        slice may start: a line's start near ``x`` (see each text's ``line_start``), or the end of the files."""
        offsets = self._file_offsets
        if x >= offsets[-1]:
            return int(offsets[-1])
        f = int(np.searchsorted(offsets, x, side="right")) - 1
        return int(offsets[f]) + self._texts[f].line_start(x - int(offsets[f]))

    def _piece(self, rank: int, file: int) -> tuple[int, int]:
        """``(lo, hi)``: the bytes of ``file`` in ``rank``'s slice (empty: lo == hi)."""
        start = int(self._file_offsets[file])
        size = int(self._file_offsets[file + 1]) - start
        lo = min(max(int(self._cuts[rank]) - start, 0), size)
        hi = min(max(int(self._cuts[rank + 1]) - start, 0), size)
        return lo, max(lo, hi)

    def _my_pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """``(file, a, b)`` of each file's bytes ``[a, b)`` in the global range ``[lo, hi)``."""
        for f in range(len(self.paths)):
            start = int(self._file_offsets[f])
            a, b = max(lo - start, 0), min(hi, int(self._file_offsets[f + 1])) - start
            if a < b:
                yield f, a, b

    def _count(self, lo: int, hi: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any], npt.NDArray[Any]]:
        """``(3, files)``: the samples, the newlines and the bytes of text of each file in the planned
        range ``[lo, hi)``; and where each sample starts (from the slice's start, in bytes of text)
        and its length."""
        counts = np.zeros((3, len(self.paths)), np.int64)
        pieces = list(self._my_pieces(lo, hi))
        # A Parquet file's text may be longer than planned: its starts in 8 bytes until the end.
        rows = any(isinstance(self._texts[f], RowsText) for f, _, _ in pieces)
        dtype = np.dtype(np.int64) if rows else offset_dtype(hi - lo)
        starts: list[npt.NDArray[Any]] = [np.zeros(0, dtype)]
        lengths: list[npt.NDArray[Any]] = [np.zeros(0, dtype)]
        done = 0  # bytes of text of the slice before the piece's
        for f, a, b in pieces:
            for lines in self._texts[f].count(a, b):
                counts[:, f] += (lines.starts.size, lines.newlines, lines.nbytes)
                starts.append((lines.starts + done).astype(dtype))
                lengths.append(lines.lengths.astype(dtype))
            done += int(counts[2, f])
        dtype = offset_dtype(done)
        return (
            counts,
            np.concatenate(starts).astype(dtype, copy=False),
            np.concatenate(lengths).astype(dtype, copy=False),
        )

    def _fingerprints(self, file_samples: npt.NDArray[np.int64]) -> tuple[str, tuple[str, ...]]:
        """MetaFile's fingerprints of the files (together, each alone): read by rank 0, sent to all."""
        if self.rank == 0:
            whole, each = hashlib.sha256(), []
            for path, key, count, text in zip(self.paths, self._keys, file_samples.tolist(), self._texts):
                part = struct.pack("<qq", count, key.size)
                if isinstance(text, RowsText):  # as MetaFile's: other columns, other samples
                    part += "\t".join(text.columns).encode() + b"\n"
                if key.size:
                    n = min(key.size, _FINGERPRINT_BYTES)
                    with open_checked(path, key) as fd:
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

    def _serve(
        self, k: int, rows: npt.NDArray[Any], splits: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], _Failure | None]:
        """Round ``k``: what this rank sends each rank, back to back, and the bytes for each. Rank
        ``r``'s part is a status byte (:data:`_OK` or what went wrong), then its ``splits[r]`` samples
        of ``rows`` (numbers within this slice, all in the round's part of it), from one sequential
        read of the round's part of the slice, which is checked against the count. Also what went
        wrong (a file changed, or a line asked for is not valid UTF-8, naming file and line): then
        the lines' bytes are zeros, and are not packed anywhere.
        """
        held = self._starts.size
        first, stop = k * self._per_round, min((k + 1) * self._per_round, held)
        # The bytes asked for, as counted: what is sent whether or not the lines can be served.
        lengths = self._lengths[rows].astype(np.int64)
        sizes = _split_sums(lengths, splits) + _HEAD
        send = np.empty(int(sizes.sum()), np.uint8)
        heads = _exclusive(sizes)
        send[heads] = _OK
        if k and first >= held:  # the slice has no samples in this round
            return send, sizes, None
        # Bytes [lo, hi) of the slice (from its start): the round's samples, the first round from the
        # slice's start and the last to its end (so that every byte is read, and checked, once).
        lo = 0 if k == 0 else int(self._starts[first])
        hi = int(self._cuts[self.rank + 1] - self._cuts[self.rank]) if stop >= held else int(self._starts[stop])
        try:
            buf, parts, ascii_ = self._read(lo, hi, first, stop)
            at = self._starts[rows].astype(np.int64) - lo
            dst = _exclusive(lengths) + _HEAD * np.repeat(np.arange(1, splits.size + 1, dtype=np.int64), splits)
            copy_rows(buf, at, lengths, send, dst)
            if not ascii_:
                _check_utf8(send, dst, lengths, lambda r: self._line_of(buf, parts, int(at[r]), int(rows[r])))
        except (MetaFileChangedError, ValueError) as exc:  # a CorruptMetaFileError is a ValueError
            failure = _failure(exc)
            assert failure is not None
        else:
            return send, sizes, None
        send[:] = 0
        send[heads] = failure.kind
        return send, sizes, failure

    def _read(
        self, lo: int, hi: int, first: int, stop: int
    ) -> tuple[npt.NDArray[np.uint8], list[tuple[int, int, int]], bool]:
        """Bytes ``[lo, hi)`` of the slice (from its start), which hold its samples ``[first, stop)``:
        read, scanned and checked against what the count of lines found. Also each file's part of them
        as ``(file, start in the buffer, newlines before it in the file)``, and whether all is ASCII."""
        base = int(self._cuts[self.rank])
        buf = np.empty(hi - lo, np.uint8)
        parts, ascii_, done = [], True, first
        for f, a, b in self._my_pieces(base + lo, base + hi):
            path = self.paths[f]
            at = int(self._file_offsets[f]) + a - base - lo  # where the file's part starts in buf
            piece = buf[at : at + b - a]
            reading = self._reading(f)
            chunk = reading.lines(piece, a, until=self._piece(self.rank, f)[1])
            reading.check()
            m = chunk.starts.size
            if not (
                done + m <= stop
                and np.array_equal(chunk.starts + (lo + at), self._starts[done : done + m])
                and np.array_equal(chunk.lengths, self._lengths[done : done + m])
            ):
                counted = f"{int(self._samples[self.rank, f]):,} counted in its bytes {self._piece(self.rank, f)}"
                what = (
                    f"the samples in its bytes [{a:,}, {b:,}) are not those found when the dataset was made ({counted})"
                )
                raise MetaFileChangedError(path, what)
            parts.append((f, at, int(self._newlines[: self.rank, f].sum()) + int(self._seen[f])))
            self._seen[f] += chunk.newlines
            ascii_ = ascii_ and chunk.ascii
            done += m
        if done != stop:
            f = parts[-1][0] if parts else 0
            what = f"a slice of it holds {done - first:,} samples where it held {stop - first:,}"
            raise MetaFileChangedError(self.paths[f], what)
        return buf, parts, ascii_

    def _line_of(self, buf: npt.NDArray[np.uint8], parts: list[tuple[int, int, int]], at: int, row: int) -> str:
        """``path:line`` of the line at ``buf[at]``, this slice's sample ``row`` (``parts`` as
        :meth:`_read` gives them)."""
        f, start, before = next(p for p in reversed(parts) if p[1] <= at)
        if isinstance(self._texts[f], RowsText):  # a row may hold newlines: named by its number
            return self.where(int(self._owned[self.rank]) + row)
        return f"{self.paths[f]}:{before + int(np.count_nonzero(buf[start:at] == NEWLINE)) + 1}"

    def _check_status(self, status: npt.NDArray[Any], failure: _Failure | None) -> None:
        """Raise, on every rank alike, the error of the first owner whose status (``status[r]``: the
        byte rank ``r`` headed its lines with, the same to every rank) says it could not serve its
        slice as counted; its lines are then never packed."""
        import torch.distributed as dist

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
        values = np.ascontiguousarray(values)
        kind = values.dtype
        if kind.kind == "u" and kind.itemsize > 1:  # gloo carries signed integers: the same bits
            values = values.view(f"i{kind.itemsize}")
        mine = torch.from_numpy(values)
        out = torch.empty(int(out_splits.sum()), dtype=mine.dtype)
        with self._collective(name):
            dist.all_to_all_single(out, mine, out_splits.tolist(), splits.tolist(), group=self.group)
        got: npt.NDArray[Any] = out.numpy().view(kind)
        return got


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


def _repeats(plan: npt.NDArray[np.int64], total: int) -> bool:
    """Whether some sample number of ``plan`` (numbers below ``total``) occurs more than once."""
    if plan.size < 2:
        return False
    if total <= 8 * plan.size:  # a flag a sample, no more than 8 bytes a row: no sort
        seen = np.zeros(total, bool)
        seen[plan] = True
        return int(np.count_nonzero(seen)) < plan.size
    ordered = np.sort(plan)
    return bool((ordered[1:] == ordered[:-1]).any())


def _key_dtype(size: int) -> type[np.unsignedinteger[Any]]:
    """The smallest unsigned dtype for keys below ``size`` (up to 16 bits numpy sorts them by radix)."""
    return np.uint8 if size <= 1 << 8 else np.uint16 if size <= 1 << 16 else np.uint32


def _exclusive(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each of ``lengths`` starts, back to back from 0."""
    at = np.empty(lengths.size, np.int64)
    if lengths.size:
        at[0] = 0
        np.cumsum(lengths[:-1], out=at[1:])
    return at


def _starts_of(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each part of ``counts`` (in row-major order) starts, back to back, in its shape."""
    return _exclusive(counts.reshape(-1)).reshape(counts.shape)


def _ranges(starts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``[starts[0], starts[0] + counts[0]), [starts[1], ...), ...`` one after the other, without a loop."""
    total = int(counts.sum())
    out = np.repeat(starts - _exclusive(counts), counts)
    out += np.arange(total, dtype=np.int64)
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


def _checkpoints(path: Path, key: FileKey) -> Checkpoints:
    """The checkpoints of the compressed file ``path`` from its index (made if there is none), which
    must be of the file ``key`` describes."""
    index = load_index(path)
    try:
        checkpoints = read_checkpoints(index)
    except LookupError:  # the cache was removed or replaced meanwhile: the file's index as it is now
        index = load_index(path, rebuild=True)
        checkpoints = read_checkpoints(index)
    what = key.change(index.key)
    if what is not None:
        raise MetaFileChangedError(path, what)
    return checkpoints


def _pread(fd: int, path: Path, offset: int, count: int) -> bytes:
    raw = os.pread(fd, count, offset)
    if len(raw) < count:
        raise MetaFileChangedError(path, "it shrank while being read")
    return raw


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
