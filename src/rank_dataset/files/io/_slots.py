"""What bounds the payload reads of a process and of a node: :class:`ByteBudget`, the bytes one process holds
for payloads read and not yet handed out, reserved in the order the reads were asked for; and
:class:`NodeSlots`, requests in flight shared by the processes of one machine, given to the requests that wait
for one in the order they began to wait, whichever process they are in.

The node's slots are counted in one small file (in /dev/shm), read and written under an ``fcntl`` record lock
on its first byte (``F_SETLKW``, held for a few system calls). Each process that uses the file has a record in
it (the slots it holds) and holds a record lock on the byte of its record for its whole life. The kernel drops
a process's record locks when it exits, however it exits (SIGKILL included), so a record whose byte no one
holds is a dead process's: its slots count as free again, and its requests waiting in the queue are skipped,
at the next look at the queue that meets them. A request not served from a spare slot takes a ticket at the
end of the queue (a ring of tickets in the file, each naming its process), and the free slots go to the oldest
live tickets (counted in their processes' records as granted): a process that gives a slot back does not take
it again while an older request of another process waits, and keeps no spare slot then. A slot granted to this
process's waiting request is handed to it at once; one granted by another process is seen by the one waiting
thread of this process that looks at the queue every :attr:`NodeSlots.recheck` seconds (a record lock tells no
one when it is freed; a blocking lock would wait for one byte, not for a turn). Record locks belong to the
process, not to a thread or a descriptor: one descriptor per file and process (:func:`node_slots`), the queue
looked at by one thread of a process at a time, and a process forked from one holding slots holds none (the
kernel does not copy its locks; it takes its own record).
Needs ``fcntl`` record locks that work between the processes on the file's file system (tmpfs and local file
systems do; some network file systems do not).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import heapq
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["ByteBudget", "NodeSlots", "node_slots", "slots_dir"]

#: Where the node's slot files are, unless RANK_DATASET_PAYLOAD_SLOTS_DIR says: memory, not a disk.
_SHM = "/dev/shm"

# The slot file: a head (tickets issued, tickets served, records in use), then a record per process (pid,
# generation, slots held, slots granted to its waiting requests and not yet handed to them), then a ring of
# waiting tickets (record index + 1 and generation of the ticket's process; zeros: given up). Zeros are an
# empty queue: the file is made by growing it. Byte locks: 0 the queue's lock, 1 + i record i's process alive.
_HEAD = struct.Struct("<QQI")
_REC = struct.Struct("<IIII")
_ENTRY = struct.Struct("<II")
_RECORDS = 4096
_RING = 16384
_REC_AT = 64
_RING_AT = _REC_AT + _RECORDS * _REC.size
_SIZE = _RING_AT + _RING * _ENTRY.size


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
        if self.held > self.peak:
            self.peak = self.held
        self._next += 1
        if self._skipped:
            self._advance(0)

    def _advance(self, by: int = 1) -> None:
        self._next += by
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
            held = self.held
            if ticket != self._next or (held + n > self.limit and held):  # (_fits and _take inline: once a payload)
                return False
            self.held = held = held + n
            if held > self.peak:
                self.peak = held
            self._next += 1
            if self._skipped:
                self._advance(0)
            if not self._waiting:  # the common case: no one to wake
                return True
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
                if not self._waiting:
                    return
                woken = self._grant()
            _call(woken)


def _call(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


class NodeSlots:
    """``n`` slots shared by the processes of this machine that use the file ``path``, given to the requests
    that wait for one in the order they began to wait, across processes (see the module)."""

    #: Seconds between two looks at the node's queue by the one waiting thread of a process that looks (a
    #: record lock tells no one when it is freed); a slot given back by this process reaches the next
    #: request in the queue at once if that request is this process's.
    recheck = 0.01

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # RANK_DATASET_PAYLOAD_SLOTS_DIR: made when used
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._pid = os.getpid()
        st = os.fstat(self._fd)
        self._claimed = _claimed.setdefault((st.st_dev, st.st_ino), set())  # this process's records in the file
        self._lock = threading.Lock()  # this process's threads: fcntl locks do not exclude them from each other
        self._mine: set[int] = set()  # the slots this process holds (in use, or spare), by number
        self._numbers: list[int] = []  # numbers given back, below self._count: the lowest is used first
        self._count = 0
        self._spare: list[int] = []
        self._waiting: collections.deque[_Waiter] = collections.deque()  # this process's, in ticket order
        self._watcher: _Waiter | None = None  # the one waiter that looks at the queue every `recheck`
        self._seen: dict[tuple[int, int], float] = {}  # (record, generation) -> alive until (monotonic)
        self._index, self._gen = self._register()

    # -- the shared file -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _queue(self) -> Iterator[_Queue]:
        """The node's queue, read and written back under its lock (held by this thread alone: ``_lock``)."""
        fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0)  # waits: every holder keeps it for a few system calls
        try:
            head = os.pread(self._fd, _REC_AT, 0)
            issued, served, used = _HEAD.unpack_from(head) if len(head) == _REC_AT else (0, 0, 0)
            table = os.pread(self._fd, used * _REC.size, _REC_AT)
            records = [list(_REC.unpack_from(table, i * _REC.size)) for i in range(used)]
            queue = _Queue(self, issued, served, records)
            yield queue
            os.pwrite(self._fd, queue.pack(), 0)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)

    def _register(self) -> tuple[int, int]:
        """This process's record: the first whose byte lock no live process holds, locked for its lifetime."""
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0)
            try:
                if os.fstat(self._fd).st_size < _SIZE:
                    os.ftruncate(self._fd, _SIZE)  # zeros: no ticket, no record
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
            with self._queue() as queue:
                for index in range(_RECORDS):
                    if index in self._claimed:
                        continue  # another handle of this process (its lock does not stop this one's)
                    try:
                        fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1 + index)
                    except OSError:  # a live process's
                        continue
                    while len(queue.records) <= index:
                        queue.records.append([0, 0, 0, 0])
                    gen = (queue.records[index][1] + 1) & 0xFFFFFFFF or 1
                    queue.records[index] = [self._pid, gen, 0, 0]
                    self._claimed.add(index)
                    return index, gen
        raise OSError(f"{self.path}: more than {_RECORDS} processes use these payload slots")

    def _alive(self, queue: _Queue, index: int, gen: int, fresh: bool = False) -> bool:
        """Whether record ``index`` is still that of generation ``gen`` and its process is alive (seen
        alive a moment ago is enough unless ``fresh``); a dead process's record is cleared (its slots are
        free again)."""
        if index >= len(queue.records) or queue.records[index][1] != gen or not queue.records[index][0]:
            return False
        if index in self._claimed:  # this process's (probing its byte would drop the lock)
            return True
        now = time.monotonic()
        if not fresh and self._seen.get((index, gen), -1.0) > now:
            return True
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1 + index)
        except OSError:  # held: its process is alive
            # Believed for a while: slots granted to a process that died meanwhile come back when a look
            # that needs them finds it dead (a system call a grant is most of a look's cost).
            self._seen[(index, gen)] = now + 10 * self.recheck
            return True
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 1 + index)  # no one holds it: its process died
        queue.records[index] = [0, gen, 0, 0]
        self._seen.pop((index, gen), None)
        return False

    def _sync(self, *, give: int = 0, take: bool = False, cancel: _Waiter | None = None) -> bool:
        """One look at the node's queue (under ``_lock``): give back ``give`` slots, give this process's
        waiters their tickets, grant the free slots to the oldest tickets, hand out those granted to this
        process's waiters; with ``take``, take a slot if no ticket waits (True if taken); ``cancel`` a waiter
        whose time is up (unless a slot was granted to it first)."""
        taken = False
        with self._queue() as queue:
            me = queue.records[self._index]
            me[2] -= give
            for waiter in self._waiting:
                if waiter.ticket is None and queue.issued - queue.served < _RING:
                    waiter.ticket = queue.issued
                    queue.put(waiter.ticket, self._index + 1, self._gen)
                    queue.issued += 1
            free = self.n - sum(record[2] for record in queue.records)
            checked = False  # the holders' processes looked at (once a look: a system call each)
            while queue.served < queue.issued or take:
                if queue.served == queue.issued:  # no ticket waits: take one for try_acquire
                    if free <= 0 and not checked:
                        free, checked = self._reclaim(queue), True
                    taken = free > 0
                    if taken:
                        me[2] += 1
                    break
                index, gen = queue.get(queue.served)
                if not index or not self._alive(queue, index - 1, gen):  # given up, or its process died
                    queue.served += 1
                    free = self.n - sum(record[2] for record in queue.records)
                    continue
                if free <= 0:
                    if checked or (index - 1 != self._index and not take):
                        break
                    free, checked = self._reclaim(queue), True  # the next ticket is ours: dead holders' slots
                    continue
                record = queue.records[index - 1]
                record[2] += 1
                record[3] += 1
                free -= 1
                queue.served += 1
            while me[3] and self._waiting and self._waiting[0].ticket is not None:
                waiter = self._waiting.popleft()
                me[3] -= 1
                waiter.slot = self._number()
                self._wake(waiter)
            me[2] -= me[3]  # granted to waiters no longer here (never: a waiter gives up its ticket first)
            me[3] = 0
            if cancel is not None and cancel.slot is None:
                self._waiting.remove(cancel)
                if cancel.ticket is not None and cancel.ticket >= queue.served:
                    queue.put(cancel.ticket, 0, 0)
            return taken

    def _reclaim(self, queue: _Queue) -> int:
        """Free slots once the records of dead processes that held some are cleared."""
        for index, record in enumerate(queue.records):
            if record[2] and record[0]:
                self._alive(queue, index, record[1], fresh=True)
        return self.n - sum(record[2] for record in queue.records)

    def _others_wait(self) -> bool:
        """Whether a ticket waits in the node's queue (read without its lock: a hint)."""
        issued, served = struct.unpack("<QQ", os.pread(self._fd, 16, 0))
        return bool(issued != served)

    # -- this process ---------------------------------------------------------------------------------------

    def _number(self) -> int:
        if self._numbers:
            slot = heapq.heappop(self._numbers)
        else:
            slot, self._count = self._count, self._count + 1
        self._mine.add(slot)
        return slot

    def _drop(self, slots: list[int]) -> int:
        for slot in slots:
            self._mine.discard(slot)
            heapq.heappush(self._numbers, slot)
        return len(slots)

    def _wake(self, waiter: _Waiter) -> None:
        if not waiter.woken:
            waiter.woken = True
            waiter.gate.release()

    def try_acquire(self) -> int | None:
        """A free slot, now taken by this process; None if every slot is taken or requests wait for one."""
        with self._lock:
            if self._spare and not self._others_wait():
                return self._spare.pop()
            spare = self._spare[:]
            self._spare.clear()
            if self._sync(give=self._drop(spare), take=True):
                return self._number()
            return None

    def acquire(self, deadline: float) -> int | None:
        """A slot, waiting for one until ``deadline`` (``time.monotonic()``), after the requests of the node's
        processes that began to wait before this one; None if none came. A spare slot (see :meth:`release`)
        is taken first, with no lock, when no request of the node waits."""
        with self._lock:
            if self._spare and not self._others_wait():
                return self._spare.pop()
            waiter = _Waiter()
            self._waiting.append(waiter)
            spare = self._spare[:]
            self._spare.clear()
            self._sync(give=self._drop(spare))  # the spares go back: older requests come first
            while waiter.slot is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._sync(cancel=waiter)
                    break
                if self._watcher is None:
                    self._watcher = waiter
                watching = self._watcher is waiter
                self._lock.release()
                try:
                    woken = waiter.gate.acquire(timeout=min(left, self.recheck) if watching else left)
                finally:
                    self._lock.acquire()
                if woken:
                    waiter.woken = False
                if waiter.slot is None and self._watcher is waiter:
                    self._sync()
            if self._watcher is waiter:  # the next waiter looks now
                self._watcher = self._waiting[0] if self._waiting else None
                if self._watcher is not None:
                    self._wake(self._watcher)
            return waiter.slot

    def release(self, slot: int, keep: bool = False) -> None:
        """Give ``slot`` back to the node; with ``keep``, keep it as a spare for this process's next request
        (given back by :meth:`trim`) while no request of the node waits for a slot: a busy process then
        locks the queue once a slot and batch, not once a request, and holds no more slots than it has had
        requests in flight at once."""
        with self._lock:
            if slot not in self._mine or slot in self._spare:
                raise ValueError(f"slot={slot!r} is not one this process holds in {self.path}")
            if keep and not self._waiting and not self._others_wait():
                self._spare.append(slot)
                return
            spare = [slot, *self._spare]  # someone waits: the spares go back too
            self._spare.clear()
            self._sync(give=self._drop(spare))

    def trim(self) -> None:
        """Give the spare slots back to the node."""
        with self._lock:
            if self._spare:
                spare = self._spare[:]
                self._spare.clear()
                self._sync(give=self._drop(spare))

    def held(self) -> int:
        """The slots this process holds now (spare ones included)."""
        return len(self._mine)

    def waiting(self) -> int:
        """The requests of the node's live processes waiting for a slot now."""
        with self._lock, self._queue() as queue:
            tickets = (queue.get(ticket) for ticket in range(queue.served, queue.issued))
            return sum(1 for index, gen in tickets if index and self._alive(queue, index - 1, gen, fresh=True))


