"""A rank's shard, made and shared: the readers that fill it (the ``ShardReader`` protocol and
:class:`~rank_dataset.shards.reader.FileReader`), and the channel that hands it to the DataLoader
workers with the pass audit's counts. No torch.

Imports :mod:`rank_dataset.files`, :mod:`rank_dataset.plan` and :mod:`rank_dataset.core`.
"""
