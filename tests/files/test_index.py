from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset import MetaFile, build_index
from rank_dataset.files.index import _build as build_mod
from rank_dataset.files.index import _cachefile as cachefile_mod
from rank_dataset.files.index import cache as cache_mod
from rank_dataset.files.index import load as index_mod
from rank_dataset.files.index import scan as scan_mod
from rank_dataset.files.index.cache import CACHE_DIR_ENV
from rank_dataset.files.index.scan import Chunk
from rank_dataset.files.io import LocalFile, hash_ends
from tests_helpers import random_file, reference_index, start_together


def test_index_out_of_range_and_negative(write_meta) -> None:
    mf = MetaFile(write_meta(["a", "b", "c"]))
    assert mf[-1] == "c"
    with pytest.raises(IndexError, match="sample index 3 is out of range for 3 samples"):
        mf[3]
    with pytest.raises(IndexError):
        mf[-4]
    with pytest.raises(TypeError):
        mf["0"]  # type: ignore[index]


def test_many_files_are_one(write_meta) -> None:
    a, b, c = write_meta(["a0", "a1"]), write_meta(["", "  "], name="blank.txt"), write_meta(["c0", "c1", "c2"])
    with pytest.raises(ValueError, match=r"no samples in .*blank\.txt"):
        MetaFile(b)
    mf = MetaFile([a, b, c])
    assert [mf[i] for i in range(len(mf))] == ["a0", "a1", "c0", "c1", "c2"]
    assert mf.file_bounds.tolist() == [0, 2, 2, 5]
    assert mf.where(3).endswith(f"{c.name}:2")


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        MetaFile(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="path_or_paths is empty"):
        MetaFile([])
    with pytest.raises(TypeError, match="path_or_paths must be a path"):
        MetaFile(3)  # type: ignore[arg-type]


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok\n\nfine\nbad \xff here\n")
    mf = MetaFile(p)
    with pytest.raises(ValueError, match=r"bad\.txt:4: line is not valid UTF-8"):
        mf[2]


def test_cache_is_reused_and_rebuilt_when_stale(write_meta, tmp_path: Path) -> None:
    p = write_meta(["a", "b"])
    MetaFile(p)
    caches = list((tmp_path / "cache").iterdir())
    assert len(caches) == 1
    first = caches[0].stat().st_mtime_ns
    assert len(MetaFile(p)) == 2
    assert caches[0].stat().st_mtime_ns == first  # reused, not rewritten
    p.write_text("a\nb\nc\n")
    os.utime(p, ns=(first + 10**9, first + 10**9))
    assert len(MetaFile(p)) == 3  # stale: size and mtime changed
    assert MetaFile(p)[2] == "c"


def test_cache_beside_file_else_user_cache(write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    p = write_meta(["a", "b"])
    MetaFile(p)
    assert (p.parent / f".{p.name}.rdidx").exists()
    beside, user = cache_mod.cache_paths(p.resolve())
    assert beside == p.resolve().parent / f".{p.name}.rdidx"
    assert user.parent == tmp_path / "xdg" / "rank-dataset"


def test_unwritable_cache_location_falls_back(write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, who can write to read-only directories, so the preferred location is
    # made unwritable another way: a file stands where its directory would be.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setattr(
        index_mod, "cache_paths", lambda path: [blocker / "sub" / "x.rdidx", tmp_path / "fallback" / "x.rdidx"]
    )
    p = write_meta(["a", "b", "c"])
    assert len(MetaFile(p)) == 3
    assert (tmp_path / "fallback" / "x.rdidx").exists()


def test_concurrent_builders_all_succeed(write_meta, tmp_path: Path) -> None:
    p = write_meta(n=200_000)
    code = (
        "import logging, sys; from rank_dataset import MetaFile; "
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s'); "
        "m = MetaFile(sys.argv[1]); print(len(m), m[len(m) - 1])"
    )
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache")}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    done = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, [err for _, err in done]
    outs = [out for out, _ in done]
    assert len(set(outs)) == 1 and outs[0].split()[0] == b"200000"
    # One of the four built it (each build is a record of the logger rank_dataset.index); the others loaded it.
    builds = [line for _, err in done for line in err.decode().splitlines() if line.startswith("rank_dataset.index ")]
    assert len(builds) == 1 and f"built the index of {p.resolve()} (200000 lines) into" in builds[0], builds
    assert not list((tmp_path / "cache").glob("*.tmp"))
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert len(MetaFile(p)) == 200_000


def test_corrupt_cache_is_rebuilt(write_meta, tmp_path: Path) -> None:
    p = write_meta(["a", "b"])
    MetaFile(p)
    (cache,) = (tmp_path / "cache").iterdir()
    cache.write_bytes(b"garbage")
    assert [MetaFile(p)[i] for i in range(2)] == ["a", "b"]


LINES = [f"{i}.jpg {i}" for i in range(1000)]


def the_cache(tmp_path: Path) -> Path:
    (cache,) = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".rdidx"]
    return cache


