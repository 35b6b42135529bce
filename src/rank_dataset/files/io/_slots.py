"""What bounds the payload reads of a process and of a node: :class:`ByteBudget`, the bytes one process holds
for payloads read and not yet handed out, reserved in the order the reads were asked for; and
:class:`NodeSlots`, requests in flight shared by the processes of one machine.

The node's slots are byte locks (``fcntl`` record locks, ``F_SETLK``) on one empty file: a slot is taken by
locking one byte, given back by unlocking it. The kernel drops a process's record locks when it exits, however
it exits (SIGKILL included), so a dead process never keeps a slot. Record locks belong to the process, not to a
thread or a descriptor: one descriptor per file and process (:func:`node_slots`), the slots this process holds
kept apart in a set, and a process forked from one holding slots holds none (the kernel does not copy them).
A thread waiting for a slot is woken at once by one this process gives back; one given back by another
process is seen by the one waiting thread that looks again every :attr:`NodeSlots.recheck` seconds (a record
lock tells no one when it is freed; a blocking lock would wait for one byte, not for any slot).
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable

__all__ = ["ByteBudget", "NodeSlots", "node_slots", "slots_dir"]

#: Where the node's slot files are, unless RANK_DATASET_PAYLOAD_SLOTS_DIR says: memory, not a disk.
_SHM = "/dev/shm"


class ByteBudget:
    """At most ``limit`` bytes reserved at a time, reserved in ticket order (0, 1, 2, ... in the order the
    reads were asked for): the read the consumer waits for is never kept waiting by reads behind it, so a
    batch larger than the budget is read in pieces rather than never. A payload larger than ``limit`` is
    reserved alone (when nothing else is). Every ticket ends once: reserved (:meth:`reserve`,
    :meth:`try_reserve`, :meth:`reserve_or_wait`) or :meth:`skip`. A reservation that must wait is woken
    when its turn and its room come (no polling), and no other waiter is woken with it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (what the tests and the benchmark measure)
        self._next = 0  # the ticket whose turn it is to reserve
        self._issued = 0
        self._skipped: set[int] = set()
        self._waiting: dict[int, tuple[int, Callable[[], None]]] = {}  # ticket -> (bytes, wake), see reserve_or_wait
        self._lock = threading.Lock()

    def tickets(self, n: int) -> range:
        """``n`` tickets, after every ticket issued so far."""
        with self._lock:
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

    def _grant(self) -> list[Callable[[], None]]:
        """Reserve for the waiting tickets whose turn and room have come; their wake-ups, to call unlocked."""
        woken: list[Callable[[], None]] = []
        while True:
            waiting = self._waiting.get(self._next)
            if waiting is None or not self._fits(self._next, waiting[0]):
                return woken
            del self._waiting[self._next]
            woken.append(waiting[1])
            self._take(waiting[0])

    def try_reserve(self, ticket: int, n: int) -> bool:
        """Reserve ``n`` bytes for ``ticket`` if it is its turn and they fit, without waiting."""
        with self._lock:
            if not self._fits(ticket, n):
                return False
            self._take(n)
            woken = self._grant()
        _call(woken)
        return True

    def reserve(self, ticket: int, n: int, deadline: float) -> bool:
        """Reserve ``n`` bytes for ``ticket``, waiting for its turn and the room until ``deadline``
        (``time.monotonic()``); False if the deadline passed first (the ticket is then skipped)."""
        gate = threading.Lock()  # released by the wake-up of this ticket alone: no thread woken for another's
        gate.acquire()
        if self.reserve_or_wait(ticket, n, gate.release):
            return True
        if gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return True
        return not self.give_up(ticket)  # reserved meanwhile: True

    def reserve_or_wait(self, ticket: int, n: int, wake: Callable[[], None]) -> bool:
        """Reserve ``n`` bytes for ``ticket`` now (True), or once its turn and the room come (False): then
        ``wake`` is called, from whichever thread made the room, after the bytes are reserved. A wait
        ends with the wake-up or with :meth:`skip` (the reservation given up)."""
        with self._lock:
            if not self._fits(ticket, n):
                self._waiting[ticket] = (n, wake)
                return False
            self._take(n)
            woken = self._grant()
        _call(woken)
        return True

    def skip(self, ticket: int) -> None:
        """``ticket`` reserves nothing (its read failed first)."""
        with self._lock:
            self._skip(ticket)
            woken = self._grant()
        _call(woken)

    def give_up(self, ticket: int) -> bool:
        """End the wait of :meth:`reserve_or_wait` for ``ticket``: True if it was still waiting (the ticket
        is skipped), False if its bytes were reserved meanwhile (they are the caller's to release)."""
        with self._lock:
            if self._waiting.pop(ticket, None) is None:
                return False
            self._skip(ticket)
            woken = self._grant()
        _call(woken)
        return True

    def _skip(self, ticket: int) -> None:
        if ticket == self._next:
            self._advance()
        elif ticket > self._next:
            self._skipped.add(ticket)

    def release(self, n: int) -> None:
        """Give back ``n`` bytes (a payload handed out, or dropped)."""
        if n:
            with self._lock:
                self.held -= n
                woken = self._grant()
            _call(woken)


def _call(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


class NodeSlots:
    """``n`` slots shared by the processes of this machine that use the file ``path`` (see the module)."""

    #: Seconds between two looks for a slot another process gave back, by the one waiting thread that looks
    #: (a record lock tells no one when it is freed); a slot of this process given back wakes a waiter at once.
    recheck = 0.01

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # RANK_DATASET_PAYLOAD_SLOTS_DIR: made when used
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._mine: set[int] = set()  # held by this process: in use, or spare
        self._spare: list[int] = []
        self._cond = threading.Condition()
        self._watching = False  # a waiting thread looks for other processes' slots (the others wait to be woken)

    def _take(self) -> int | None:
        start = random.randrange(self.n)  # processes start their search apart: fewer collisions
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

    def try_acquire(self) -> int | None:
        """A free slot, now taken by this process; None if every slot is taken."""
        with self._cond:
            return self._take()

    def acquire(self, deadline: float) -> int | None:
        """A slot, waiting for one until ``deadline`` (``time.monotonic()``); None if none came. A spare slot
        (see :meth:`release`) is taken first, with no system call."""
        with self._cond:
            slot = self._next_slot()
            while slot is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self._watching:
                    self._cond.wait(left)
                else:
                    self._watching = True
                    try:
                        self._cond.wait(min(left, self.recheck))
                    finally:
                        self._watching = False
                    self._cond.notify()  # another waiter looks next
                slot = self._next_slot()
            return slot

    def _next_slot(self) -> int | None:
        if self._spare:
            return self._spare.pop()
        return self._take() if len(self._mine) < self.n else None

    def release(self, slot: int, keep: bool = False) -> None:
        """Give ``slot`` back to the node; with ``keep``, keep it as a spare for this process's next request
        (given back by :meth:`trim`): a busy process then locks and unlocks once a slot and batch, not once a
        request, and holds no more slots than it has had requests in flight at once."""
        with self._cond:
            if keep:
                self._spare.append(slot)
            else:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
                self._mine.discard(slot)
            self._cond.notify()

    def trim(self) -> None:
        """Give the spare slots back to the node."""
        with self._cond:
            for slot in self._spare:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
                self._mine.discard(slot)
            self._spare.clear()

    def held(self) -> int:
        """The slots this process holds now (spare ones included)."""
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
