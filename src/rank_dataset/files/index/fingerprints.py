"""The fingerprint of meta files: a short hash of each file's sample count, size (and a Parquet
file's chosen columns) and first and last 64 KiB, computed without reading the whole file. What a
resume state is checked against, and what the ranks agree on; equal for the same files on any machine
(paths and mtimes do not enter it).

The file reader (:class:`~rank_dataset.files.read.metafile.MetaFile`) and the collective reader both call
:func:`fingerprints`: one implementation, the same bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.io import ENDS, ShortRead, SourceKey, open_source, read_ends

__all__ = ["FINGERPRINT_BYTES", "fingerprint_part", "fingerprints"]

#: Bytes of each end of a file that enter its fingerprint.
FINGERPRINT_BYTES = ENDS


def fingerprint_part(count: int, size: int, columns: Sequence[str] | None, ends: bytes) -> bytes:
    """What a file contributes to a fingerprint: its ``count`` samples, its ``size``, a Parquet file's
    chosen ``columns`` (the same file read with other columns holds other samples), and ``ends``, its
    first and last :data:`FINGERPRINT_BYTES` (all of it twice if shorter; nothing if empty)."""
    part = struct.pack("<qq", count, size)
    if columns is not None:
        part += "\t".join(columns).encode() + b"\n"
    return part + ends


def _ends(path: Path, key: SourceKey) -> bytes:
    if not key.size:
        return b""
    with open_source(path, key=key) as source:  # an object: checked by one HEAD, read in two GETs
        try:
            return read_ends(source)
        except ShortRead:
            raise MetaFileChangedError(path, "it shrank while being read") from None


def fingerprints(files: Iterable[tuple[Path, SourceKey, int, Sequence[str] | None]]) -> tuple[str, tuple[str, ...]]:
    """The fingerprint of ``files`` taken as one, and of each alone: for each ``(path, key, samples,
    columns)`` (``columns`` a Parquet file's chosen ones, else None), one read of its ends.

    Raises:
        MetaFileChangedError: a file is not the one ``key`` describes, or shrank.
    """
    whole, each = hashlib.sha256(), []
    for path, key, count, columns in files:
        part = fingerprint_part(count, key.size, columns, _ends(path, key))
        whole.update(part)
        each.append(hashlib.sha256(part).hexdigest()[:32])
    return whole.hexdigest()[:32], tuple(each)
