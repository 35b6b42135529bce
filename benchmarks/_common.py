"""Shared by the benchmark scripts: the machine description and synthetic meta files."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path


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


def write_imagenet_meta(path: Path, n: int, chunk: int = 500_000) -> Path:
    """Write ``n`` lines shaped like ImageNet's ``train/<wnid>/<wnid>_<k>.JPEG <label>``."""
    from tqdm import tqdm

    with open(path, "w") as f, tqdm(total=n, desc=f"writing {path.name}", unit="line", disable=None) as bar:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            f.write(
                "".join(
                    f"train/n{(i * 7919) % 1000 + 1440764:08d}/img_{i}.JPEG {(i * 7919) % 1000}\n"
                    for i in range(lo, hi)
                )
            )
            bar.update(hi - lo)
    return path