class _Waiter:
    """A request of this process waiting for a slot: its ticket in the node's queue (None while the
    queue is full), the slot handed to it, and the gate its thread waits at."""

    __slots__ = ("gate", "slot", "ticket", "woken")

    def __init__(self) -> None:
        self.ticket: int | None = None
        self.slot: int | None = None
        self.gate = threading.Lock()
        self.gate.acquire()  # released by a wake-up (a slot, or this waiter's turn to look)
        self.woken = False


class _Queue:
    """The node's queue as read under its lock: tickets issued and served (granted, or skipped as given
    up or dead), and the processes' records."""

    def __init__(self, owner: NodeSlots, issued: int, served: int, records: list[list[int]]) -> None:
        self.fd = owner._fd
        self.issued, self.served, self.records = issued, served, records
        self._first, self._block = 0, b""  # the tickets read last, from self._first on

    def get(self, ticket: int) -> tuple[int, int]:
        """The process (record index + 1, generation) of ``ticket``, read with the tickets after it."""
        at = (ticket - self._first) * _ENTRY.size
        if not 0 <= at < len(self._block):
            first = ticket % _RING
            count = max(1, min(self.issued - ticket, _RING - first, 16))
            self._first, self._block = ticket, os.pread(self.fd, count * _ENTRY.size, _RING_AT + first * _ENTRY.size)
            at = 0
        if at + _ENTRY.size > len(self._block):
            return 0, 0
        index, gen = _ENTRY.unpack_from(self._block, at)
        return index, gen

    def put(self, ticket: int, index: int, gen: int) -> None:
        self._block = b""
        os.pwrite(self.fd, _ENTRY.pack(index, gen), _RING_AT + (ticket % _RING) * _ENTRY.size)

    def pack(self) -> bytes:
        return _HEAD.pack(self.issued, self.served, len(self.records)).ljust(_REC_AT, b"\0") + b"".join(
            _REC.pack(*record) for record in self.records
        )


_pid = os.getpid()
_files: dict[tuple[str, int], NodeSlots] = {}
# The records this process's handles hold, by slot file (device, inode): a record of another process with
# the same pid (a dead one's pid reused) is not this one's. A forked child holds none.
_claimed: dict[tuple[int, int], set[int]] = {}
os.register_at_fork(after_in_child=_claimed.clear)
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
            path = os.path.join(directory, f"rank_dataset-payload-slots-q-{os.getuid()}-{n}")  # q: the queue's layout
            found = _files[key] = NodeSlots(path, n)
        return found
