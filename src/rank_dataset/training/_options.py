"""The keywords every dataset shares, read one way: ``timeout`` (float seconds or a timedelta) and
``reader`` (a name or a ShardReader). No torch."""

from __future__ import annotations

import datetime
import math
from typing import Any

__all__ = ["READER_NAMES", "is_shard_reader", "timeout_seconds", "timeout_timedelta"]

READER_NAMES = ("file", "collective")


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


def is_shard_reader(reader: Any) -> bool:
    """Whether ``reader`` looks like a :class:`~rank_dataset.shards.reader.ShardReader` (builds shards)."""
    return all(callable(getattr(reader, name, None)) for name in ("build", "where", "set_exclusion"))
