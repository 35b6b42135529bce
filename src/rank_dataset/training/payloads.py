"""Read the samples, not only their lines: :class:`Payloads` says where the file a line names is, and a dataset
given ``payloads=Payloads(...)`` makes each item ``(meta, data)``, ``data`` the ``bytes`` of that file.

A batch's payloads are read at once (``__getitems__``, which torch's DataLoader calls with each batch), local
files by a small thread pool, objects through obstore's concurrent requests
(:mod:`rank_dataset.files.io.payloads`), and each item is made (parsed, paired with its bytes, transformed) as
its payload arrives, in the batch's order. A payload that cannot be read is the sample's failure, as a
``transform`` that raises: ``on_error="raise"`` raises a :class:`~rank_dataset.errors.PayloadError` naming the
sample's ``file:line`` and the path or URL; ``on_error="replace"`` substitutes and records it.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from rank_dataset.core.checks import check_int, is_url
from rank_dataset.core.stages import CURRENT, FETCH, ITEM_STAGES, ITEMS, PARSE, SINCE, STAGE, add_transformed
from rank_dataset.errors import PayloadError
from rank_dataset.files.io.payloads import (
    PayloadReader,
    ReadSettings,
    Target,
    require_client,
    resolver,
    slots_dir,
    target_root,
)

__all__ = ["Payloads", "payload_items", "payload_one"]

Key = int | str | tuple[int | str, ...] | Callable[[Any], str]
_MiB = 1 << 20
_clock = time.monotonic_ns


def _check_field(key: Any, what: str) -> int | str:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise TypeError(
            f"{what} must be an int (a field of a text line), a str (a JSON field or Parquet column), got {key!r}"
        )
    if isinstance(key, int) and key < 0:
        raise ValueError(f"{what} must be a field number >= 0 (0-based, whitespace-separated), got {key}")
    if isinstance(key, str) and not key:
        raise ValueError(f"{what} must name a field: got the empty string")
    return key


class Payloads:
    """Where the file each line names is, and how many to read at once.

    Args:
        root: the directory (or URL: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``https://``) the lines'
            paths are under; None with ``allow`` for lines that hold full URLs. A path that leaves the root
            (absolute, ``..``, a symlink out of a local root, a URL, a NUL byte) is that sample's failure and
            is never read.
        key: where a line's path is: an int (a 0-based whitespace-separated field of a text line), a str (a
            field of a JSON line, or a column of a Parquet meta file), a tuple of those (then ``data`` is a
            tuple of ``bytes``, one per key), or a picklable function of the parsed sample returning the path.
        storage_options: obstore's settings for the objects (as a dataset's ``storage_options`` for meta
            files), over the environment's.
        max_in_flight: requests (or local reads) in flight at once in one process.
        max_bytes: bytes of payloads one process holds, read and not yet handed to the transform.
        timeout: seconds (or a timedelta) a payload's read may take with its retries.
        allow: with ``root=None``, the prefixes a line's URL (or absolute local path) must start with, e.g.
            ``["s3://bucket/", "https://host/images/"]``; a line outside every one is that sample's failure.
        node_max_in_flight: requests to object stores in flight at once from every process of this machine
            (its ranks and their DataLoader workers) that use the same value: slots in a file of
            ``RANK_DATASET_PAYLOAD_SLOTS_DIR`` (default ``/dev/shm``), freed by the kernel when a process dies.

    Raises:
        ValueError, TypeError: a setting out of range or of the wrong type (the message names it).

    Examples:
        >>> import os, tempfile
        >>> from rank_dataset import Payloads, RankDataset
        >>> d = tempfile.mkdtemp()
        >>> for i in range(4):
        ...     _ = open(os.path.join(d, f"{i}.bin"), "wb").write(bytes([i]) * 3)
        >>> _ = open(os.path.join(d, "meta.txt"), "w").write("".join(f"{i}.bin {i}\\n" for i in range(4)))
        >>> ds = RankDataset(os.path.join(d, "meta.txt"), is_test=True, payloads=Payloads(d), parser="label")
        >>> ds[1]
        (('1.bin', 1), b'\\x01\\x01\\x01')
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        *,
        key: Key = 0,
        storage_options: Mapping[str, Any] | None = None,
        max_in_flight: int = 64,
        max_bytes: int = 256 * _MiB,
        timeout: float | datetime.timedelta = 60.0,
        allow: Sequence[str | os.PathLike[str]] | None = None,
        node_max_in_flight: int = 256,
    ) -> None:
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory, a URL or None (with allow=), got {root!r}")
        if root is None:
            if allow is None or isinstance(allow, (str, os.PathLike)) or not len(allow):
                raise ValueError(
                    "Payloads(root=None) reads lines that hold full URLs: give allow=[...] the prefixes they "
                    "may start with, e.g. allow=['s3://bucket/']"
                )
            self.allow = tuple(_allowed(a) for a in allow)
        elif allow is not None:
            raise ValueError("allow= goes with root=None (lines of full URLs); with a root, paths are under it")
        else:
            self.allow = ()
        self.root = None if root is None else target_root(root)
        for where in (self.root, *self.allow):
            if where is not None and is_url(where):
                require_client(where)  # no obstore: the ImportError naming the cloud extra, now
        if isinstance(key, tuple):
            if not key:
                raise ValueError("key as a tuple must name at least one field")
            self.key: Key = tuple(_check_field(k, f"key[{n}]") for n, k in enumerate(key))
        elif callable(key):
            try:
                pickle.dumps(key)
            except Exception as exc:
                raise TypeError(
                    f"key={key!r} must be picklable (it travels to DataLoader workers): a function defined "
                    f"at a module's top level, not a lambda ({type(exc).__name__})"
                ) from None
            self.key = key
        else:
            self.key = _check_field(key, "key")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a dict of obstore settings or None, got {storage_options!r}")
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be seconds (a number) or a timedelta, got {timeout!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.settings = ReadSettings(
            dict(storage_options or {}),
            check_int("max_in_flight", max_in_flight, low=1),
            check_int("max_bytes", max_bytes, low=1),
            check_int("node_max_in_flight", node_max_in_flight, low=1),
            float(timeout),
            slots_dir(),
        )
        self.columns: tuple[str, ...] | None = None  # a Parquet meta file's columns (set by the dataset)
        self._reader: PayloadReader | None = None
        self._resolve: Callable[[str], Target | PayloadError] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a reader (its pool, loop, clients) is the process's own; the resolver a closure, made again
        return {**self.__dict__, "_reader": None, "_resolve": None}

    def __repr__(self) -> str:
        where = f"{self.root!r}" if self.root is not None else f"None, allow={list(self.allow)}"
        s = self.settings
        return f"Payloads({where}, key={self.key!r}, max_in_flight={s.max_in_flight}, max_bytes={s.max_bytes})"

    @property
    def max_bytes(self) -> int:
        return self.settings.max_bytes

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_in_flight

    def reader(self) -> PayloadReader:
        """This process's reader, made on first use in each process."""
        reader = self._reader
        if reader is None or reader.pid != os.getpid():
            reader = self._reader = PayloadReader(self.settings)
        return reader

    # -- from a line to its paths -----------------------------------------------------------------

    def names(self, text: str, meta: Any) -> str | tuple[str, ...]:
        """The path (or paths, for a tuple key) sample ``text`` (``meta`` once parsed) names.

        Raises:
            PayloadError: the line has no such field.
        """
        key = self.key
        if type(key) is int:  # the common case, a field of a text line, without a _Fields
            split = text.split()
            if key < len(split):
                return split[key]
            return _Fields(text, self.columns).get(key)  # its error
        if isinstance(key, tuple):
            fields = _Fields(text, self.columns)
            return tuple(fields.get(k) for k in key)
        if callable(key):
            name = key(meta)
            if not isinstance(name, str):
                what = getattr(key, "__name__", key)
                raise PayloadError(repr(name), f"key {what!r} returned {type(name).__name__}, not a str")
            return name
        return _Fields(text, self.columns).get(key)

    def targets(self, name: str | tuple[str, ...]) -> list[Target | PayloadError]:
        """What to read for ``name`` (from :meth:`names`): one target or error per path."""
        resolve = self._resolve
        if resolve is None:
            resolve = self._resolve = resolver(self.root, self.allow)
        if isinstance(name, tuple):
            return [resolve(n) for n in name]
        return [resolve(name)]

    def found(self, text: str, meta: Any) -> list[Target | PayloadError]:
        """``targets(names(text, meta))``: what to read for sample ``text``; an int key's in one step.

        Raises:
            PayloadError: the line has no such field.
        """
        key, resolve = self.key, self._resolve
        if type(key) is int and resolve is not None:
            split = text.split()
            if key < len(split):
                return [resolve(split[key])]
        return self.targets(self.names(text, meta))

    def where(self, text: str, meta: Any) -> str:
        """The path(s) or URL(s) the payload of sample ``text`` is read from (nothing is read)."""
        try:
            found = self.targets(self.names(text, meta))
        except Exception as exc:
            return f"(no path: {exc})"
        return ", ".join(str(getattr(t, "url", getattr(t, "path", t))) for t in found)


def _allowed(prefix: Any) -> str:
    if not isinstance(prefix, (str, os.PathLike)):
        raise TypeError(f"allow must be a list of URL prefixes or directories, got an item {prefix!r}")
    text = os.fspath(prefix)
    if is_url(text):
        rest = text.partition("://")[2]
        if not rest.strip("/"):
            raise ValueError(f"allow prefix {text!r} names no bucket or host: give e.g. 's3://bucket/'")
        return text if text.endswith("/") else text + "/"
    return target_root(text)


class _Fields:
    """The fields of one line, split once: by whitespace (an int key), as JSON or by a Parquet meta
    file's columns (a str key)."""

    def __init__(self, text: str, columns: tuple[str, ...] | None) -> None:
        self.text, self.columns = text, columns
        self._split: list[str] | None = None
        self._json: Any = None

    def get(self, key: int | str) -> str:
        if isinstance(key, int):
            if self._split is None:
                self._split = self.text.split()
            if key >= len(self._split):
                raise PayloadError(f"field {key}", f"the line has {len(self._split)} fields: {self.text[:120]!r}")
            return self._split[key]
        if self.columns is not None:
            if key not in self.columns:
                raise PayloadError(f"column {key!r}", f"not one of the meta file's columns {list(self.columns)}")
            values = self.text.split("\t")
            return values[self.columns.index(key)]
        if self._json is None:
            try:
                self._json = json.loads(self.text)
            except ValueError:
                raise PayloadError(f"field {key!r}", f"the line is not JSON: {self.text[:120]!r}") from None
        value = self._json.get(key) if isinstance(self._json, dict) else None
        if not isinstance(value, str):
            raise PayloadError(f"field {key!r}", f"the line has no str field {key!r}: {self.text[:120]!r}")
        return value


# -- the items ----------------------------------------------------------------------------------------
# ``view`` is the dataset's ItemView (training/_items.py): plain, parse(text, i), transform, replace,
# substitute(i, exc), where(sample), indices, stages, payloads.


def _reraise(view: Any, i: int, exc: Exception) -> NoReturn:
    """Under ``on_error="raise"``: raise ``exc``; a payload's error with the sample and its ``file:line``."""
    if isinstance(exc, PayloadError) and not exc.where:
        sample = int(view.indices[i])
        raise PayloadError(exc.path, exc.reason, f"sample {sample} ({view.where(sample)})") from None
    raise exc


def payload_one(view: Any, text: str, i: int) -> Any:
    """Item ``i`` of line ``text``, its payload read now (a substitute's, or ``ds[i]``): raises its failure."""
    payloads: Payloads = view.payloads
    meta = text if view.plain else view.parse(text, i)
    name = payloads.names(text, meta)
    got = list(payloads.reader().read(payloads.targets(name)))
    for data in got:
        if isinstance(data, PayloadError):
            if view.replace:  # a substitute's failure: recorded by the substitutes as it is
                raise data
            _reraise(view, i, data)
    item = (meta, tuple(got) if isinstance(name, tuple) else got[0])
    return item if view.transform is None else view.transform(item)


# A row's STAGE word while a stage runs (what a stall dump names).
_PARSING, _FETCHING, _TRANSFORMING = (ITEM_STAGES.index(s) + 1 for s in ("parse", "fetch", "transform"))


def payload_items(view: Any, texts: list[str], indices: Sequence[int]) -> list[Any]:
    """A batch's items: every payload asked for at once, each item made as its payload arrives, in order;
    timed stage by stage while a monitor is on (``fetch``: the wait for the payloads)."""
    payloads: Payloads = view.payloads
    words = view.stages.words if view.stages.words[0] else None
    row = view.stages.claim() if words is not None else 0
    t0 = _clock() if words is not None else 0
    if words is not None:
        words[row + STAGE] = _PARSING
    metas: list[Any] = []
    counts: list[int] = []  # the targets of each item (0: it failed before any)
    targets: list[Target | PayloadError] = []
    failed: dict[int, Exception] = {}
    plain, found_of = view.plain, payloads.found  # looked up once a batch
    for k, (text, i) in enumerate(zip(texts, indices)):
        try:
            meta = text if plain else view.parse(text, i)
            found = found_of(text, meta)
        except Exception as exc:
            if not view.replace:
                _reraise(view, i, exc)
            failed[k] = exc
            metas.append(None)
            counts.append(0)
            continue
        metas.append(meta)
        counts.append(len(found))
        targets.extend(found)
    many = isinstance(payloads.key, tuple)  # data is a tuple of bytes, one per key
    stream = payloads.reader().read(targets)  # a generator: closed below
    if words is not None:
        t1 = _clock()
        words[row + PARSE] += t1 - t0
        words[row + PARSE + 1] += len(texts)
        words[row + SINCE] = t1
    out: list[Any] = []
    failing: list[tuple[int, int, Exception]] = []  # (place in out, item, error): substituted after the batch
    fetch = transform = replaced_ns = 0
    make = view.transform
    try:
        for k, i in enumerate(indices):
            if words is not None:
                words[row + CURRENT] = i  # a stall dump names this item (and its payload)
                words[row + STAGE] = _FETCHING
                a = _clock()
            if many:
                got: Any = tuple(next(stream) for _ in range(counts[k]))
                error = failed.get(k) or next((d for d in got if isinstance(d, PayloadError)), None)
            elif counts[k]:
                got = next(stream)
                error = got if isinstance(got, PayloadError) else None
            else:
                got, error = None, failed[k]
            if words is not None:
                b = _clock()
                fetch += b - a
                words[row + STAGE] = _TRANSFORMING
            try:
                if error is not None:
                    raise error
                item = (metas[k], got)
                out.append(item if make is None else make(item))
            except Exception as exc:
                if not view.replace:
                    _reraise(view, i, exc)
                failing.append((len(out), i, exc))
                out.append(None)
            del got
            if words is not None:
                transform += _clock() - b
        stream.close()  # type: ignore[attr-defined]
        # The substitutes once the batch's reads are all taken: a substitute's read then waits for no read
        # of the batch (nor for the room they hold under max_bytes), and a helper's pipe carries one batch at once.
        c = _clock()
        for at, i, why in failing:
            out[at] = view.substitute(i, why)
        replaced_ns = _clock() - c
    finally:
        stream.close()  # type: ignore[attr-defined]  # the payloads not taken (an item raised) are dropped as they arrive
        if words is not None:
            n = len(out)
            words[row + FETCH] += fetch
            words[row + FETCH + 1] += n
            words[row + ITEMS] += n
            add_transformed(words, row, transform, n, len(failing), replaced_ns)
    return out
