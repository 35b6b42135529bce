"""What bounds the payload reads of a process and of a node: :class:`ByteBudget`, the bytes one process holds
for payloads read and not yet handed out, reserved in the order the reads were asked for; and
:class:`NodeSlots`, requests in flight shared by the processes of one machine.

The node's slots are byte locks (``fcntl`` record locks, ``F_SETLK``) on one empty file: a slot is taken by
locking one byte, given back by unlocking it. The kernel drops a process's record locks when it exits, however
it exits (SIGKILL included), so a dead process never keeps a slot. Record locks belong to the process, not to a
thread or a descriptor: one descriptor per file and process (:func:`node_slots`), the slots this process holds
kept apart in a set, and a process forked from one holding slots holds none (the kernel does not copy them).
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
import threading
import time

__all__ = ["ByteBudget", "NodeSlots", "node_slots", "slots_dir"]

#: Where the node's slot files are, unless RANK_DATASET_PAYLOAD_SLOTS_DIR says: memory, not a disk.
_SHM = "/dev/shm"


class ByteBudget:
    """At most ``limit`` bytes reserved at a time, reserved in ticket order (0, 1, 2, ... in the order the
    reads were asked for): the read the consumer waits for is never kept waiting by reads behind it, so a
    batch larger than the budget is read in pieces rather than never. A payload larger than ``limit`` is
    reserved alone (when nothing else is). Every ticket ends once: :meth:`reserve` or :meth:`skip`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (what the tests and the benchmark measure)
        self._next = 0  # the ticket whose turn it is to reserve
        self._issued = 0
        self._skipped: set[int] = set()
        self._cond = threading.Condition()

    def tickets(self, n: int) -> range:
        """``n`` tickets, after every ticket issued so far."""
        with self._cond:
            first, self._issued = self._issued, self._issued + n
        return range(first, first + n)

    def _fits(self, ticket: int, n: int) -> bool:
        return ticket == self._next and (self.held + n <= self.limit or self.held == 0)

    def _take(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)
        self._advance()

    def _advance(self) -> None:
        self._next += 1
        while self._next in self._skipped:
            self._skipped.discard(self._next)
            self._next += 1
        self._cond.notify_all()

    def try_reserve(self, ticket: int, n: int) -> bool:
        """Reserve ``n`` bytes for ``ticket`` if it is its turn and they fit, without waiting."""
        with self._cond:
            if not self._fits(ticket, n):
                return False
            self._take(n)
            return True

    def reserve(self, ticket: int, n: int, deadline: float) -> bool:
        """Reserve ``n`` bytes for ``ticket``, waiting for its turn and the room until ``deadline``
        (``time.monotonic()``); False if the deadline passed first (the ticket is then skipped)."""
        with self._cond:
            while not self._fits(ticket, n):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._skip(ticket)
                    return False
                self._cond.wait(min(left, 1.0))
            self._take(n)
            return True

    def skip(self, ticket: int) -> None:
        """``ticket`` reserves nothing (its read failed first)."""
        with self._cond:
            self._skip(ticket)

    def _skip(self, ticket: int) -> None:
        if ticket == self._next:
            self._advance()
        elif ticket > self._next:
            self._skipped.add(ticket)

    def release(self, n: int) -> None:
        """Give back ``n`` bytes (a payload handed out, or dropped)."""
        if n:
            with self._cond:
                self.held -= n
                self._cond.notify_all()


class NodeSlots:
    """``n`` slots shared by the processes of this machine that use the file ``path`` (see the module)."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._mine: set[int] = set()
        self._lock = threading.Lock()

    def try_acquire(self) -> int | None:
        """A free slot, now taken by this process; None if every slot is taken."""
        start = random.randrange(self.n)  # processes start their search apart: fewer collisions
        with self._lock:
            for k in range(self.n):
                slot = (start + k) % self.n
                if slot in self._mine:
                    continue
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
                except OSError:  # another process holds it (EAGAIN or EACCES)
                    continue
                self._mine.add(slot)
                return slot
        return None

    def release(self, slot: int) -> None:
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
            self._mine.discard(slot)

    def held(self) -> int:
        """The slots this process holds now."""
        return len(self._mine)


_pid = os.getpid()
_files: dict[tuple[str, int], NodeSlots] = {}
_files_lock = threading.Lock()


def slots_dir() -> str:
    """The directory of the node's slot files: RANK_DATASET_PAYLOAD_SLOTS_DIR, else /dev/shm, else the
    temporary directory."""
    given = os.environ.get("RANK_DATASET_PAYLOAD_SLOTS_DIR")
    if given:
        return given
    return _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else tempfile.gettempdir()


def node_slots(directory: str, n: int) -> NodeSlots:
    """This process's handle on the node's ``n`` slots in ``directory`` (one file per user and ``n``: the
    processes that share a cap share its file). One descriptor per file and process (closing another
    would drop this process's locks)."""
    global _pid
    if os.getpid() != _pid:  # a forked child: the parent's handles say it holds slots it does not
        _pid = os.getpid()
        _files.clear()
    key = (directory, n)
    with _files_lock:
        found = _files.get(key)
        if found is None:
            path = os.path.join(directory, f"rank_dataset-payload-slots-{os.getuid()}-{n}")
            found = _files[key] = NodeSlots(path, n)
        return found
