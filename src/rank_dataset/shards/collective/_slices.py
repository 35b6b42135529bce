"""The slices of the collective reader: the meta files taken as one text, cut into one contiguous slice
a rank at line starts (a compressed file's near its checkpoints, a Parquet file's at its row groups),
and counted, each rank its own, then placed by one all-gather of the counts (:func:`count_slices`).
Also what rank 0 reads for every rank at the making: the compressed files' checkpoints and the
fingerprints.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import prefix_sums
from rank_dataset.core.shard import offset_dtype
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.formats import PARQUET, Checkpoints, Format
from rank_dataset.files.index.fingerprints import fingerprints
from rank_dataset.files.index.load import checkpoints_of
from rank_dataset.files.index.scan import scan_buffer
from rank_dataset.files.io import SourceKey
from rank_dataset.plan.bounds import Bounds
from rank_dataset.shards._rows import RowsText
from rank_dataset.shards._text import Text, chunks
from rank_dataset.shards.collective import _routing
from rank_dataset.shards.collective._dist import Collectives, from_rank0
from rank_dataset.shards.collective._status import failure_of, raise_reported

__all__ = ["Slices", "count_slices", "shared_checkpoints", "shared_fingerprints"]

_Ints = npt.NDArray[np.int64]


class Slices:
    """The files' slices as every rank knows them once the lines are counted.

    Rank ``r``'s slice is bytes ``[cuts[r], cuts[r + 1])`` of the text of the files taken as one (file
    ``f`` is ``[offsets[f], offsets[f + 1])`` of it), and holds the global samples
    ``[owned[r], owned[r + 1])``; ``samples`` and ``newlines`` are of shape (rank, file).
    """

    def __init__(
        self, paths: tuple[Path, ...], texts: list[Text | RowsText], rank: int, table: npt.NDArray[np.int64]
    ) -> None:
        w, files = table.shape[0], len(paths)
        self.paths, self.texts, self.rank = paths, texts, rank
        per = table.reshape(w, 3, files)
        self.samples, self.newlines, text = per[:, 0, :], per[:, 1, :], per[:, 2, :]  # (rank, file)
        self.offsets = prefix_sums(text.sum(axis=0))
        self.cuts = prefix_sums(text.sum(axis=1))
        for f, t in enumerate(texts):
            if isinstance(t, RowsText):
                t.place(int(text[:rank, f].sum()), int(text[:, f].sum()))
        self.bounds = Bounds(self.samples.sum(axis=0))
        #: The samples each rank's slice holds; slices are in file order.
        self.held: _Ints = self.samples.sum(axis=1)
        self.owned = prefix_sums(self.held)

    @property
    def text_bytes(self) -> int:
        """Bytes of text of the files together."""
        return int(self.offsets[-1])

    @property
    def slice_bytes(self) -> int:
        """Bytes of text of this rank's slice."""
        return int(self.cuts[self.rank + 1] - self.cuts[self.rank])

    def piece(self, rank: int, file: int) -> tuple[int, int]:
        """``(lo, hi)``: the bytes of ``file`` in ``rank``'s slice (empty: lo == hi)."""
        return _routing.piece(self.offsets, self.cuts, rank, file)

    def pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """``(file, a, b)`` of each file's bytes ``[a, b)`` in the range ``[lo, hi)`` of the files as one."""
        return _routing.pieces(self.offsets, lo, hi)

    def read_bytes(self) -> int:
        """Bytes of the files (compressed ones of a compressed file) that reading this rank's slice takes."""
        lo, hi = int(self.cuts[self.rank]), int(self.cuts[self.rank + 1])
        return sum(self.texts[f].compressed(a, b) for f, a, b in self.pieces(lo, hi))

    def where(self, sample: int) -> str:
        """``path:line`` of global sample ``sample`` (found by reading the slice that holds it)."""
        file, local = self.bounds.locate(sample)
        path = self.paths[file]
        text = self.texts[file]
        if not isinstance(text, Text):  # as the file reader names a Parquet file's row
            return f"{path}, row {local}"
        owner = int(np.searchsorted(self.owned, sample, side="right")) - 1
        k = local - int(self.samples[:owner, file].sum())  # its number within the owner's piece
        line = int(self.newlines[:owner, file].sum())
        lo, hi = self.piece(owner, file)
        try:
            with text.open() as reading:
                for buf, offset, last in chunks(reading, lo, hi):
                    chunk = scan_buffer(buf, offset, last)
                    if k < chunk.starts.size:
                        start = int(chunk.starts[k]) - offset
                        return f"{path}:{line + native.count_newlines(buf[:start]) + 1}"
                    k -= chunk.starts.size
                    line += chunk.newlines
        except (OSError, MetaFileChangedError, CorruptMetaFileError):
            pass
        return f"{path}, sample {local} of the file"


