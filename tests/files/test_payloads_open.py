"""Local payloads opened by the native opener (``native.open_files``: ``openat2`` beneath the root, in runs)
against the Python walk it stands in for: the same bytes and the same errors for every hostile path, misses
handed to the pool open, and nothing left open or held when a batch is left part-read."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rank_dataset import PayloadError, Payloads
from rank_dataset.core import native
from rank_dataset.files.io import payloads as payload_io

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="openat2 is Linux's")


@pytest.fixture(autouse=True)
def _needs_the_opener(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        if native.open_files(fd, [], 0) is None:
            pytest.skip("no native opener here (numpy kernels, or no openat2)")
    finally:
        os.close(fd)


@pytest.fixture
def walk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Python walk alone (as where the opener is not): each file opened one component at a time."""
    monkeypatch.setattr(payload_io, "_native_open", False)
    yield


def _hostile(tmp_path: Path) -> tuple[Path, list[str]]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"SECRET")
    (root / "good.bin").write_bytes(b"good")
    (root / "sub" / "inner.bin").write_bytes(b"inner")
    (root / "sub" / "deep" / "d.bin").write_bytes(b"deep" * 1000)
    (root / "empty.bin").write_bytes(b"")
    (root / "link.bin").symlink_to(outside / "secret.bin")
    (root / "rellink.bin").symlink_to("../outside/secret.bin")
    (root / "dirlink").symlink_to(outside)
    (root / "reldirlink").symlink_to("../outside")
    (root / "inlink.bin").symlink_to(root / "sub" / "inner.bin")  # absolute, inside: read
    (root / "relin.bin").symlink_to("sub/inner.bin")  # relative, inside: read
    (root / "subin").symlink_to("sub")  # a directory link inside: read through
    (root / "sub" / "up").symlink_to("..")  # inside (the root itself)
    (root / "sub" / "upup").symlink_to("../..")  # out
    (root / "dangling.bin").symlink_to("nowhere.bin")
    (root / "magic").symlink_to("/proc/self/root")
    os.mkfifo(root / "fifo")
    names = [
        "good.bin", "link.bin", "rellink.bin", "dirlink/secret.bin", "reldirlink/secret.bin", "inlink.bin",
        "relin.bin", "subin/inner.bin", "sub/up/good.bin", "sub/upup/outside/secret.bin", "dangling.bin",
        "magic/etc/passwd", "fifo", "sub", "missing.bin", "sub/missing/x.bin", "good.bin/", "good.bin/x",
        "sub//inner.bin", "./good.bin", "sub/./deep/d.bin", "empty.bin", "sub/deep/d.bin", ".",
        "../outside/secret.bin", "/etc/passwd", "sub/../../outside/secret.bin", "good.bin\0../x",
        "../../../../../../etc/passwd",
    ]  # fmt: skip
    for name in ("good.bin", "sub/inner.bin", "sub/deep/d.bin"):
        (root / name).read_bytes()  # in the page cache
    return root, names


def _read(payloads: Payloads, names: list[str]) -> list[Any]:
    targets = [t for name in names for t in payloads.targets(name)]
    return [data if isinstance(data, bytes) else str(data) for data in payloads.reader().read(targets)]


