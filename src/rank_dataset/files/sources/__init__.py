"""Where meta files' bytes come from: :class:`Source`, the seam; :class:`LocalFile`, a file on a
local or network file system identified by its :class:`FileKey`; and :class:`ObjectFile`, an object in
S3, GCS, Azure or on an HTTP server, identified by its :class:`ObjectKey` (size and ETag), read with
ranged GETs through obstore (the cloud extra, imported only when an object is read). No torch.
"""

from __future__ import annotations

from rank_dataset.files._pread import ShortRead
from rank_dataset.files.sources.base import STREAM_BLOCK, Source
from rank_dataset.files.sources.local import FileKey, LocalFile, raise_if_changed, read_exact
from rank_dataset.files.sources.object import ObjectFile, ObjectKey, UrlPath, is_url

__all__ = [
    "STREAM_BLOCK",
    "FileKey",
    "LocalFile",
    "ObjectFile",
    "ObjectKey",
    "ShortRead",
    "Source",
    "UrlPath",
    "is_url",
    "raise_if_changed",
    "read_exact",
]