def count_slices(
    net: Collectives,
    paths: tuple[Path, ...],
    keys: Sequence[SourceKey],
    formats: Sequence[Format],
    columns: Sequence[tuple[str, ...] | None],
    checkpoints: Sequence[Checkpoints | None],
) -> tuple[Slices, list[npt.NDArray[Any]], list[npt.NDArray[Any]]]:
    """Cut the files into slices, count this rank's lines, and place every slice by one all-gather of
    each rank's samples, newlines and bytes of text in each file (and whether it could count them: an
    error met by any rank is raised on every rank). Also where each sample of this rank's slice starts
    (from the slice's start, in bytes of text) and its length, in parts (one a read, in order: the
    exchange writes them once, into its shared table)."""
    w, files = net.world_size, len(paths)
    failure = None
    try:
        # A Parquet file's footer is read here, by every rank (its slices are cut at its row groups).
        texts: list[Text | RowsText] = [
            RowsText(p, k, c) if f is PARQUET else Text(p, k, ck)
            for p, k, f, c, ck in zip(paths, keys, formats, columns, checkpoints)
        ]
        # The slices are cut in planned bytes (a Parquet file's are its row groups' sizes in the
        # footer: its text is known once rendered), then placed in bytes of text by the count.
        planned = prefix_sums([t.planned for t in texts])
        lo, hi = (_cut(texts, planned, int(planned[-1]) * r // w) for r in (net.rank, net.rank + 1))
        counts, starts, lengths = _count(texts, planned, lo, hi)
    except Exception as exc:  # told to every rank by the all-gather, then raised on each
        failure = failure_of(exc)
        if failure is None:
            raise
        counts = np.zeros((3, files), np.int64)
        starts, lengths = [], []
    mine = np.concatenate([counts.reshape(-1), [failure is not None]])
    table = net.all_gather(mine, "the count of lines")
    raise_reported(net, table[:, -1], failure)
    return Slices(paths, texts, net.rank, table[:, :-1]), starts, lengths


def _cut(texts: Sequence[Text | RowsText], offsets: _Ints, x: int) -> int:
    """The first offset at or after ``x`` (in the planned bytes of the files taken as one, the files at
    ``offsets``) where a slice may start: a line's start near ``x`` (see each text's ``line_start``), or
    the end of the files."""
    if x >= offsets[-1]:
        return int(offsets[-1])
    f = int(np.searchsorted(offsets, x, side="right")) - 1
    return int(offsets[f]) + texts[f].line_start(x - int(offsets[f]))


def _count(
    texts: Sequence[Text | RowsText], offsets: _Ints, lo: int, hi: int
) -> tuple[_Ints, list[npt.NDArray[Any]], list[npt.NDArray[Any]]]:
    """``(3, files)``: the samples, the newlines and the bytes of text of each file in the planned
    range ``[lo, hi)``; and where each sample starts (from the slice's start, in bytes of text)
    and its length, in parts."""
    counts = np.zeros((3, len(texts)), np.int64)
    pieces = list(_routing.pieces(offsets, lo, hi))
    # A Parquet file's text may be longer than planned: its starts in 8 bytes until the end.
    rows = any(isinstance(texts[f], RowsText) for f, _, _ in pieces)
    dtype = np.dtype(np.int64) if rows else offset_dtype(hi - lo)
    starts: list[npt.NDArray[Any]] = []
    lengths: list[npt.NDArray[Any]] = []
    done = 0  # bytes of text of the slice before the piece's
    for f, a, b in pieces:
        for lines in texts[f].count(a, b):
            counts[:, f] += (lines.starts.size, lines.newlines, lines.nbytes)
            # From the slice's start, in the table's width; kept in parts, never joined here (a joined
            # copy would be new memory the size of the table, written once more).
            starts.append(np.add(lines.starts, done, out=np.empty(lines.starts.size, dtype), casting="unsafe"))
            lengths.append(lines.lengths.astype(dtype))
        done += int(counts[2, f])
    return counts, starts, lengths


def shared_checkpoints(
    net: Collectives, paths: Sequence[Path], keys: Sequence[SourceKey], formats: Sequence[Format]
) -> list[Checkpoints | None]:
    """The checkpoints of each gzip and zstd file (None for another): rank 0 loads them from each
    file's index (which it makes if there is none: one decompression of the file per job) and
    sends them to every rank, or the error it met."""
    if not any(f.compressed for f in formats):
        return [None] * len(formats)
    got: list[bytes | None] = from_rank0(
        net,
        lambda: [checkpoints_of(p, k).to_bytes() if f.compressed else None for p, k, f in zip(paths, keys, formats)],
        "the checkpoints",
        (OSError, ValueError),
    )
    return [None if raw is None else Checkpoints.from_bytes(raw) for raw in got]


def shared_fingerprints(
    net: Collectives, slices: Slices, keys: Sequence[SourceKey], file_samples: _Ints
) -> tuple[str, tuple[str, ...]]:
    """MetaFile's fingerprints of the files (together, each alone): read by rank 0, sent to all."""

    def both() -> tuple[str, tuple[str, ...]]:
        columns = [t.columns if isinstance(t, RowsText) else None for t in slices.texts]
        return fingerprints(zip(slices.paths, keys, file_samples.tolist(), columns))

    whole, each = from_rank0(net, both, "the fingerprint")
    return whole, tuple(each)
