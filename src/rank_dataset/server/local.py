"""A meta server on this machine: ``rank-dataset serve`` in a child process, on a loopback port, and
the wait until it answers ``/healthz``; used by the demo, the tests and the benchmarks."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import IO, Any

__all__ = ["LocalServer", "free_port", "wait_until_up"]


def _limit_open_files(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(url: str, proc: subprocess.Popen[Any], timeout: float) -> None:
    """Return once ``url`` answers (any HTTP status but 5xx).

    Raises:
        RuntimeError: ``proc`` exited first (the message gives its status), or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


class LocalServer:
    """``rank-dataset serve PATHS ARGS --port PORT`` on 127.0.0.1, started and healthy.

    Args:
        paths: the meta files to serve.
        args: more command-line options of ``rank-dataset serve``.
        port: the port (None: a free one).
        env: environment variables added to this process's.
        stdout: the server's stdout (e.g. ``subprocess.PIPE``; None: inherited).
        timeout: seconds to wait for ``/healthz``.
        fd_limit: run the server with at most this many open files (its soft and hard limit, as
            after ``ulimit -n``; None: this process's limits).

    Raises:
        RuntimeError: the server exited or did not answer ``/healthz`` in time (it is stopped).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *args: str,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        stdout: int | IO[Any] | None = None,
        timeout: float = 60.0,
        fd_limit: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "rank_dataset", "serve", *map(str, paths), "--port", str(self.port), *args]
        limit = None if fd_limit is None else functools.partial(_limit_open_files, fd_limit)
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=stdout, text=True, preexec_fn=limit)
        try:
            wait_until_up(f"{self.url}/healthz", self.proc, timeout)
        except RuntimeError:
            self.stop()
            raise

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` (if the server still runs) and return its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
