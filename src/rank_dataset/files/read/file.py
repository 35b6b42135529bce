"""One meta file as the readers take it: its bytes (:class:`FileBytes`: a local file's,
:class:`LocalBytes`, or an object's, :class:`ObjectBytes`; :func:`bytes_of` picks) and its index
(:class:`IndexedFile`). Every read is checked to be of the file its index describes.
"""

from __future__ import annotations

import abc
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.checks import UrlPath
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.index.load import Index, load_index, read_checkpoints
from rank_dataset.files.io import ByteSource, LocalFile, SourceKey, open_source, raise_if_changed
from rank_dataset.files.io.pread import RangeLoader, ShortRead

if TYPE_CHECKING:
    from rank_dataset.files.formats import ParquetLayout, ParquetRows, SpanSource

__all__ = ["FileBytes", "IndexedFile", "LocalBytes", "ObjectBytes", "bytes_of", "checked_rows"]


class FileBytes(abc.ABC):
    """The bytes of one meta file, as the gather, ``mf[i]`` and grouping read them: :meth:`open` for
    ranges (a descriptor, or a :class:`~rank_dataset.files.io.pread.RangeLoader`), :meth:`rows` for a
    Parquet file's row groups, :meth:`read_once` and :meth:`count_newlines` for a few bytes, each read
    checked to be of the file its index describes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @abc.abstractmethod
    def open(self, index: Index) -> contextlib.AbstractContextManager[int | RangeLoader]:
        """The file's bytes (a compressed file's decompressed ones), checked against ``index.key``."""

    @abc.abstractmethod
    def rows(self, index: Index) -> contextlib.AbstractContextManager[ParquetRows]:
        """The rows of a Parquet file, its footer checked against ``index`` (its row groups and schema)."""

    @abc.abstractmethod
    def check(self, fd: int | RangeLoader, key: SourceKey) -> None:
        """Raise MetaFileChangedError if the file read through ``fd`` is not the one ``key`` describes."""

    @abc.abstractmethod
    def _plain(self, index: Index) -> contextlib.AbstractContextManager[ByteSource]:
        """A plain file's source, checked against ``index.key`` (a local file's after its reads)."""

    @contextlib.contextmanager
    def _reading(self, index: Index) -> Iterator[Callable[[int, int], bytes]]:
        """``read(a, b)``: bytes ``[a, b)`` (decompressed ones, of a compressed file; fewer past its end)."""
        if index.format.compressed:
            with self.open(index) as spans:
                yield cast("SpanSource", spans).read
        else:
            with self._plain(index) as source:
                yield lambda a, b: source.pread(b - a, a)

    def read_once(self, index: Index, offset: int, count: int) -> bytes:
        """``count`` bytes at ``offset`` (decompressed ones, of a compressed file), checked once, after
        the read (a local file's descriptor against ``index.key``: enough for one read, as the key holds
        the ctime and the path named the file when it was opened; an object's read pinned to its ETag).

        Raises:
            MetaFileChangedError: the file is not the one indexed, or ends before the bytes do.
        """
        with self._reading(index) as read:
            raw = read(offset, offset + count)
        if len(raw) < count:
            raise MetaFileChangedError(self.path, "it shrank while being read")
        return raw

    def count_newlines(self, index: Index, start: int, stop: int) -> int:
        """The newlines in bytes ``[start, stop)`` (decompressed ones, of a compressed file)."""
        with self._reading(index) as read:
            return native.count_newlines(np.frombuffer(read(start, stop), np.uint8))


class LocalBytes(FileBytes):
    """The bytes of a local meta file: no descriptor is kept between reads (a job with thousands of
    meta files stays far below the descriptor limit, and a DataLoader worker never needs the file)."""

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
        local = LocalFile(self.path, index.key, checked=False)
        try:
            yield checked_rows(local, _layout(self.path, index), "it was indexed")
            local.check()
        finally:
            local.close()

    def _source(self, fd: int, index: Index) -> SpanSource:
        from rank_dataset.files.formats import SpanSource  # on first use: a compressed file's

        try:
            checkpoints = read_checkpoints(index)
        except LookupError:  # the cache was removed or replaced: the file's index as it is now
            again = load_index(self.path, distrust=index)
            what = index.key.change(again.key)
            if what is not None:
                raise MetaFileChangedError(self.path, what) from None
            checkpoints = read_checkpoints(again)

        def open_fd() -> int:  # another descriptor of the file, for one thread's decoder
            return LocalFile(self.path, index.key).detach()

        return SpanSource(self.path, fd, checkpoints, open_fd)

    @contextlib.contextmanager
    def _plain(self, index: Index) -> Iterator[ByteSource]:
        with LocalFile(self.path, index.key, checked=False) as local:
            yield local
            local.check_open()

    def check(self, fd: int | RangeLoader, key: SourceKey) -> None:
        """Raise MetaFileChangedError if the file open at ``fd`` (:meth:`open`'s) is not the one ``key``
        describes."""
        if not isinstance(fd, int):  # a compressed file's SpanSource, which reads a descriptor
            fd = cast(int, cast("SpanSource", fd).fd)
        raise_if_changed(self.path, key, os.fstat(fd))


class ObjectBytes(FileBytes):
    """The bytes of a meta file that is an object: the object opened (one HEAD) on the first read in a
    process and checked against the index's key, then every read pinned to its ETag."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
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
    def open(self, index: Index) -> Iterator[RangeLoader]:
        """The object's bytes (a compressed one's decompressed bytes, from its checkpoints)."""
        from rank_dataset.files.formats import SpanSource
        from rank_dataset.files.io.object import ObjectSpans

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
        layout = _layout(self.path, index)
        held = self._rows
        if held is not None and held[0] == (os.getpid(), layout):
            # Its footer, read once in this process: every GET is pinned to the ETag indexed, so
            # the footer cannot have changed (a replaced object fails the next GET).
            yield held[1]
            return
        rows = checked_rows(self.source(index.key), layout, "it was indexed")
        self._rows = ((os.getpid(), layout), rows)
        yield rows

    def _plain(self, index: Index) -> contextlib.AbstractContextManager[ByteSource]:
        return contextlib.nullcontext(self.source(index.key))

    def check(self, fd: int | RangeLoader, key: SourceKey) -> None:
        """Raise MetaFileChangedError if the object is no longer the one indexed (one HEAD)."""
        self.source(key).check()


def _layout(path: Path, index: Index) -> ParquetLayout:
    if index.parquet is None:
        raise ValueError(f"{path} was not indexed as a Parquet file")
    return index.parquet


def checked_rows(source: ByteSource, layout: ParquetLayout, since: str, *, ahead: int = 0) -> ParquetRows:
    """The rows of the Parquet file ``source`` (:func:`~rank_dataset.files.formats.source_rows`, ``ahead``
    as it takes it), its footer read again and checked against ``layout``: the same schema of the chosen
    columns, the same row groups, and a local file still the one of its key.

    Raises:
        MetaFileChangedError: the file's schema (checked first: a file rewritten with another schema is
            told as that) or row groups are not those of ``layout``, taken when ``since`` says; or a
            local file is not the one of its key.
        CorruptMetaFileError: the footer cannot be read (and the file has not changed).
    """
    from rank_dataset.files.formats import source_rows

    schema = f"its schema changed since {since}: the columns {list(layout.columns)} are not those it had"
    try:
        rows = source_rows(source, layout.columns, ahead=ahead)
    except CorruptMetaFileError:
        if source.local:
            source.check()  # a file rewritten while its footer was read is that error
        raise
    except ValueError as exc:  # a chosen column gone, or nested now
        raise MetaFileChangedError(source.path, f"{schema} ({exc})") from None
    if rows.schema_hash != layout.schema_hash:
        raise MetaFileChangedError(source.path, f"{schema} (another type, or another column)")
    if source.local:
        source.check()  # an object's GETs are each pinned to its ETag
    if rows.layout.bounds != layout.bounds:
        raise MetaFileChangedError(source.path, f"its row groups changed since {since}")
    return rows


def bytes_of(path: Path) -> FileBytes:
    """The bytes of the meta file ``path``: a local file's, or an object's (ranged GETs)."""
    if not isinstance(path, UrlPath):  # as meta_path makes it
        return LocalBytes(path)
    return ObjectBytes(path)


@dataclass(frozen=True)
class IndexedFile:
    """A meta file as the gather reads it: its path, its index and its bytes."""

    path: Path
    index: Index
    bytes: FileBytes
