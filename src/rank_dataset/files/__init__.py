"""Meta files on disk: the line scan, the line-offset index and its cache, :class:`MetaFile` (random
reads of lines into a Shard), grouping by label, and the recipes that read labels. No torch.

Imports :mod:`rank_dataset.plan` and :mod:`rank_dataset.core` only.
"""
