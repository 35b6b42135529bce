"""What import-linter (pyproject's contracts, run by ``make lint``) cannot see: no import cycle between the
package's modules (module level, under ``TYPE_CHECKING`` and inside functions alike), no module importing another
module's private name, and a private module imported only from inside its own package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rank_dataset

PACKAGE = Path(rank_dataset.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(importer: str, source: str, modules: set[str]) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for each import of the package in ``source`` (the text of module ``importer``):
    ``name`` is ``""`` where the import names a module, else the name taken from ``module``."""
    found = []
    package = importer if f"{importer}.__init__" in modules else importer.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                dotted = f"{base}.{alias.name}"
                found.append((node.lineno, dotted, "") if dotted in modules else (node.lineno, base, alias.name))
    return [item for item in found if item[1].split(".")[0] == "rank_dataset"]


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def violations(importer: str, source: str, modules: set[str]) -> list[str]:
    """The imports in ``source`` of another module's private name, or of a private module from outside the
    package that holds it."""
    bad = []
    for line, module, name in imports(importer, source, modules):
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
            bad.append(f"line {line}: {importer} imports the private name {name} of {module}")
            continue
        # The innermost private part of the imported module's path, and the package that holds it.
        parts = module.split(".")
        private = [i for i in range(1, len(parts)) if parts[i].startswith("_")]
        if private:
            owner = ".".join(parts[: private[-1]])
            if importer != owner and not importer.startswith(owner + "."):
                bad.append(f"line {line}: {importer} imports {module}, private to {owner}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    names = set(modules) | {f"{m}.__init__" for m, p in modules.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, target, _ in imports(module, path.read_text(), names):
            if target in graph and target != module:
                graph[module].add(target)
    assert len(graph) > 40
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_another_modules_private_names() -> None:
    modules = _modules()
    names = set(modules) | {f"{m}.__init__" for m, p in modules.items() if p.name == "__init__.py"}
    bad = []
    for module, path in modules.items():
        bad += violations(module, path.read_text(), names)
    assert not bad, "private names imported:\n" + "\n".join(bad)


MODULES = {
    "rank_dataset.files",
    "rank_dataset.files.__init__",
    "rank_dataset.files.io",
    "rank_dataset.files.io.__init__",
    "rank_dataset.files.io._pread",
    "rank_dataset.files.index",
    "rank_dataset.shards",
    "rank_dataset.shards.__init__",
    "rank_dataset.shards._control",
    "rank_dataset.shards.channel",
}


@pytest.mark.parametrize(
    ("importer", "source", "bad"),
    [
        ("rank_dataset.shards.channel", "from rank_dataset.files.io._pread import pread_exact", True),
        ("rank_dataset.shards.channel", "from rank_dataset.files.index import _cache_paths", True),
        ("rank_dataset.files.index", "from rank_dataset.files.io import _pread", True),  # not its package
        ("rank_dataset.shards.channel", "import rank_dataset.files.io._pread", True),
        ("rank_dataset.files.io", "from rank_dataset.files.io._pread import pread_exact", False),  # its own
        ("rank_dataset.files.io", "from . import _pread", False),
        ("rank_dataset.shards.channel", "from rank_dataset.shards._control import ControlBlock", False),
        ("rank_dataset.shards.channel", "from ._control import _Header", True),  # a private name, even there
        ("rank_dataset.shards.channel", "from rank_dataset.files.index import Index", False),
    ],
)
def test_the_check_sees_a_private_import(importer: str, source: str, bad: bool) -> None:
    assert bool(violations(importer, source, MODULES)) is bad


def test_the_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
