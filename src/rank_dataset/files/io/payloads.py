"""The files a meta file's lines name, read many at a time: :func:`resolve` turns a name into what to read
(a file under a local root, an object under a URL root) or the reason it must not be read, and
:class:`PayloadReader` reads a batch of them at once, handing out each one's ``bytes`` (or its error) in the
batch's order.

- Names are checked before anything is read: a NUL byte, an absolute path, a ``..`` component or a URL where a
  root is a directory is refused; a local file must stay under its root with symlinks followed
  (:meth:`PayloadReader._open_checked`, or the native opener where the system has ``openat2``) and be a
  regular file. With no root, a name must be a URL (or an absolute path) under one of the ``allow`` prefixes.
- A local file in the page cache is read in the taking thread; from the first that is not, the batch's local
  files are read by a small thread pool. Either way one ``os.pread`` of its size reads it.
- Objects are read by a pool of ``max_in_flight`` threads through obstore's blocking API, with the clients of
  meta files (:mod:`._stores`); a request holds one of the node's slots (:mod:`._slots`) while it runs.
- The bytes read and not yet handed out stay under ``max_bytes`` (:class:`~._slots.ByteBudget`).
- A failure is the payload's: a :class:`~rank_dataset.errors.PayloadError` naming the path or URL. 5xx and
  dropped connections are retried by the client and a short body or a stalled request is asked again here,
  with backoff, all within ``timeout``.

Nothing here crosses a fork (the pid is checked on each batch). A process forked from one that had imported
obstore cannot run obstore's runtime (obstore #441), so it reads objects through a helper process started with
``python -m rank_dataset.files.io.payloads``, which sends each payload back through a pipe in order.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import os
import pickle
import random
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from rank_dataset.core import native
from rank_dataset.core.checks import is_url
from rank_dataset.errors import PayloadError
from rank_dataset.files.io import _stores
from rank_dataset.files.io._slots import ByteBudget, node_slots, slots_dir
from rank_dataset.files.io._stores import require_client

__all__ = [
    "COUNTS",
    "LocalTarget",
    "ObjectTarget",
    "PayloadReader",
    "ReadSettings",
    "require_client",
    "resolve",
    "resolver",
    "slots_dir",
    "target_root",
]

#: This process's payload reads so far (for the tests and the benchmark): files (of which read by the pool, not
#: found in the page cache), objects, GETs asked again; and local files opened by the native opener.
COUNTS = {"files": 0, "pooled": 0, "objects": 0, "again": 0, "native": 0}
_COUNTS_LOCK = threading.Lock()
_LOCAL_THREADS = 8  # local reads at once: a disk or page cache needs few
_BACKOFF = (0.05, 2.0)  # first and longest wait before a request is asked again


class LocalTarget(NamedTuple):  # a tuple: made once a sample, cheaply
    """A local file to read: ``rel`` under the directory ``root`` (a real path); ``path`` names it in messages.
    ``rel`` has passed the lexical checks (no ``..``, not absolute); symlinks are checked as it is opened."""

    path: str
    root: str
    rel: str


@dataclass(frozen=True)
class ObjectTarget:
    """An object to read: ``name`` under the client of ``directory``; ``url`` names it in messages."""

    directory: str
    name: str
    url: str


Target = LocalTarget | ObjectTarget
_new_local = tuple.__new__


class _Opened:
    """A run of a batch's local files opened by one call of :func:`~rank_dataset.core.native.open_files`:
    ``pending[start:start + n]``; ``out`` its descriptors (-1 once taken), sizes and statuses."""

    __slots__ = ("n", "out", "start")

    def __init__(self, start: int, n: int, out: Any) -> None:
        self.start, self.n, self.out = start, n, out


class _Miss:
    """A local file found open but not in the page cache: its descriptor and size, for the pool."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size


# Opening a file under its root: walked with openat where the system has it (Windows has not).
_WALK = os.open in os.supports_dir_fd
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW
# A read that fails rather than waits for a disk (Linux preadv2): how a page-cache hit is told from a miss.
_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
_HERE_MAX = 4 << 20  # larger files go to the pool (a probe of one page says less of them)
_probe = bytearray(1)  # what a probe reads (thrown away: threads may share it)
# Local files opened by one call of the native opener (openat2, fstat and the probe of each, in C): a batch's
# next files in the page cache, opened ahead of their turn (at most this many descriptors held ahead).
_RUN = 32
_native_open = _WALK and sys.platform == "linux"  # False once the system says it has no openat2


