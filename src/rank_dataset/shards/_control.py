"""The control block of a dataset: which shard its DataLoader workers serve.

A 64 KiB shareable segment (:mod:`rank_dataset.core.shm`), created with the dataset and written only by
the process that created it (the rank). Forked workers inherit its mapping; spawn and forkserver
workers map it by handle. It holds:

- ``version``: bumped by every write (odd while one is under way, a seqlock), so that a worker
  checks one word per item to know that nothing changed;
- ``gen`` and the *current* slot: the generation of the shard ``set_epoch`` made current, with its
  segment handle and plan;
- ``passes``, ``pass_gen`` and the *pass* slot: how many passes rank_dataset's samplers have started,
  and the shard the latest one started with (what workers serve until the next pass starts);
- ``joined``: the latest pass some worker has started serving (written by workers; a hint for the
  rank, outside the seqlock);
- the *tally*: for each reader of the dataset (the rank, and each DataLoader worker by its id), the
  pass it last served and the items it has read in it (each pair written by its reader alone, outside
  the seqlock), so that the rank can compare a finished pass's reads with its sampler's draws;
  ``untallied``, the latest pass some reader could not count (a worker id past the table, or a worker whose
  read raised before it counted the batch).
"""

from __future__ import annotations

import mmap
import struct
import threading
import time
from dataclasses import dataclass

from rank_dataset.core import shm as _shm

__all__ = ["ControlBlock", "Snapshot"]

VERSION, GEN, PASSES, PASS_GEN, JOINED, UNTALLIED = range(6)
#: Readers the tally has room for: the rank (0) and DataLoader workers 0..READERS-2 (1..READERS-1).
READERS = 512
_TALLY = 32  # word offset of the tally: (pass, items) per reader
_HEAD = 256 + 16 * READERS  # bytes before the record slots
SIZE = _HEAD + 2 * ((1 << 15) - 128)  # each record slot: room for the plan of a mix of a thousand or so sources
_SLOT = (SIZE - _HEAD) // 2
_SLOTS = (_HEAD, _HEAD + _SLOT)  # byte offsets of the current and the pass slot
_SLOT_HEAD = struct.Struct("<QQ")  # generation, length of the record
_SLOT_CAP = _SLOT - _SLOT_HEAD.size


@dataclass(frozen=True)
class Snapshot:
    """A consistent reading of a control block."""

    version: int
    gen: int
    passes: int
    pass_gen: int
    joined: int
    current_slot: tuple[int, bytes]  # (generation, record)
    pass_slot: tuple[int, bytes]

    def record(self, gen: int) -> bytes | None:
        """The record of generation ``gen``, if a slot still holds it."""
        for slot_gen, record in (self.pass_slot, self.current_slot):
            if slot_gen == gen and record:
                return record
        return None


class ControlBlock(_shm.Table):
    """A control block: :meth:`create` in the rank, :meth:`attach` in a worker."""

    SIZE, NAME = SIZE, "rank_dataset_control"

    def __init__(self, mm: mmap.mmap, handle: _shm.Handle, segment: _shm.Segment | None) -> None:
        super().__init__(mm, handle, segment)
        self.words = memoryview(mm).cast("Q")
        self._lock = threading.Lock()

    # -- the rank's writes ------------------------------------------------------------------------

    def publish(self, gen: int, record: bytes) -> None:
        """Make shard ``gen`` (described by ``record``) the current one."""
        if len(record) > _SLOT_CAP:
            raise ValueError(
                f"this shard's plan takes {len(record)} bytes to describe to DataLoader workers, over the "
                f"{_SLOT_CAP} a dataset's control block holds: mix fewer sources (concatenate small ones into one)"
            )
        with self._lock:
            w = self.words
            w[VERSION] += 1
            _SLOT_HEAD.pack_into(self._mm, _SLOTS[0], gen, len(record))
            self._mm[_SLOTS[0] + _SLOT_HEAD.size : _SLOTS[0] + _SLOT_HEAD.size + len(record)] = record
            w[GEN] = gen
            w[VERSION] += 1

    def start_pass(self) -> int:
        """Record that a pass starts with the current shard; return the pass number."""
        with self._lock:
            w = self.words
            w[VERSION] += 1
            head = _SLOT_HEAD.size + _SLOT_HEAD.unpack_from(self._mm, _SLOTS[0])[1]
            self._mm[_SLOTS[1] : _SLOTS[1] + head] = self._mm[_SLOTS[0] : _SLOTS[0] + head]
            w[PASS_GEN] = w[GEN]
            w[PASSES] += 1
            passes = int(w[PASSES])
            w[VERSION] += 1
            return passes

    # -- reading ----------------------------------------------------------------------------------

    def join(self, passes: int) -> None:
        """(Worker) note that pass ``passes`` is being served."""
        self.words[JOINED] = passes

    # -- the tally --------------------------------------------------------------------------------

    def tally_word(self, reader: int, passes: int) -> int:
        """(Reader ``reader``) start counting pass ``passes``: its count is 0 from now on. Returns
        the word the reader stores its count in (-1: no room in the table; the pass is marked
        untallied)."""
        if not 0 <= reader < READERS:
            self.words[UNTALLIED] = passes
            return -1
        word = _TALLY + 2 * reader
        self.words[word + 1] = 0  # the count before the pass: never a stale count under the new pass
        self.words[word] = passes
        return word + 1

    def untallied(self) -> None:
        """(Worker) a read raised before it counted its items: the latest pass cannot be counted."""
        self.words[UNTALLIED] = self.words[PASSES]

    def items_read(self, passes: int) -> int | None:
        """(Rank) the items read in pass ``passes``: by the DataLoader workers that served it, or if
        none did, by the rank (reader 0) itself. None if some worker could not count."""
        w = self.words
        if w[UNTALLIED] == passes and passes:
            return None
        tally = w[_TALLY : _TALLY + 2 * READERS]
        workers = [int(tally[k + 1]) for k in range(2, 2 * READERS, 2) if tally[k] == passes]
        if workers:
            return sum(workers)
        return int(tally[1]) if tally[0] == passes else 0

    def snapshot(self) -> Snapshot:
        """A consistent copy of the block (retried while the rank is writing it)."""
        w, mm = self.words, self._mm
        while True:
            version = w[VERSION]
            if not version & 1:
                slots = []
                for off in _SLOTS:
                    gen, length = _SLOT_HEAD.unpack_from(mm, off)
                    length = min(length, _SLOT_CAP)
                    slots.append((gen, bytes(mm[off + _SLOT_HEAD.size : off + _SLOT_HEAD.size + length])))
                snap = Snapshot(version, w[GEN], w[PASSES], w[PASS_GEN], w[JOINED], slots[0], slots[1])
                if w[VERSION] == version:
                    return snap
            time.sleep(0)
