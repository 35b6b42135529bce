"""Shared by the benchmark scripts: the machine description and synthetic meta files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rank_dataset.demo.synthetic import write_imagenet_meta

__all__ = ["PEAK_PRELUDE", "machine_info", "plotting", "save_results", "write_imagenet_meta"]

#: Code for a measured child process: ``rss()`` gives (RSS, peak RSS) in bytes, ``reset_peak()`` resets
#: the peak (through /proc/self/clear_refs), so a measurement's peak is its own.
PEAK_PRELUDE = """
import json, os, sys, time
def rss():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""


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
        torch_version = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
        ).stdout.strip()
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


def save_results(out: Path, name: str, rows: list[str], data: Any, plot: Callable[[Path], None]) -> None:
    """Write ``name``.md (the table), ``name``.json (the figures) and ``name``.png under ``out``; print the table."""
    table = "\n".join(rows) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    plot(out / f"{name}.png")
    print(table)
