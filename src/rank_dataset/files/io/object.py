"""A meta file in an object store (S3, GCS, Azure, or an HTTP server that honours Range):
:class:`ObjectFile`, identified by :class:`ObjectKey` (its size and ETag from one HEAD).

Every read is a ranged GET pinned to that ETag (``If-Match``): an object replaced or deleted under a
job is :class:`~rank_dataset.errors.MetaFileChangedError` naming the URL. Failed requests are retried
with backoff and jitter, and a body cut short is asked again from where it stopped (else
:class:`~rank_dataset.errors.CorruptMetaFileError` naming the URL and the offset), all within the
timeout (:func:`~rank_dataset.files.io._stores.budget`). A process holds at most
``RANK_DATASET_OBJECT_REQUESTS`` (4) requests in flight, its first after a delay of its rank's
(:func:`~rank_dataset.files.io._stores.start_delay`).

Configuration: the standard environment as obstore reads it (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*``;
``AZURE_*``), and ``storage_options``, obstore's config keys given explicitly (they win).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt8Array
from rank_dataset.core.checks import UrlPath, is_url
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.io._stores import (
    acquire,
    budget,
    no_credentials,
    object_store,
    reason_of,
    retried,
    split_url,
    status_of,
)
from rank_dataset.files.io.base import STREAM_BLOCK, ByteSource, ObjectKey, PositionalIO
from rank_dataset.files.io.pread import ShortRead

__all__ = ["COUNTS", "REQUEST", "ObjectFile", "ObjectIO", "ObjectSpans"]

#: This process's requests to object stores so far: HEADs, GETs and bytes received (for the tests
#: and the benchmark; a forked child starts from its parent's).
COUNTS = {"heads": 0, "gets": 0, "bytes": 0}

#: Bytes a streaming read asks in one GET (the collective reader's slices, an index build): large
#: enough that a GET's latency is small beside its transfer, small enough that a retry costs little.
REQUEST = 32 << 20
#: Bytes between two wanted ranges that are fetched rather than asked for apart (coalesced reads).
COALESCE = 1 << 20
_ATTEMPTS = 4  # asks of a range whose body came back short, before it is called corrupt
_TIMEOUT = 1800.0


class ObjectFile(ByteSource):
    """The object at ``url``.

    With ``key``, reads are pinned to the object ``key`` describes (no request at construction; with
    ``checked``, one HEAD, MetaFileChangedError if it is not that object); without, one HEAD learns its
    size and ETag: a missing object or bucket, or credentials refused, raise here, naming the URL and
    the HTTP status. Picklable: another process makes its own client. ``storage_options`` and
    ``timeout`` default to those ``url`` carries (a :class:`~rank_dataset.core.checks.UrlPath`'s), else
    the environment's and :data:`_TIMEOUT`.
    """

    key: ObjectKey

    def __init__(
        self,
        url: str | os.PathLike[str],
        key: ObjectKey | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        checked: bool = False,
    ) -> None:
        if not is_url(url):
            raise ValueError(f"{url!r} is not an object URL (s3://, gs://, az://, abfs://, http(s)://)")
        # The settings given win over those the URL carries (a UrlPath's, e.g. a Source's).
        where = UrlPath(cast(str, url), storage_options, timeout)
        self.path = cast(Path, where)  # a UrlPath where a local file's source has its Path
        self._directory, self._name = split_url(where)
        self.storage_options = where.storage_options
        self.timeout = _TIMEOUT if where.timeout is None else float(where.timeout)
        self.key = self._head() if key is None or checked else key
        what = key.change(self.key) if key is not None and checked else None
        if what is not None:
            raise MetaFileChangedError(self.path, what)
        self._ahead: tuple[int, bytes] | None = None  # the block of a read in order (read_into's until)
        self._next = 0  # where a read in order (pread) would start next

    def _store(self) -> Any:
        return object_store(self._directory, self.storage_options, self.timeout)

    def _head(self) -> ObjectKey:
        store = self._store()  # first: without obstore, the ImportError naming the extra; forked: said as it is
        import obstore

        COUNTS["heads"] += 1
        slots = acquire()  # after the spread start (a bad setting of it raises as itself)
        try:
            with slots:
                meta = obstore.head(store, self._name)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"meta file not found: {self.path} ({status_of(exc)})") from None
        except Exception as exc:
            raise _failure(self.path, exc, self.timeout) from None
        modified = None if meta.get("e_tag") else str(meta.get("last_modified"))
        return ObjectKey(str(self.path), int(meta["size"]), meta.get("e_tag"), modified)

    def _options(self, start: int, stop: int) -> dict[str, Any]:
        options: dict[str, Any] = {"range": (start, stop)}
        if self.key.etag is not None:
            options["if_match"] = self.key.etag
        return options

    def _get(self, start: int, stop: int) -> Any:
        """The response to one GET of bytes ``[start, stop)``, pinned to the key."""
        store = self._store()  # first, as in _head
        import obstore

        COUNTS["gets"] += 1
        try:
            return obstore.get(store, self._name, options=self._options(start, stop))  # type: ignore[arg-type]
        except Exception as exc:
            raise self._error(exc) from None

    def _error(self, exc: BaseException) -> BaseException:
        import obstore.exceptions as errors

        if isinstance(exc, errors.PreconditionError):
            return MetaFileChangedError(self.path, f"it was replaced (its ETag is no longer {self.key.etag})")
        if isinstance(exc, FileNotFoundError):
            return MetaFileChangedError(self.path, "it was deleted")
        return _failure(self.path, exc, self.timeout)

    def stream(self, start: int = 0, stop: int | None = None, block: int = STREAM_BLOCK) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` in order, ``block`` at a time (the last shorter), from GETs of at most
        :data:`REQUEST` bytes each, never more than one block held."""
        stop = self.size if stop is None else min(stop, self.size)
        pending = b""
        for piece in self._pieces(start, stop):
            if pending:
                piece, pending = pending + piece, b""
            at = 0
            while len(piece) - at >= block:
                yield piece[at : at + block]
                at += block
            pending = piece[at:]
        if pending:
            yield pending

    def _pieces(self, start: int, stop: int) -> Iterator[bytes]:
        """The bytes ``[start, stop)`` as they arrive; a body cut short is asked again from where it
        stopped (a short body after :data:`_ATTEMPTS` asks is corrupt)."""
        at, short, deadline = start, 0, 0.0
        reasks = budget(self.timeout)["reasks"].total_seconds()
        while at < stop:
            if short == 0:  # a range's first ask: it and its asks again end within the timeout
                deadline = time.monotonic() + reasks
            end = min(at + REQUEST, stop)
            got = at
            with acquire():
                try:
                    for chunk in self._get(at, end).stream(min_chunk_size=min(end - at, 8 << 20)):
                        got += len(chunk)
                        COUNTS["bytes"] += len(chunk)
                        yield bytes(chunk)
                except (MetaFileChangedError, CorruptMetaFileError, OSError, ImportError):
                    raise  # ImportError: no obstore, said by the client's maker
                except Exception as exc:  # the body broke off: asked again below from ``got``
                    if short + 1 >= _ATTEMPTS or time.monotonic() > deadline:
                        raise self._error(exc) from None
            if got < end:
                short += 1
                if short >= _ATTEMPTS or time.monotonic() > deadline:
                    raise CorruptMetaFileError(self.path, got, f"the body ended {end - got:,} bytes short")
            else:
                short = 0
            at = got

    def read(self, offset: int, count: int) -> bytes:
        """Bytes ``[offset, offset + count)``, exactly (MetaFileChangedError past the object's end)."""
        if offset + count > self.size:
            raise MetaFileChangedError(self.path, "it shrank while being read")
        if count <= 0:
            return b""
        return b"".join(self._pieces(offset, offset + count))

    def read_into(self, out: UInt8Array, offset: int, until: int | None = None) -> None:
        """Fill ``out`` from ``offset``. With ``until`` (reads go on in order, none past ``until``: a
        slice read front to back), from GETs of up to :data:`REQUEST` bytes held one at a time, so
        that a slice read in small pieces still costs one GET per :data:`REQUEST` bytes."""
        if offset + out.size > self.size:
            raise ShortRead(self.size)
        if until is not None:
            self._read_ahead(out, offset, until)
            return
        at = 0
        for piece in self._pieces(offset, offset + out.size):
            out[at : at + len(piece)] = np.frombuffer(piece, np.uint8)
            at += len(piece)

    def _read_ahead(self, out: UInt8Array, offset: int, until: int) -> None:
        n, at = out.size, 0
        while at < n:
            pos = offset + at
            held = self._ahead
            if held is None or not held[0] <= pos < held[0] + len(held[1]):
                end = min(pos + REQUEST, max(until, offset + n), self.size)
                held = self._ahead = (pos, b"")  # the old block let go of before the next is fetched
                held = self._ahead = (pos, self.read(pos, end - pos))
            start, data = held
            take = min(n - at, start + len(data) - pos)
            out[at : at + take] = np.frombuffer(data, np.uint8, take, pos - start)
            at += take
        if offset + n >= until:
            self._ahead = None  # the run is done: its block goes

    def pread(self, count: int, offset: int) -> bytes:
        """As ``os.pread``: up to ``count`` bytes at ``offset`` (fewer at the end). A read that starts
        where the one before ended (a decoder going through a compressed object) fetches a block of
        :data:`REQUEST` bytes that the reads after it take from, so small reads in order cost few GETs."""
        count = max(0, min(count, self.size - offset))
        if count == 0:
            return b""
        held = self._ahead
        if held is not None and held[0] <= offset and offset + count <= held[0] + len(held[1]):
            at = offset - held[0]
            return held[1][at : at + count]
        sequential, self._next = offset == self._next, offset + count
        if not sequential:
            return self.read(offset, count)
        self._ahead = None  # the old block let go of before the next is fetched
        data = self.read(offset, min(offset + max(count, REQUEST), self.size) - offset)
        self._ahead = (offset, data)
        return data[:count]

    def check(self) -> None:
        """Raise MetaFileChangedError if the object is no longer the one of the key (one HEAD)."""
        try:
            now = self._head()
        except FileNotFoundError:
            raise MetaFileChangedError(self.path, "it was deleted") from None
        what = self.key.change(now)
        if what is not None:
            raise MetaFileChangedError(self.path, what)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_ahead": None}

    def __repr__(self) -> str:
        return f"ObjectFile({str(self.path)!r}, {self.key!r})"


class ObjectIO(PositionalIO):
    """A seekable read-only file object over a source (for pyarrow's ParquetFile): a read
    is one ranged GET of exactly the bytes asked, pinned to the object's ETag (a footer costs a GET or
    two), but for reads inside the ranges last :meth:`hold`-ed, served from memory."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__(source)
        self._source: ByteSource = source
        self._held: list[tuple[int, bytes]] = []

    def hold(self, starts: Sequence[int], stops: Sequence[int]) -> None:
        """Fetch the ranges ``[starts[i], stops[i])`` now, one GET for those less than :data:`COALESCE`
        bytes apart, and serve the reads that fall inside one from memory until
        the next ``hold`` (``hold([], [])`` lets them go): a row group's column chunks in one GET."""
        self._held = []  # the old ranges let go of before the new are fetched
        self._held = [(lo, self._source.read(lo, hi - lo)) for lo, hi, _ in _coalesced(starts, stops)]

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self._source.size - self._pos))
        out = np.frombuffer(buffer, np.uint8, count)
        for start, data in self._held:
            if start <= self._pos and self._pos + count <= start + len(data):
                out[:] = np.frombuffer(data, np.uint8, count, self._pos - start)
                break
        else:
            if count:
                self._source.read_into(out, self._pos)
        self._pos += count
        return count


