"""What import-linter (pyproject's contracts, run by ``make lint``) cannot see: no module imports
another sub-package's private module or private name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rank_dataset

PACKAGE = Path(rank_dataset.__file__).parent


def _room(module: str) -> str:
    """The sub-package a module is in (``files`` for ``rank_dataset.files.index``); ``""`` at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else ""


def _is_module(dotted: str) -> bool:
    path = PACKAGE.joinpath(*dotted.split(".")[1:])
    return path.is_dir() or path.with_suffix(".py").exists()


def crossings(importer: str, source: str) -> list[str]:
    """The imports in ``source`` (the text of module ``importer``) of another room's private names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            pairs = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(alias.name, "") for alias in node.names]
        else:
            continue
        for module, name in pairs:
            if module.split(".")[0] != "rank_dataset":
                continue
            if name and _is_module(f"{module}.{name}"):  # `from package import module`
                module, name = f"{module}.{name}", ""
            if _room(module) == _room(importer):
                continue
            private = [part for part in [*module.split(".")[1:], name] if part.startswith("_")]
            if private:
                found.append(f"line {node.lineno}: {importer} imports {module} {name}".rstrip())
    return found


def test_no_module_imports_another_sub_packages_private_names() -> None:
    bad = []
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 40
    for path in sources:
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        bad += crossings(".".join(parts), path.read_text())
    assert not bad, "private names imported across sub-packages:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "crossing"),
    [
        ("from rank_dataset.files._pread import pread_exact", True),  # another room's private module
        ("from rank_dataset.files.index import _cache_paths", True),  # another room's private name
        ("from rank_dataset.files import _pread", True),  # a private module, from its package
        ("import rank_dataset.files._pread", True),
        ("from rank_dataset.shards._control import ControlBlock", False),  # its own room's
        ("from rank_dataset.plan.spec import ShardSpec", False),
        ("from rank_dataset.core.checks import check_int", False),
    ],
)
def test_the_check_sees_a_crossing(source: str, crossing: bool) -> None:
    assert bool(crossings("rank_dataset.shards.channel", source)) is crossing
