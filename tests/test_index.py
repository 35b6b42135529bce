from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rank_dataset import MetaFile
from rank_dataset import index as index_mod
from rank_dataset.index import CACHE_DIR_ENV


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
    beside, user = index_mod._cache_paths(p.resolve())
    assert beside == p.resolve().parent / f".{p.name}.rdidx"
    assert user.parent == tmp_path / "xdg" / "rank-dataset"


def test_unwritable_cache_location_falls_back(write_meta, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, who can write to read-only directories, so the preferred location is
    # made unwritable another way: a file stands where its directory would be.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setattr(
        index_mod, "_cache_paths", lambda path: [blocker / "sub" / "x.rdidx", tmp_path / "fallback" / "x.rdidx"]
    )
    p = write_meta(["a", "b", "c"])
    assert len(MetaFile(p)) == 3
    assert (tmp_path / "fallback" / "x.rdidx").exists()


def test_concurrent_builders_all_succeed(write_meta, tmp_path: Path) -> None:
    p = write_meta(n=200_000)
    code = "import sys; from rank_dataset import MetaFile; m = MetaFile(sys.argv[1]); print(len(m), m[len(m) - 1])"
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE, env=env) for _ in range(4)]
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4
    assert len(set(outs)) == 1 and outs[0].split()[0] == b"200000"
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
    raw[index_mod._DATA_OFFSET :] = bytes(len(raw) - index_mod._DATA_OFFSET)
    cache.write_bytes(raw)
    mf = MetaFile(p)
    assert [mf[i] for i in range(1000)] == LINES
    assert the_cache(tmp_path).read_bytes()[index_mod._DATA_OFFSET :] != bytes(len(raw) - index_mod._DATA_OFFSET)


def test_cache_key_holds_inode_ctime_device_and_content(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    index = index_mod.load_index(p.resolve())
    st = p.stat()
    assert index.key == index_mod.FileKey(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    header = the_cache(tmp_path).read_bytes()[: index_mod._HEADER.size]
    magic, size, mtime, ctime, inode, device, count, _, sample = index_mod._HEADER.unpack(header)
    assert (magic, size, mtime, ctime, inode, device, count) == (
        b"RDIDX\x00\x00\x02",
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_dev,
        1000,
    )
    assert len(sample) == 16


def test_cache_is_synced_before_it_is_renamed(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    MetaFile(write_meta(LINES))
    assert events == ["fsync", "replace", "fsync"]  # the data, the rename, then the directory


def test_abandoned_tmp_files_are_removed(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    cache_dir = tmp_path / "cache"
    name = index_mod._cache_paths(p.resolve())[0].name
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
    assert left == {"live builder", "other host, recent", "dead, just written", "another file's"}
