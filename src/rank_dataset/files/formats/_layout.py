"""What the index of a Parquet file holds (:class:`ParquetLayout`), apart from the reader: a rank over a
text file reads index caches that name it, and imports no Parquet reader (issue 44, item 6). No torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParquetLayout"]


@dataclass(frozen=True)
class ParquetLayout:
    """What the index of a Parquet file holds: the chosen ``columns``, the hash of their names and
    types (``schema_hash``), and ``bounds``: row ``bounds[g]`` is the first of row group ``g``,
    ``bounds[-1]`` the number of rows. All from the footer."""

    columns: tuple[str, ...]
    schema_hash: bytes
    bounds: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.bounds[-1]