def target_root(root: str | os.PathLike[str]) -> str:
    """``root`` as :func:`resolve` takes it: a URL without its trailing slashes, or a local directory's real path.

    Raises:
        ValueError: a local root that is not a directory.
    """
    text = os.fspath(root)
    if is_url(text):
        return text.rstrip("/")
    real = os.path.realpath(text)
    if not os.path.isdir(real):
        raise ValueError(f"Payloads root {text!r} is not a directory (nor a URL such as s3://bucket/prefix)")
    return real


def _relative_problem(name: str) -> str | None:
    """Why the relative name ``name`` must not be read under a root (None: it may)."""
    if name and name[0] not in "/\\" and ".." not in name and ":" not in name and "\0" not in name:
        return None  # the common case, at a glance: none of the checks below can fail without one of these
    if not name:
        return "an empty path"
    if "\0" in name:
        return "a NUL byte in the path"
    if is_url(name) or "://" in name:
        return "a URL where a path under the root was expected"
    if name.startswith(("/", "\\")) or os.path.isabs(name):
        return "an absolute path where a path under the root was expected"
    if ".." in name.replace("\\", "/").split("/"):
        return "a '..' component (it would leave the root)"
    return None


def resolve(name: str, root: str | None, allow: Sequence[str] = ()) -> Target | PayloadError:
    """What to read for ``name`` (a line's path) under ``root`` (from :func:`target_root`), or with no root
    under one of the ``allow`` prefixes (URLs ending in ``/``, or local directories' real paths); the
    :class:`~rank_dataset.errors.PayloadError` saying why it must not be read otherwise. No file is opened."""
    if not isinstance(name, str):
        return PayloadError(repr(name), f"the key gave {type(name).__name__}, not a str path")
    if root is None:
        for prefix in allow:
            if is_url(prefix) and name.startswith(prefix):
                return _under(name[len(prefix) :], prefix.rstrip("/"), name)
            if not is_url(prefix) and name.startswith(prefix + os.sep):
                return _under(name[len(prefix) + 1 :], prefix, name)
        if "\0" in name:
            return PayloadError(name.replace("\0", "\\0"), "a NUL byte in the path")
        return PayloadError(name, f"not under any allowed prefix (allow={list(allow)})")
    return _under(name, root, None)


def resolver(root: str | None, allow: Sequence[str] = ()) -> Callable[[str], Target | PayloadError]:
    """:func:`resolve` with ``root`` and ``allow`` bound (what it answers, the same), the root looked at once:
    under a local root, a name that passes the checks at a glance is a :class:`LocalTarget` at once."""
    if root is None or is_url(root):
        return functools.partial(resolve, root=root, allow=allow)
    prefix = root if root.endswith(os.sep) else root + os.sep

    def local(name: str) -> Target | PayloadError:
        # _relative_problem's glance, inline (once a sample); the tuple made without the class's Python __new__
        if type(name) is str and name and name[0] not in "/\\" and not (".." in name or ":" in name or "\0" in name):
            return _new_local(LocalTarget, (prefix + name, root, name))
        return resolve(name, root)

    return local


def _under(rel: str, root: str, shown: str | None) -> Target | PayloadError:
    problem = _relative_problem(rel)
    if is_url(root):
        url = shown or f"{root}/{rel}"
        if problem is not None:
            return PayloadError(url.replace("\0", "\\0"), problem)
        return ObjectTarget(root, rel, url)
    path = shown or (root + rel if root.endswith(os.sep) else f"{root}{os.sep}{rel}")
    if problem is not None:
        return PayloadError(path.replace("\0", "\\0"), problem)
    return LocalTarget(path, root, rel)  # symlinks: checked as it is opened (_open_checked)


@dataclass(frozen=True)
class ReadSettings:
    """How a process reads payloads (see :class:`~rank_dataset.Payloads`): ``storage_options`` for objects,
    ``max_in_flight`` requests and ``max_bytes`` held per process, ``node_max_in_flight`` requests per node
    (the slots' files in ``slots_dir``), each payload within ``timeout`` seconds."""

    storage_options: Mapping[str, Any]
    max_in_flight: int
    max_bytes: int
    node_max_in_flight: int
    timeout: float
    slots_dir: str


