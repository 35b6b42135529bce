"""Meta files in object storage, for the collective reader: one HEAD per object a job (by rank 0),
told to every rank with the object's format, so that every rank's GETs are pinned to the same ETag
and no rank asks the store anything at the making but its own slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rank_dataset.core.checks import UrlPath
from rank_dataset.files.formats import Format, by_name, detect_source, refuse_cut_source
from rank_dataset.files.io import SourceKey, open_source
from rank_dataset.shards.collective._dist import Collectives, from_rank0

__all__ = ["shared_objects"]


def shared_objects(net: Collectives, paths: Sequence[Path]) -> dict[int, tuple[SourceKey, Format]]:
    """For each path that is an object's URL (by its number): the key it is read under and its format,
    from rank 0's one HEAD (and first bytes), sent to every rank (or the error rank 0 met, raised on
    every rank: a missing object, a missing bucket, credentials refused, naming the URL and status).
    """
    urls = [i for i, p in enumerate(paths) if isinstance(p, UrlPath)]  # as meta_path makes them
    if not urls:
        return {}

    def heads() -> list[tuple[SourceKey, str]]:
        got = []
        for i in urls:
            source = open_source(paths[i])
            fmt = detect_source(source)
            refuse_cut_source(paths[i], source, fmt)
            got.append((source.key, fmt.value))
        return got

    keys = from_rank0(net, heads, "the objects' keys", (OSError, ValueError, ImportError, RuntimeError))
    return {i: (key, by_name(fmt_name)) for i, (key, fmt_name) in zip(urls, keys)}
