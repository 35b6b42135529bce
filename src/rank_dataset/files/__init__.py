"""Meta files on disk: where their bytes come from (:mod:`~rank_dataset.files.sources`), their formats
(:mod:`~rank_dataset.files.formats`: text, gzip, zstd, Parquet, behind one protocol and a registry),
and the readers above them, unaware of the format and the source: the line scan, the line-offset
index and its cache, :class:`MetaFile` (random reads of lines into a Shard), grouping by label, and
the recipes that read labels; with the checks (:mod:`~rank_dataset.files.lines`) and fingerprints
(:mod:`~rank_dataset.files.fingerprints`) the collective reader shares. No torch.

Imports :mod:`rank_dataset.plan` and :mod:`rank_dataset.core` only.
"""
