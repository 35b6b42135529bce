"""Shared by the benchmark scripts: measured child processes, the machine description, results, meta files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rank_dataset.demo.synthetic import write_imagenet_meta

__all__ = [
    "NATIVE_PATHS",
    "PEAK_PRELUDE",
    "barh",
    "cache_env",
    "child_code",
    "load_note",
    "machine_info",
    "native_env",
    "plotting",
    "run_child",
    "run_python",
    "save_results",
    "scratch_dir",
    "start_python",
    "write_imagenet_meta",
]

#: Code for a measured child process: ``rss()`` gives (RSS, peak RSS) in bytes, ``reset_peak()`` resets
#: the peak (through /proc/self/clear_refs), so a measurement's peak is its own; ``measured(make)`` gives
#: ``make()``'s result, its seconds and the rise of the peak RSS while it ran (with ``marks``, "start" and
#: "stop" are printed around it, for a parent sampling the process's memory in between).
PEAK_PRELUDE = """
import json, os, sys, time
def rss():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
def measured(make, marks=False):
    reset_peak(); before = rss()[0]
    if marks: print("start", flush=True)
    t = time.perf_counter()
    made = make()
    elapsed = time.perf_counter() - t
    if marks: print("stop", flush=True)
    return made, elapsed, rss()[1] - before
"""


def child_code(body: str, **names: object) -> str:
    """Source of a measured child process: PEAK_PRELUDE, a ``NAME = value`` line per keyword, then ``body``.

    Each value is written as its ``repr``, so it must be a literal: str, int, float, bool, or lists of them
    (pass paths as ``str``).
    """
    head = "".join(f"{name} = {value!r}\n" for name, value in names.items())
    return PEAK_PRELUDE + head + textwrap.dedent(body)


def run_child(body: str, env: dict[str, str], **names: object) -> dict[str, Any]:
    """Run ``child_code(body, **names)`` in a fresh Python process; the JSON object it prints last.

    Raises:
        RuntimeError: the process failed (its stderr is in the message).
    """
    out = run_python(child_code(body, **names), env=env)
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


#: Set to 1 (the smoke tests do), :func:`run_python` forks this process instead of starting an interpreter:
#: the code still runs whole, in a process of its own, with rank_dataset imported afresh under the child's
#: environment, but torch is imported once, in this process, not in each child (an interpreter importing
#: torch costs about 2 s of CPU; a smoke run starts dozens). The figures of such a run are not measurements.
FORK_CHILDREN = "BENCH_FORK_CHILDREN"


def run_python(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` under ``env`` (default: this process's); its exit status and output.

    With :data:`FORK_CHILDREN` set to 1 in this process's environment, a fork of this process runs it instead
    (see there), unless this process imported obstore. Raises ``subprocess.TimeoutExpired`` (the child
    killed) after ``timeout`` seconds.
    """
    env = dict(os.environ if env is None else env)
    # A process that made an object store client holds its runtime's threads, which a fork would not carry.
    if os.environ.get(FORK_CHILDREN) != "1" or "obstore" in sys.modules:
        cmd = [sys.executable, "-c", code, *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    child = _Fork(code, list(args), env)
    out, err = child.communicate(timeout)
    return subprocess.CompletedProcess(["<fork>"], child.returncode, out, err)


class _Fork:
    """A fork of this process running ``python -c`` code (see :data:`FORK_CHILDREN`); waited on as a Popen is."""

    def __init__(self, code: str, args: list[str], env: dict[str, str]) -> None:
        import tempfile

        with contextlib.suppress(ImportError):
            import torch  # noqa: F401  (once, here: what the forks share)
        self.code, self.returncode = code, None
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed when waited)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(args, env)

    def _child(self, args: list[str], env: dict[str, str]) -> None:
        """Run the code as `python -c` would; never return into the caller's frames."""
        import types

        status = 1
        try:
            os.dup2(self._out.fileno(), 1)
            os.dup2(self._err.fileno(), 2)
            old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            new = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:0] = [p for p in new if p not in old]
            os.environ.clear()
            os.environ.update(env)
            for name in [m for m in sys.modules if m == "rank_dataset" or m.startswith("rank_dataset.")]:
                del sys.modules[name]  # imported afresh: the child's environment chooses its kernels, caches
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            sys.argv = ["-c", *args]
            exec(compile(self.code, "<string>", "exec"), main.__dict__)
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child (killed past ``timeout`` seconds: ``subprocess.TimeoutExpired``); its stdout, stderr."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            if done:
                break
            if deadline is not None and time.monotonic() > deadline:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
                raise subprocess.TimeoutExpired(["<fork>", self.code[:80]], timeout or 0.0)
            time.sleep(0.02)
        self.returncode = os.waitstatus_to_exitcode(status)
        outputs = []
        for f in (self._out, self._err):
            f.seek(0)
            outputs.append(f.read().decode(errors="replace"))
            f.close()
        return outputs[0], outputs[1]


