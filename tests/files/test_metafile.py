"""A loader never hands out a sample that is not a line of the file as it is now.

Each case rewrites, replaces, truncates or deletes a real file after it was indexed (or damages its
index cache), then reads: the answer is the right samples or a MetaFileChangedError naming the file,
never a fragment, an empty sample, or a process killed by SIGBUS.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from torch.utils.data import DataLoader

import rank_dataset
from rank_dataset import MetaFile, MetaFileChangedError, RankDataset
from rank_dataset.core.native import MARK
from rank_dataset.files.index import _entries as readers_mod
from rank_dataset.files.index import load as index_mod
from rank_dataset.files.io import pread as pread_mod
from rank_dataset.files.read import _gather as gather_mod
from rank_dataset.files.read import _visits as visits_mod
from rank_dataset.files.read.file import FileBytes
from tests_helpers import imagenet_line, rewrite

LINES = [f"{i}.jpg {i}" for i in range(1000)]


def the_cache(tmp_path: Path) -> Path:
    (cache,) = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".rdidx"]
    return cache


def test_changed_error_is_public_and_says_what_and_how(tmp_path: Path) -> None:
    assert "MetaFileChangedError" in rank_dataset.__all__
    # sorted as ruff's RUF022 (isort style) keeps it: constants, then classes, then functions, each A-Z
    names = rank_dataset.__all__
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    exc = MetaFileChangedError(tmp_path / "m.txt", "its size changed")
    assert isinstance(exc, ValueError)
    assert str(tmp_path / "m.txt") in str(exc) and "its size changed" in str(exc)
    assert "build the dataset again" in str(exc) and "restart the meta server" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.path == exc.path


@pytest.mark.slow  # a subprocess reading a file cut short
def test_shorter_file_is_an_error_not_sigbus(write_meta) -> None:
    # Through a shared map of the file this was death by SIGBUS; it runs in a child so that a
    # regression shows as a signal, not as a crashed test session.
    p = write_meta(n=200_000)
    code = """if True:
        import os, sys
        from rank_dataset import MetaFileChangedError, RankDataset
        ds = RankDataset(sys.argv[1], reload_cfg={"seed": 1}, rank=0, world_size=2)
        before = ds.indices.copy()
        with open(sys.argv[1], "r+b") as f:
            f.truncate(os.path.getsize(sys.argv[1]) // 3)
        try:
            ds.set_epoch(1)
        except MetaFileChangedError as exc:
            assert (ds.indices == before).all() and ds.spec.epoch == 0  # the dataset is as it was
            print(exc)
    """
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120)
    assert out.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert out.returncode == 0, out.stderr
    assert str(p) in out.stdout and "size changed from" in out.stdout


@pytest.mark.parametrize("how", ["longer lines", "shorter lines", "same size, mtime restored", "cp -p over it"])
def test_rewritten_file_is_an_error_then_reindexed(write_meta, tmp_path: Path, how: str) -> None:
    p = write_meta(LINES)
    mf = MetaFile(p)
    ds = RankDataset(p, rank=0, world_size=1)
    fingerprint = mf.fingerprint
    if how == "longer lines":
        new = [f"/{i}.jpg {i}" for i in range(1000)]  # the bug: '/150304.jpg 150304\nIM'-like fragments
        rewrite(p, new)
    elif how == "shorter lines":
        new = [f"{i}.jp {i}" for i in range(1000)]
        rewrite(p, new)
    elif how == "same size, mtime restored":
        new = [f"{i}.jpg {i}" for i in range(500)] + [f"{i}.JPG {i}" for i in range(500, 1000)]
        rewrite(p, new, keep_times=True)  # os.utime / touch -r: only the ctime tells
    else:
        new = [f"{i}.JPG {i}" for i in range(1000)]
        other = write_meta(new)
        os.utime(other, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns))
        shutil.copy2(other, p)  # cp -p: same inode, same size, same mtime
    for read in [lambda: mf.read(np.arange(1000)), lambda: mf[5], lambda: mf.raw(999), lambda: ds.set_epoch(1)]:
        with pytest.raises(MetaFileChangedError, match=rf"meta file {p} changed"):
            read()
    assert len(ds) == 1000 and ds.spec.epoch == 0
    # The fingerprint is of the files as indexed: taking it does not fail (in the ranks' agreement
    # check, one rank failing alone would leave the others waiting in the collective).
    assert mf.fingerprint == fingerprint
    fresh = MetaFile(p)  # the cache is not trusted for the new file: rebuilt
    assert [fresh[i] for i in range(len(fresh))] == new
    assert fresh.read(np.arange(999, -1, -7)).texts(range(143)) == new[::-1][::7]


def test_a_selection_of_files_is_checked_too(write_meta) -> None:
    a, b = write_meta(LINES), write_meta(LINES[:10])
    view = MetaFile([a, b]).select([1, 0])
    assert view.read(np.arange(1010)).texts([0, 10]) == [LINES[0], LINES[0]]
    rewrite(a, LINES[::-1])
    with pytest.raises(MetaFileChangedError, match=rf"meta file {a} changed"):
        view.read(np.arange(1010))


def test_what_changed_is_named(write_meta, tmp_path: Path) -> None:
    p = write_meta(LINES)
    mf = MetaFile(p)
    os.chmod(p, 0o600)  # metadata only: ctime
    with pytest.raises(MetaFileChangedError, match="ctime changed"):
        mf.read([0])
    mf = MetaFile(p)
    size = p.stat().st_size
    with open(p, "ab") as f:
        f.write(b"more 1\n")
    with pytest.raises(MetaFileChangedError, match=rf"size changed from {size:,} to {size + 7:,} bytes"):
        mf.read([0])
    mf = MetaFile(p)
    moved = tmp_path / "moved.txt"
    p.rename(moved)
    with pytest.raises(MetaFileChangedError, match="deleted or moved"):
        mf.read([0])
    shutil.copy(moved, p)
    with pytest.raises(MetaFileChangedError, match="replaced by another file"):
        mf.read([0])


def test_a_change_the_stat_cannot_see_is_caught_by_the_bytes(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    # Were mtime and ctime forged (root can set the clock), the spans are still checked against the
    # bytes: lines that moved are refused rather than cut, and the index rebuilt finds the samples.
    real = index_mod.FileKey.change
    forged = lambda self, now: real(self, replace(now, mtime_ns=self.mtime_ns, ctime_ns=self.ctime_ns))  # noqa: E731
    monkeypatch.setattr(index_mod.FileKey, "change", forged)
    p = write_meta(LINES)
    mf = MetaFile(p)
    rewrite(p, LINES[::-1])  # same size, same number of lines, other lengths where they were
    assert [mf[i] for i in (0, 999)] == [LINES[999], LINES[0]]  # re-indexed: still 1000 lines
    assert mf.read(np.arange(1000)).texts(range(1000)) == LINES[::-1]
    size = p.stat().st_size
    rewrite(p, ["x" * (size // 2 - 1), "y" * (size - size // 2 - 1)])  # same size, two lines
    with pytest.raises(MetaFileChangedError, match="holds 2 samples now, not 1,000"):
        mf.read(np.arange(1000))


def test_file_truncated_during_a_build(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write_meta(n=20_000)
    mf = MetaFile(p)
    monkeypatch.setattr(gather_mod, "_WINDOW", 1 << 14)  # many windows
    real_load = pread_mod.Window.load
    calls = []

    def truncate_after_first_window(self: pread_mod.Window, *args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            os.truncate(p, p.stat().st_size // 2)
        return real_load(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pread_mod.Window, "load", truncate_after_first_window)
    with pytest.raises(MetaFileChangedError, match=rf"meta file {p} changed: .*(shrank|size)"):
        mf.read(np.arange(len(mf)))
    assert len(calls) >= 2


def test_file_rewritten_during_a_build_is_caught_after_the_copy(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write_meta(LINES)
    mf = MetaFile(p)
    # A batch is copied the general way (_copy_file_rows) or, dense on the native path, in one pass (_gather_window).
    for name in ("_copy_file_rows", "_gather_window"):
        real = getattr(gather_mod, name)

        def rewrite_after_copy(*args: object, real: Any = real) -> Any:
            ok = real(*args)
            rewrite(p, LINES[::-1], keep_times=True)  # same size and mtime: only the ctime differs
            return ok

        monkeypatch.setattr(gather_mod, name, rewrite_after_copy)
    with pytest.raises(MetaFileChangedError, match="ctime changed"):
        mf.read(np.arange(1000))


@pytest.mark.parametrize("damage", ["zeroed page", "overlapping spans", "span past the end"])
def test_damaged_cache_found_when_read_is_rebuilt(write_meta, tmp_path: Path, damage: str) -> None:
    # Damage in the middle of a large cache passes the cheap check at load (its ends); the spans a
    # build uses are checked against the bytes, and the cache is rebuilt.
    lines = [imagenet_line(i) for i in range(30_000)]
    p = write_meta(lines)
    MetaFile(p)
    cache = the_cache(tmp_path)
    size = p.stat().st_size
    entries = np.fromfile(cache, "<u8", count=30_000, offset=readers_mod.DATA_OFFSET)
    bits = np.uint64(index_mod.length_bits(size))
    starts, lengths = (
        (entries >> bits).astype(np.int64),
        (entries & ((np.uint64(1) << bits) - np.uint64(1))).astype(np.int64),
    )
    if damage == "zeroed page":
        starts[15_000:15_512] = lengths[15_000:15_512] = 0
    elif damage == "overlapping spans":
        lengths[15_000] = starts[15_001] + lengths[15_001] - starts[15_000]
    else:
        lengths[15_000] = size + 100 - starts[15_000]
    damaged = (starts.astype("<u8") << bits) | lengths.astype("<u8")
    with open(cache, "r+b") as f:
        f.seek(readers_mod.DATA_OFFSET)
        f.write(damaged.tobytes())
    mf = MetaFile(p)
    assert mf[15_000] == lines[15_000]
    idx = np.arange(14_000, 16_000)
    mf = MetaFile(p)  # from the rebuilt cache, then damaged again under it
    with open(cache, "r+b") as f:
        f.seek(readers_mod.DATA_OFFSET)
        f.write(damaged.tobytes())
    assert mf.read(idx).texts(range(idx.size)) == lines[14_000:16_000]


def test_where_counts_one_marks_span(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``where`` counts the newlines from the index's mark before the sample to the sample: at most
    # MARK bytes and a line, wherever the sample lies in a file of several marks.
    block = b"a\n\n  \nb\r\nc\n"  # 5 lines, 3 samples (lines 1, 4 and 5 of each block)
    blocks = 3 * MARK // len(block)
    p = tmp_path / "m.txt"
    p.write_bytes(block * blocks + b"last")
    mf = MetaFile(p)
    counted: list[int] = []
    real = FileBytes.count_newlines

    def count(self: FileBytes, index: Any, start: int, stop: int) -> int:
        counted.append(stop - start)
        return real(self, index, start, stop)

    monkeypatch.setattr(FileBytes, "count_newlines", count)
    at_mark = 2 * MARK // len(block)  # the blocks either side of the second mark
    samples = [0, 1, 2, 3, *range(3 * at_mark - 6, 3 * at_mark + 6), len(mf) - 2]
    assert [mf.where(i) for i in samples] == [f"{p}:{5 * (i // 3) + (1, 4, 5)[i % 3]}" for i in samples]
    assert mf.where(len(mf) - 1) == f"{p}:{5 * blocks + 1}"
    assert len(counted) == len(samples) + 1
    assert MARK - len(block) <= max(counted) <= MARK + len(block)
    p.unlink()
    assert mf.where(3) == f"{p}, sample 3 of the file"  # a message, even for a file that is gone


@pytest.mark.slow  # a subprocess indexing a thousand files
def test_a_thousand_files_under_a_low_descriptor_limit(tmp_path: Path) -> None:
    code = """if True:
        import os, resource, sys
        import numpy as np
        from rank_dataset import MetaFile
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        paths = []
        for f in range(1000):
            path = os.path.join(sys.argv[1], f"m{f}.txt")
            with open(path, "w") as out:
                out.write("".join(f"f{f}_{i}\\n" for i in range(3)))
            paths.append(path)
        mf = MetaFile(paths)
        before = len(os.listdir("/proc/self/fd"))
        shard = mf.read(np.random.default_rng(0).permutation(len(mf)))
        assert sorted(shard.texts(range(len(shard)))) == sorted(f"f{f}_{i}" for f in range(1000) for i in range(3))
        assert mf.where(2999).endswith("m999.txt:3") and len(mf.fingerprint) == 32
        # nothing kept open per file: the new descriptors are the shard's own shared-memory segment
        # and the copy of it that its map holds
        assert len(os.listdir("/proc/self/fd")) == before + 2
        del shard
        assert len(os.listdir("/proc/self/fd")) == before
        again = MetaFile(paths)  # from the caches
        print(len(again), before)
    """
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, index_mod.CACHE_DIR_ENV: str(tmp_path / "cache")},
    )
    assert out.returncode == 0, out.stderr
    count, fds = map(int, out.stdout.split())
    assert count == 3000 and fds < 20


def test_pickled_metafile_needs_no_file_until_it_reads(write_meta) -> None:
    p = write_meta(LINES)
    mf = MetaFile(p)
    fingerprint = mf.fingerprint
    p.unlink()
    copy = pickle.loads(pickle.dumps(mf))  # reopened and re-indexed nothing
    assert len(copy) == 1000 and copy.paths == mf.paths and copy.fingerprint == fingerprint
    with pytest.raises(MetaFileChangedError, match="deleted or moved"):
        copy.read([0])


def test_in_memory_index_is_not_pickled_but_rebuilt_on_read(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_mod, "cache_paths", lambda path: [])  # nowhere to cache
    p = write_meta(n=50_000)
    mf = MetaFile(p)
    blob = pickle.dumps(mf)
    assert len(blob) < 2000  # not the 800 KB of spans
    assert pickle.loads(blob)[49_999] == imagenet_line(49_999)


def line_of(i: int) -> str:
    return f"sample_{i}"


@pytest.mark.slow  # spawned DataLoader workers: not in make test-quick
def test_spawn_workers_need_no_meta_file(write_meta) -> None:
    p = write_meta([line_of(i) for i in range(3000)])
    ds = RankDataset(p, reload_cfg={"seed": 2}, rank=0, world_size=1)
    loader = DataLoader(ds, batch_size=100, num_workers=2, multiprocessing_context="spawn")
    p.unlink()  # the shard is in shared memory: workers never open the file
    got = [item for batch in loader for item in batch]
    assert sorted(got) == sorted(line_of(i) for i in range(3000))


def test_where_reads_less_than_a_window(tmp_path: Path) -> None:
    # Every 7th line blank, so line numbers differ from sample numbers; 16 MiB of file.
    lines = ["" if i % 7 == 3 else imagenet_line(i) for i in range(480_000)]
    p = tmp_path / "m.txt"
    p.write_text("".join(f"{line}\n" for line in lines))
    assert p.stat().st_size > 16 << 20
    line_of = [i + 1 for i, line in enumerate(lines) if line]
    mf = MetaFile(p)
    me = psutil.Process()
    for sample in (0, 1, 1000, len(mf) // 2, len(mf) - 1):
        before = me.io_counters().read_chars
        assert mf.where(sample) == f"{p}:{line_of[sample]}"
        assert me.io_counters().read_chars - before < (4 << 20) + (1 << 16)


def varied_file(path: Path, first: int, count: int, *, bom: bool, crlf: bool) -> list[str]:
    """A file of ``count`` samples of varied lengths (blank lines between some), written as bytes;
    its samples."""
    lines = [f"s{first + i}_" + "x" * ((first + i) * 7919 % 53) for i in range(count)]
    ending = b"\r\n" if crlf else b"\n"
    body = b"".join(line.encode() + ending + (b"  \n" if i % 11 == 5 else b"") for i, line in enumerate(lines))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body[: -len(ending)])  # no ending after the last
    return lines


@pytest.mark.parametrize(
    ("rows", "kept_span"),
    [*((rows, None) for rows in (1, 7, 256, 4096, 4097, 70_000)), (4097, 0), (70_000, 0), (70_000, 40_000)],
)
def test_reads_give_exactly_the_samples_asked_for_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, kept_span: int | None
) -> None:
    # Small reads (sorted in full, joined reads of what each line needs) and large ones (bucketed,
    # windows, two threads) give the same: the lines asked for, in that order, repeats included,
    # across files with a BOM, CRLF endings and blank lines. With kept_span, batches whose rows lie
    # that far apart (none, or some) have their entries read again by the second pass.
    if kept_span is not None:
        monkeypatch.setattr(visits_mod, "_KEPT_SPAN", kept_span)
    sizes = [30_000, 5, 45_000]  # the last file's 70,000 rows are read by two threads
    samples: list[str] = []
    paths = []
    for f, size in enumerate(sizes):
        paths.append(tmp_path / f"m{f}.txt")
        samples += varied_file(paths[-1], len(samples), size, bom=f == 0, crlf=f == 2)
    mf = MetaFile(paths)
    n = len(mf)
    assert n == len(samples)
    rng = np.random.default_rng(rows)
    start = int(rng.integers(0, n - min(rows, n) + 1))
    picks = {
        "random, repeats": rng.integers(0, n, rows),
        "consecutive": np.arange(start, start + min(rows, n)),
        "descending": np.arange(n - 1, -1, -max(1, n // rows))[:rows],
        "one sample many times": np.full(rows, n - 1),
        "from the last file, repeats": rng.integers(30_005, n, rows),
        "the first and last of each file": np.resize(np.array([0, 29_999, 30_000, 30_004, 30_005, n - 1]), rows),
    }
    for what, indices in picks.items():
        shard = mf.read(indices)
        assert shard.texts(range(len(shard))) == [samples[i] for i in indices.tolist()], what
        assert shard.ids is not None and shard.ids.tolist() == indices.tolist(), what
    for i in picks["random, repeats"][:50].tolist():
        assert mf[i] == samples[i]


@pytest.mark.parametrize("read", ["mf[i]", "read 3", "read 5000"])
def test_a_file_changed_between_reads_is_seen_by_the_next(write_meta, tmp_path: Path, read: str) -> None:
    p = write_meta(n=20_000)
    reads = {
        "mf[i]": lambda mf: [mf[17]],
        "read 3": lambda mf: mf.read([19_999, 5, 5]).texts(range(3)),
        "read 5000": lambda mf: mf.read(np.arange(0, 20_000, 4)).texts([0]),
    }
    go = reads[read]
    mf = MetaFile(p)
    go(mf)
    rewrite(p, [imagenet_line(i) for i in range(20_000)][::-1], keep_times=True)  # same size and times
    with pytest.raises(MetaFileChangedError, match="ctime changed"):
        go(mf)
    mf = MetaFile(p)
    go(mf)
    other = tmp_path / "other.txt"
    shutil.copy(p, other)
    os.replace(other, p)  # the same bytes, another file
    with pytest.raises(MetaFileChangedError, match="replaced by another file"):
        go(mf)
    mf = MetaFile(p)
    go(mf)
    p.unlink()
    with pytest.raises(MetaFileChangedError, match="deleted or moved"):
        go(mf)


def test_a_plan_is_let_go_by_the_build_and_made_again_when_needed(tmp_path: Path) -> None:
    # _read_made (a dataset's builds) holds no sample numbers while the shard fills: it makes them
    # once for the build, and again only to name a bad line.
    n, bad = 70_000, 54_321
    p = tmp_path / "m.txt"
    p.write_bytes(b"".join(b"\xff_bad\n" if i == bad else f"\u00e9_{i}\n".encode() for i in range(n)))
    mf = MetaFile(p)
    made: list[int] = []

    def make() -> np.ndarray:
        made.append(1)
        return np.arange(n - 1, -1, -1, dtype=np.int64)

    with pytest.raises(ValueError, match=rf"m\.txt:{bad + 1}: line is not valid UTF-8"):
        mf._read_made(make, ids=False)
    assert len(made) == 2
    made.clear()
    good = tmp_path / "good.txt"
    good.write_text("".join(f"s_{i}\n" for i in range(n)))
    shard = MetaFile(good)._read_made(make, ids=True)
    assert made == [1]
    assert shard.texts([0, n - 1]) == [f"s_{n - 1}", "s_0"]
    assert shard.ids is not None and shard.ids[:3].tolist() == [n - 1, n - 2, n - 3]


def test_a_random_batch_is_read_in_one_window_a_call_a_line(write_meta, monkeypatch: pytest.MonkeyPatch) -> None:
    # 256 random lines of an 8 MiB file: their index entries through the process's map of the index
    # cache (no read an entry), and one read of their lines (a batch charged what its reads hold: 256
    # lines and the bytes around them, not 256 pages), a call per line at most, besides the index's header.
    p = write_meta(n=200_000)
    assert p.stat().st_size > 2 * gather_mod._WINDOW
    mf = MetaFile(p)
    lines = p.read_text().splitlines()
    loads: list[int] = []
    calls: list[int] = []
    real_load, real_pread, real_preadv = pread_mod.Window.load, os.pread, os.preadv

    def load(self: pread_mod.Window, fd: int, starts: np.ndarray, *args: object, **kwargs: object) -> object:
        loads.append(starts.size)
        return real_load(self, fd, starts, *args, **kwargs)  # type: ignore[arg-type]

    def pread(fd: int, n: int, at: int) -> bytes:
        calls.append(n)
        return real_pread(fd, n, at)

    def preadv(fd: int, buffers: list[memoryview], at: int) -> int:
        calls.append(sum(len(b) for b in buffers))
        return real_preadv(fd, buffers, at)

    monkeypatch.setattr(pread_mod.Window, "load", load)
    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    rng = np.random.default_rng(5)
    for _ in range(5):
        indices = rng.integers(0, len(mf), 256)
        loads.clear()
        calls.clear()
        shard = mf.read(indices)
        assert shard.texts(range(256)) == [lines[i] for i in indices.tolist()]
        assert loads == [256]  # the lines (the entries come from the map)
        assert len(calls) <= 256 + 2  # and the index's header and table of long lines


def test_small_takes_map_a_cache_once_and_a_replaced_cache_anew(write_meta) -> None:
    from rank_dataset.files.index import load as index_mod

    p = write_meta(n=readers_mod._MAPPED_MIN + 10)
    lines = p.read_text().splitlines()
    rng = np.random.default_rng(1)
    mf = MetaFile(p)
    readers_mod._maps.clear()
    picks = rng.integers(0, len(mf), 100)
    assert mf.read(picks).texts(range(100)) == [lines[i] for i in picks.tolist()]
    first = set(readers_mod._maps)
    assert len(first) == 1
    mf.read(picks[::-1])
    assert set(readers_mod._maps) == first  # kept, not mapped again
    index_mod.load_index(p, distrust=index_mod.load_index(p))  # a new cache file in its place
    again = MetaFile(p)
    assert again.read(picks).texts(range(100)) == [lines[i] for i in picks.tolist()]
    assert len(readers_mod._maps) == 2 and first < set(readers_mod._maps)
    readers_mod._maps.clear()


def test_batches_charge_a_row_what_its_read_holds() -> None:
    window, page = gather_mod._WINDOW, 4096
    rng = np.random.default_rng(0)
    # Rows far apart (40 KiB on average): one batch of as many as load reads one by one.
    far = np.sort(rng.integers(0, 1 << 30, 5000))
    lengths = np.full(far.size, 42)
    batches = gather_mod._batches(far, lengths, window, 1 << 15)
    assert [b - a for a, b in batches[:-1]] == [gather_mod._SPARSE_ROWS] * (len(batches) - 1)
    for a, b in batches:  # each wider than the window, so too sparse for load to read its span whole
        assert (b - a) * page < 2 * int(far[b - 1] + 44 - far[a] + 1)
    assert gather_mod._batches(far[:256], lengths[:256], window, 1 << 15) == [(0, 256)]
    # Rows 6 KiB apart are read with the bytes between them: a batch spans about the window.
    close = np.arange(0, 64 << 20, 6 << 10)
    batches = gather_mod._batches(close, np.full(close.size, 42), window, 1 << 15)
    spans = [int(close[b - 1] - close[a]) for a, b in batches]
    assert len(batches) > 1 and all(window - (8 << 10) <= s <= window for s in spans[:-1])
