"""Shared by the benchmark scripts: the machine description and synthetic meta files."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from rank_dataset._synthetic import write_imagenet_meta

__all__ = ["machine_info", "write_imagenet_meta"]


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
