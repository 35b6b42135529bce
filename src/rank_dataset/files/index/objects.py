"""Meta files in object storage (text, gzip, zstd and Parquet), for the index and
:class:`~rank_dataset.files.read.metafile.MetaFile`: the index of an object (built by one streaming pass,
cached locally, never in the bucket; a Parquet object's from its footer), and its bytes read with
coalesced ranged GETs (a compressed object's through its checkpoints, each decoder reading its spans
in order; a Parquet object's by pyarrow through a file object of exact ranged GETs).

An object's index is cached under the user cache directory (or ``RANK_DATASET_CACHE_DIR``), named by
a hash of its :class:`~rank_dataset.files.io.ObjectKey` (URL, size, ETag), one process a node building it
while the others wait. Every read is pinned to the ETag of the process's first HEAD.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import UrlPath
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.formats import ParquetRows, SpanSource, detect_source, object_rows, refuse_cut_source
from rank_dataset.files.index._build import cached_index, index_in_memory
from rank_dataset.files.index._cachefile import Index
from rank_dataset.files.index._entries import read_checkpoints
from rank_dataset.files.index.cache import CACHE_DIR_ENV
from rank_dataset.files.io import ByteSource, SourceKey, hash_ends, open_source
from rank_dataset.files.io.object import COALESCE

__all__ = ["ObjectBytes", "ObjectSpans", "load_object_index", "object_cache_path"]

_Ints = npt.NDArray[np.int64]


def object_cache_path(url: str, key: SourceKey) -> Path:
    """Where the index of the object ``url`` (``key``: its URL, size and ETag) is cached on this node."""
    name = f"{UrlPath(url).name}.{key.size}.{key.digest().hex()[:32]}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override) / name
    from platformdirs import user_cache_dir  # on first use, as for a local file's index

    return Path(user_cache_dir("rank-dataset")) / "objects" / name


def load_object_index(source: ByteSource, *, rebuild: bool = False, columns: Sequence[str] | None = None) -> Index:
    """The index of the object ``source``: from this node's cache, else built by one streaming pass (one
    process builds while the others wait) and cached (in memory where no cache is writable).

    Raises:
        FileNotFoundError, PermissionError, OSError: the object cannot be had (naming URL and status).
        ValueError: ``columns`` for an object that is not Parquet, or naming a column a Parquet
            object lacks (or a nested or binary one).
        ImportError: a Parquet object without pyarrow.
        MetaFileChangedError: it was replaced while it was being indexed.
    """
    path = source.path
    fmt = detect_source(source)
    if fmt.rows:  # its index is its footer's (a GET or two, not cached: as a local Parquet file's)
        ends_hash = hash_ends(source)
        rows = object_rows(source, columns)
        return Index(source.key, ends_hash, len(rows), False, None, None, fmt, parquet=rows.layout)
    if columns is not None:
        raise ValueError(f"columns= picks the columns of a Parquet meta file, and {path} is {fmt.value}")
    refuse_cut_source(path, source, fmt)  # type: ignore[arg-type]
    key = source.key
    ends_hash = hash_ends(source)
    cache = object_cache_path(str(path), key)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        return cached_index([cache], path, source, key, ends_hash, rebuild=rebuild)  # type: ignore[arg-type]
    except OSError:  # no writable cache directory: the lock cannot be taken either
        return index_in_memory(path, source, key, ends_hash)  # type: ignore[arg-type]


class ObjectSpans:
    """The bytes of an object as :class:`~rank_dataset.files.io.pread.Window` asks them (a RangeLoader):
    the ranges of a batch merged where less than ``COALESCE`` bytes lie between them, one GET each."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source

    def load(
        self,
        starts: _Ints,
        stops: _Ints,
        end: int,
        pad: int = 0,
        buffer: Callable[[int], npt.NDArray[np.uint8]] | None = None,
    ) -> tuple[npt.NDArray[np.uint8], int | _Ints]:
        hi = np.minimum(stops, min(end, self.source.size)).astype(np.int64)
        lo = np.minimum(starts, hi).astype(np.int64)
        shift = np.zeros(lo.size, np.int64)
        if not lo.size:
            return np.zeros(pad, np.uint8), 0
        order = np.argsort(lo, kind="stable")
        reach = np.maximum.accumulate(hi[order])
        # A new group where a range starts more than COALESCE past all before it reach.
        cut = np.flatnonzero(lo[order][1:] > reach[:-1] + COALESCE) + 1
        groups = np.split(order, cut)
        spans = [(int(lo[g].min()), int(hi[g].max())) for g in groups]
        total = sum(b - a for a, b in spans)
        buf = buffer(total + pad) if buffer is not None else np.empty(total + pad, np.uint8)
        at = 0
        for g, (a, b) in zip(groups, spans):
            if b > a:
                self.source.read_into(buf[at : at + b - a], a)
            shift[g] = a - at
            at += b - a
        buf[at : at + pad] = 0
        return buf, shift

    def close(self) -> None:
        """Nothing: the source holds no descriptor."""


