"""A rank's shard, made and shared: the readers that fill it (the ShardReader protocol, FileReader, and
CollectiveReader, which exchanges the files' lines between the ranks of a process group), and the channel
that hands it to the DataLoader workers with the pass audit's counts. No torch (but the collective
reader's module of torch.distributed calls, when a collective reader is made).

Imports :mod:`rank_dataset.files`, :mod:`rank_dataset.plan` and :mod:`rank_dataset.core`.
"""
