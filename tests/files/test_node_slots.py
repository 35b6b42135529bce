"""The node's payload request slots (:class:`NodeSlots`) across real processes: given to waiting requests in
the order they began to wait, whichever process they are in, also when the processes ask for more than the
cap; a process that gives a slot back does not take it again before an older request of another process; a
process killed while it waits or while it holds slots wedges no one."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rank_dataset.files.io._slots import NodeSlots

CONTEXT = multiprocessing.get_context("spawn")
FAR = 120.0  # seconds: a deadline no request of these tests reaches unless the queue is wedged


def _until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check`` (a condition another process brings about); fail if it never comes."""
    give_up = time.monotonic() + FAR
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"{what}: not within {FAR:g} s")
        time.sleep(0.005)


def _stop(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(30)


def _run_threads(run: Callable[[], None], threads: int, slots: NodeSlots) -> None:
    """Run ``run`` in ``threads`` threads, wait for them all, then drop the process's spare slots."""
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    slots.trim()


def _take_turns(path: str, name: int, threads: int, go: Any, counter: Any, order: Any) -> None:
    """``threads`` threads ask for a slot once ``go`` is set, note their turn (the slot held, so the node's
    one slot orders the notes), give it back as a spare (as the payload reader does) and ask again."""
    slots = NodeSlots(path, 1)
    go.wait()

    def run() -> None:
        for _ in range(2):
            slot = slots.acquire(time.monotonic() + FAR)
            if slot is None:
                return
            with counter.get_lock():
                order[counter.value] = name
                counter.value += 1
            slots.release(slot, keep=True)

    _run_threads(run, threads, slots)


def test_slots_go_to_the_processes_waiting_in_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "slots" / "turns")
    processes_, threads = 3, 3  # 9 requests for 1 slot
    mine = NodeSlots(path, 1)
    slot = mine.acquire(time.monotonic() + FAR)
    assert slot is not None and mine.try_acquire() is None
    counter = CONTEXT.Value("i", 0)
    order = CONTEXT.Array("i", [-1] * (2 * processes_ * threads))
    gos = [CONTEXT.Event() for _ in range(processes_)]
    processes = [
        CONTEXT.Process(target=_take_turns, args=(path, name, threads, gos[name], counter, order))
        for name in range(processes_)
    ]
    try:
        for process in processes:
            process.start()
        for name, go in enumerate(gos):  # the processes' requests join the queue one process after another
            go.set()
            _until(lambda name=name: mine.waiting() == (name + 1) * threads, f"process {name}'s requests wait")
        mine.release(slot, keep=True)
        assert mine.held() == 0  # not kept as a spare: other processes' requests wait
        for process in processes:
            process.join(FAR)
        assert [process.exitcode for process in processes] == [0] * processes_
    finally:
        _stop(processes)
    turns = list(order)
    first = [name for name in range(processes_) for _ in range(threads)]
    # Every first request is served in the order it began to wait; a process's second requests, asked once
    # its first were served (the slot given back as a spare), come after every first request of the others.
    assert turns[: processes_ * threads] == first
    assert sorted(turns[processes_ * threads :]) == first
    assert mine.waiting() == 0 and mine.try_acquire() is not None


def _busy(path: str, n: int, threads: int, rounds: int, start: Any, counter: Any, conn: Any) -> None:
    """``threads`` threads each ask for a slot ``rounds`` times, hold it a moment and give it back as a
    spare; each request's turns (the shared counter when it was asked and when it was served) go back."""
    slots = NodeSlots(path, n)
    notes: list[tuple[int, int, bool]] = []
    start.wait()

    def run() -> None:
        for _ in range(rounds):
            with counter.get_lock():
                asked = counter.value
                counter.value += 1
            slot = slots.acquire(time.monotonic() + FAR)
            with counter.get_lock():
                served = counter.value
                counter.value += 1
            notes.append((asked, served, slot is not None))
            if slot is not None:
                time.sleep(0.003)  # a request in flight
                slots.release(slot, keep=True)

    _run_threads(run, threads, slots)
    conn.send(notes)


