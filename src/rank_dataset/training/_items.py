"""Item access over the shard a dataset holds now: ``len``, ``ds[i]``, batches, ``indices``, ``source_ids``.

The hot path of training: :class:`ShardItems` is the part of
:class:`~rank_dataset.training.dataset.ShardedDataset` that every ``ds[i]`` runs through, kept apart from
the planning, the resume and the pass audit. Per item it reads one word of the control block (has anything
changed?), checks the index inline and slices the shard; parsing, ``transform`` and ``on_error`` are a
branch each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.checks import check_index
from rank_dataset.core.parsers import Parser, parse_line
from rank_dataset.training._stages import timed_items

if TYPE_CHECKING:  # a DataLoader worker imports what its items need, not the readers of meta files
    from rank_dataset.core.shard import Shard
    from rank_dataset.core.stages import StageTable
    from rank_dataset.plan.spec import ShardSpec
    from rank_dataset.shards.channel import ShardChannel
    from rank_dataset.shards.reader import ShardReader
    from rank_dataset.training._failures import FailureBook

__all__ = ["ShardItems"]


class ShardItems:
    """Item access over the shard held now (a mixin of ShardedDataset, which sets these attributes)."""

    reader: ShardReader
    channel: ShardChannel
    _book: FailureBook
    _spec: ShardSpec
    _shard: Shard
    _n: int
    _text: Callable[[int], str]
    _indices: npt.NDArray[np.int64] | None
    _source_ids: npt.NDArray[np.integer[Any]] | None
    _version: Any  # the control block's version word (an array of one)
    _seen: int
    _tally: Callable[[int], None]
    _parser: Parser | None
    _parsers: Sequence[Parser | None] | None
    _transform: Callable[[Any], Any] | None
    _replace: bool
    _made_by_policy: bool
    stages: StageTable  # the item stages' timers: off (word 0 is 0) unless a monitor is on

    def _serve(self, shard: Shard, spec: ShardSpec) -> None:
        self._shard, self._n, self._spec = shard, len(shard), spec
        self._indices: npt.NDArray[np.int64] | None = None
        self._source_ids: npt.NDArray[np.integer[Any]] | None = None
        self._text = shard.text  # the shard's own slicing, bound once: item access calls it directly

    def _sync(self, items: bool = False) -> None:
        """The control block changed since this process last looked (``_version[0] != _seen``, the
        per-item check): let the channel act on it, and serve the shard it says to."""
        served = self.channel.follow(items, holding=self._shard is not None)
        if served is not None:
            self._serve(*served)
        self._seen = self.channel.seen

    @property
    def source_ids(self) -> npt.NDArray[np.integer[Any]] | None:
        """For a mix, a read-only integer array: the source number of each item (``self[i]`` is a sample
        of ``sources[source_ids[i]]``). None for plain meta files. Computed from the plan on first use
        and kept until the shard changes, like ``indices``."""
        if self._source_ids is None:  # (None for plain meta files, each time)
            mixture = self._book.mixture
            if mixture is None:
                return None
            # The source of a plan number (not of a sample: one sample may be in several sources).
            plan = self._spec.indices() if self._shard.ids is not None else self.indices
            source_ids = mixture.source_ids(plan)
            source_ids.flags.writeable = False
            self._source_ids = source_ids
        return self._source_ids

    @property
    def shard(self) -> Shard:
        """The shard held now."""
        if self._version[0] != self._seen:
            self._sync()
        return self._shard

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        """Read-only int64 array of global sample numbers: ``self[i]`` is sample ``indices[i]``.

        Computed from the plan on first use and kept until the shard changes (a shard stores its
        sample numbers only where the plan's numbers are not them: sources over subsets).
        """
        if self._version[0] != self._seen:
            self._sync()
        if self._indices is None:
            ids = self._shard.ids
            indices = self._spec.indices() if ids is None else np.array(ids)
            indices.flags.writeable = False
            self._indices = indices
        return self._indices

    def __len__(self) -> int:
        if self._version[0] != self._seen:
            self._sync()
        return self._n

    def _check_index(self, i: Any) -> int:
        n = self._n
        return check_index(i, n, label="dataset index", of=f"a shard of {n} samples")

    def _item(self, text: str, i: int) -> Any:
        """Item ``i`` (of line ``text``): parsed and transformed; with ``on_error="replace"``, a substitute's
        if that raises."""
        try:
            item = text if self._parser is None and self._parsers is None else self._parse(text, i)
            return item if self._transform is None else self._transform(item)
        except Exception as exc:
            if not self._replace:
                raise
            return self._book.substitute(self._spec, self._n, i, exc, self._made, self.indices)

    def _made(self, j: int) -> Any:
        """Item ``j``, made again: a substitute's."""
        text = self._text(j)
        item = text if self._parser is None and self._parsers is None else self._parse(text, j)
        return item if self._transform is None else self._transform(item)

    def _parse(self, text: str, i: int) -> Any:
        # In a mix whose sources have parsers of their own, item i's source chooses.
        parser = self._parser if self._parsers is None else self._parsers[self.source_ids[i]]  # type: ignore[index]
        return parse_line(parser, text, lambda: self.reader.where(int(self.indices[i])))

    def __getitem__(self, i: int) -> Any:
        # Once per sample: one word of the control block says whether anything changed, the inline
        # check is the fast path, the shard does the slicing.
        if self._version[0] != self._seen:
            self._sync(items=True)
        if not (type(i) is int and 0 <= i < self._n):
            i = self._check_index(i)
        if self.stages.words[0]:  # a monitor is on: the timed path (training/_stages.py)
            return timed_items(self, [i])[0]
        text = self._text(i)
        self._tally(1)
        if self._made_by_policy:
            return self._item(text, i)
        return text if self._parser is None and self._parsers is None else self._parse(text, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of items at once (torch's DataLoader calls this with each batch of indices)."""
        if self._version[0] != self._seen:
            self._sync(items=True)
        n = self._n
        if not all(type(i) is int and 0 <= i < n for i in indices):
            indices = [self._check_index(i) for i in indices]
        if self.stages.words[0]:  # a monitor is on: the timed path (training/_stages.py)
            return timed_items(self, indices)
        texts = self._shard.texts(indices)
        self._tally(len(texts))  # the pass audit: a store in the control block per batch (a replaced item counts)
        if self._made_by_policy:
            return [self._item(t, i) for t, i in zip(texts, indices)]
        if self._parser is None and self._parsers is None:
            return texts
        return [self._parse(t, i) for t, i in zip(texts, indices)]
