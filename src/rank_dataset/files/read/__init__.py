"""Reading a shard's lines: :class:`~rank_dataset.files.read.metafile.MetaFile` (random reads into a
Shard), the gather over text, compressed and Parquet files, and the checks of gathered lines."""
