"""The errors users catch, in one place; every one is in ``rank_dataset.__all__``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

__all__ = [
    "CollectiveError",
    "CorruptMetaFileError",
    "MetaFileChangedError",
    "PassAuditError",
    "PassAuditWarning",
    "PayloadError",
    "ProtocolError",
    "RanksDisagreeError",
    "TooManyFailuresError",
]


def _path(path: Path | str) -> Path:
    """``path`` as a Path, but an object's URL (``scheme://...``) kept whole: a Path folds its ``//``,
    and the error (pickled to another rank, raised there again) must name the object."""
    return cast(Path, path) if isinstance(path, str) and "://" in path else Path(path)


class MetaFileChangedError(ValueError):
    """A meta file is no longer the file that was indexed: rewritten, replaced, moved or deleted.

    Its samples are not the ones its dataset planned with, so none is handed out. ``path`` is the
    file, ``what`` says what changed.
    """

    def __init__(self, path: Path | str, what: str) -> None:
        super().__init__(
            f"meta file {path} changed: {what}. Its lines are no longer the samples indexed for it; "
            "build the dataset again (a new RankDataset or MetaFile indexes the file as it is "
            "now), or restart the meta server that serves it"
        )
        self.path, self.what = _path(path), what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.what))


class CorruptMetaFileError(ValueError):
    """A compressed or Parquet meta file cannot be decoded: corrupt, truncated, or not what it claims.

    No sample is read from it past that point. ``path`` is the file, ``offset`` the byte of the file
    (compressed) at or after which the fault lies, ``what`` says what is wrong.
    """

    def __init__(self, path: Path | str, offset: int, what: str) -> None:
        super().__init__(f"meta file {path} cannot be decoded at or after compressed byte {offset:,}: {what}")
        self.path, self.offset, self.what = _path(path), offset, what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.offset, self.what))


class RanksDisagreeError(ValueError):
    """The ranks of a process group were about to plan their shards from different inputs.

    Raised with the same message on every rank. ``field`` is the first field that differs and
    ``values`` maps each of its distinct values (as ``repr``) to the ranks holding it.
    """

    def __init__(self, message: str, field: str = "", values: Mapping[str, Sequence[int]] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.values: dict[str, list[int]] = {k: list(v) for k, v in (values or {}).items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.field, self.values)


class CollectiveError(RuntimeError):
    """A collective of the collective reader (``reader="collective"``) failed or timed out: a rank died, or
    did not reach it (did not call ``set_epoch`` or ``load_state_dict`` with the others) within the timeout.
    Raised on every rank that reached it, with the same message; the process group's own error is its
    ``__cause__``."""


class ProtocolError(ConnectionError):
    """Client and server do not understand each other (different versions, or not a meta server)."""


class PassAuditWarning(UserWarning):
    """A pass over a rank's shard read fewer or more items than its sampler drew: most likely the
    DataLoader was sharded a second time (see the dataset's ``audit=``). Warned once per dataset;
    ``warnings.simplefilter("error", PassAuditWarning)`` or ``audit="error"`` makes it an error."""


class PassAuditError(RuntimeError):
    """A pass over a rank's shard read fewer or more items than its sampler drew, under
    ``audit="error"``. ``count`` is the pass's :class:`~rank_dataset.PassCount`."""

    def __init__(self, message: str, count: Any = None) -> None:
        super().__init__(message)
        self.count = count

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.count)


class PayloadError(OSError):
    """A sample's payload (the file or object its line names, read through
    :class:`~rank_dataset.Payloads`) could not be read, or must not be: missing, refused, timed out, cut
    short, or outside the root. ``path`` is the path or URL, ``reason`` says why, ``where`` (when raised by
    a dataset) the sample and its ``file:line``."""

    def __init__(self, path: str, reason: str | None = None, where: str = "") -> None:
        # PayloadError(message) alone is a whole message: what torch's DataLoader raises again in the
        # main process from a worker's error (as its type, not a RuntimeError).
        message = path if reason is None else f"payload {path}: {reason}"
        super().__init__(f"{where}: {message}" if where else message)
        self.path, self.reason, self.where = path, reason or "", where

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.reason, self.where)


class TooManyFailuresError(RuntimeError):
    """More items of a pass failed to load (their ``transform`` raised) than ``max_failures`` allows, under
    ``on_error="replace"``; or no substitute could be made for an item. The message names the first
    failures (sample number, ``file:line``, error) and how to leave those samples out. ``failures``
    holds their records (sample number, ``file:line``, error), where known."""

    def __init__(self, message: str, failures: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.failures)
