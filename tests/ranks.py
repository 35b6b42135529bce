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
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import socket
import sys
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


def main() -> int:
    nproc, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
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
            code = _rank(rank, nproc, port, script, args)
            raise SystemExit(code)  # the interpreter's usual exit: atexit handlers, flushed streams
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
