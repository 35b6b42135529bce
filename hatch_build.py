"""Hatchling build hook: compile ``src/rank_dataset/core/_kernels.c`` into the package's native library.

A wheel gets the library (built in a temporary directory, added as ``rank_dataset/core/_kernels.so``)
and the tag of this platform for any Python 3 (``py3-none-<platform>``: the library has no Python
headers, so one wheel serves every CPython). An editable install builds it in place, beside the
module that loads it. The sdist carries the C file and builds nothing.

With no C compiler (or one that fails), the build goes on without the library: the wheel is pure
(``py3-none-any``), a warning says so here, and at run time the package takes its numpy path and
says so once. ``RANK_DATASET_BUILD_NATIVE=0`` skips the library on purpose. The compiler is ``$CC``
(default ``cc``), with ``-O2 -fPIC -shared -std=c99`` (no ``-march=native``: a wheel runs on other
machines) and ``$CFLAGS`` after them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("src/rank_dataset/core/_kernels.c")
FLAGS = ["-O2", "-fPIC", "-shared", "-std=c99"]


def library_name() -> str:
    """As ``rank_dataset.core._native_lib.library_name``."""
    if sys.platform == "win32":
        return "_kernels.dll"
    return "_kernels.dylib" if sys.platform == "darwin" else "_kernels.so"


def compile_library(root: Path, out: Path) -> str | None:
    """Compile the kernels into ``out``; None on success, else why not."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler ({cc[0] if cc else '$CC is empty'} not found)"
    command = [*cc, *FLAGS, *shlex.split(os.environ.get("CFLAGS", "")), "-o", str(out), str(root / SOURCE)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        return f"{shlex.join(command)} failed to start: {exc}"
    if done.returncode != 0:
        return f"{shlex.join(command)} failed:\n{done.stderr.strip()}"
    return None


def platform_tag() -> str:
    """This platform's wheel tag (``linux_x86_64``, ``macosx_11_0_arm64``, ...)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class KernelsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return  # the sdist ships the C file (it is under src/) and builds nothing
        if os.environ.get("RANK_DATASET_BUILD_NATIVE", "1").strip() == "0":
            self.app.display_warning("rank-dataset: RANK_DATASET_BUILD_NATIVE=0: no native kernels, numpy only")
            return
        root = Path(self.root)
        name = library_name()
        if version == "editable":
            out = root / SOURCE.parent / name  # found there by the editable install's path
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="rank-dataset-build-")
            out = Path(self._tmp.name) / name
        why = compile_library(root, out)
        if why is not None:
            self.app.display_warning(
                f"rank-dataset: the native kernels were not built ({why}). The package installs and runs on "
                "its numpy path (slower per line); install a C compiler and reinstall to build them."
            )
            return
        self.app.display_info(f"rank-dataset: built the native kernels ({out.name})")
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag()}"
        if version != "editable":
            build_data["force_include"][str(out)] = f"rank_dataset/core/{name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