Result = tuple[Any, int]  # (bytes or the PayloadError, bytes reserved in the budget for it)


class PayloadReader:
    """Reads payloads for one process (see the module): :meth:`read` a batch, in order."""

    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.budget = ByteBudget(settings.max_bytes)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # local files
        self._objects: concurrent.futures.ThreadPoolExecutor | None = None  # objects: max_in_flight threads
        self._active = 0  # object requests asked for and not ended (at 0, the spare node slots are given back)
        self._helper: _Helper | None = None
        self._roots: dict[str, int] = {}  # each local root's directory, opened once (see _open_checked)
        self._lock = threading.Lock()

    def read(self, targets: Sequence[Target | PayloadError]) -> Iterator[bytes | PayloadError]:
        """Each target's bytes (or its error), in order; all are asked for at once (local files in the page
        cache: read as they are taken, see the module). A payload is the
        caller's when it is yielded; one the caller leaves unread (it stops early) is dropped when it arrives."""
        if os.getpid() != self.pid:
            raise RuntimeError("a PayloadReader serves the process that made it")  # the caller makes one per pid
        tickets = self.budget.tickets(len(targets))
        helper = self._helper_if_forked() if any(isinstance(t, ObjectTarget) for t in targets) else None
        pending: list[concurrent.futures.Future[Result] | PayloadError | LocalTarget | None] = []  # None: the helper's
        remote: list[ObjectTarget] = []
        stores: dict[str, Any] = {}  # each directory's client, looked up once a batch
        for target, ticket in zip(targets, tickets):
            if isinstance(target, PayloadError):
                self.budget.skip(ticket)
                pending.append(target)
            elif isinstance(target, LocalTarget):
                pending.append(target)  # read as it is taken, or by the pool (see below)
            elif helper is not None:
                self.budget.skip(ticket)  # the helper holds its own budget
                remote.append(target)
                pending.append(None)
            else:
                store = stores.get(target.directory)
                if store is None:
                    store = stores[target.directory] = self._store_of(target.directory)
                with self._lock:
                    self._active += 1
                pending.append(self._objects_of().submit(self._get, target, ticket, store))
        from_helper = helper.read(remote) if helper is not None else iter(())
        k = 0
        run: _Opened | None = None  # the local files opened ahead (see _open_run)
        try:
            for k, item in enumerate(pending):
                if isinstance(item, LocalTarget):  # (the batch's files before it were all in the page cache)
                    if run is None or k >= run.start + run.n:
                        run = self._open_run(pending, k)
                    if run is not None:
                        here = self._take_opened(item, tickets[k], run, k)
                    else:
                        here = self._read_here(item, tickets[k])
                    if isinstance(here, _Miss):  # not in the page cache: it and the batch's next files go to the pool
                        here = self._to_pool(pending, tickets, k, here, run).result()
                    self.budget.release(here[1])  # handed out: the caller's now
                    yield here[0]
                    continue
                if isinstance(item, PayloadError):
                    yield item
                elif item is None:
                    yield next(from_helper)
                else:
                    data, reserved = item.result()
                    if not isinstance(data, (bytes, PayloadError)):
                        # The one copy, from the client's buffer into the bytes handed out, made here: in the
                        # thread that takes the payloads, the memory of those it freed is reused, where a
                        # copy in each of the pool's threads takes fresh pages (zeroed by the kernel).
                        data = data.to_bytes()
                    self.budget.release(reserved)  # handed out: the caller's now
                    yield data
            k = len(pending)
        finally:
            for j in range(k + 1, len(pending)):
                left = pending[j]
                if isinstance(left, concurrent.futures.Future):
                    left.add_done_callback(self._drop)
                elif isinstance(left, LocalTarget):  # not read (a miss went to the pool)
                    self.budget.skip(tickets[j])
            if run is not None:  # the files opened ahead and not taken
                for fd in run.out[: run.n]:
                    if fd >= 0:
                        os.close(fd)
            if isinstance(from_helper, Iterator):
                for _ in from_helper:  # the helper's answers are read to the end: the pipe stays in step
                    pass

    def _drop(self, future: concurrent.futures.Future[Result]) -> None:
        self.budget.release(future.result()[1])

    def _pool_of(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                n = min(_LOCAL_THREADS, self.settings.max_in_flight)
                self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="rank_dataset-payloads")
            return self._pool

    def _objects_of(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._objects is None:
                self._objects = concurrent.futures.ThreadPoolExecutor(
                    self.settings.max_in_flight, thread_name_prefix="rank_dataset-payloads-get"
                )
            return self._objects

    def _store_of(self, directory: str) -> Any:
        """The client of ``directory``, or the reason there is none (each of its objects fails with it)."""
        settings = self.settings
        try:
            return _stores.object_store(directory, settings.storage_options, settings.timeout)
        except Exception as exc:
            return exc

    # -- local files ------------------------------------------------------------------------------

    def _read_here(self, target: LocalTarget, ticket: int) -> Result | _Miss:
        """The file's bytes (or its error), read in this thread if its pages are in the page cache (a read
        that cannot wait for a disk); else the open file, for the pool."""
        opened = self._open_checked(target, ticket)
        if isinstance(opened, PayloadError):
            return opened, 0
        fd, size = opened
        if _NOWAIT is None or size > _HERE_MAX:
            return _Miss(fd, size)
        if size:
            # The last byte read without waiting for a disk says the file is in the page cache (a file is read,
            # and evicted, whole); EAGAIN says it is not, EOPNOTSUPP that its file system cannot tell.
            try:
                os.preadv(fd, [_probe], size - 1, _NOWAIT)
            except OSError:
                return _Miss(fd, size)
        return self._read_open(target, ticket, fd, size)  # read now, or once its turn and room come

    def _open_run(self, pending: list[Any], k: int) -> _Opened | None:
        """Open ``pending[k]`` and the batch's local files right after it under the same root (up to
        :data:`_RUN`) in one native call (:func:`~rank_dataset.core.native.open_files`); None where it
        cannot (then each is opened by :meth:`_open_checked`)."""
        global _native_open
        if not _native_open:
            return None
        root = pending[k].root
        rels = []
        for j in range(k, min(k + _RUN, len(pending))):
            target = pending[j]
            if type(target) is not LocalTarget or target.root != root:
                break
            rels.append(target.rel)
        at = self._root_fd(root)
        try:
            out = native.open_files(at, rels, _HERE_MAX if _NOWAIT is not None else -1)
        except UnicodeEncodeError:  # a name the file system cannot spell: the walk's turn, file by file
            return None
        if out is None:
            _native_open = False
            return None
        _count("native", len(rels))
        return _Opened(k, len(rels), out)

    def _take_opened(self, target: LocalTarget, ticket: int, run: _Opened, k: int) -> Result | _Miss:
        """As :meth:`_read_here`, for ``pending[k]`` opened in ``run``. A file the opener refused for another
        reason than its absence or its type (a symlink, say) is opened again by :meth:`_read_here`, whose walk
        reads it or names why not."""
        out, n, i = run.out, run.n, k - run.start
        fd, size, status = out[i], out[n + i], out[2 * n + i]
        out[i] = -1  # taken: closed below (or by the pool)
        if status == native.OPEN_HIT:
            return self._read_open(target, ticket, fd, size)
        if status == native.OPEN_MISS:
            return _Miss(fd, size)
        if status == native.OPEN_NOT_FILE:
            self.budget.skip(ticket)
            return PayloadError(target.path, "not a regular file"), 0
        if status == -errno.ENOENT:
            self.budget.skip(ticket)
            return PayloadError(target.path, "no such file"), 0
        return self._read_here(target, ticket)

    def _to_pool(
        self, pending: list[Any], tickets: range, k: int, miss: _Miss, run: _Opened | None = None
    ) -> concurrent.futures.Future[Result]:
        """Give the pool ``pending[k]`` (open: ``miss``) and the batch's local files after it (their reads
        then overlap; those opened ahead in ``run`` handed over open); ``pending[k]``'s future."""
        pool = self._pool_of()
        first = pending[k] = pool.submit(self._read_file, pending[k], tickets[k], miss.fd, miss.size)
        out, n, start = (run.out, run.n, run.start) if run is not None else (None, 0, 0)
        for j in range(k + 1, len(pending)):
            if isinstance(pending[j], LocalTarget):
                i = j - start
                if out is not None and 0 <= i < n and out[i] >= 0:
                    fd, out[i] = out[i], -1
                    pending[j] = pool.submit(self._read_file, pending[j], tickets[j], fd, out[n + i])
                else:
                    pending[j] = pool.submit(self._read_file, pending[j], tickets[j])
        return first

    def _read_file(self, target: LocalTarget, ticket: int, fd: int = -1, size: int = 0) -> Result:
        """The file's bytes or its error (never raises), in a thread of the pool."""
        _count("pooled")
        if fd < 0:
            opened = self._open_checked(target, ticket)
            if isinstance(opened, PayloadError):
                return opened, 0
            fd, size = opened
        return self._read_open(target, ticket, fd, size)

    def _open_checked(self, target: LocalTarget, ticket: int) -> tuple[int, int] | PayloadError:
        """The file's descriptor, open for reading, and its size; or its error (the file closed, its ticket
        ended). Never through a symlink that leaves its root: walked from the root's directory (opened once a
        process) one component at a time with ``O_NOFOLLOW`` (no symlink followed, no path looked up twice);
        where that meets a symlink, the real path is checked to be under the root and opened with
        ``O_NOFOLLOW`` (its last component cannot be swapped for a link after the check). ``O_NONBLOCK``: a
        FIFO named by a line does not block. Must be a regular file."""
        fd, ok = -1, False
        try:
            if _WALK:
                at = self._root_fd(target.root)
                parts = target.rel.split(os.sep)
                if "" in parts or "." in parts:  # "a//b", "./a": the same file
                    parts = [part for part in parts if part and part != "."] or ["."]
                opened = -1
                try:
                    for part in parts[:-1]:
                        at = os.open(part, _DIR_FLAGS, dir_fd=at)
                        if opened >= 0:
                            os.close(opened)
                        opened = at
                    fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=at)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # not a symlink met on the way
                        raise
                finally:
                    if opened >= 0:
                        os.close(opened)
            if fd < 0:
                real = os.path.realpath(target.path)
                if not real.startswith(target.root + os.sep):
                    raise PayloadError(target.path, "it resolves outside the root (a symlink out of it)")
                fd = os.open(real, _FILE_FLAGS)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                ok = True  # the descriptor is the caller's now
                return fd, st.st_size
            error = PayloadError(target.path, "not a regular file")
        except PayloadError as exc:
            error = exc
        except OSError as exc:
            error = _file_error(target.path, exc)
        finally:
            if not ok:  # failed, or interrupted: the file closed, the ticket ended
                if fd >= 0:
                    os.close(fd)
                self.budget.skip(ticket)
        return error

    def _root_fd(self, root: str) -> int:
        """A descriptor of the directory ``root``, opened on this process's first read under it."""
        fd = self._roots.get(root)  # opened already: no lock taken
        if fd is not None:
            return fd
        with self._lock:
            fd = self._roots.get(root)
            if fd is None:
                fd = self._roots[root] = os.open(root, _DIR_FLAGS)
            return fd

    def _read_open(self, target: LocalTarget, ticket: int, fd: int, size: int) -> Result:
        """The open file's bytes once its turn and room under ``max_bytes`` come, one ``pread`` of its size
        into the ``bytes`` handed out; the file closed."""
        reserved = 0
        try:
            budget = self.budget
            if not budget.try_reserve(ticket, size) and not budget.reserve(
                ticket, size, time.monotonic() + self.settings.timeout
            ):
                return PayloadError(target.path, _budget_timeout(self.settings)), 0
            reserved = size
            _count("files")
            data = os.pread(fd, size, 0) if size < (1 << 31) else _read_all(fd, size)
            if len(data) != size:
                return PayloadError(target.path, f"read {len(data):,} of its {size:,} bytes"), reserved
            return data, reserved
        except OSError as exc:
            return _file_error(target.path, exc), reserved
        finally:
            os.close(fd)

    # -- objects ----------------------------------------------------------------------------------

    def _get(self, target: ObjectTarget, ticket: int, store: Any) -> Result:
        """The object's bytes or its error (never raises), in a thread of the objects' pool."""
        try:
            return self._get_one(target, ticket, store)
        finally:
            with self._lock:
                self._active -= 1
                if not self._active:  # the last request of the batch (or batches) ended: spare slots go back
                    node_slots(self.settings.slots_dir, self.settings.node_max_in_flight).trim()

    def _get_one(self, target: ObjectTarget, ticket: int, store: Any) -> Result:
        reserved = [0, ticket]  # bytes reserved, and the ticket while it has not reserved (-1 after)
        try:
            if isinstance(store, Exception):
                raise store
            return self._get_body(target, store, reserved, time.monotonic() + self.settings.timeout)
        except Exception as exc:  # an error of obstore's
            error = _object_error(target.url, exc, self.settings.timeout)
        finally:
            if reserved[1] >= 0:
                self.budget.skip(reserved[1])
        return error, reserved[0]

    def _get_body(self, target: ObjectTarget, store: Any, reserved: list[int], deadline: float) -> Result:
        import obstore

        settings = self.settings
        slots = node_slots(settings.slots_dir, settings.node_max_in_flight)
        attempt = 0
        while True:
            slot = slots.acquire(deadline)
            if slot is None:
                raise PayloadError(target.url, _slots_timeout(settings))
            response: Any = None
            body: Any = None
            broke: BaseException | None = None
            size = 0
            try:
                _count("objects")
                try:  # 5xx, timeouts and connections dropped before the reply: retried by the client itself
                    response = obstore.get(store, target.name)
                except Exception as exc:
                    if _permanent(exc):
                        raise
                    broke = exc  # a reply the client could not read: asked again below
                if response is not None:
                    start, stop = response.range
                    size = stop - start
                    if reserved[1] >= 0:
                        if not self.budget.reserve(reserved[1], size, deadline):
                            reserved[1] = -1  # skipped by reserve
                            raise PayloadError(target.url, _budget_timeout(settings))
                        reserved[0], reserved[1] = size, -1
                    elif size > reserved[0]:
                        raise PayloadError(target.url, f"its size changed to {size:,} bytes between two asks")
                    try:
                        body = response.bytes()
                    except Exception as exc:  # the body broke off: asked again below
                        broke = exc
            finally:
                slots.release(slot, keep=True)
            if body is not None and len(body) == size:
                return body, reserved[0]  # copied into bytes as it is handed out
            attempt += 1
            pause = min(_BACKOFF[0] * 2**attempt, _BACKOFF[1]) * random.uniform(0.5, 1.0)
            if time.monotonic() + pause >= deadline:
                if body is None and response is None and broke is not None:
                    raise _object_error(target.url, broke, settings.timeout)
                short = f"the body ended {size - len(body):,} bytes short" if body is not None else ""
                why = short or _stores.status_of(broke or RuntimeError("no reply"))
                raise PayloadError(target.url, f"{why}, asked {attempt} times within timeout={settings.timeout:g} s")
            _count("again")
            time.sleep(pause)

    # -- a process forked from one that ran obstore ------------------------------------------------

    def _helper_if_forked(self) -> _Helper | None:
        if not _forked_with_obstore and _stores.forked_from_client() is None:
            return None
        if self._helper is None:
            self._helper = _Helper(self.settings)
        return self._helper

    def close(self) -> None:
        """End the pools and the helper of this process (each ends with it anyway)."""
        if os.getpid() != self.pid:
            return
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # its reads use the roots' descriptors, closed below
        if self._objects is not None:
            self._objects.shutdown(wait=False)
        if self._helper is not None:
            self._helper.close()
        for fd in self._roots.values():
            os.close(fd)
        self._roots.clear()
        self._pool = self._objects = self._helper = None


