"""The reader a :class:`~rank_dataset.training.dataset.RankDataset` reads through, made from what it was
given: ``reader="file"`` or ``"collective"`` with its meta files, or a reader object."""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rank_dataset.files.metafile import MetaFile
from rank_dataset.plan.sources import Source, as_sources, column_names
from rank_dataset.shards.collective import CollectiveReader
from rank_dataset.shards.reader import FileReader, ShardReader, columns_of, files_of
from rank_dataset.training._agree import check_ranks_agree
from rank_dataset.training._options import READER_NAMES, is_shard_reader

__all__ = ["reader_for"]


def reader_for(
    meta_file: Any, reader: Any, columns: Sequence[str] | None, group: Any, timeout: datetime.timedelta | None
) -> tuple[ShardReader, Sequence[Source] | None, MetaFile | None]:
    """The reader RankDataset reads through (``reader``: a name, or the reader itself), the mix's
    sources (None: no mix), and the MetaFile, if the reader reads through one."""
    if not isinstance(reader, str):
        return _given_reader(reader, meta_file, columns, timeout)
    if reader not in READER_NAMES:
        raise ValueError(f"reader must be 'file', 'collective' or a ShardReader, got {reader!r}")
    if meta_file is None:
        raise TypeError("RankDataset needs meta_file (a path, a list of paths, a MetaFile or Sources)")
    if timeout is not None and reader != "collective":
        raise ValueError("timeout applies to reader='collective' only (the file reader runs no exchange)")
    sources = as_sources(meta_file)
    if columns is not None and (sources is not None or isinstance(meta_file, MetaFile)):
        where = "give each Source its columns=" if sources is not None else "give the MetaFile its columns="
        raise ValueError(f"columns= applies to a path or a list of paths: {where}")
    if reader == "collective":
        paths: Sequence[str | os.PathLike[str]]
        chosen: Sequence[tuple[str, ...] | None]
        if sources is not None:
            paths, chosen = files_of(sources), columns_of(sources)
        elif isinstance(meta_file, MetaFile):
            paths, chosen = meta_file.paths, meta_file.columns
        else:
            paths = _paths_of(meta_file)
            chosen = [None if columns is None else column_names(columns)] * len(paths)
        agree = functools.partial(_agree_files, paths=[os.fspath(p) for p in paths])
        collective = CollectiveReader(paths, sources, group=group, timeout=timeout, agree=agree, columns=chosen)
        return collective, sources, None  # no MetaFile: no index is read or written
    if sources is None:
        meta = meta_file if isinstance(meta_file, MetaFile) else MetaFile(meta_file, columns=columns)
    else:  # one MetaFile of the distinct files: each indexed once, read once per shard
        meta = MetaFile.from_files(files_of(sources), columns_of(sources))
    return FileReader(meta, sources), sources, meta


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
    if isinstance(meta_file, Sequence) and meta_file and all(isinstance(p, (str, os.PathLike)) for p in meta_file):
        return list(meta_file)
    raise TypeError(f"meta_file must be a path, a list of paths, a MetaFile or Sources, got {meta_file!r}")


def _agree_files(fields: Mapping[str, object], group: Any, paths: Sequence[str] = ()) -> None:
    """The ranks' agreement on the files, before the collective reader's first collective over them (a
    disagreement names the ``paths`` each rank reads)."""
    check_ranks_agree(fields, None, group, context={"paths": list(paths)})
