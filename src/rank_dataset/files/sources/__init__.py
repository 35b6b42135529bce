"""Where meta files' bytes come from: :class:`Source`, the seam, and :class:`LocalFile`, a file on a
local or network file system identified by its :class:`FileKey`. No torch.

An object store is the next source (an ETag as its identity): the formats and readers above read
through a ``Source`` and do not know which.
"""

from __future__ import annotations

from rank_dataset.files._pread import ShortRead
from rank_dataset.files.sources.base import STREAM_BLOCK, Source
from rank_dataset.files.sources.local import FileKey, LocalFile, raise_if_changed, read_exact

__all__ = ["STREAM_BLOCK", "FileKey", "LocalFile", "ShortRead", "Source", "raise_if_changed", "read_exact"]