def test_a_node_asking_for_more_than_the_cap_serves_every_request_near_its_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "slots" / "busy")
    n, processes_, threads, rounds = 4, 3, 4, 25  # 12 threads asking for 4 slots, 300 requests
    counter = CONTEXT.Value("q", 0)
    start = CONTEXT.Event()
    pipes = [CONTEXT.Pipe() for _ in range(processes_)]
    processes = [
        CONTEXT.Process(target=_busy, args=(path, n, threads, rounds, start, counter, theirs)) for _, theirs in pipes
    ]
    try:
        for process in processes:
            process.start()
        start.set()
        notes = [(asked, served, ok, name) for name, (ours, _) in enumerate(pipes) for asked, served, ok in ours.recv()]
        for process in processes:
            process.join(FAR)
    finally:
        _stop(processes)
    assert len(notes) == processes_ * threads * rounds and all(ok for _, _, ok, _ in notes)  # none timed out
    # Overtaken: served before a request of another process that was asked before it. A request joins the
    # queue a few instructions after it takes its number here, so a few overtakes are the measure's; the
    # bound (4 requests of each thread) is far below what a process that keeps retaking its slots causes.
    overtaken = [
        sum(1 for a, s, _, p in notes if p != name and a > asked and s < served) for asked, served, _, name in notes
    ]
    assert max(overtaken) <= 4 * processes_ * threads, sorted(overtaken)[-10:]
    mine = NodeSlots(path, n)
    assert mine.waiting() == 0 and [mine.try_acquire() for _ in range(n + 1)][n] is None  # all n free again


def _hold(path: str, n: int, conn: Any) -> None:
    slots = NodeSlots(path, n)
    conn.send([slots.acquire(time.monotonic() + FAR) for _ in range(n)])
    signal.pause()


def _wait(path: str, n: int) -> None:
    NodeSlots(path, n).acquire(time.monotonic() + FAR)
    signal.pause()


def test_killed_waiters_and_holders_wedge_no_one(tmp_path: Path) -> None:
    # A process holding every slot and one waiting for one, both SIGKILLed: the waiter's ticket is skipped
    # and the holder's slots are free again.
    path = str(tmp_path / "slots" / "dead")
    ours, theirs = CONTEXT.Pipe()
    holder = CONTEXT.Process(target=_hold, args=(path, 2, theirs))
    waiter = CONTEXT.Process(target=_wait, args=(path, 2))
    try:
        holder.start()
        assert sorted(ours.recv()) == [0, 1]
        mine = NodeSlots(path, 2)
        waiter.start()
        _until(lambda: mine.waiting() == 1, "the waiter waits")
        os.kill(waiter.pid, signal.SIGKILL)  # type: ignore[arg-type]
        waiter.join(30)
        assert mine.waiting() == 0  # a dead process's request is not counted
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(30)
        got = [mine.acquire(time.monotonic() + FAR) for _ in range(2)]
        assert sorted(got) == [0, 1] and mine.held() == 2  # type: ignore[type-var]
    finally:
        _stop([holder, waiter])

    # A slot granted to a waiting process that is killed before it takes it (stopped, so it cannot look):
    # the slot comes back with its death.
    path = str(tmp_path / "slots" / "granted")
    mine = NodeSlots(path, 1)
    slot = mine.acquire(time.monotonic() + FAR)
    waiter = CONTEXT.Process(target=_wait, args=(path, 1))
    try:
        waiter.start()
        _until(lambda: mine.waiting() == 1, "the waiter waits")
        os.kill(waiter.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        assert slot is not None
        mine.release(slot, keep=True)  # granted to the waiter (the older request), not kept
        assert mine.held() == 0 and mine.waiting() == 0 and mine.try_acquire() is None
        os.kill(waiter.pid, signal.SIGKILL)  # type: ignore[arg-type]
        waiter.join(30)
        assert mine.acquire(time.monotonic() + FAR) == 0
    finally:
        _stop([waiter])


def test_giving_back_a_slot_not_held_is_refused(tmp_path: Path) -> None:
    slots = NodeSlots(str(tmp_path / "slots" / "once"), 2)
    slot = slots.acquire(time.monotonic() + FAR)
    assert slot is not None
    slots.release(slot)
    with pytest.raises(ValueError, match=rf"slot={slot} is not one this process holds"):
        slots.release(slot)  # the node's count stays right: a second give-back would free a slot another holds
    assert slots.held() == 0 and [slots.try_acquire() for _ in range(3)][2] is None
