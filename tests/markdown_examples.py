"""The Python examples of a Markdown page (the README, the docs), and running one as a script.

An example is a fenced ```python block. If the next fenced block on the page is a ```text block, it is
the example's printed output. A block that cannot run here (it needs a GPU, another node, a server
elsewhere) says so on the line right before its fence, invisibly on the rendered page:
``<!-- not run: needs a CUDA device -->``; such a block is only compiled.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Example", "check_example", "examples", "run_example"]

_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, its code, the output it must print, and why it is not run."""

    page: Path
    line: int  # the line of the opening fence, counted from 1
    code: str
    output: str | None  # the ```text block that follows it, if the next fenced block is one
    not_run: str | None  # the reason given by a <!-- not run: ... --> line right before the fence

    def name(self, root: Path) -> str:
        return f"{self.page.relative_to(root).as_posix()}:{self.line}"


def _blocks(text: str) -> list[tuple[str, int, str, str]]:
    """Each top-level fenced block: its language, the line of its fence, its text, the line before the fence."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"unclosed ``` fence opened at line {start + 1}")
        blocks.append((opening.group(1), start + 1, "\n".join(lines[start + 1 : i]) + "\n", before))
        i += 1
    return blocks


def examples(page: Path) -> list[Example]:
    """The ```python blocks of ``page``, in order."""
    try:
        blocks = _blocks(page.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{page}: {error}") from None
    found = []
    for k, (lang, line, code, before) in enumerate(blocks):
        if lang != "python":
            continue
        following = blocks[k + 1] if k + 1 < len(blocks) else None
        output = following[2] if following is not None and following[0] == "text" else None
        marker = _NOT_RUN.match(before)
        found.append(Example(page, line, code, output, marker.group(1) if marker else None))
    return found


def run_example(example: Example, cwd: Path, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the example as a script in ``cwd``, as a user would (``python example.py``)."""
    script = cwd / "example.py"
    script.write_text(example.code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def check_example(example: Example, cwd: Path, root: Path) -> None:
    """Compile a not-run example; run any other one, which must exit 0 and print its ```text block."""
    where = example.name(root)
    if example.not_run is not None:
        compile(example.code, where, "exec")
        return
    out = run_example(example, cwd)
    assert out.returncode == 0, f"{where} failed:\n{out.stderr}"
    if example.output is not None:
        assert out.stdout == example.output, f"{where} printed:\n{out.stdout}\nthe page says:\n{example.output}"
