"""The index of a meta file in object storage (text, gzip, zstd and Parquet): built by one streaming
pass, cached locally, never in the bucket; a Parquet object's from its footer. (An object's bytes are
read by :class:`~rank_dataset.files.read.file.ObjectBytes`.)

An object's index is cached under the user cache directory (or ``RANK_DATASET_CACHE_DIR``), named by
a hash of its :class:`~rank_dataset.files.io.ObjectKey` (URL, size, ETag), one process a node building it
while the others wait.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from rank_dataset.core.checks import UrlPath
from rank_dataset.files.formats import detect_source, refuse_cut_source, source_rows
from rank_dataset.files.index._build import cached_index, index_in_memory
from rank_dataset.files.index._cachefile import Index
from rank_dataset.files.index.cache import CACHE_DIR_ENV
from rank_dataset.files.io import ByteSource, SourceKey, hash_ends

__all__ = ["load_object_index", "object_cache_path"]


def object_cache_path(url: str, key: SourceKey) -> Path:
    """Where the index of the object ``url`` (``key``: its URL, size and ETag) is cached on this node."""
    name = f"{UrlPath(url).name}.{key.size}.{key.digest().hex()[:32]}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override) / name
    from platformdirs import user_cache_dir  # on first use, as for a local file's index

    return Path(user_cache_dir("rank-dataset")) / "objects" / name


def load_object_index(
    source: ByteSource, *, distrust: Index | None = None, columns: Sequence[str] | None = None
) -> Index:
    """The index of the object ``source``: from this node's cache, else built by one streaming pass (one
    process builds while the others wait) and cached (in memory where no cache is writable). ``distrust``:
    as for :func:`~rank_dataset.files.index.load.load_index`.

    Raises:
        FileNotFoundError, PermissionError, OSError: the object cannot be had (naming URL and status).
        ValueError: ``columns`` for an object that is not Parquet, or naming a column a Parquet
            object lacks (or a nested or binary one).
        ImportError: a Parquet object without pyarrow.
        MetaFileChangedError: it was replaced while it was being indexed.
    """
    path = source.path
    fmt = detect_source(source)
    if fmt.rows:  # its index is its footer's (a GET or two, not cached: as a local Parquet file's)
        ends_hash = hash_ends(source)
        rows = source_rows(source, columns)
        return Index(source.key, ends_hash, len(rows), False, None, None, fmt, parquet=rows.layout)
    if columns is not None:
        raise ValueError(f"columns= picks the columns of a Parquet meta file, and {path} is {fmt.value}")
    refuse_cut_source(path, source, fmt)  # type: ignore[arg-type]
    key = source.key
    ends_hash = hash_ends(source)
    cache = object_cache_path(str(path), key)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        return cached_index([cache], path, source, key, ends_hash, distrust=distrust)  # type: ignore[arg-type]
    except OSError:  # no writable cache directory: the lock cannot be taken either
        return index_in_memory(path, source, key, ends_hash)  # type: ignore[arg-type]
