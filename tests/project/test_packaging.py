"""Package metadata: py.typed ships beside the code, the supported versions agree, each version is in the changelog."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import rank_dataset

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli is what became tomllib (a dev dependency on 3.10)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_py_typed_ships_with_the_package() -> None:
    package = Path(rank_dataset.__file__).parent
    assert (package / "py.typed").is_file()
    assert PROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/rank_dataset"]
    assert "Typing :: Typed" in PROJECT["project"]["classifiers"]


def test_supported_versions_are_declared_and_agree() -> None:
    project = PROJECT["project"]
    low = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert low is not None
    minor = int(low.group(1))
    listed = sorted(
        int(c.rsplit(".", 1)[1])
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert listed and listed[0] == minor and listed == list(range(minor, listed[-1] + 1))
    assert PROJECT["tool"]["ruff"]["target-version"] == f"py3{minor}"
    assert PROJECT["tool"]["mypy"]["python_version"] == f"3.{minor}"
    assert any(re.fullmatch(r"torch>=\d+\.\d+", d.split("#")[0].strip()) for d in project["dependencies"])
    assert project["keywords"]


def test_changelog_has_the_current_version_and_an_unreleased_section() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, flags=re.M)
    assert headings[0] == "Unreleased"
    assert PROJECT["project"]["version"] in headings


def test_the_installed_version_is_the_projects() -> None:
    assert rank_dataset.__version__ == PROJECT["project"]["version"]
