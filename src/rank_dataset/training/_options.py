"""The keywords every dataset shares, read one way: ``timeout`` (float seconds or a timedelta) and
``reader`` (a name or a ShardReader)."""

from __future__ import annotations

from typing import Any

from rank_dataset.core.checks import timeout_seconds, timeout_timedelta

__all__ = ["READER_NAMES", "is_shard_reader", "timeout_seconds", "timeout_timedelta"]

READER_NAMES = ("file", "collective")


def is_shard_reader(reader: Any) -> bool:
    """Whether ``reader`` looks like a :class:`~rank_dataset.shards.reader.ShardReader` (builds shards)."""
    return all(callable(getattr(reader, name, None)) for name in ("build", "where", "set_exclusion"))
