"""Where meta files' bytes come from: :class:`ByteSource`, the seam, and :func:`open_source`, the one
place that tells an object's URL from a local path; :class:`LocalFile`, a file on a local or network
file system identified by its :class:`FileKey`; and :class:`ObjectFile`, an object in S3, GCS, Azure
or on an HTTP server, identified by its :class:`ObjectKey` (URL, size and ETag), read with ranged GETs
through obstore (the cloud extra, imported only when an object is read). :func:`register_scheme`
adds a store.

:class:`ObjectFile` is a lazy name: its module is imported on first use, so a job over local files
imports no object storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rank_dataset.core.checks import UrlPath
from rank_dataset.files.io.base import (
    ENDS,
    STREAM_BLOCK,
    ByteSource,
    FileKey,
    ObjectKey,
    SourceKey,
    hash_ends,
    read_ends,
)
from rank_dataset.files.io.local import LocalFile, raise_if_changed, read_exact
from rank_dataset.files.io.pread import ShortRead
from rank_dataset.files.io.registry import SourceFactory, is_url, open_source, register_scheme

if TYPE_CHECKING:
    from rank_dataset.files.io.object import ObjectFile

__all__ = [
    "ENDS",
    "STREAM_BLOCK",
    "ByteSource",
    "FileKey",
    "LocalFile",
    "ObjectFile",
    "ObjectKey",
    "ShortRead",
    "SourceFactory",
    "SourceKey",
    "UrlPath",
    "hash_ends",
    "is_url",
    "open_source",
    "raise_if_changed",
    "read_ends",
    "read_exact",
    "register_scheme",
]


def __getattr__(name: str) -> Any:
    """``ObjectFile``, imported on first use (see the package's docstring)."""
    if name == "ObjectFile":
        from rank_dataset.files.io.object import ObjectFile

        return ObjectFile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