# Whether this process was forked from one that had imported obstore: that one may have run its runtime
# (through this library or any other code), which a forked child cannot run. Such a child reads objects
# through a helper; one forked from a process that never imported obstore makes its own client.
_forked_with_obstore = False


def _after_fork() -> None:
    global _forked_with_obstore
    _forked_with_obstore = _forked_with_obstore or "obstore" in sys.modules


os.register_at_fork(after_in_child=_after_fork)


def _count(key: str, n: int = 1) -> None:
    """``n`` more in ``COUNTS[key]``, from any thread (``+=`` on a dict's item can lose a concurrent one)."""
    with _COUNTS_LOCK:
        COUNTS[key] += n


def _read_all(fd: int, size: int) -> bytes:
    """A file of 2 GiB or more (one ``pread`` reads less), in pieces."""
    return b"".join(os.pread(fd, min(1 << 30, size - at), at) for at in range(0, size, 1 << 30))


def _slots_timeout(settings: ReadSettings) -> str:
    return (
        f"no free request slot of the node's node_max_in_flight={settings.node_max_in_flight} within "
        f"timeout={settings.timeout:g} s"
    )


def _budget_timeout(settings: ReadSettings) -> str:
    return (
        f"no room under max_bytes={settings.max_bytes:,} within timeout={settings.timeout:g} s "
        "(the payloads read before it were not taken)"
    )