class ObjectSpans:
    """The bytes of an object as :class:`~rank_dataset.files.io.pread.Window` asks them (a RangeLoader):
    the ranges of a batch merged where less than ``COALESCE`` bytes lie between them, one GET each."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source

    def load(
        self,
        starts: Int64Array,
        stops: Int64Array,
        end: int,
        pad: int = 0,
        buffer: Callable[[int], UInt8Array] | None = None,
    ) -> tuple[UInt8Array, int | Int64Array]:
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


def _coalesced(starts: Sequence[int], stops: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """The non-empty ranges ``[starts[i], stops[i])`` merged where less than :data:`COALESCE` bytes lie
    between them: ``(lo, hi, members)`` for each GET, in order of position."""
    merged: list[tuple[int, int, list[int]]] = []
    group: list[int] = []
    for i in [*sorted(range(len(starts)), key=lambda i: starts[i]), -1]:
        if group and (i < 0 or starts[i] > max(stops[j] for j in group) + COALESCE):
            merged.append((starts[group[0]], max(stops[j] for j in group), group))
            group = []
        if i >= 0 and stops[i] > starts[i]:
            group.append(i)
    return merged


def _failure(url: object, exc: BaseException, timeout: float) -> OSError:
    """The error of a request that failed for good, naming the URL, the status (or the failure's
    kind), and whether obstore retried it within the timeout, as its error reports."""
    import obstore.exceptions as errors

    denied = no_credentials(exc, timeout)
    if denied is not None:  # no credentials given: obstore asked the instance's metadata service, which failed
        return PermissionError(f"meta file {url}: {denied}")
    status = status_of(exc)
    if isinstance(exc, (errors.PermissionDeniedError, errors.UnauthenticatedError, PermissionError)):
        return PermissionError(f"meta file {url}: access denied ({status}); check the credentials")
    return OSError(f"meta file {url}: the object store failed ({reason_of(exc)}{retried(exc, timeout)})")
