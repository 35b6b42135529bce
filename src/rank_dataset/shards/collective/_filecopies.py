"""Private copies of four helpers of :mod:`rank_dataset.files`, kept together in this one module.

TO BE REPLACED by the public helpers that :mod:`rank_dataset.files` exposes (issue 42, item 3: a
fingerprint or a UTF-8 check has one implementation): the switch is made once that re-layout of
``files/`` and this split of the collective reader are both merged. Until then nothing here changes:
:func:`fingerprints` must match :class:`~rank_dataset.files.metafile.MetaFile`'s byte for byte (a
resume state saved with either reader loads with the other), and :func:`check_utf8` must word its
error as the file reader does.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import Checkpoints
from rank_dataset.files.index import FileKey, load_index, read_checkpoints
from rank_dataset.shards._text import open_checked

__all__ = ["check_utf8", "checkpoints", "fingerprints", "pread"]

_FINGERPRINT_BYTES = 1 << 16  # as MetaFile's fingerprint: each file's first and last 64 KiB


def fingerprints(
    paths: Sequence[Path],
    keys: Sequence[FileKey],
    counts: Sequence[int],
    columns: Sequence[Sequence[str] | None],
) -> tuple[str, tuple[str, ...]]:
    """MetaFile's fingerprints of the files (together, and each alone): ``counts`` their samples,
    ``columns`` a Parquet file's columns read (None: not a Parquet file)."""
    whole, each = hashlib.sha256(), []
    for path, key, count, cols in zip(paths, keys, counts, columns):
        part = struct.pack("<qq", count, key.size)
        if cols is not None:  # as MetaFile's: other columns, other samples
            part += "\t".join(cols).encode() + b"\n"
        if key.size:
            n = min(key.size, _FINGERPRINT_BYTES)
            with open_checked(path, key) as fd:
                part += pread(fd, path, 0, n) + pread(fd, path, key.size - n, n)
        whole.update(part)
        each.append(hashlib.sha256(part).hexdigest()[:32])
    return whole.hexdigest()[:32], tuple(each)


def checkpoints(path: Path, key: FileKey) -> Checkpoints:
    """The checkpoints of the compressed file ``path`` from its index (made if there is none), which
    must be of the file ``key`` describes."""
    index = load_index(path)
    try:
        found = read_checkpoints(index)
    except LookupError:  # the cache was removed or replaced meanwhile: the file's index as it is now
        index = load_index(path, rebuild=True)
        found = read_checkpoints(index)
    what = key.change(index.key)
    if what is not None:
        raise MetaFileChangedError(path, what)
    return found


def pread(fd: int, path: Path, offset: int, count: int) -> bytes:
    """``count`` bytes of ``path`` (open as ``fd``) from ``offset``; MetaFileChangedError if fewer."""
    raw = os.pread(fd, count, offset)
    if len(raw) < count:
        raise MetaFileChangedError(path, "it shrank while being read")
    return raw


def check_utf8(
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
