"""A rank's shard, made and shared: the readers that fill it (the ShardReader protocol, FileReader, and
CollectiveReader, which exchanges the files' lines between the ranks of a process group), the channel
that hands it to the DataLoader workers, the pass audit and the failure log.

Imports :mod:`rank_dataset.files`, :mod:`rank_dataset.plan` and :mod:`rank_dataset.core`.
"""
