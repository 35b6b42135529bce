"""The text of a Parquet meta file as the collective reader reads it: its rows' lines (the chosen
columns joined by a tab, as :class:`~rank_dataset.files.formats.ParquetRows` renders them), each
followed by a newline, row group after row group. Row ``i`` is sample ``i`` and line ``i``, whatever it
holds (an empty row, a value with a tab or a newline): the samples are the rows, never a scan of the
bytes, so the shards are the file reader's.

A row group's text is known only once it is decoded, so a Parquet file is cut into slices in other
coordinates first (:attr:`RowsText.planned`): each row group weighs its chosen columns' uncompressed
bytes from the footer (plus one, so that no row group weighs nothing), and slices start at row-group
boundaries. Each rank renders only its own row groups (:meth:`RowsText.count`); once the ranks have
all-gathered what each rendered, :meth:`RowsText.place` puts this rank's row groups at their offsets
in the file's text, which the exchange reads (:meth:`RowsReading.lines`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.files.formats import ParquetRows, source_rows
from rank_dataset.files.io import ByteSource, SourceKey, open_source
from rank_dataset.files.io.object import REQUEST
from rank_dataset.files.read.file import checked_rows
from rank_dataset.shards._text import Lines, SourceReading, SourceText

__all__ = ["RowsReading", "RowsText"]

_IntArray = npt.NDArray[np.int64]


class RowsText(SourceText["RowsReading"]):
    """The rows of the Parquet file at ``path`` (which ``key`` describes) as text, ``columns`` chosen.

    Raises:
        ValueError: a chosen column is missing, nested or binary (as the file reader words it).
        CorruptMetaFileError: the footer cannot be read.
        MetaFileChangedError: the file is not the one of ``key``.
    """

    def __init__(self, path: Path, key: SourceKey, columns: Sequence[str] | None) -> None:
        self.path, self.key = path, key
        with open_source(path, key=key, checked=False) as source:  # an object's GETs pinned to its ETag
            rows = source_rows(source, columns)
            if source.local:
                source.check()  # the footer read was this file's
        self.columns, self.layout = rows.columns, rows.layout
        self._read_bytes, uncompressed = rows.group_bytes()
        #: Row group ``g`` is bytes ``[edges[g], edges[g + 1])`` of the planned coordinates.
        self.edges: _IntArray = prefix_sums(uncompressed + 1)
        #: Bytes of text: known once :meth:`place` is called.
        self.size = -1
        #: This rank's row groups ``[g0, g1)``: those :meth:`count` rendered.
        self.groups = (0, 0)
        self._sizes: _IntArray = np.zeros(0, np.int64)  # their bytes of text
        #: Where each of them starts in the text, and where the last ends (once placed).
        self.group_starts: _IntArray = np.zeros(1, np.int64)

    @property
    def planned(self) -> int:
        """The file's weight in the coordinates its slices are cut in (its row groups', from the footer)."""
        return int(self.edges[-1])

    def line_start(self, x: int) -> int:
        """The row-group boundary nearest ``x`` (planned coordinates): where a slice starts."""
        return int(self.edges[int(np.argmin(np.abs(self.edges - x)))])

    def count(self, a: int, b: int) -> Iterator[Lines]:
        """The rows of the row groups in ``[a, b)`` (planned coordinates, at row-group boundaries),
        one row group at a time, rendered; kept (their sizes) for :meth:`place`."""
        g0, g1 = (int(np.searchsorted(self.edges, x)) for x in (a, b))
        self.groups, self._sizes, done = (g0, g1), np.zeros(g1 - g0, np.int64), 0
        with self.open() as reading:
            for g in range(g0, g1):
                text, starts, lengths = reading.render(g)
                yield Lines(starts + done, lengths, starts.size, text.size, _ascii(text))
                self._sizes[g - g0] = text.size
                done += text.size

    def place(self, start: int, size: int) -> None:
        """Put this rank's row groups (those :meth:`count` rendered) at byte ``start`` of the file's
        text, which is ``size`` bytes long."""
        self.size = size
        self.group_starts = start + prefix_sums(self._sizes)

    def compressed(self, lo: int, hi: int) -> int:
        """Bytes of the file that reading text ``[lo, hi)`` (of this rank's row groups) takes: its row
        groups' chosen columns (the footer, read with each reading, is not counted)."""
        g0 = self.groups[0]
        first = int(np.searchsorted(self.group_starts, lo, side="right")) - 1
        last = int(np.searchsorted(self.group_starts, hi, side="left"))
        return int(self._read_bytes[g0 + max(first, 0) : g0 + last].sum()) if lo < hi else 0

    def _reading_of(self, source: ByteSource) -> RowsReading:
        return RowsReading(self, source)


class RowsReading(SourceReading):
    """Reads of a :class:`RowsText` through one descriptor, checked against its key, the footer read
    again and checked against the one the text was made from. Keeps the last row group it rendered
    (the rounds of an exchange read on from where the one before stopped)."""

    def __init__(self, text: RowsText, source: ByteSource) -> None:
        self.text, self.source = text, source
        # Row groups in order, this rank's: an object's chunks in GETs of about 32 MiB.
        rows = checked_rows(source, text.layout, "the dataset was made", ahead=REQUEST)
        self._rows: ParquetRows | None = rows
        self._kept: tuple[int, npt.NDArray[np.uint8], _IntArray, _IntArray] | None = None

    def render(self, g: int) -> tuple[npt.NDArray[np.uint8], _IntArray, _IntArray]:
        """Row group ``g`` as text: its bytes, and where each row starts in them and its length."""
        if self._kept is None or self._kept[0] != g:
            assert self._rows is not None, "the reading was closed"
            self._kept = (g, *self._rows.group_text(g))
        return self._kept[1], self._kept[2], self._kept[3]

    def lines(self, buf: npt.NDArray[np.uint8], offset: int, until: int | None = None) -> Lines:
        """Fill ``buf`` from byte ``offset`` of the text (within this rank's row groups, placed;
        ``offset`` starts a row and ``buf`` ends one) and give its rows."""
        del until  # a row group is decoded whole: there is nothing past it to read on to
        text, done = self.text, 0
        starts: list[_IntArray] = [np.zeros(0, np.int64)]
        lengths: list[_IntArray] = [np.zeros(0, np.int64)]
        k = int(np.searchsorted(text.group_starts, offset, side="right")) - 1  # this rank's k-th row group
        while done < buf.size:
            at = int(text.group_starts[k])  # where it starts in the text
            rendered, row_starts, row_lengths = self.render(text.groups[0] + k)
            a, b = offset + done - at, min(offset + buf.size - at, rendered.size)
            buf[done : done + b - a] = rendered[a:b]
            rows = slice(*np.searchsorted(row_starts, (a, b)).tolist())
            starts.append(row_starts[rows] + (at - offset))
            lengths.append(row_lengths[rows])
            done, k = done + b - a, k + 1
        found = np.concatenate(starts)
        return Lines(found, np.concatenate(lengths), found.size, buf.size, _ascii(buf))

    def close(self) -> None:
        """Let go of the row group kept, the footer and the descriptor."""
        if self._rows is None:
            return
        self._rows = self._kept = None
        self.source.close()


def _ascii(data: npt.NDArray[np.uint8]) -> bool:
    return not data.size or int(data.max()) < 0x80
