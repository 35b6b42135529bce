"""The README's examples run as written and print what the README shows; its quickstart names the real
make targets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from markdown_examples import Example, check_example, examples

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = examples(README)
LOOP = next(e for e in EXAMPLES if "set_epoch(epoch, mini)" in e.code)
# A complete program runs and shows its output after it; a fragment (a client of a server elsewhere, a
# two-node job) is compiled.
PROGRAMS = [e for e in EXAMPLES if 'if __name__ == "__main__":' in e.code and e.not_run is None]


def test_training_loop_example_shows_one_rank_reading_its_half_each_mini_epoch() -> None:
    # The README's output block is itself right: 10,000 samples, 2 mini-epochs, one rank.
    assert LOOP.output is not None
    assert LOOP.output.splitlines() == [
        f"epoch {e} mini-epoch {m}: 5000 samples on this rank" for e in range(2) for m in range(2)
    ]


def test_every_runnable_example_shows_its_output() -> None:
    assert PROGRAMS, "the README has no complete example program"
    for example in PROGRAMS:
        assert example.output is not None, f"{example.name(ROOT)} prints, but the README shows no output after it"


@pytest.mark.slow  # each example a Python process, some of them DataLoaders: not in make test-quick
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name(ROOT))
def test_every_example_prints_what_the_readme_shows(example: Example, tmp_path: Path) -> None:
    if example not in PROGRAMS:
        example = Example(example.page, example.line, example.code, None, "a fragment")
    check_example(example, tmp_path, ROOT)


def test_readme_is_a_front_page() -> None:
    # The details live on the documentation site; the README points there.
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make docs" in text and "site/index.html" in text


def test_quickstart_targets_exist() -> None:
    makefile = (README.parent / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README.read_text()
        assert re.search(rf"^{target}:", makefile, flags=re.M)


def test_readme_links_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to no documentation page"
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert not missing, f"the README links to files that do not exist: {missing}"
