"""Failure records: samples whose item could not be made, and how they reach the rank.

A :class:`Failure` names a sample that failed (its number, ``file:line``, the error) and where in the
plan it failed. Workers write them to the dataset's :class:`FailureLog`, a shared segment created with
the dataset's shard channel (as the pass audit's counts live in its control block): each reader (the
rank, and each DataLoader worker by its id) appends to a ring of its own, and counts its failures in
the current pass, so that any reader can tell how many the pass has had on this rank. The rank
collects the new records when it looks (at each pass, ``set_epoch``, ``state_dict``, ``ds.failures``).

The segment is sparse: 64 readers x 256 records of 512 bytes are reserved, only the pages written
take memory. A reader past the 64th counts its failures itself and its records do not reach the rank.
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from typing import Any

from rank_dataset.core import shm as _shm

__all__ = ["CAPACITY", "ERROR_CHARS", "Failure", "FailureLog"]

#: The characters of an error's message a record keeps.
ERROR_CHARS = 200
READERS = 64
CAPACITY = 256  # records a reader's ring holds until the rank collects them
_RECORD = 512
_HEAD = struct.Struct("<qqqqII")  # sample, position, epoch, mini-epoch, len(where), len(error)
_TEXT = _RECORD - _HEAD.size
_WORDS = 4  # per reader: pass, failures in that pass, records written, -
_HEADER = 8 * _WORDS * READERS
SIZE = _HEADER + READERS * CAPACITY * _RECORD


@dataclasses.dataclass(frozen=True)
class Failure:
    """One sample whose item could not be made.

    Args:
        sample: its sample number (over the dataset's files, or the mix's: what ``ds.indices`` holds).
        where: ``file:line`` of its line (or the server and sample).
        error: the exception's type and message, cut to about 200 characters.
        epoch: the epoch it failed in.
        mini_epoch: the mini-epoch it failed in.
        position: its position in the epoch order (the plan), which keys its substitute.
    """

    sample: int
    where: str
    error: str
    epoch: int = 0
    mini_epoch: int = 0
    position: int = 0

    @classmethod
    def of(cls, sample: int, where: str, exc: BaseException, epoch: int, mini_epoch: int, position: int) -> Failure:
        """The record of ``exc``, raised for ``sample``."""
        message = str(exc).replace("\n", " ")
        if len(message) > ERROR_CHARS:
            message = message[: ERROR_CHARS - 3] + "..."
        return cls(sample, where, f"{type(exc).__name__}: {message}", epoch, mini_epoch, position)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Failure:
        """The record of ``data`` (from :meth:`to_dict`); ValueError naming what is wrong."""
        keys = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"a failure record is a dict with the keys {sorted(keys)}, got {data!r}")
        for name in ("sample", "epoch", "mini_epoch", "position"):
            if type(data[name]) is not int:
                raise TypeError(f"failure record {name} must be an int, got {data[name]!r}")
        return cls(**data)

    def __str__(self) -> str:
        return f"sample {self.sample} ({self.where}): {self.error}"


def _encode(failure: Failure) -> bytes:
    where = failure.where.encode("utf-8", "replace")[: _TEXT // 2]
    error = failure.error.encode("utf-8", "replace")[: _TEXT - len(where)]
    head = _HEAD.pack(failure.sample, failure.position, failure.epoch, failure.mini_epoch, len(where), len(error))
    return head + where + error


def _decode(raw: bytes) -> Failure:
    sample, position, epoch, mini, nw, ne = _HEAD.unpack_from(raw)
    text = raw[_HEAD.size : _HEAD.size + nw + ne]
    where, error = text[:nw].decode("utf-8", "replace"), text[nw:].decode("utf-8", "replace")
    return Failure(sample, where, error, epoch, mini, position)


class FailureLog(_shm.Table):
    """A dataset's failure records in shared memory: :meth:`create` in the rank, a handle to workers."""

    SIZE, NAME = SIZE, "rank_dataset_failures"

    def __init__(self, mm: mmap.mmap, handle: _shm.Handle, segment: _shm.Segment | None) -> None:
        super().__init__(mm, handle, segment)
        self._words = memoryview(mm).cast("q")
        self._collected = [0] * READERS  # (rank) records of each reader collected so far
        self._own: dict[int, int] = {}  # failures counted by readers past the table, by pass

    def add(self, reader: int, passes: int, failure: Failure) -> int:
        """(Reader ``reader``) record ``failure`` in pass ``passes``; return the failures this rank has
        had in that pass so far, over every reader that serves it."""
        if not 0 <= reader < READERS:
            self._own[passes] = self._own.get(passes, 0) + 1
            return self._own[passes] + self.in_pass(passes)
        w = self._words
        base = _WORDS * reader
        if w[base] != passes:
            w[base + 1] = 0
            w[base] = passes
        written = int(w[base + 2])
        at = _HEADER + (reader * CAPACITY + written % CAPACITY) * _RECORD
        raw = _encode(failure)
        self._mm[at : at + len(raw)] = raw
        w[base + 2] = written + 1  # after the record: the rank reads only whole ones
        w[base + 1] += 1
        return self.in_pass(passes)

    def in_pass(self, passes: int) -> int:
        """The failures recorded in pass ``passes`` by all readers."""
        w = self._words
        return sum(int(w[_WORDS * r + 1]) for r in range(READERS) if w[_WORDS * r] == passes)

    def collect(self) -> tuple[list[Failure], int]:
        """(Rank) the records written since the last call, and how many were lost (a ring overrun)."""
        found: list[Failure] = []
        lost = 0
        for reader in range(READERS):
            written = int(self._words[_WORDS * reader + 2])
            first = self._collected[reader]
            if written == first:
                continue
            if written - first > CAPACITY:
                lost += written - first - CAPACITY
                first = written - CAPACITY
            for k in range(first, written):
                at = _HEADER + (reader * CAPACITY + k % CAPACITY) * _RECORD
                found.append(_decode(bytes(self._mm[at : at + _RECORD])))
            self._collected[reader] = written
        return found, lost
