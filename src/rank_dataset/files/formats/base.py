"""What every meta file format answers (:class:`Format`): the protocol the readers above the formats
(the index, :class:`~rank_dataset.files.read.metafile.MetaFile`, grouping, the collective reader) go
through, so that a new format is its own module and a line in :mod:`~rank_dataset.files.formats.registry`.

A format is one of three kinds, which decide how the readers above use it:

- text (``compressed`` and ``rows`` False): the file's bytes are its lines, scanned in place;
- a compressed stream of text (``compressed``): its decompressed bytes are lines; the index is made in one
  decompression (:meth:`Format.stream`) that records checkpoints, and reads start at the checkpoint
  before them (:meth:`Format.reader`);
- rows of a table (``rows``, Parquet): no scan; its index is read from the file (its footer).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rank_dataset.core.arrays import Int64Array
from rank_dataset.files.formats._raw import RawFile

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["BLOCK", "SPACING", "Decoder", "Format", "Points", "Recognised", "row_at"]

#: Decompressed bytes between two checkpoints (at least; zstd's are frame starts).
SPACING = 4 << 20
#: Decompressed bytes handed out at a time by a :class:`~rank_dataset.files.formats.checkpoints.Decompression`.
BLOCK = 4 << 20
#: What a compressed format's pass returns once its bytes are out: (decompressed size, checkpoints
#: ``(output, input)`` rows from ``(0, 0)``, the decoder's state the checkpoints need besides).
Stream = Generator[bytes, None, tuple[int, Int64Array, bytes]]


def row_at(points: Int64Array, offset: int) -> int:
    """The row of the last checkpoint at or before output ``offset`` in ``points``, ``(output, input)``
    rows increasing from ``(0, 0)`` (row 0 is output 0)."""
    return max(int(np.searchsorted(points[:, 0], offset, side="right")) - 1, 0)


class Recognised(Protocol):
    """The bytes of a file that tell its format: ``head`` (its first bytes, up to 8), its ``size``,
    and ``tail(n)``, its last ``n`` bytes (read only if a format asks)."""

    @property
    def head(self) -> bytes: ...

    @property
    def size(self) -> int: ...

    def tail(self, n: int) -> bytes: ...


class Points(Protocol):
    """What a format's decoder reads a compressed file from (a
    :class:`~rank_dataset.files.formats.checkpoints.Checkpoints`): the ``format``, the decompressed
    ``size``, ``(output, input)`` ``points`` from ``(0, 0)`` and the decoder's ``state``."""

    @property
    def format(self) -> Format: ...

    @property
    def size(self) -> int: ...

    @property
    def points(self) -> Int64Array: ...

    @property
    def state(self) -> bytes: ...


class Decoder(Protocol):
    """Random reads of a compressed file's decompressed bytes, each from the checkpoint before it (or
    on from where the read before stopped). Not thread-safe."""

    def read(self, a: int, b: int, until: int | None = None) -> tuple[bytes, int]:
        """``(bytes [a, b) (short if the file ends first), output bytes decompressed)``; ``until``: the
        next read starts at ``b``, and none asks past ``until``."""
        ...

    def close(self) -> None: ...


class Format:
    """One format of meta file. Subclasses set ``value`` (its name, kept in caches: at most 8 ASCII
    bytes), ``code`` (its number in the index cache's header) and the kind (``compressed`` or
    ``rows``), and implement what their kind needs. Instances compare by identity: one per format,
    listed by the registry (which pickles them by name)."""

    value: str = ""
    code: int = -1
    #: A compressed stream of text, read through checkpoints.
    compressed: bool = False
    #: Rows of a table (Parquet): indexed from the file itself, read by row group.
    rows: bool = False

    def __repr__(self) -> str:
        return f"<Format.{self.value.upper()}>"

    def recognise(self, found: Recognised) -> bool:
        """Whether a file with these first (and last) bytes is of this format."""
        raise NotImplementedError

    def refuse_cut(self, path: Path, head: bytes, size: int) -> None:
        """Raise CorruptMetaFileError if a file that no format recognised (so told as text), with these
        first 64 KiB (``head``) and ``size``, is a file of this format cut short: read as text, its
        bytes would be taken for lines. By default, nothing."""

    # -- a compressed stream of text -----------------------------------------------------------------

    def stream(self, path: Path, fd: RawFile, spacing: int, block: int) -> Stream:
        """Yield the decompressed bytes of the file open at ``fd`` (``path`` names it in errors) in
        blocks of about ``block`` bytes, checked; return its size, its checkpoints at least ``spacing``
        output bytes apart, and the state they need.

        Raises (while iterated):
            CorruptMetaFileError: the file is corrupt or truncated.
        """
        raise ValueError(f"{path} is {self.value}, not a compressed stream of text")

    def members(self, path: Path, fd: RawFile, block: int) -> Iterator[bytes]:
        """The checked decompressed bytes, front to back, without recording checkpoints (for a reader
        of the whole file in order: grouping). By default :meth:`stream`'s."""
        yield from self.stream(path, fd, SPACING, block)

    def reader(self, path: Path, fd: RawFile, checkpoints: Points) -> Decoder:
        """A :class:`Decoder` of the file open at ``fd``, which ``checkpoints`` were made from."""
        raise ValueError(f"{path} is {self.value}, not a compressed stream of text")

    def span_cuts(self, checkpoints: Points, span: int) -> Int64Array:
        """Where a span cache cuts the decompressed bytes (a span is decoded and kept whole): the
        checkpoints by default; a format whose checkpoints may lie far apart cuts them every ``span``."""
        return checkpoints.points[:, 0]

    # -- rows of a table -------------------------------------------------------------------------------

    def open_rows(self, path: Path, columns: Sequence[str] | None) -> Any:
        """The rows of the file ``path`` as lines of its ``columns`` (None: all), its footer read: what the
        index (the rows of each row group) and every read of rows go through.

        Raises:
            ValueError: a column is missing, nested or binary.
            CorruptMetaFileError: the footer cannot be read.
        """
        raise ValueError(f"{path} is {self.value}, not rows of a table")

    # -- any -----------------------------------------------------------------------------------------

    def advice(self, path: Path, checkpoints: Points) -> str | None:
        """What to do about a file this format reads slowly (``rank-dataset index`` prints it); None."""
        return None
