"""The reader a :class:`~rank_dataset.training.dataset.RankDataset` reads through, made from what it was
given: ``reader="file"`` or ``"collective"`` with its meta files, or a reader object."""

from __future__ import annotations

import datetime
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rank_dataset.core.checks import UrlPath, with_storage
from rank_dataset.files.read.metafile import MetaFile
from rank_dataset.shards.reader import FileReader, ShardReader, columns_of, files_of
from rank_dataset.training._agree import check_ranks_agree
from rank_dataset.training._options import READER_NAMES, is_shard_reader

if TYPE_CHECKING:
    from rank_dataset.plan.sources import Source

__all__ = ["reader_for"]


def reader_for(
    meta_file: Any,
    reader: Any,
    columns: Sequence[str] | None,
    group: Any,
    timeout: datetime.timedelta | None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[ShardReader, Sequence[Source] | None, MetaFile | None]:
    """The reader RankDataset reads through (``reader``: a name, or the reader itself), the mix's
    sources (None: no mix), and the MetaFile, if the reader reads through one. Meta files that are
    objects carry ``storage_options`` (where a Source gave none of its own) and ``timeout``: the
    client's requests and retries take at most that long."""
    if not isinstance(reader, str):
        if storage_options is not None:
            raise ValueError(
                "storage_options= goes with reader='file' or 'collective': a reader object knows its files"
            )
        return _given_reader(reader, meta_file, columns, timeout)
    if reader not in READER_NAMES:
        raise ValueError(f"reader must be 'file', 'collective' or a ShardReader, got {reader!r}")
    if meta_file is None:
        raise TypeError("RankDataset needs meta_file (a path, a list of paths, a MetaFile or Sources)")
    sources = _sources_in(meta_file)
    for name, value in (("columns", columns), ("storage_options", storage_options)):
        if value is not None and (sources is not None or isinstance(meta_file, MetaFile)):
            where = f"give each Source its {name}=" if sources is not None else f"give the MetaFile its {name}="
            raise ValueError(f"{name}= applies to a path or a list of paths: {where}")
    paths: Sequence[str | os.PathLike[str]]
    if sources is not None:
        paths = files_of(sources)
    elif isinstance(meta_file, MetaFile):
        paths = meta_file.paths
    else:
        paths = _paths_of(meta_file)
    seconds = None if timeout is None else timeout.total_seconds()
    paths = [with_storage(p, storage_options, seconds) for p in paths]  # an object's URL: a UrlPath
    if timeout is not None and reader != "collective" and not any(isinstance(p, UrlPath) for p in paths):
        raise ValueError(
            "timeout applies to reader='collective' (its exchanges) and to meta files in object storage "
            "(their requests): the file reader over local files waits for nothing"
        )
    if isinstance(meta_file, MetaFile) and seconds is not None and reader != "collective":
        raise ValueError("timeout= with a MetaFile: give its paths instead (the MetaFile has opened its objects)")
    if reader == "collective":
        chosen: Sequence[tuple[str, ...] | None]
        if sources is not None:
            chosen = columns_of(sources)
        elif isinstance(meta_file, MetaFile):
            chosen = meta_file.columns
        else:
            from rank_dataset.plan.sources import column_names

            chosen = [None if columns is None else column_names(columns)] * len(paths)
        # On first use: a job on the file reader (and its DataLoader workers) never imports the exchange.
        from rank_dataset.shards.collective import CollectiveReader

        agree = functools.partial(_agree_files, paths=[os.fspath(p) for p in paths])
        collective = CollectiveReader(paths, sources, group=group, timeout=timeout, agree=agree, columns=chosen)
        return collective, sources, None  # no MetaFile: no index is read or written
    if isinstance(meta_file, MetaFile):
        meta = meta_file
    elif sources is None:
        meta = MetaFile(paths, columns=columns)
    else:  # one MetaFile of the distinct files: each indexed once, read once per shard
        meta = MetaFile.from_files(paths, columns_of(sources))
    return FileReader(meta, sources), sources, meta


def _sources_in(meta_file: Any) -> tuple[Source, ...] | None:
    """``meta_file`` as Sources (see :func:`~rank_dataset.plan.sources.as_sources`): None, without importing
    their module, where it is not imported yet. A Source exists only once its module is (its class is
    there), so then ``meta_file`` holds none: a job over plain files plans no mix."""
    if "rank_dataset.plan.sources" not in sys.modules:
        return None
    from rank_dataset.plan.sources import as_sources

    return as_sources(meta_file)


def _given_reader(
    reader: Any, meta_file: Any, columns: Any, timeout: Any
) -> tuple[ShardReader, Sequence[Source] | None, MetaFile | None]:
    """A reader object given as ``reader=``: it, its sources (for a mix) and its MetaFile (if it has one)."""
    if not is_shard_reader(reader):
        raise TypeError(f"reader must be 'file', 'collective' or a ShardReader, got {reader!r}")
    for name, value in (("meta_file", meta_file), ("columns", columns), ("timeout", timeout)):
        if value is not None:
            raise ValueError(f"{name}= goes with reader='file' or 'collective': a reader object knows its files")
    sources = getattr(reader, "sources", None)
    if sources is None and reader.source_sizes is not None:
        raise ValueError(
            "this reader reads a mix whose sources it does not tell: give the sources as meta_file with "
            "reader='file' or 'collective'"
        )
    meta = getattr(reader, "meta", None)
    return reader, sources, meta if isinstance(meta, MetaFile) else None


def _paths_of(meta_file: Any) -> list[str | os.PathLike[str]]:
    """The paths of meta files given as a path or a list of paths."""
    if isinstance(meta_file, (str, os.PathLike)):
        return [meta_file]
    if isinstance(meta_file, Sequence) and all(isinstance(p, (str, os.PathLike)) for p in meta_file):
        return list(meta_file)
    raise TypeError(f"meta_file must be a path, a list of paths, a MetaFile or Sources, got {meta_file!r}")


def _agree_files(fields: Mapping[str, object], group: Any, paths: Sequence[str] = ()) -> None:
    """The ranks' agreement on the files, before the collective reader's first collective over them (a
    disagreement names the ``paths`` each rank reads)."""
    check_ranks_agree(fields, None, group, context={"paths": list(paths)})
