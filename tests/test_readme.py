"""The README's examples run as written and print what the README shows; its quickstart names the real
make targets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_training_loop_example_runs(tmp_path: Path) -> None:
    example = next(b for b in python_blocks() if "set_epoch(epoch, mini)" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"epoch {e} mini-epoch {m}: 5000 samples on this rank" for e in range(2) for m in range(2)
    ]


def runnable_examples() -> list[tuple[str, list[str] | None]]:
    """Each runnable example, with the output the README shows right after it (None: it shows none)."""
    found = re.findall(
        r"```python\n(.*?)```\n(?:\s*Its output[^\n]*:\s*\n\s*```text\n(.*?)```)?", README.read_text(), flags=re.S
    )
    return [(code, out.splitlines() if out else None) for code, out in found if 'if __name__ == "__main__":' in code]


def test_every_runnable_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    runnable = runnable_examples()
    assert len(runnable) >= 3
    for i, (block, shown) in enumerate(runnable):
        script = tmp_path / f"example_{i}.py"
        script.write_text(block)
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"example {i}:\n{block}\n{out.stderr}"
        assert shown is not None, f"example {i} prints {out.stdout!r}, but the README shows no output after it"
        assert out.stdout.splitlines() == shown, f"example {i}:\n{block}"


def test_quickstart_targets_exist() -> None:
    makefile = (README.parent / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README.read_text()
        assert re.search(rf"^{target}:", makefile, flags=re.M)
