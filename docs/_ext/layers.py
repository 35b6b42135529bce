"""A mkdocs hook: the development page's project layout, made from the import-linter contracts in
pyproject.toml and each sub-package's docstring, so the page cannot drift from what `make lint` holds.

The page writes ``<!-- layers -->`` where the layout goes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the docs extra installs tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- layers -->"


def render() -> str:
    """The layers, top to bottom, each with its modules and the first paragraph of its docstring."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = project["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")
    lines = ["```", "src/rank_dataset/        (each layer imports only the layers below it)"]
    for level in layers["layers"]:
        for package in level.split("|"):
            name = package.strip().removeprefix("rank_dataset.")
            folder = ROOT / "src" / "rank_dataset" / name
            is_package = folder.is_dir()  # a sub-package, or a module of its own (errors.py, cli.py)
            source = folder / "__init__.py" if is_package else folder.with_suffix(".py")
            doc = ast.get_docstring(ast.parse(source.read_text())) or ""
            # Sphinx roles as plain names: :class:`~a.b.C` -> C
            summary = re.sub(r":\w+:`~?([\w.]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], doc.split("\n\n")[0])
            summary = " ".join(summary.replace("``", "").split())
            modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__") if is_package else []
            modules += sorted(f"{p.parent.name}/" for p in folder.glob("*/__init__.py")) if is_package else []
            beside = "  (beside the other on its level)" if "|" in level else ""
            lines.append(f"  {name}/{beside}" if is_package else f"  {name}.py{beside}")
            lines += [f"      {chunk}" for chunk in _wrap(summary, 100)]
            lines += [f"      modules: {chunk}" for chunk in _wrap(", ".join(modules), 91)]
    lines += ["```", ""]
    for contract in contracts:
        if contract["type"] == "forbidden":
            sources = ", ".join(f"`{m}`" for m in contract["source_modules"])
            forbidden = ", ".join(f"`{m}`" for m in contract["forbidden_modules"])
            excepted = "".join(f" (except `{i}`)" for i in contract.get("ignore_imports", []))
            lines.append(f"- *{contract['name']}*: {sources} import none of {forbidden}{excepted}.")
        else:
            lines.append(f"- *{contract['name']}*.")
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*out, line] if line else out


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown
