"""The README's examples run as written and print what the README shows; its quickstart names the real
make targets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from markdown_examples import Example, check_example, examples, run_example

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLES = examples(README)
LOOP = next(e for e in EXAMPLES if "set_epoch(epoch, mini)" in e.code)
# A complete program runs and shows its output after it; a fragment (a client of a server elsewhere, a
# two-node job) is compiled.
PROGRAMS = [e for e in EXAMPLES if 'if __name__ == "__main__":' in e.code and e.not_run is None]


def test_training_loop_example_runs(tmp_path: Path) -> None:
    out = run_example(LOOP, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"epoch {e} mini-epoch {m}: 5000 samples on this rank" for e in range(2) for m in range(2)
    ]


def test_every_runnable_example_shows_its_output() -> None:
    assert len(PROGRAMS) >= 3
    for example in PROGRAMS:
        assert example.output is not None, f"{example.name(ROOT)} prints, but the README shows no output after it"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e is not LOOP], ids=lambda e: e.name(ROOT))
def test_every_runnable_example_prints_what_the_readme_shows(example: Example, tmp_path: Path) -> None:
    if example not in PROGRAMS:
        example = Example(example.page, example.line, example.code, None, "a fragment")
    check_example(example, tmp_path, ROOT)


def test_quickstart_targets_exist() -> None:
    makefile = (README.parent / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README.read_text()
        assert re.search(rf"^{target}:", makefile, flags=re.M)