def test_zeroed_cache_is_rebuilt_not_trusted(write_meta, tmp_path: Path) -> None:
    # A crash could leave a cache renamed into place with its data never written: a valid header
    # and zeroed spans, which gave '' for every sample.
    p = write_meta(LINES)
    MetaFile(p)
    cache = the_cache(tmp_path)
    raw = bytearray(cache.read_bytes())
    raw[cachefile_mod.DATA_OFFSET :] = bytes(len(raw) - cachefile_mod.DATA_OFFSET)
    cache.write_bytes(raw)
    mf = MetaFile(p)
    assert [mf[i] for i in range(1000)] == LINES
    assert the_cache(tmp_path).read_bytes()[cachefile_mod.DATA_OFFSET :] != bytes(len(raw) - cachefile_mod.DATA_OFFSET)


def test_cache_key_holds_inode_ctime_device_and_content(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    index = index_mod.load_index(p.resolve())
    st = p.stat()
    assert index.key == index_mod.FileKey(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    header = the_cache(tmp_path).read_bytes()[: cachefile_mod.HEADER.size]
    magic, size, digest, device, count, _, sample, *_ = cachefile_mod.HEADER.unpack(header)
    assert (magic, size, digest, device, count) == (
        b"RDIDX\x00\x00\x06",
        st.st_size,
        index.key.digest(),
        st.st_dev,
        1000,
    )
    assert len(sample) == 16
    fields = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    for i in range(1, 4):  # the mtime, the ctime and the inode each enter the digest; the device does not
        other = [*fields, st.st_dev]
        other[i] += 1
        assert index_mod.FileKey(*other).digest() != digest
    assert index_mod.FileKey(*fields, st.st_dev + 1).digest() == digest


def _record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each sync, rename and seal written, in order."""
    events: list[str] = []
    real_fsync, real_fdatasync, real_replace, real_pwrite = os.fsync, os.fdatasync, os.replace, os.pwrite
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append("fdatasync"), real_fdatasync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if data == cache_mod.SEAL:
            events.append("seal")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return events


def _join_seals() -> None:
    for thread in threading.enumerate():
        if thread.name == "rank-dataset-index-seal":
            thread.join()


def _sealed(cache: Path) -> bool:
    return cache.read_bytes()[cachefile_mod.SEAL_AT :][: len(cache_mod.SEAL)] == cache_mod.SEAL


def test_cache_is_sealed_once_synced(write_meta, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Renamed into place, then: its data synced, the seal written and synced, the directory synced.
    events = _record_syncs(monkeypatch)
    MetaFile(write_meta(LINES))
    assert events == ["replace", "fdatasync", "seal", "fdatasync", "fsync"]
    assert _sealed(the_cache(tmp_path))


def test_a_large_cache_is_synced_while_it_is_built(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every SYNC_EVERY bytes written, a sync in the background; the seal's syncs still come.
    events = _record_syncs(monkeypatch)
    monkeypatch.setattr(cache_mod, "SYNC_EVERY", 1000)
    monkeypatch.setattr(build_mod, "scan_map", functools.partial(scan_mod.scan_map, chunk_size=4096))
    mf = MetaFile(write_meta(LINES))
    seal = events.index("seal")  # (a sync while it was written may come after the rename)
    assert events[seal - 1 :] == ["fdatasync", "seal", "fdatasync", "fsync"] and "replace" in events[:seal]
    assert events.count("fdatasync") >= 3
    assert [mf[i] for i in range(len(LINES))] == LINES


def test_an_unsealed_cache_is_rebuilt_not_trusted(write_meta, tmp_path: Path) -> None:
    # A crash after the rename, before the seal reached the disk: the cache may be torn.
    p = write_meta(LINES)
    MetaFile(p)
    cache = the_cache(tmp_path)
    with open(cache, "r+b") as f:
        f.seek(cachefile_mod.SEAL_AT)
        f.write(bytes(len(cache_mod.SEAL)))
    before = cache.stat().st_ino
    mf = MetaFile(p)
    assert the_cache(tmp_path).stat().st_ino != before and _sealed(the_cache(tmp_path))
    assert [mf[i] for i in range(len(LINES))] == LINES


def test_a_cache_of_the_format_before_is_rebuilt(write_meta, tmp_path: Path) -> None:
    # Format 3 had the same layout, synced before its rename, and no seal.
    p = write_meta(LINES)
    MetaFile(p)
    cache = the_cache(tmp_path)
    raw = bytearray(cache.read_bytes())
    raw[:8], raw[cachefile_mod.SEAL_AT : cachefile_mod.DATA_OFFSET] = b"RDIDX\x00\x00\x03", bytes(32)
    cache.write_bytes(raw)
    before = cache.stat().st_ino
    mf = MetaFile(p)
    assert the_cache(tmp_path).read_bytes()[:8] == cachefile_mod._MAGIC and the_cache(tmp_path).stat().st_ino != before
    assert [mf[i] for i in range(len(LINES))] == LINES


@dataclass
class _Sealing:
    """A cache just built by ``mf`` from ``path``, whose seal waits until ``release`` is set."""

    path: Path
    mf: MetaFile
    cache: Path
    inode: int
    release: threading.Event


@pytest.fixture
def sealing(write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Sealing]:
    monkeypatch.setattr(cache_mod, "SEAL_APART", 1)  # every cache is sealed in the background
    real_fdatasync, release = os.fdatasync, threading.Event()

    def held_back(fd: int) -> None:
        if threading.current_thread().name == "rank-dataset-index-seal":
            release.wait(60)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", held_back)
    try:
        p = write_meta(LINES)
        mf = MetaFile(p)
        cache = the_cache(tmp_path)
        yield _Sealing(p, mf, cache, cache.stat().st_ino, release)
    finally:
        release.set()
        _join_seals()


def test_a_large_cache_is_used_while_it_is_sealed(sealing: _Sealing) -> None:
    # The builder reads its samples before the cache is sealed; another process that wants the
    # index waits for the seal, then loads the cache (it does not rebuild it).
    mf = sealing.mf
    assert not _sealed(sealing.cache)
    assert [mf[i] for i in range(len(LINES))] == LINES
    assert mf.read(np.arange(len(LINES))[::-1]).texts(range(len(LINES))) == LINES[::-1]
    code = f"from rank_dataset import MetaFile; print(len(MetaFile({str(sealing.path)!r})))"
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(1.0)  # waiting for the builder's lock
    finally:
        sealing.release.set()
    out, _ = other.communicate(timeout=60)
    _join_seals()
    assert out.strip() == str(len(LINES)) and other.returncode == 0
    assert _sealed(sealing.cache) and sealing.cache.stat().st_ino == sealing.inode


def test_a_load_in_the_builders_process_waits_for_its_seal(sealing: _Sealing) -> None:
    # The builder's thread took the lock that the seal's thread holds: loading the index again in
    # it waits for the seal, then loads the sealed cache (neither a deadlock nor a rebuild).
    timer = threading.Timer(0.3, sealing.release.set)
    timer.start()
    again = MetaFile(sealing.path)
    timer.join()
    _join_seals()
    assert _sealed(sealing.cache) and sealing.cache.stat().st_ino == sealing.inode
    assert [again[i] for i in range(len(LINES))] == LINES


def _length_of(path: str, out: Any) -> None:
    try:
        out.put(len(MetaFile(path)))
    except Exception as exc:
        out.put(repr(exc))


def test_a_process_forked_while_a_cache_is_sealed_waits_for_it(sealing: _Sealing) -> None:
    # A DataLoader worker forked right after the build: its load of the index waits for the
    # parent's seal (the lock the parent's seal holds), then loads the sealed cache.
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    child = ctx.Process(target=_length_of, args=(str(sealing.path), out))
    child.start()
    child.join(1.0)
    alive = child.is_alive()  # waiting for the seal
    sealing.release.set()
    child.join(60)
    assert alive
    assert child.exitcode == 0 and out.get() == len(LINES)
    assert _sealed(sealing.cache) and sealing.cache.stat().st_ino == sealing.inode


def _rebuilt_inode(path: str, bad: index_mod.Index, release: threading.Event, out: Any) -> None:
    release.set()  # (this process's copy: its own seal goes ahead)
    index = index_mod.load_index(Path(path), distrust=bad)
    assert index.cache is not None
    out.put(index.cache.stat().st_ino)


def test_a_rebuild_asked_for_while_a_cache_is_sealed_rebuilds_it(sealing: _Sealing) -> None:
    # A process that found the unsealed cache wrong distrusts it: the seal (which changes its mtime)
    # is not another process writing it anew.
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    bad = sealing.mf._files[0].index
    assert bad.cache_inode == sealing.inode
    child = ctx.Process(target=_rebuilt_inode, args=(str(sealing.path.resolve()), bad, sealing.release, out))
    child.start()
    child.join(0.5)
    sealing.release.set()
    child.join(60)
    assert child.exitcode == 0 and out.get() != sealing.inode


def test_a_seal_outlives_a_builder_in_a_daemon_thread(write_meta, tmp_path: Path) -> None:
    # The interpreter waits for the seal even when the thread that built the cache was a daemon.
    p = write_meta(LINES)
    code = f"""
import os, threading, time
from rank_dataset import MetaFile
from rank_dataset.files.index import cache as _cache
_cache.SEAL_APART = 1
real = os.fdatasync
def slow(fd):
    if threading.current_thread().name == "rank-dataset-index-seal":
        time.sleep(0.5)
    real(fd)
os.fdatasync = slow
builder = threading.Thread(target=MetaFile, args=({str(p)!r},), daemon=True)
builder.start()
builder.join()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert _sealed(the_cache(tmp_path))
    assert not list((tmp_path / "cache").glob("*.lock"))


def test_a_cache_is_sealed_in_place_when_no_thread_can_start(
    write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_mod, "SEAL_APART", 1)
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "rank-dataset-index-seal":
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    p = write_meta(LINES)
    mf = MetaFile(p)
    assert _sealed(the_cache(tmp_path)) and not cache_mod.SEALING
    assert not list((tmp_path / "cache").glob("*.lock"))  # the lock was let go
    assert [mf[i] for i in (0, 999)] == [LINES[0], LINES[999]]


def _sealing_state(out: Any) -> None:
    out.put((cache_mod.SEALING_LOCK.locked(), dict(cache_mod.SEALING)))


def test_a_child_forked_while_the_seal_registry_is_locked_gets_it_unlocked() -> None:
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    with cache_mod.SEALING_LOCK:
        child = ctx.Process(target=_sealing_state, args=(out,))
        child.start()
    child.join(60)
    assert child.exitcode == 0 and out.get() == (False, {})


def _seal_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rank_dataset.files.index.cache" and r.levelno == logging.WARNING
    ]


def test_a_large_cache_whose_seal_fails_is_rebuilt(
    write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Its data may not be on disk: it stays unsealed, and the next load rebuilds it. The builder's
    # own reads (its bytes are in the page cache, and checked) are right. The seal's thread says so.
    monkeypatch.setattr(cache_mod, "SEAL_APART", 1)
    real_fdatasync = os.fdatasync

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    p = write_meta(LINES)
    with caplog.at_level(logging.WARNING, logger="rank_dataset.files.index.cache"):
        mf = MetaFile(p)
        _join_seals()
    cache = the_cache(tmp_path)
    assert not _sealed(cache)
    assert _seal_warnings(caplog) == [
        f"could not seal the index cache {cache}: the sync of its data failed: [Errno 5] Input/output error; "
        "it is not trusted, and is rebuilt by the next load"
    ]
    assert [mf[i] for i in (0, 999)] == [LINES[0], LINES[999]]
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    before = cache.stat().st_ino
    assert [MetaFile(p)[i] for i in (0, 999)] == [LINES[0], LINES[999]]
    assert the_cache(tmp_path).stat().st_ino != before and _sealed(the_cache(tmp_path))


def test_the_sync_thread_starts_only_when_a_sync_is_due(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    # A small cache (a file of a mix of thousands) costs no thread; a large one syncs in one.
    started: list[str] = []

    class Recorded(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(threading, "Thread", Recorded)
    MetaFile(write_meta(LINES))
    assert "rank-dataset-index-sync" not in started
    monkeypatch.setattr(cache_mod, "SYNC_EVERY", 1000)
    MetaFile(write_meta(LINES))
    assert started.count("rank-dataset-index-sync") == 1


def test_a_cache_whose_sync_fails_is_not_used(
    write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A sync that failed may have lost data that a later one would not report: the cache is dropped,
    # and the index is kept in memory. Each location tried is named in a warning.
    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    monkeypatch.setattr(cache_mod, "SYNC_EVERY", 1000)
    p = write_meta(LINES)
    with caplog.at_level(logging.WARNING, logger="rank_dataset.files.index.cache"):
        mf = MetaFile(p)
    warnings = _seal_warnings(caplog)
    caches = cache_mod.cache_paths(p.resolve())
    assert len(warnings) == len(caches) >= 1
    for cache, warning in zip(caches, warnings):
        assert warning.startswith(f"could not seal the index cache {cache}: a sync of its data while it was written")
        assert "[Errno 5] Input/output error" in warning
    assert mf._files[0].index.cache is None and mf._files[0].index.memory is not None
    assert [mf[i] for i in (0, 999)] == [LINES[0], LINES[999]]
    assert not list((tmp_path / "cache").iterdir())


def test_a_seal_refused_by_the_kernel_is_logged(write_meta, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # No fault put into os: the descriptor the seal syncs is made a pipe's, which the kernel will not
    # sync (EINVAL), as a file system whose syncs fail would. The cache stays unsealed, and a warning
    # from the module's logger names it and the error.
    p = write_meta(LINES)
    cache = tmp_path / "cache" / "refused.rdidx"
    with LocalFile(p) as source:
        written = build_mod.write_cache(cache, source, hash_ends(source))
    assert written is not None
    seal = written[1]
    r, w = os.pipe()
    os.dup2(r, seal.file.fileno())
    os.close(r)
    os.close(w)
    with caplog.at_level(logging.WARNING, logger="rank_dataset.files.index.cache"):
        assert seal() is False
    assert _seal_warnings(caplog) == [
        f"could not seal the index cache {cache}: the sync of its data failed: [Errno 22] Invalid argument; "
        "it is not trusted, and is rebuilt by the next load"
    ]
    assert not _sealed(cache)


def test_abandoned_tmp_files_are_removed(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    cache_dir = tmp_path / "cache"
    name = cache_mod.cache_paths(p.resolve())[0].name
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is not alive
    host = socket.gethostname()
    old = 1_000_000_000  # 2001: long untouched
    tmps = {
        "dead builder": f"{name}.{dead.pid}@{host}.abc.tmp",
        "live builder": f"{name}.{os.getpid()}@{host}.def.tmp",
        "other host, old": f"{name}.{os.getpid()}@other-host.example.ghi.tmp",
        "other host, recent": f"{name}.12@other-host.example.jkl.tmp",
        "dead, just written": f"{name}.{dead.pid}@{host}.mno.tmp",
        "older version, old": f"{name}xyz123.tmp",
        "another file's": f"x{name}.{dead.pid}@{host}.pqr.tmp",
    }
    cache_dir.mkdir()
    for label, tmp in tmps.items():
        (cache_dir / tmp).write_bytes(b"\0" * 1000)
        if label not in ("other host, recent", "dead, just written"):
            os.utime(cache_dir / tmp, (old, old))
    MetaFile(p)
    left = {label for label, tmp in tmps.items() if (cache_dir / tmp).exists()}
    # A builder on this host whose pid is gone left its file for good, however recent: removed at once.
    assert left == {"live builder", "other host, recent", "another file's"}


_MEASURED_LOAD = """
import json, resource, sys
from pathlib import Path
import psutil
from rank_dataset.files.index.load import load_index
me = psutil.Process()
bad = load_index(Path(sys.argv[1])) if sys.argv[2] == "1" else None  # the cache this process finds wrong
print("ready", flush=True)
sys.stdin.readline()  # go
reads, usage = me.io_counters().read_chars, resource.getrusage(resource.RUSAGE_SELF)
index = load_index(Path(sys.argv[1]), distrust=bad)
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
print(json.dumps({"reads": me.io_counters().read_chars - reads, "cpu": cpu, "count": index.count}), flush=True)
"""


def _measured_loads(path: Path, processes: int, *, rebuild: bool = False) -> list[dict[str, float]]:
    """Load the index of ``path`` in ``processes`` processes started at once (with ``rebuild``, each
    distrusting the cache it loaded before): what each read and spent."""
    argv = [sys.executable, "-c", _MEASURED_LOAD, str(path), str(int(rebuild))]
    return [json.loads(out) for out in start_together(argv, processes)]


def test_a_cache_found_wrong_after_another_process_rebuilt_it_is_loaded_not_rebuilt(write_meta) -> None:
    # A rank slower to find the cache wrong than another was to rebuild it loads the new one.
    p = write_meta(LINES)
    bad = index_mod.load_index(p)
    assert bad.cache is not None and bad.cache_inode == bad.cache.stat().st_ino
    rebuilt = index_mod.load_index(p, distrust=bad)
    assert rebuilt.cache == bad.cache and rebuilt.cache_inode != bad.cache_inode
    assert rebuilt.cache_inode == bad.cache.stat().st_ino
    late = index_mod.load_index(p, distrust=bad)
    assert late.cache_inode == rebuilt.cache_inode == bad.cache.stat().st_ino
    again = index_mod.load_index(p, distrust=late)  # the new one found wrong in turn: rebuilt
    assert again.cache_inode != late.cache_inode  # (it may be the first one's: its inode was freed)
    assert [MetaFile(p)[i] for i in range(len(LINES))] == LINES


@pytest.mark.slow  # several processes indexing one file at once
@pytest.mark.parametrize("rebuild", [False, True])
def test_processes_indexing_one_file_at_once_read_it_about_once(write_meta, tmp_path: Path, rebuild: bool) -> None:
    # The 8 local ranks of a node opening a new file at job start (or all finding its cache bad).
    p = write_meta(n=600_000)
    size = p.stat().st_size
    (alone,) = _measured_loads(write_meta(p.read_text().splitlines(), name="copy.txt"), 1)
    if rebuild:
        MetaFile(p)
    runs = _measured_loads(p, 8, rebuild=rebuild)
    assert {run["count"] for run in runs} == {alone["count"]} == {600_000}
    assert alone["reads"] >= size
    # Each process reads the file's ends and the cache's ends (about 0.4 MiB); one reads the file.
    total_reads = sum(run["reads"] for run in runs)
    assert total_reads <= alone["reads"] + 8 * (1 << 20), (total_reads, size)
    total_cpu = sum(run["cpu"] for run in runs)
    # The others sleep while one builds (each spends 0.03-0.05 s opening the file and the cache): a
    # busy wait would spend about the build's time in each of them.
    assert total_cpu <= 2 * alone["cpu"] + 8 * 0.06, (total_cpu, alone["cpu"])
    assert sorted(x.suffix for x in (tmp_path / "cache").iterdir()) == [".rdidx", ".rdidx"]  # no lock, no tmp


def test_an_index_of_the_format_before_is_rebuilt_not_misread(write_meta, tmp_path: Path) -> None:
    # The format before: 16 bytes a sample (two int64) after the same 128-byte header, version 2.
    p = write_meta(LINES)
    data = p.read_bytes()
    st = p.stat()
    with LocalFile(p) as source:
        sample = hash_ends(source)
    spans = build_index(p)
    old = struct.pack("<8sqqqQQqq16s", b"RDIDX\x00\x00\x02", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                      st.st_dev, len(spans), 1, sample)  # fmt: skip
    cache = cache_mod.cache_paths(p.resolve())[0]
    cache.parent.mkdir(parents=True)
    cache.write_bytes(old.ljust(cachefile_mod.DATA_OFFSET, b"\0") + spans.astype("<i8").tobytes())
    mf = MetaFile(p)
    assert [mf[i] for i in range(len(mf))] == LINES
    assert cache.read_bytes()[:8] == b"RDIDX\x00\x00\x06"
    assert cache.stat().st_size == cachefile_mod.DATA_OFFSET + 8 * len(LINES) + 16  # entries, one mark
    assert mf.read(np.arange(len(LINES))[::-1]).texts(range(len(LINES))) == LINES[::-1]
    assert data == p.read_bytes()


@pytest.mark.parametrize("size", [1, 100, 5000, (1 << 32) + 7, (1 << 40) + 3])
def test_entries_hold_start_and_length_in_8_bytes(size: int) -> None:
    # A file of `size` bytes: starts up to `size`, lengths up to `size`; what does not fit in the
    # length field (only past 4 GiB) is a long line, kept in its table.
    rng = np.random.default_rng(size)
    starts = np.sort(rng.integers(0, size, 1000))
    lengths = np.minimum(rng.integers(1, size + 1, 1000), size - starts).clip(1)
    lengths[:3] = [1, size - starts[1], max(1, size // 2)]
    chunk = Chunk(0, size, starts, lengths, True, 0, np.empty((0, 2), np.int64))
    part = build_mod._encoder(size)(chunk)
    assert part.entries.dtype == np.dtype("<u8")
    got_starts, got_lengths = index_mod.decode(part.entries, np.arange(1000), size, part.longs)
    assert got_starts.tolist() == starts.tolist() and got_lengths.tolist() == lengths.tolist()
    assert (size < 1 << 32) == (len(part.longs) == 0)
    assert index_mod.length_bits(size) + size.bit_length() == 64


def test_each_build_is_one_record_of_the_index_logger(
    write_meta, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = write_meta(LINES)
    with caplog.at_level(logging.INFO, logger="rank_dataset.index"):
        MetaFile(p)
        MetaFile(p)  # from the cache: no build
        cache = cache_mod.cache_paths(p.resolve())[0]
        assert [r.args for r in caplog.records if r.name == "rank_dataset.index"] == [(p.resolve(), len(LINES), cache)]
        cache.unlink()
        cache.mkdir()  # no cache can be written: built in memory, and said so
        MetaFile(p)
    assert [r.args for r in caplog.records if r.name == "rank_dataset.index"][1:] == [(p.resolve(), len(LINES), None)]


def test_a_cache_path_that_is_a_directory_means_an_index_in_memory(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    cache = cache_mod.cache_paths(p.resolve())[0]
    cache.mkdir(parents=True)  # hostile, or a mistake: where the cache would go is a directory
    mf = MetaFile(p)
    assert mf._files[0].index.cache is None and mf._files[0].index.memory is not None
    assert [mf[i] for i in (0, 999)] == [LINES[0], LINES[999]]
    assert mf.read(np.arange(1000)).texts(range(1000)) == LINES
    assert cache.is_dir() and not list(cache.iterdir())


# A builder that says, from inside its build (its first chunk encoded: it holds the lock and writes
# its temporary file), that it is there, and waits to be killed.
_BUILDER_STOPPED_MID_BUILD = """
import os, pathlib, sys, time
import rank_dataset.files.index._build as build
import rank_dataset.files.index.load as index

encoder = build._encoder

def stopping(size):
    encode = encoder(size)

    def first(chunk):
        part = encode(chunk)
        os.write(1, b"mid-build\\n")  # one write a line: the encoding threads may each get here
        time.sleep(600)  # killed here
        return part

    return first

build._encoder = stopping
index.load_index(pathlib.Path(sys.argv[1]))
print("finished", flush=True)
"""


def test_a_builder_killed_mid_build_leaves_nothing_in_the_way(write_meta, tmp_path: Path) -> None:
    p = write_meta(n=200_000)
    cache_dir = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", _BUILDER_STOPPED_MID_BUILD, str(p.resolve())], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "mid-build\n"
        # Its lock, and its file half written; no cache.
        assert sorted(x.suffix for x in cache_dir.iterdir()) == [".lock", ".tmp"]
    finally:
        child.kill()
        out, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL and "finished" not in out  # killed, and mid-build
    assert ".rdidx" not in [x.suffix for x in cache_dir.iterdir()]
    index = index_mod.load_index(p.resolve())  # not wedged by the lock; the dead builder's file removed
    assert index.count == 200_000 and index.cache is not None
    _join_seals()  # (the lock is held, and its file kept, until the cache is sealed)
    assert sorted(x.suffix for x in cache_dir.iterdir()) == [".rdidx"]


@pytest.mark.parametrize("field", ["size", "inode", "samples", "ascii flag", "hash"])
def test_one_entry_is_read_only_from_a_header_of_this_index(write_meta, tmp_path: Path, field: str) -> None:
    # mf[i] reads one entry and the cache's header: a header of another file (or another index of
    # this one) means the cache was replaced, and its entry is not used.
    lines = [f"{i}.jpg {i}" for i in range(5000)]
    p = write_meta(lines)
    mf = MetaFile(p)
    index = mf._files[0].index
    assert index_mod.read_entry(index, 4321)[1] == len(lines[4321])
    cache = the_cache(tmp_path)
    raw = bytearray(cache.read_bytes())
    at = {"size": 8, "inode": 32, "samples": 48, "ascii flag": 56, "hash": 64}[field]
    raw[at] ^= 1
    cache.write_bytes(raw)
    with pytest.raises(LookupError, match="replaced or damaged"):
        index_mod.read_entry(index, 4321)
    assert mf[4321] == lines[4321]  # the index loaded again (rebuilt): the sample still read
    rebuilt = bytearray(the_cache(tmp_path).read_bytes())
    rebuilt[40] ^= 1  # the device differs on every NFS client: not part of the match
    the_cache(tmp_path).write_bytes(rebuilt)
    assert index_mod.read_entry(mf._files[0].index, 4321)[1] == len(lines[4321])


@pytest.mark.parametrize("chunk_size", [3, 200, 1 << 20])
def test_a_cache_holds_the_format_whatever_the_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int
) -> None:
    # Written plainly: the entries (start << bits | length, little-endian), no long lines, then the
    # marks; counts, lines and offsets carried across the chunks of a scan.
    monkeypatch.setattr(scan_mod, "MARK", 97)
    monkeypatch.setattr(build_mod, "scan_map", functools.partial(scan_mod.scan_map, chunk_size=chunk_size))
    rng = np.random.default_rng(chunk_size)
    for trial in range(20):
        data = random_file(rng, 3000 if chunk_size < 64 else 40_000)
        p = tmp_path / f"m{trial}.txt"
        p.write_bytes(data)
        spans, marks = reference_index(data, 97)
        index = index_mod.load_index(p.resolve())
        assert index.cache is not None and (index.count, index.ascii) == (len(spans), data.isascii())
        body = index.cache.read_bytes()[cachefile_mod.DATA_OFFSET :]
        bits = 64 - max(1, len(data).bit_length())
        expect = b"".join(struct.pack("<Q", start << bits | (stop - start)) for start, stop in spans)
        expect += b"".join(struct.pack("<qq", offset, line) for offset, line in marks)
        assert body == expect, f"file {trial}: {data[:60]!r}"
