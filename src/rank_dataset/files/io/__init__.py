"""Where meta files' bytes come from: :class:`ByteSource`, the seam; :class:`LocalFile`, a file on a
local or network file system identified by its :class:`FileKey`; and :class:`ObjectFile`, an object in
S3, GCS, Azure or on an HTTP server, identified by its :class:`ObjectKey` (size and ETag), read with
ranged GETs through obstore (the cloud extra, imported only when an object is read).

:class:`ObjectFile` and :class:`ObjectKey` are lazy names: their module is imported on first use, so a
job over local files imports no object storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rank_dataset.core.checks import UrlPath, is_url
from rank_dataset.files.io.base import ENDS, STREAM_BLOCK, ByteSource, hash_ends, read_ends
from rank_dataset.files.io.local import FileKey, LocalFile, raise_if_changed, read_exact
from rank_dataset.files.io.pread import ShortRead

if TYPE_CHECKING:
    from rank_dataset.files.io.object import ObjectFile, ObjectKey

__all__ = [
    "ENDS",
    "STREAM_BLOCK",
    "ByteSource",
    "FileKey",
    "LocalFile",
    "ObjectFile",
    "ObjectKey",
    "ShortRead",
    "UrlPath",
    "hash_ends",
    "is_url",
    "raise_if_changed",
    "read_ends",
    "read_exact",
]


def __getattr__(name: str) -> Any:
    """``ObjectFile`` and ``ObjectKey``, imported on first use (see the package's docstring)."""
    if name in ("ObjectFile", "ObjectKey"):
        from rank_dataset.files.io import object as _object

        return getattr(_object, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