def start_python(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """``python -c code args...`` under ``env`` started, its stdout and stderr piped (text), not waited for: a
    ``subprocess.Popen``, or with :data:`FORK_CHILDREN` set a fork (as :func:`run_python`) with the same
    ``communicate(timeout)`` and ``returncode``."""
    env = dict(os.environ if env is None else env)
    if os.environ.get(FORK_CHILDREN) != "1" or "obstore" in sys.modules:
        cmd = [sys.executable, "-c", code, *args]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return _Fork(code, list(args), env)


#: The kernels' paths a benchmark compares: ``RANK_DATASET_NATIVE=0`` (numpy) and ``require`` (native).
NATIVE_PATHS = ("0", "require")


def native_env(env: dict[str, str], mode: str) -> dict[str, str]:
    """``env`` with the kernels' path set to ``mode`` (one of :data:`NATIVE_PATHS`)."""
    return {**env, "RANK_DATASET_NATIVE": mode}


def ratio(a: float, b: float) -> str:
    """``a / b`` as a table cell (``1.23x``); ``n/a`` where ``b`` is 0 (a CPU time under the clock's tick at
    the smoke tests' tiny sizes)."""
    return f"{a / b:.2f}x" if b else "n/a"


def load_note() -> str:
    """The load averages now, for a note beside figures from a shared machine."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def cache_env(cache: Path) -> dict[str, str]:
    """This process's environment with rank_dataset's caches (index, grouping) under ``cache``."""
    return {**os.environ, "RANK_DATASET_CACHE_DIR": str(cache)}


@contextmanager
def scratch_dir(path: Path, *, keep: bool = False) -> Iterator[Path]:
    """``path``, created if missing and removed with all it holds on leaving, unless ``keep``."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def machine_info() -> str:
    """A markdown line describing this machine and the versions measured."""
    import numpy as np

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    versions = f"Python {platform.python_version()}, numpy {np.__version__}"
    try:
        torch_version = run_python("import torch; print(torch.__version__)").stdout.strip()
        versions += f", torch {torch_version}"
    except OSError:
        pass
    return f"Machine: {os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB RAM, {platform.system()}; {versions}."


def plotting() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def barh(path: Path, bars: dict[str, float], xlabel: str, height: float) -> None:
    """Save a horizontal bar chart of ``bars`` (the first on top), 6 inches wide, to ``path``."""
    plt = plotting()
    fig, ax = plt.subplots(figsize=(6, height))
    ax.barh(list(bars), list(bars.values()))
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def md_table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The lines of a markdown table: the header of ``columns``, its rule, then one line a row (cells as ``str``).
    ``align`` has one letter a column, ``r`` for right (``---:``), any other for left; empty: all left."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align or "l" * len(columns))
    return [_md_row(columns), "|" + rule, *(_md_row(r) for r in rows)]


def _md_row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def save_results(out: Path, name: str, rows: list[str], data: Any, plot: Callable[[Path], None]) -> None:
    """Write ``name``.md (the table), ``name``.json (the figures) and ``name``.png under ``out``; print the table."""
    table = "\n".join(rows) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    plot(out / f"{name}.png")
    print(table)
