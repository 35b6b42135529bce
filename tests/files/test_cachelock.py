from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rank_dataset.files.index.cachelock import load_or_build, lock_path, one_builder

_HOLD = """
import sys, time
from pathlib import Path
from rank_dataset.files.index.cachelock import one_builder
with one_builder(Path(sys.argv[1])) as locked:
    print(locked, flush=True)
    time.sleep(600)
"""


def _holder(cache: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(cache)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "True"
    return proc


def test_a_held_lock_keeps_others_out_until_released(tmp_path: Path) -> None:
    cache = tmp_path / "x.idx"
    holder = _holder(cache)
    try:
        started = time.monotonic()
        with one_builder(cache, timeout=0.3) as locked:
            assert not locked  # held elsewhere: timed out, and the body runs all the same
        assert time.monotonic() - started >= 0.3
    finally:
        holder.terminate()
        holder.wait(timeout=30)
    with one_builder(cache, timeout=10) as locked:
        assert locked


def test_a_killed_holder_does_not_wedge_the_next_builder(tmp_path: Path) -> None:
    cache = tmp_path / "x.idx"
    holder = _holder(cache)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    with one_builder(cache, timeout=10) as locked:
        assert locked  # taken: a wedged lock would have timed out (False)


def test_the_lock_file_is_not_left_behind(tmp_path: Path) -> None:
    cache = tmp_path / "x.idx"
    with one_builder(cache) as locked:
        assert locked and lock_path(cache).exists()
    assert list(tmp_path.iterdir()) == []


def test_without_a_lock_everyone_builds(tmp_path: Path) -> None:
    # A file where the cache's directory would be: nothing can be created there (as in a read-only
    # directory, which root could still write to).
    (tmp_path / "blocker").write_text("")
    cache = tmp_path / "blocker" / "x.idx"
    built = []
    with one_builder(cache) as locked:
        assert not locked
    assert load_or_build([cache], lambda _: None, lambda _held, _: built.append(1) or 7) == 7
    assert built == [1]


def test_load_or_build_loads_what_another_builder_wrote_while_it_waited(tmp_path: Path) -> None:
    cache = tmp_path / "x.txt"
    holder = _holder(cache)
    loads: list[int | None] = []

    def load(_: Path) -> int | None:
        loads.append(int(cache.read_text()) if cache.exists() else None)
        return loads[-1]

    def build(_held: object, _: Path) -> int:
        raise AssertionError("built although another process built it meanwhile")

    def finish() -> None:  # the holder's build: it writes the cache, then goes (here: is killed)
        while not loads:  # the waiter has looked once and found nothing
            time.sleep(0.01)
        time.sleep(0.2)
        cache.write_text("9")
        holder.kill()

    thread = threading.Thread(target=finish)
    thread.start()
    try:
        assert load_or_build([cache], load, build) == 9
    finally:
        thread.join()
        holder.wait(timeout=30)
    assert loads == [None, 9]  # not there before waiting, there after
