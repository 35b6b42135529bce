"""Run a test worker script as ``nproc`` gloo ranks on this machine, as ``torchrun --standalone`` does,
for a fraction of its cost: torch is imported once, here, and each rank is a fork of this process that
runs the script as ``__main__``, with the environment torchrun gives (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). torchrun starts an agent and
every rank as a fresh interpreter that imports torch again: about 2 s of CPU each, most of the suite's
time on 2 cores. The tests that are about torchrun itself (its agent ending the other ranks when one
fails) still run under it (``tests_helpers.torchrun_cmd``).

As torchrun does, when a rank fails the others are ended (SIGTERM, then SIGKILL), and the exit status is
1 if any rank failed. A rank dies with this process (``PR_SET_PDEATHSIG``), so a test's timeout that
kills it leaves no rank behind.

Usage: python tests/ranks.py NPROC SCRIPT [ARGS...]

The suite runs these jobs without even this interpreter: :func:`job`, run by a test process's forkserver
(which imported torch once, ``tests/conftest.py``), does what this command does (``tests_helpers.run_ranks``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback


def _rank(rank: int, nproc: int, port: int, script: str, args: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _end(pids: set[int]) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid:
                pids.discard(pid)
            else:
                time.sleep(0.05)
        if not pids:
            return


def _leave(code: int) -> None:
    """End a rank as an interpreter's exit would (its other non-daemon threads joined, atexit handlers
    run, streams flushed), through ``_exit``: the frames it was forked from (the launcher's, or those of
    multiprocessing in a forkserver's child) are not the rank's to unwind."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main() -> int:
    return launch(int(sys.argv[1]), sys.argv[2], sys.argv[3:])


def job(nproc: int, script: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """:func:`launch`, in a child of a forkserver, with the environment ``env`` and its output in the
    files ``out`` and ``err`` (the job's exit status is the process's)."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    # A forkserver's child takes its parent's start method (multiprocessing's preparation data): back to
    # the platform's default, which the ranks of the command (a fresh interpreter) have.
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = paths
    sys.exit(launch(nproc, script, args))


def launch(nproc: int, script: str, args: list[str]) -> int:
    """Run ``nproc`` ranks of ``script`` (given ``args``); 1 if any failed, the others then ended."""
    import torch.distributed  # noqa: F401 - once, before the forks: every rank inherits it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sys.stdout.flush()
    sys.stderr.flush()
    pids: set[int] = set()
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            _leave(_rank(rank, nproc, port, script, args))
        pids.add(pid)
    failed = False
    while pids:
        pid, status = os.wait()
        pids.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            failed = True
            _end(pids)
            pids.clear()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