def _file_error(path: str, exc: OSError) -> PayloadError:
    if isinstance(exc, FileNotFoundError):
        return PayloadError(path, "no such file")
    if isinstance(exc, PermissionError):
        return PayloadError(path, "permission denied")
    if exc.errno == errno.ELOOP:
        return PayloadError(path, "a symlink (its target was swapped after the check)")
    return PayloadError(path, f"{type(exc).__name__}: {exc.strerror or exc}")


def _permanent(exc: BaseException) -> bool:
    """Whether obstore's error says the request cannot succeed if asked again (missing, refused, invalid)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, PayloadError)):
        return True
    if _stores.credential_request(exc) is not None:  # no credentials anywhere: asking again finds none
        return True
    return type(exc).__name__ in (
        "NotFoundError", "PermissionDeniedError", "UnauthenticatedError", "PreconditionError",
        "NotSupportedError", "InvalidPathError", "AlreadyExistsError", "NotModifiedError",
    )  # fmt: skip


def _object_error(url: str, exc: BaseException, timeout: float) -> PayloadError:
    if isinstance(exc, PayloadError):
        return exc
    status = _stores.status_of(exc)
    if isinstance(exc, FileNotFoundError):
        return PayloadError(url, f"no such object ({status})")
    if isinstance(exc, PermissionError) or type(exc).__name__ in ("PermissionDeniedError", "UnauthenticatedError"):
        return PayloadError(url, f"access denied ({status})")
    denied = _stores.no_credentials(exc, timeout)
    if denied is not None:
        return PayloadError(url, denied)
    return PayloadError(url, f"the object store failed ({_stores.reason_of(exc)}{_stores.retried(exc, timeout)})")


# -- the helper of a forked process ------------------------------------------------------------------


class _Helper:
    """A process started with ``python -m rank_dataset.files.io.payloads`` (see the module), reading a
    batch's objects for this one: one pickled list of targets in, each payload (``bytes``, or a pickled
    error) back in order."""

    def __init__(self, settings: ReadSettings) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rank_dataset.files.io.payloads"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self._in = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self._out.send_bytes(pickle.dumps(settings))

    def read(self, targets: list[ObjectTarget]) -> Iterator[bytes | PayloadError]:
        if not targets:
            return
        self._out.send_bytes(pickle.dumps(targets))
        for _ in targets:
            kind = self._in.recv_bytes()
            raw = self._in.recv_bytes()  # the bytes as received: the one copy, in place of the client's
            yield raw if kind == b"D" else pickle.loads(raw)

    def close(self) -> None:
        self._out.close()
        self._in.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _serve() -> None:
    """The helper's loop: settings, then batches of targets, until the pipe closes."""
    stdin = Connection(os.dup(0), writable=False)
    stdout = Connection(os.dup(1), readable=False)
    try:
        settings = pickle.loads(stdin.recv_bytes())
        reader = PayloadReader(settings)
        while True:
            targets = pickle.loads(stdin.recv_bytes())
            for item in reader.read(targets):
                if isinstance(item, bytes):
                    stdout.send_bytes(b"D")
                    stdout.send_bytes(item)
                else:
                    stdout.send_bytes(b"E")
                    stdout.send_bytes(pickle.dumps(item))
    except (EOFError, BrokenPipeError, OSError):
        return


if __name__ == "__main__":
    _serve()
