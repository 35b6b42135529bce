"""The formats a meta file may be in, and the detection of a file's format by its content (its first
bytes, and for Parquet its last four), never by its name.

A new format is a module with a :class:`~rank_dataset.files.formats.base.Format` and a line in
:data:`_BUILT_IN`; :func:`register` adds one at run time. A format pickles as its name, looked up here.

A built-in format's module is imported on first use: where a file's first bytes start with one of its magics
(the table's), or where it is asked for by name or code. A built-in format recognises, and refuses as cut
short, only a file that starts with one of its magics: a text file imports none of their codecs.
"""

from __future__ import annotations

import copyreg
import functools
import importlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rank_dataset.files.formats.base import Format
from rank_dataset.files.formats.text import TEXT
from rank_dataset.files.io import ByteSource, LocalFile

if TYPE_CHECKING:
    from rank_dataset.files.formats.gzip import GZIP
    from rank_dataset.files.formats.parquet import PARQUET
    from rank_dataset.files.formats.zstd import ZSTD

__all__ = [
    "GZIP",
    "PARQUET",
    "TEXT",
    "ZSTD",
    "by_code",
    "by_name",
    "detect_path",
    "detect_source",
    "formats",
    "refuse_cut_source",
    "register",
    "unregister",
]

_HEAD = 8  # first bytes read to tell a format
_CUT_HEAD = 1 << 16  # first bytes read to tell a file cut short
#: The built-in formats but text, in the order detection asks them: (module, its format's name there, the
#: first bytes of every file of it). zstd's: a frame's magic, or a skippable frame's (0x184D2A50-5F).
_ZSTD_MAGICS = (b"\x28\xb5\x2f\xfd", *(bytes([k]) + b"\x2a\x4d\x18" for k in range(0x50, 0x60)))
_BUILT_IN: tuple[tuple[str, str, tuple[bytes, ...]], ...] = (
    ("rank_dataset.files.formats.gzip", "GZIP", (b"\x1f\x8b",)),
    ("rank_dataset.files.formats.zstd", "ZSTD", _ZSTD_MAGICS),
    ("rank_dataset.files.formats.parquet", "PARQUET", (b"PAR1",)),
)
_registered: list[Format] = []  # asked first, the last registered first; text, which recognises anything, last


def _by_name(fmt: Format) -> tuple[Callable[[str], Format], tuple[str]]:
    return by_name, (fmt.value,)


@functools.cache
def _built_in(module: str, name: str) -> Format:
    """The built-in format ``name`` of ``module``, imported now (pickled by its name from then on)."""
    fmt: Format = getattr(importlib.import_module(module), name)
    copyreg.pickle(type(fmt), _by_name)
    return fmt


def _asked(head: bytes | None) -> Iterator[Format]:
    """The formats but text in the order detection asks them: the registered ones, then the built-ins (with
    ``head``, only those whose magic it starts with)."""
    yield from list(_registered)
    for module, name, magics in _BUILT_IN:
        if head is None or head.startswith(magics):
            yield _built_in(module, name)


def formats() -> tuple[Format, ...]:
    """Every format, in the order detection asks them (text last)."""
    return (*_asked(None), TEXT)


def by_name(name: str) -> Format:
    """The format named ``name`` (its ``value``).

    Raises:
        ValueError: no format has that name.
    """
    for fmt in itertools.chain((TEXT,), _asked(None)):  # text first: a text file's imports no other format
        if fmt.value == name:
            return fmt
    raise ValueError(f"no meta file format is named {name!r}")


def by_code(code: int) -> Format | None:
    """The format numbered ``code`` in an index cache's header; None if none is."""
    return next((fmt for fmt in itertools.chain((TEXT,), _asked(None)) if fmt.code == code), None)


def register(fmt: Format) -> None:
    """Add ``fmt``, asked before the formats registered earlier but text.

    Raises:
        ValueError: its name or code is another format's, or its name is not 1-8 ASCII characters.
    """
    if not (fmt.value.isascii() and 1 <= len(fmt.value) <= 8) or fmt.code < 0:
        raise ValueError(f"a format needs a name of 1-8 ASCII characters and a code >= 0: {fmt.value!r}, {fmt.code}")
    for other in formats():
        if other.value == fmt.value or other.code == fmt.code:
            raise ValueError(f"format {fmt.value!r} (code {fmt.code}) clashes with {other.value!r} (code {other.code})")
    _registered.insert(0, fmt)
    copyreg.pickle(type(fmt), _by_name)


def unregister(fmt: Format) -> None:
    """Undo :func:`register` of ``fmt`` (a built-in format stays)."""
    if fmt in _registered:
        _registered.remove(fmt)


@dataclass(frozen=True)
class _Found:
    """The bytes of a file that tell its format (a :class:`~.base.Recognised`), read from ``source``
    (an object's: a few ranged reads, not the whole object)."""

    source: ByteSource
    head: bytes

    @property
    def size(self) -> int:
        return self.source.size

    def tail(self, n: int) -> bytes:
        n = min(n, self.size)
        return self.source.read(self.size - n, n)


def detect_source(source: ByteSource) -> Format:
    """The format of the bytes of ``source`` (a local file or an object), from its first bytes (and, for
    Parquet, its last four)."""
    found = _Found(source, source.read(0, min(_HEAD, source.size)))
    return next((fmt for fmt in _asked(found.head) if fmt.recognise(found)), TEXT)


def refuse_cut_source(path: Path, source: ByteSource, fmt: Format) -> None:
    """Raise CorruptMetaFileError if ``source``, told as ``fmt``, is text only because it is a file of
    another format cut short (see :meth:`~rank_dataset.files.formats.base.Format.refuse_cut`)."""
    if fmt is not TEXT:
        return
    head = source.read(0, min(_CUT_HEAD, source.size))
    for other in _asked(head):
        other.refuse_cut(path, head, source.size)


def detect_path(path: str | os.PathLike[str]) -> Format:
    """The format of the local file at ``path`` (see :func:`detect_source`)."""
    with LocalFile(Path(path)) as source:
        return detect_source(source)


_text: Format = TEXT
copyreg.pickle(type(_text), _by_name)

_LAZY = {name: module for module, name, _ in _BUILT_IN}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Format:
        """``GZIP``, ``ZSTD``, ``PARQUET``: a built-in format, its module imported on first use."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return _built_in(module, name)
