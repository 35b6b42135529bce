"""Shareable memory segments: the buffers of a shard, and the control block of a dataset.

On Linux a segment is a memfd (``os.memfd_create``): anonymous memory behind a file descriptor that
has no name in any file system. Another process of the same user opens it again through
``/proc/<pid>/fd/<fd>`` of the process that created it, which is how spawn and forkserver workers
(and forked ones, for segments made after they started) reach it. The kernel frees it when the last
descriptor and the last mapping of it are gone, so nothing is ever left behind, not even after
SIGKILL. Where memfds do not exist, a segment is a file in ``/dev/shm`` (or the temporary
directory), removed by the creating process when its :class:`Segment` is collected or closed.

A :class:`Segment` is the creator's hold on the memory (the descriptor, or the file's name); a
mapping is held separately (``mmap``), so the creator can unmap a segment and keep it reachable for
other processes, or drop both. A forked child does not inherit that hold: descriptors of segments
are closed in the child right after ``fork`` (their mappings stay valid), so a forked DataLoader
worker never keeps alive a segment its parent has released.

A segment that is a named file is called ``rank_dataset_<pid>_<random>``, or
``rank_dataset_<tag>_<pid>_<random>`` when the environment sets ``RANK_DATASET_SHM_TAG``, so that a job
(or a test session) can find the segments that its own processes left behind.

:func:`host_key` tells which processes can map each other's segments (the ranks of one host).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import tempfile
import threading
import weakref
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

__all__ = ["HOST_ENV", "Handle", "Segment", "SegmentGone", "Table", "attach", "host_key"]

_T = TypeVar("_T", bound="Table")
_SHM_DIR = "/dev/shm"
TAG_ENV = "RANK_DATASET_SHM_TAG"
#: For tests only: a host name that replaces :func:`host_key`'s, so that the ranks of one machine stand
#: for several hosts (those given different names exchange as ranks of different hosts do).
HOST_ENV = "RANK_DATASET_TEST_HOST"
#: Off in tests that exercise the named-file fallback.
USE_MEMFD = hasattr(os, "memfd_create")


class SegmentGone(FileNotFoundError):
    """The segment a handle names was released by its creator (or the creator has exited)."""


@dataclass(frozen=True)
class Handle:
    """What another process needs to map a segment: where to open it, and what to expect there.

    ``kind`` is ``"memfd"`` (opened as ``/proc/<pid>/fd/<fd>``) or ``"file"`` (opened at ``path``);
    ``ino`` and ``size`` guard against a descriptor number or a name reused for something else.
    """

    kind: str
    pid: int
    fd: int
    path: str
    ino: int
    size: int

    def __reduce__(self) -> tuple[type[Handle], tuple[str, int, int, str, int, int]]:
        # Positional: handles travel in every pickled dataset (to each DataLoader worker).
        return Handle, (self.kind, self.pid, self.fd, self.path, self.ino, self.size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Handle:
        return cls(str(d["kind"]), int(d["pid"]), int(d["fd"]), str(d["path"]), int(d["ino"]), int(d["size"]))

    def open_path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}" if self.kind == "memfd" else self.path


# Segments whose descriptor this process holds: closed in a forked child (see the module docstring).
_held: weakref.WeakSet[Segment] = weakref.WeakSet()
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave the child's copy held for good.
    global _lock
    _lock = threading.Lock()
    for segment in list(_held):
        segment._disown()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Segment:
    """A new segment of ``size`` bytes, created in this process. ``map()`` gives a writable mapping.

    ``close()`` (or collection) gives up this process's hold: the memory lives on only while other
    processes have it open or mapped.
    """

    def __init__(self, size: int, *, name: str = "rank_dataset") -> None:
        size = max(int(size), 1)
        self.size = size
        self._pid = os.getpid()
        if USE_MEMFD:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            path = ""
        else:
            directory = _SHM_DIR if os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK) else tempfile.gettempdir()
            tag = os.environ.get(TAG_ENV)
            prefix = f"{name}_{tag}_{self._pid}_" if tag else f"{name}_{self._pid}_"
            fd, path = tempfile.mkstemp(prefix=prefix, dir=directory)
        try:
            os.ftruncate(fd, size)
            ino = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            if path:
                _unlink(path, self._pid)
            raise
        self.handle = Handle("memfd" if USE_MEMFD else "file", self._pid, fd, path, ino, size)
        self._fd = fd
        self._finalizer = weakref.finalize(self, _release, fd, path, self._pid)
        with _lock:
            _held.add(self)

    def map(self) -> mmap.mmap:
        """A new shared, writable mapping of the whole segment."""
        if self._fd < 0:
            raise SegmentGone(f"segment {self.handle.open_path()} was closed")
        return mmap.mmap(self._fd, self.size)

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def close(self) -> None:
        """Give up this process's hold (descriptor or name); mappings stay valid."""
        self._finalizer()
        self._fd = -1

    def _disown(self) -> None:
        # In a forked child: the descriptor belongs to the parent's hold, not ours.
        self._finalizer.detach()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1

    def __repr__(self) -> str:
        return f"Segment({self.handle.open_path()!r}, size={self.size}, alive={self.alive})"


