"""Line parsers: ``None`` (the line as str), ``"json"``, ``"label"``, or any callable taking the str."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["Parser", "parse_json", "parse_label", "parse_line", "quote", "resolve_parser"]

Parser = Callable[[str], Any]


class LineError(ValueError):
    """A line that its parser rejects; the dataset adds the file and line number."""


def parse_line(parser: Parser | None, text: str, where: Callable[[], str]) -> Any:
    """``parser(text)`` (``text`` itself without a parser); a :class:`LineError` becomes a
    ``ValueError`` headed by ``where()``, which is called only then (it may read a file to find the
    line's number, and a per-item f-string is not free on the hot path).
    """
    if parser is None:
        return text
    try:
        return parser(text)
    except LineError as exc:
        raise ValueError(f"{where()}: {exc}") from None


_QUOTED = 200  # characters of a line an error message quotes at most


def quote(text: str) -> str:
    """``repr`` of ``text``, cut to its first 200 characters (and saying how long it is) when longer:
    a message about a 10 MB line stays short.

    Example:
        >>> quote("a" * 300)[-25:]
        "aaaa'... (300 characters)"
    """
    if len(text) <= _QUOTED:
        return repr(text)
    return f"{text[:_QUOTED]!r}... ({len(text):,} characters)"


def parse_label(line: str) -> tuple[str, int]:
    """Split ``"path/to/img.JPEG 3"`` at its last run of whitespace into ``(path, 3)``.

    Examples:
        >>> parse_label("train/n01440764/my image.JPEG  3")
        ('train/n01440764/my image.JPEG', 3)
    """
    parts = line.rsplit(None, 1)
    if len(parts) != 2:
        raise LineError(f"expected '<path> <integer label>', got {quote(line)}")
    path, label = parts
    try:
        return path, int(label)
    except ValueError:
        raise LineError(f"label {quote(label)} is not an integer in line {quote(line)}") from None


def parse_json(line: str) -> Any:
    """``json.loads`` of the line.

    Examples:
        >>> parse_json('{"path": "a.jpg", "label": 1}')
        {'path': 'a.jpg', 'label': 1}
    """
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise LineError(f"invalid JSON ({exc.msg} at column {exc.colno}): {quote(line)}") from None


_BY_NAME: dict[str, Parser] = {"json": parse_json, "label": parse_label}


def resolve_parser(parser: str | Parser | None) -> Parser | None:
    """The parser function for ``parser``: None, ``"json"``, ``"label"`` or a callable."""
    if parser is None or callable(parser):
        return parser
    if isinstance(parser, str) and parser in _BY_NAME:
        return _BY_NAME[parser]
    raise ValueError(f"parser must be None, 'json', 'label' or a callable taking a str, got {parser!r}")
