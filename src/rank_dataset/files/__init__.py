"""Meta files: where their bytes come from (:mod:`~rank_dataset.files.io`), their formats
(:mod:`~rank_dataset.files.formats`: text, gzip, zstd, Parquet), the line-offset index and its cache
(:mod:`~rank_dataset.files.index`), reading a shard's lines (:mod:`~rank_dataset.files.read`:
:class:`MetaFile` and the gather), and grouping by label (:mod:`~rank_dataset.files.group`: group_by,
ids_of, recipes). The five stack in that order; none imports one above it.
"""