class ObjectBytes:
    """The bytes of one meta file that is an object, for MetaFile (as
    :class:`~rank_dataset.files.read.file.FileBytes` for a local file): the object opened (one HEAD) on the
    first read in a process and checked against the index's key, then every read pinned to its ETag."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._source: ByteSource | None = None
        self._rows: tuple[tuple[int, object], ParquetRows] | None = None  # a Parquet object's footer, read
        self._pid = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path}  # a UrlPath: its settings go with it (a client does not)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(UrlPath(state["path"]))  # type: ignore[misc, arg-type]

    def source(self, key: SourceKey) -> ByteSource:
        """The object, checked to be the one indexed (``key``)."""
        with self._lock:
            if self._source is None or self._pid != os.getpid():
                try:
                    self._source = open_source(self.path, key=key)
                except FileNotFoundError:
                    raise MetaFileChangedError(self.path, "it was deleted") from None
                self._pid = os.getpid()
            return self._source

    @contextlib.contextmanager
    def open(self, index: Index) -> Iterator[ObjectSpans | SpanSource]:
        """The object's bytes (a compressed one's decompressed bytes, from its checkpoints)."""
        source = self.source(index.key)
        if not index.format.compressed:
            yield ObjectSpans(source)
            return
        spans = SpanSource(
            self.path, source, read_checkpoints(index), lambda: open_source(self.path, key=source.key, checked=False)
        )
        try:
            yield spans
        finally:
            spans.close()

    @contextlib.contextmanager
    def rows(self, index: Index) -> Iterator[ParquetRows]:
        """The rows of a Parquet object, its footer read again (pinned to the ETag indexed) and checked
        against ``index`` (the same row groups and schema of the chosen columns), as a local file's."""
        layout = index.parquet
        if layout is None:
            raise ValueError(f"{self.path} was not indexed as a Parquet file")
        source = self.source(index.key)
        held = self._rows
        if held is not None and held[0] == (os.getpid(), layout):
            # Its footer, read once in this process: every GET is pinned to the ETag indexed, so
            # the footer cannot have changed (a replaced object fails the next GET).
            yield held[1]
            return
        try:
            rows = object_rows(source, layout.columns)
        except ValueError as exc:  # a chosen column gone, or nested now (the ETag held: never so)
            raise MetaFileChangedError(self.path, f"its schema changed since it was indexed ({exc})") from None
        if rows.schema_hash != layout.schema_hash or rows.layout.bounds != layout.bounds:
            raise MetaFileChangedError(self.path, "its schema or row groups changed since it was indexed")
        self._rows = ((os.getpid(), layout), rows)
        yield rows

    def read_once(self, index: Index, offset: int, count: int) -> bytes:
        if index.format.compressed:
            with self.open(index) as spans:
                raw = cast(SpanSource, spans).read(offset, offset + count)
            if len(raw) < count:
                raise MetaFileChangedError(self.path, "it shrank while being read")
            return raw
        return self.source(index.key).read(offset, count)

    def count_newlines(self, index: Index, start: int, stop: int) -> int:
        if index.format.compressed:
            with self.open(index) as spans:
                return cast(SpanSource, spans).read(start, stop).count(b"\n")
        return sum(block.count(b"\n") for block in self.source(index.key).stream(start, stop))

    def check(self, fd: object, key: SourceKey) -> None:
        """Raise MetaFileChangedError if the object is no longer the one indexed (one HEAD)."""
        self.source(key).check()
