"""The documentation site: every code example on its pages runs as written and prints what the page
shows, and its API reference covers exactly ``rank_dataset.__all__``. (``make docs`` builds the site
in strict mode: broken links and references fail there.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rank_dataset
from markdown_examples import Example, check_example, examples

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if not p.is_symlink() and "results" not in p.parts)
EXAMPLES = [e for page in PAGES for e in examples(page)]


@pytest.mark.slow  # each example a Python process, some of them DataLoaders: not in make test-quick
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name(DOCS) for e in EXAMPLES])
def test_example_runs_and_prints_what_the_page_shows(example: Example, tmp_path: Path) -> None:
    check_example(example, tmp_path, DOCS)


def test_pages_have_examples_that_run() -> None:
    runnable = [e for e in EXAMPLES if e.not_run is None]
    assert len(runnable) >= 10
    assert sum(e.output is not None for e in runnable) >= 8
    pages = {e.page.relative_to(DOCS).as_posix() for e in runnable}
    assert {"getting-started.md", "concepts/plan.md", "guides/meta-server.md", "guides/workers.md"} <= pages


def test_every_runnable_example_shows_its_output() -> None:
    # The README's rule, held on the pages its examples moved to: an example that runs shows what it prints.
    runnable = [e for e in EXAMPLES if e.not_run is None]
    assert sum('if __name__ == "__main__":' in e.code for e in runnable) >= 3
    for example in runnable:
        assert example.output is not None, f"{example.name(DOCS)} runs, but the page shows no output after it"


def test_api_reference_documents_exactly_the_public_names() -> None:
    documented = [
        m.group(1)
        for page in sorted((DOCS / "reference").glob("*.md"))
        for m in re.finditer(r"^::: rank_dataset\.(\w+)$", page.read_text(), flags=re.M)
    ]
    assert sorted(documented) == sorted(set(documented)), "a name is documented twice"
    assert set(documented) == set(rank_dataset.__all__)


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert page.relative_to(DOCS).as_posix() in nav, f"{page} is not in mkdocs.yml's nav"


def test_the_check_reads_outputs_and_markers_and_fails_on_a_wrong_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n```python\nprint('hi')\n```\n\nIt prints:\n\n```text\nhi\n```\n\n"
        "```python\nprint('no output block')\n```\n\n```sh\necho not text\n```\n\n"
        "<!-- not run: needs a GPU -->\n```python\nimport torch\ntorch.cuda.set_device(0)\n```\n"
        "```python\nprint('wrong')\n```\n```text\nright\n```\n"
    )
    first, second, gpu, wrong = examples(page)
    assert (first.line, first.code, first.output, first.not_run) == (3, "print('hi')\n", "hi\n", None)
    assert second.output is None  # the next fenced block is not a ```text block
    assert gpu.not_run == "needs a GPU" and gpu.output is None
    for example in (first, second, gpu):
        check_example(example, tmp_path, tmp_path)
    with pytest.raises(AssertionError, match="printed:\nwrong\n"):
        check_example(wrong, tmp_path, tmp_path)
    broken = Example(page, 1, "import nonexistent_module_xyz\n", None, None)
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        check_example(broken, tmp_path, tmp_path)
    with pytest.raises(SyntaxError):
        check_example(Example(page, 1, "def (:\n", None, "a fragment"), tmp_path, tmp_path)
    page.write_text("```python\nprint(1)\n")
    with pytest.raises(ValueError, match="unclosed ``` fence opened at line 1"):
        examples(page)