def test_the_opener_reads_and_refuses_as_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, names = _hostile(tmp_path)
    before = payload_io.COUNTS["native"]
    got = _read(Payloads(root), names)
    assert payload_io.COUNTS["native"] - before == len(names) - 5  # all but the 5 refused by the lexical checks
    monkeypatch.setattr(payload_io, "_native_open", False)
    before = payload_io.COUNTS["native"]
    walked = _read(Payloads(root), names)
    assert payload_io.COUNTS["native"] == before
    assert got == walked  # the same bytes, the same messages, in the same order
    assert b"SECRET" not in got and all(isinstance(g, (bytes, str)) for g in got)
    readable = {"good.bin", "inlink.bin", "relin.bin", "subin/inner.bin", "sub/up/good.bin", "sub//inner.bin",
                "./good.bin", "sub/./deep/d.bin", "empty.bin", "sub/deep/d.bin", "good.bin/"}  # fmt: skip
    assert {n for n, g in zip(names, got) if isinstance(g, bytes)} == readable
    reasons = dict(zip(names, got))
    for name in ("link.bin", "rellink.bin", "dirlink/secret.bin", "reldirlink/secret.bin",
                 "sub/upup/outside/secret.bin", "magic/etc/passwd"):  # fmt: skip
        assert "outside the root" in reasons[name], name
    assert "not a regular file" in reasons["fifo"] and "not a regular file" in reasons["sub"]
    assert "no such file" in reasons["missing.bin"] and "no such file" in reasons["dangling.bin"]


def _open_under(root: Path) -> list[str]:
    """What this process's descriptors under ``root`` name (other tests' descriptors may close meanwhile)."""
    real = os.path.realpath(root)
    named = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed since
            continue
        if target == real or target.startswith(real + os.sep):
            named.append(target)
    return sorted(named)


def test_misses_go_to_the_pool_open_and_a_part_read_batch_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    n = 3 * payload_io._RUN + 5  # runs of the opener, and a short one
    for i in range(n):
        (root / f"{i}.bin").write_bytes(bytes([i % 251]) * (1000 + i))
    os.sync()
    for i in range(n):
        (root / f"{i}.bin").read_bytes()
    names = [f"{i}.bin" for i in range(n)]
    names[7] = "missing.bin"
    names[40] = "../escape.bin"
    want = [bytes([i % 251]) * (1000 + i) for i in range(n)]
    payloads = Payloads(root, max_bytes=8000)
    reader = payloads.reader()
    assert _open_under(root) == []
    before = dict(payload_io.COUNTS)
    got = _read(payloads, names)
    assert [g for i, g in enumerate(got) if i not in (7, 40)] == [w for i, w in enumerate(want) if i not in (7, 40)]
    assert "no such file" in got[7] and "'..' component" in got[40]
    assert payload_io.COUNTS["native"] - before["native"] == n - 1  # all but the lexically refused one
    for i in range(45, n):  # a miss from item 45 on: it and the files after it go to the pool
        fd = os.open(root / f"{i}.bin", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    before = dict(payload_io.COUNTS)
    got = _read(payloads, names)
    assert [g for i, g in enumerate(got) if i not in (7, 40)] == [w for i, w in enumerate(want) if i not in (7, 40)]
    pooled = payload_io.COUNTS["pooled"] - before["pooled"]
    assert pooled in (0, n - 45)  # (0: a file system that keeps its pages, or cannot tell, reads them all here)
    assert payload_io.COUNTS["files"] - before["files"] == n - 2
    # Part-read (all in the page cache again): taken up to item 10 of a run of 32, the generator closed: the
    # files opened ahead are closed, their tickets ended.
    targets = [t for name in names for t in payloads.targets(name)]
    stream = reader.read(targets)
    for _ in range(10):
        next(stream)
    assert len(_open_under(root)) > 10
    stream.close()  # type: ignore[attr-defined]
    assert _open_under(root) == [os.path.realpath(root)]  # the root's descriptor, kept for the next batch
    assert reader.budget.held == 0
    assert _read(payloads, names[:3]) == want[:3]  # the budget's turns go on


def test_runs_break_at_a_change_of_root(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for i in range(10):
        (a / f"{i}.bin").write_bytes(b"a%d" % i)
        (b / f"{i}.bin").write_bytes(b"b%d" % i)
    payloads = Payloads(None, allow=[a, b])
    names = [str((a if i % 3 else b) / f"{i}.bin") for i in range(10)]
    want = [(b"a%d" if i % 3 else b"b%d") % i for i in range(10)]
    assert _read(payloads, names) == want
    assert isinstance(payloads.targets(str(tmp_path / "c.bin"))[0], PayloadError)
