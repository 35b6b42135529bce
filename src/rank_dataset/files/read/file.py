"""One meta file as the readers take it: its bytes (:class:`FileBytes`: a local file's, or an object's
through :class:`~rank_dataset.files.index.objects.ObjectBytes`) and its index (:class:`IndexedFile`).

:class:`FileBytes` opens a file only while reading it and reads it with positional reads (a shared map
of a file that shrinks kills the process with SIGBUS; a positional read comes back short), checking when
it opens the file and again when it is done that it is still the file the index describes. A Parquet
file's rows are read by row group through :meth:`FileBytes.rows`, checked as a text file is.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rank_dataset.core.checks import UrlPath
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.index.load import Index, load_index, read_checkpoints
from rank_dataset.files.io import LocalFile, SourceKey, raise_if_changed
from rank_dataset.files.io.pread import RangeLoader, ShortRead, count_newlines

if TYPE_CHECKING:
    from rank_dataset.files.formats import ParquetRows, SpanSource

__all__ = ["FileBytes", "IndexedFile", "bytes_of"]


class FileBytes:
    """The bytes of one meta file: no descriptor is kept between reads (a job with thousands of meta
    files stays far below the descriptor limit, and a DataLoader worker never needs the file). The
    bytes of a gzip or zstd file are its decompressed ones, read through its checkpoints
    (:class:`~rank_dataset.files.formats.SpanSource`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def open(self, index: Index) -> Iterator[int | SpanSource]:
        """A descriptor of the file (a :class:`SpanSource` of a compressed one), checked against
        ``index.key`` on entry and (after a read completes) on exit, both the descriptor and the path:
        the bytes read are those of the file indexed.

        Raises:
            MetaFileChangedError: the file is not (or, by the end, no longer) the one indexed.
            CorruptMetaFileError: a compressed file is corrupt (which its index pass would have found:
                its checkpoints are damaged, or the disk returned other bytes).
        """
        local = LocalFile(self.path, index.key)
        spans: SpanSource | None = None
        try:
            if index.format.compressed:
                spans = self._source(local.fd, index)
            try:
                yield local.fd if spans is None else spans
            except ShortRead:
                local.check_open()
                raise MetaFileChangedError(self.path, "it shrank while being read") from None
            local.check()
        finally:
            if spans is not None:
                spans.close()
            local.close()

    @contextlib.contextmanager
    def rows(self, index: Index) -> Iterator[ParquetRows]:
        """The rows of a Parquet file, its footer read again and checked against ``index`` (the same
        row groups, and the same schema of the chosen columns), the file checked as :meth:`open` does.

        Raises:
            MetaFileChangedError: the file is not (or, by the end, no longer) the one indexed; its
                schema or its row groups are not those indexed.
            CorruptMetaFileError: a row group cannot be decoded.
        """
        layout = index.parquet
        if layout is None:
            raise ValueError(f"{self.path} was not indexed as a Parquet file")
        local = LocalFile(self.path, index.key, checked=False)
        try:
            # The schema first: a file rewritten with another schema is told as that, not as "modified".
            schema = (
                f"its schema changed since it was indexed: the columns {list(layout.columns)} are not those indexed"
            )
            try:
                rows = index.format.open_rows(self.path, layout.columns)
            except CorruptMetaFileError:
                local.check_open()  # a file rewritten while its footer was read is that error
                raise
            except ValueError as exc:  # a chosen column gone, or nested now
                raise MetaFileChangedError(self.path, f"{schema} ({exc})") from None
            if rows.schema_hash != layout.schema_hash:
                raise MetaFileChangedError(self.path, f"{schema} (another type, or another column)")
            local.check_open()
            if rows.layout.bounds != layout.bounds:
                raise MetaFileChangedError(self.path, "its row groups changed since it was indexed")
            yield rows
            local.check()
        finally:
            local.close()

    def _source(self, fd: int, index: Index) -> SpanSource:
        from rank_dataset.files.formats import SpanSource  # on first use: a compressed file's

        try:
            checkpoints = read_checkpoints(index)
        except LookupError:  # the cache was removed or replaced: the file's index as it is now
            again = load_index(self.path, rebuild=True)
            what = index.key.change(again.key)
            if what is not None:
                raise MetaFileChangedError(self.path, what) from None
            checkpoints = read_checkpoints(again)

        def open_fd() -> int:  # another descriptor of the file, for one thread's decoder
            return LocalFile(self.path, index.key).detach()

        return SpanSource(self.path, fd, checkpoints, open_fd)

    def read_once(self, index: Index, offset: int, count: int) -> bytes:
        """``count`` bytes at ``offset``, the descriptor checked against ``index.key`` once, after the
        read: enough for one read, as the key holds the ctime (any change since indexing is seen), and
        the path named the file when it was opened.

        Raises:
            MetaFileChangedError: the file is not the one indexed, or ends before the bytes do.
        """
        if index.format.compressed:
            with self.open(index) as source:
                assert not isinstance(source, int)
                raw = source.read(offset, offset + count)
        else:
            with LocalFile(self.path, index.key, checked=False) as local:
                raw = os.pread(local.fd, count, offset)
                local.check_open()
        if len(raw) < count:
            raise MetaFileChangedError(self.path, "it shrank while being read")
        return raw

    def count_newlines(self, index: Index, start: int, stop: int) -> int:
        """The newlines in bytes ``[start, stop)`` (decompressed ones, of a compressed file)."""
        if index.format.compressed:
            with self.open(index) as source:
                assert not isinstance(source, int)
                return source.read(start, stop).count(b"\n")
        with LocalFile(self.path) as local:
            return count_newlines(local.fd, stop, start)

    def check(self, fd: int | RangeLoader, key: SourceKey) -> None:
        """Raise MetaFileChangedError if the file open at ``fd`` is not the one ``key`` describes."""
        if not isinstance(fd, int):
            from rank_dataset.files.formats import SpanSource  # a compressed file's

            if not isinstance(fd, SpanSource):
                raise TypeError(f"a file's bytes are read from a descriptor or a SpanSource, not {fd!r}")
            fd = cast(int, fd.fd)  # a local file's SpanSource reads a descriptor
        raise_if_changed(self.path, key, os.fstat(fd))


def bytes_of(path: Path) -> FileBytes:
    """The bytes of the meta file ``path``: a local file's, or an object's (ranged GETs)."""
    if not isinstance(path, UrlPath):  # as meta_path makes it
        return FileBytes(path)
    from rank_dataset.files.index.objects import ObjectBytes  # on first use: a job over local files reads no object

    return cast(FileBytes, ObjectBytes(path))


@dataclass(frozen=True)
class IndexedFile:
    """A meta file as the gather reads it: its path, its index and its bytes."""

    path: Path
    index: Index
    bytes: FileBytes
