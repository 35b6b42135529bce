"""Helpers importable by tests (conftest keeps the fixtures): synthetic lines, random meta files and a plain
reference index of them, free ports, a real server, torchrun jobs of the worker scripts beside this file."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zstandard

from rank_dataset.core.shard import Shard
from rank_dataset.demo.synthetic import imagenet_line
from rank_dataset.files.index.scan import BOM
from rank_dataset.server.local import LocalServer, free_port

__all__ = [
    "Server",
    "compressed_pair",
    "free_port",
    "hostile_lines",
    "imagenet_line",
    "kill_tree",
    "random_file",
    "rank_results",
    "ranks_cmd",
    "reference_index",
    "rewrite",
    "run_ranks",
    "shard_of",
    "spawn_workers",
    "start_methods",
    "start_together",
    "torchrun_cmd",
    "worker_env",
    "write_rank_result",
]

HERE = Path(__file__).resolve().parent


def start_methods(*names: str) -> list[Any]:
    """DataLoader start methods to parametrize a test with: fork runs in ``make test-quick``; spawn and
    forkserver start fresh interpreters that import torch (seconds each, on 2 cores), so they are marked slow."""
    return [name if name == "fork" else pytest.param(name, marks=pytest.mark.slow) for name in names]


def spawn_workers(context: str | None, workers: int = 2) -> int:
    """How many DataLoader workers a test that is parametrized over start methods gives ``context``: ``workers``,
    or one under spawn. Each spawn worker is a fresh interpreter that imports torch (seconds of CPU); what the
    start method changes (the dataset and sampler pickled to a worker, the shard opened there) one worker shows,
    and how workers split a pass is the DataLoader's, the same under every start method (fork checks it)."""
    return 1 if context == "spawn" else workers


class Server(LocalServer):
    """A real `rank-dataset serve` process on a free loopback port, its stdout piped."""

    def __init__(
        self,
        paths: list[Path],
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        fd_limit: int | None = None,
    ):
        super().__init__(paths, *args, port=port, env=env, stdout=subprocess.PIPE, fd_limit=fd_limit)


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return [root, *root.children(recursive=True)]
    return []


def kill_tree(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> None:
    """SIGKILL ``proc`` and every process under it, and wait until all are gone.

    Descendants are found by parent links, not by process group or session: torchrun starts its
    ranks in new sessions, so ``os.killpg`` on torchrun's group misses them and their DataLoader
    workers. The tree is frozen (SIGSTOP) before it is killed, so that nothing forks or is
    reparented away while it is being listed.
    """
    try:
        root = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        proc.wait(timeout=timeout)
        return
    seen: dict[int, psutil.Process] = {}
    while True:  # until no stopped process has a child not yet stopped
        fresh = [p for p in _tree(root) if p.pid not in seen]
        if not fresh:
            break
        for p in fresh:
            seen[p.pid] = p
            with contextlib.suppress(psutil.NoSuchProcess):
                p.suspend()
    for p in seen.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=timeout)
    _, alive = psutil.wait_procs([p for p in seen.values() if p.pid != proc.pid], timeout=timeout)
    if alive:
        raise RuntimeError(f"processes still alive {timeout}s after SIGKILL: {[p.pid for p in alive]}")


def rewrite(path: Path, lines: list[str], *, keep_times: bool = False) -> None:
    """Rewrite ``path`` in place (same inode), as an editor or ``cat > file`` does."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write("".join(f"{line}\n" for line in lines).encode())
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def start_together(argv: list[str], processes: int, timeout: float = 300) -> list[str]:
    """Run ``processes`` copies of ``argv`` at once; what each printed after "ready", in start order.

    Each copy prints "ready" and waits for a line on stdin; every copy gets it once all are ready, so
    that they race. They are killed on the way out, also on failure.
    """
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def torchrun_cmd(worker: str, nproc: int, *args: object, log_dir: Path) -> list[str]:
    """The command running ``nproc`` gloo ranks of the script ``tests/<worker>`` (given ``args``) under
    ``torchrun --standalone``, its logs under ``log_dir`` (without it torchrun makes a
    ``/tmp/torchelastic_*`` directory that it never removes)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*cmd, "--log-dir", str(log_dir), str(HERE / worker), *map(str, args)]


def ranks_cmd(worker: str, nproc: int, *args: object) -> list[str]:
    """The command running ``nproc`` gloo ranks of the script ``tests/<worker>`` (given ``args``) as forks of
    one process that imported torch once (``tests/ranks.py``): the environment and the failure handling
    of ``torchrun --standalone``, without an interpreter and an import of torch a rank."""
    return [sys.executable, str(HERE / "ranks.py"), str(nproc), str(HERE / worker), *map(str, args)]


