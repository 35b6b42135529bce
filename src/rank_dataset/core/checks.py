"""Argument checks shared by the public classes; each error names the argument and what is valid."""

from __future__ import annotations

import datetime
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

#: The bound of sample counts, positions, epochs and seeds: permute's largest ``n``, and small enough
#: that every int64 sum and product of the plan stays exact.
MAX_EXACT = 1 << 62


#: The schemes of meta files read in place from object storage (through obstore: the cloud extra), and
#: those :func:`rank_dataset.files.io.register_scheme` adds.
URL_SCHEMES = {"s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(path: object) -> bool:
    """Whether ``path`` names an object (a ``str`` with one of :data:`URL_SCHEMES`), not a local file."""
    if not isinstance(path, str):
        return False
    found = _URL.match(path)
    return found is not None and found.group(1).lower() in URL_SCHEMES


class UrlPath(str):
    """An object's URL where a :class:`~pathlib.Path` names a local file: ``str()`` gives it back whole
    (a Path would fold its ``//``), so messages, cache keys and fingerprints name the object; it has
    no local path (``os.fspath`` refuses it), so nothing opens it as a file by mistake.

    It carries how to reach the object: ``storage_options`` (obstore's config keys, e.g. ``endpoint``,
    ``access_key_id``, ``region``) and ``timeout`` (seconds the client's retries may take), pickled
    with it to other processes (which make their own client from them) and never shown: its repr,
    its ``str()`` and every message name the URL alone. A UrlPath made from one keeps its settings
    unless others are given.
    """

    storage_options: dict[str, Any]
    timeout: float | None

    def __new__(
        cls, url: str, storage_options: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> UrlPath:
        self = super().__new__(cls, url)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(
                f"storage_options must be a mapping of obstore settings (e.g. {{'endpoint': ...}}), "
                f"got {type(storage_options).__name__}"
            )
        inherited = url if isinstance(url, UrlPath) else None
        if storage_options is None and inherited is not None:
            storage_options = inherited.storage_options
        self.storage_options = {str(k): v for k, v in (storage_options or {}).items()}
        self.timeout = inherited.timeout if timeout is None and inherited is not None else timeout
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (UrlPath, (str(self), self.storage_options or None, self.timeout))

    @property
    def name(self) -> str:
        return self.rsplit("/", 1)[-1]

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is an object's URL, not a local path")


def with_storage(path: Any, storage_options: Mapping[str, Any] | None, timeout: float | None = None) -> Any:
    """``path`` as given if it is not an object's URL; else a :class:`UrlPath` carrying
    ``storage_options`` and ``timeout`` where it carries none of its own (a Source's own settings
    win over its dataset's)."""
    if not is_url(path):
        return path
    own = path if isinstance(path, UrlPath) else None
    options = own.storage_options if own is not None and own.storage_options else storage_options
    return UrlPath(path, options, own.timeout if own is not None and own.timeout is not None else timeout)


def meta_path(meta_file: str | os.PathLike[str]) -> Path:
    """``meta_file`` resolved, checked to be a file; an object's URL (:func:`is_url`) as a
    :class:`UrlPath`, checked when its source opens it (one HEAD).

    Raises:
        FileNotFoundError: it does not exist, or is a directory (the message says which).
    """
    if is_url(meta_file):  # a UrlPath keeps its settings
        return cast(Path, UrlPath(cast(str, meta_file)))
    path = Path(meta_file).expanduser().resolve()
    if not path.is_file():
        why = " is a directory: give the meta file in it" if path.is_dir() else ""
        raise FileNotFoundError(f"meta file not found: {os.fspath(meta_file)!r}{why}")
    return path


def check_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None, high_name: str | None = None
) -> int:
    """Return ``value`` as an int if it is one in ``[low, high)``, else raise naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    number = int(value)
    below = low is not None and number < low
    if high is not None and (below or number >= high):
        lowest = low if low is not None else "-inf"
        raise ValueError(f"{name} must be in [{lowest}, {_of(high, high_name)}), got {number}")
    if below:
        raise ValueError(f"{name} must be >= {low}, got {number}")
    return number


def check_record(
    data: Any, key: str, versions: tuple[int, ...], *, what: str, given: str, required: tuple[str, ...]
) -> Mapping[str, Any]:
    """``data`` if it is a record of ``what`` marked ``{key: version}`` (``version`` one of ``versions``) that holds
    every ``required`` key (a manifest, a step state).

    Raises:
        TypeError: not a dict (``given`` says what it should be).
        ValueError: not such a record, another format version, or a required key missing (named).
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"a {what} is {given}, got {type(data).__name__}")
    version = data.get(key)
    if version not in versions:
        found = f"not a {what}" if version is None else f"a {what} of format {version!r}"
        raise ValueError(f"{found}: this rank_dataset reads format {' or '.join(map(str, versions))}")
    missing = sorted(k for k in required if k not in data)
    if missing:
        raise ValueError(f"invalid {what}: missing {', '.join(missing)}")
    return data


def check_ints(name: str, values: Any, *, low: int) -> tuple[int, ...]:
    """``values`` as a tuple of ints, each >= ``low``, else raise naming ``name[i]`` (plain ints in
    one pass)."""
    if all(type(v) is int and v >= low for v in values):
        return tuple(values)
    return tuple(check_int(f"{name}[{i}]", v, low=low) for i, v in enumerate(values))


def check_at_most(name: str, value: int, high: int) -> int:
    """Return ``value`` if it is at most ``high``, else raise ValueError naming ``name`` and the bound."""
    if value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")
    return value


def _of(high: int, high_name: str | None) -> str:
    return f"{high_name}={high}" if high_name else str(high)


def check_index(i: Any, n: int, *, label: str, of: str) -> int:
    """``i`` as an index in ``[0, n)`` (negative ones count from the end), else TypeError/IndexError.

    ``label`` names the index in messages (e.g. "dataset index"), ``of`` what it indexes.
    """
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"{label} must be an int, got {i!r} ({type(i).__name__})")
    if not -n <= i < n:
        raise IndexError(f"{label} {i} is out of range for {of}")
    return int(i) % n


def timeout_seconds(timeout: Any, name: str = "timeout") -> float | None:
    """``timeout`` (seconds as an int or float, a ``datetime.timedelta``, or None) as float seconds.

    Raises:
        TypeError: another type (a bool too).
        ValueError: not a positive, finite duration.
    """
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"{name} must be seconds (an int or a float) or a datetime.timedelta, got {timeout!r}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be a positive, finite duration, got {timeout!r}")
    return seconds


def timeout_timedelta(timeout: Any, name: str = "timeout") -> datetime.timedelta | None:
    """``timeout`` (as :func:`timeout_seconds` takes it) as a ``datetime.timedelta`` (None stays None)."""
    seconds = timeout_seconds(timeout, name)
    if seconds is None:
        return None
    return timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=seconds)
