"""A griffe extension for the API reference: Sphinx roles in docstrings shown as code.

Some docstrings name other objects Sphinx-style (``:class:`~rank_dataset.plan.sources.Source```,
``:meth:`state_dict```). mkdocstrings reads Markdown, where such a role would show as literal
``:class:`` text; this shows the name as inline code instead (``~`` keeps its last component, as
Sphinx does). The docstrings themselves stay as they are for ``help()`` and editors.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`(~?)([^`]+)`")


def _name(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class RstRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring that griffe loads, before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_name, obj.docstring.value)