def run_ranks(
    worker: str, nproc: int, *args: object, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``nproc`` gloo ranks of ``tests/<worker>`` (given ``args``) as ``subprocess.run(ranks_cmd(worker,
    nproc, *args), env=env, capture_output=True, text=True, timeout=timeout)`` does, without its interpreter:
    a child of this process's forkserver, which imported torch once (``conftest``), does what
    ``tests/ranks.py`` does (``ranks.job``). On a timeout the job is killed (its ranks die with it) and
    ``subprocess.TimeoutExpired`` raised, as there."""
    import multiprocessing
    import tempfile

    import ranks

    cmd = ranks_cmd(worker, nproc, *args)
    with tempfile.TemporaryDirectory(prefix="rank-dataset-job-") as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        proc = multiprocessing.get_context("forkserver").Process(
            target=ranks.job, args=(nproc, str(HERE / worker), [str(a) for a in args], env, out, err), name="ranks-job"
        )
        proc.start()
        proc.join(timeout)
        expired = proc.exitcode is None
        if expired:
            proc.kill()
            proc.join()
        code = proc.exitcode
        proc.close()
        stdout, stderr = (Path(p).read_text(errors="replace") if os.path.exists(p) else "" for p in (out, err))
    if expired:
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def worker_env(**extra: str) -> dict[str, str]:
    """This environment with ``extra`` and tests/ on PYTHONPATH, so a worker imports what the tests import."""
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}


def write_rank_result(out: str, result: object) -> None:
    """In a worker: write this rank's ``result`` to ``{out}.{rank}.json``, wait for every rank, leave the group."""
    import torch.distributed as dist  # here, not above: the other helpers do not need torch

    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def rank_results(out: Path, nproc: int) -> list[Any]:
    """What each of ``nproc`` ranks wrote with ``write_rank_result(out, ...)``, in rank order."""
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(nproc)]


def shard_of(lines: list[bytes], *, ids: np.ndarray | None = None) -> Shard:
    """A shard holding ``lines`` (bytes without line endings), in order."""
    lengths = np.fromiter((len(x) for x in lines), np.int64, len(lines))
    ends = np.cumsum(lengths)
    return Shard(np.frombuffer(b"".join(lines), np.uint8), ends - lengths, ends, ids=ids)


def random_file(rng: np.random.Generator, most: int) -> bytes:
    """Up to ``most`` bytes of lines made to catch a scanner out: empty and whitespace-only lines,
    control characters and spaces that start a line with content after them, lone and doubled CRs,
    non-ASCII bytes, lines of several KiB (past a page), CRLF and LF endings, sometimes a byte order
    mark, sometimes no final newline."""
    pieces = [b"", b" ", b"\t", b"\r", b"\r\r", b" \x0b\x0c ", b"\x00", b"\x1f", b"\x01a", b"\t x", b"a\rb", b"a\r"]
    pieces += [b"x" * int(n) for n in rng.integers(1, 50, 4)] + [b"\xc3\xa9 1", b"y" * 5000]
    out, size = [], 0
    while size < most:
        piece = pieces[int(rng.integers(len(pieces)))] + b"z" * int(rng.integers(0, 3))
        line = piece + (b"\r\n" if rng.random() < 0.3 else b"\n")
        out.append(line)
        size += len(line)
    data = b"".join(out)[: int(rng.integers(0, most + 1))]
    return (BOM + data) if rng.random() < 0.2 else data


def reference_index(data: bytes, mark: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The spans of the samples of ``data`` and its marks, written plainly: a sample is a non-blank
    line without its ending (a leading byte order mark is not part of the first one); a mark says
    where the first line at or after each multiple of ``mark`` starts, and its number."""
    spans = []
    line_starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    for k, start in enumerate(line_starts):
        if start == len(data) and k:
            break  # past the final newline: no line
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if k == 0 and data.startswith(BOM):
            start = len(BOM)
        stop = end - 1 if end > start and data[end - 1] == ord("\r") else end
        if data[start:stop].strip(b" \t\r\x0b\x0c"):
            spans.append((start, stop))
    marks = []
    for target in range(0, len(data), mark):
        at = next((k for k, s in enumerate(line_starts) if s >= target), None)
        if at is not None:
            marks.append((line_starts[at], at))
    return spans, marks


def gzip_members(raw: bytes, size: int) -> bytes:
    """``raw`` as a multi-member gzip file, a member per ``size`` bytes."""
    return b"".join(gzip.compress(raw[k : k + size], 6) for k in range(0, len(raw), size))


def zstd_frames(raw: bytes, size: int) -> bytes:
    """``raw`` as a zstd file of many frames, a frame per ``size`` bytes, each with its checksum."""
    c = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return b"".join(c.compress(raw[k : k + size]) for k in range(0, len(raw), size))


# The four shapes of compressed meta file the readers must all take: file name -> writer.
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "one.gz": lambda raw: gzip.compress(raw, 6),
    "members.gz": lambda raw: gzip_members(raw, 50_000),
    "one.zst": lambda raw: zstandard.ZstdCompressor(level=3).compress(raw),
    "frames.zst": lambda raw: zstd_frames(raw, 40_000),
}


def hostile_lines(n: int, row: Callable[[int], str]) -> bytes:
    """``n`` lines that a reader must take as the plain file's: ``row(i)`` most of them (CRLF every 13th), with
    blank and whitespace-only lines (not samples) between, a byte order mark and no newline after the last."""
    rows = []
    for i in range(n):
        if i % 97 == 5:
            rows.append(b"   ")
        elif i % 89 == 3:
            rows.append(b"")
        else:
            rows.append(row(i).encode() + (b"\r" if i % 13 == 0 else b""))
    return BOM + b"\n".join(rows)


def compressed_pair(tmp_path: Path, name: str, raw: bytes) -> tuple[Path, Path]:
    """``raw`` written twice in ``tmp_path``: as plain text (``<name>.txt``) and compressed as
    ``COMPRESSORS[name]`` does (``name``); the paths of both."""
    plain, packed = tmp_path / f"{name}.txt", tmp_path / name
    plain.write_bytes(raw)
    packed.write_bytes(COMPRESSORS[name](raw))
    return plain, packed


# Prepended to a child's code: any import of torch in it fails, so the code shows it runs without torch.
BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
"""