def attach(handle: Handle, *, writable: bool = False) -> mmap.mmap:
    """Map the segment of ``handle`` (read-only unless ``writable``).

    Raises:
        SegmentGone: its creator released it (or exited), or the name now holds something else.
    """
    path = handle.open_path()
    flags = (os.O_RDWR if writable else os.O_RDONLY) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise SegmentGone(f"shared segment {path} is gone: its creator (pid {handle.pid}) released it") from None
    except PermissionError as exc:
        raise PermissionError(
            f"cannot open shared segment {path} of process {handle.pid}: {exc.strerror} (DataLoader workers "
            "must run as the same user as the process that built the shard)"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_ino != handle.ino or st.st_size < handle.size:
            raise SegmentGone(f"shared segment {path} is gone: the name now holds another file")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, handle.size, access=access)
    finally:
        os.close(fd)


class Table:
    """A fixed-size shared table of ``SIZE`` bytes: :meth:`create` in the rank (which holds its segment),
    :meth:`attach` to its handle elsewhere; it pickles to that handle."""

    SIZE: int
    NAME: str

    def __init__(self, mm: mmap.mmap, handle: Handle, segment: Segment | None) -> None:
        self._mm, self.handle, self.segment = mm, handle, segment

    @classmethod
    def create(cls: type[_T]) -> _T:
        segment = Segment(cls.SIZE, name=cls.NAME)
        return cls(segment.map(), segment.handle, segment)

    @classmethod
    def attach(cls: type[_T], handle: Handle) -> _T:
        return cls(attach(handle, writable=True), handle, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).attach, (self.handle,))


def _release(fd: int, path: str, creator: int) -> None:
    # Only the creating process gives up the hold (a forked child has disowned its copy already).
    if os.getpid() != creator:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    if path:
        _unlink(path, creator)


def _unlink(path: str, creator: int) -> None:
    if os.getpid() != creator:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def host_key() -> str:
    """The same string in processes that can map each other's segments, a different one elsewhere: the
    host's name and boot, the user, and the network, mount and PID namespaces (processes of one machine
    in different containers, or in the hosts of a test bed made of namespaces, are different hosts).
    ``RANK_DATASET_TEST_HOST`` (:data:`HOST_ENV`), for tests only, replaces it."""
    forced = os.environ.get(HOST_ENV)
    if forced:
        return f"test:{forced}"
    parts = [socket.gethostname(), str(os.getuid()) if hasattr(os, "getuid") else "?"]
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        parts.append(f.read().strip())
    for ns in ("net", "mnt", "pid"):
        try:
            parts.append(f"{ns}:{os.stat(f'/proc/self/ns/{ns}').st_ino}")
        except OSError:
            parts.append(f"{ns}:?")
    return "/".join(parts)
