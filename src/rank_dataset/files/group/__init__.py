"""Grouping a meta file's samples by label (:func:`~rank_dataset.files.group.grouping.group_by`) and its
cache, ids by path (:func:`~rank_dataset.files.group.ids.ids_of`) and the recipes that weigh labels."""
