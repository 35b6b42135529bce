"""The node-local side of the collective reader's exchange: the ranks of one host reach each other's lines
through shared memory, and only the lines bound for other hosts travel over gloo.

Each rank holds one shared segment (:mod:`rank_dataset.core.shm`): two round buffers, into which it reads
its slice round by round (round ``k`` into buffer ``k % 2``, with a flag byte saying whether the round's
text is ASCII), then its slice's table: where each of its samples starts and its length. At the making,
the ranks of each host (:func:`~rank_dataset.core.shm.host_key`) map each other's segments, then every
creator lets go of its own hold: the memory lives while it is mapped, and the kernel frees it when the
last rank of the host unmaps it or exits, whatever way it exits (nothing is ever left in ``/dev/shm``).
In a build, a rank finds the lengths of the lines it wants from its host's ranks in their tables (no
request for them crosses gloo), and copies each round's lines straight from their buffers into its shard.

Why two buffers and no barrier of their own: every round ends with the all-to-all of the lines, in which
every rank sends every rank at least its status byte. When it returns on a rank, every rank has read
round ``k`` into its buffer and has finished copying round ``k - 1`` out of the others' (it copies before
it serves round ``k``); round ``k + 1`` writes the other buffer. A build's last collective (the check of
its lines, :meth:`Exchange.build <rank_dataset.shards.collective._rounds.Exchange.build>`) keeps the next
build's first round from writing a buffer another rank still copies from.

Where a rank cannot map a peer's segment (another user, a ``/proc`` it cannot see), every rank of its host
exchanges through gloo alone, with a warning on the rank that could not.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native, shm
from rank_dataset.core.residency import populate_map
from rank_dataset.shards.collective._dist import Collectives

__all__ = ["Local", "Table"]

_HEAD = 64  # bytes ahead of the round buffers: the two rounds' ASCII flags

# What a peer needs to view a segment: (round_bytes, starts_at, starts dtype, lengths_at, lengths dtype, samples)
_Layout = tuple[int, int, str, int, str, int]


@dataclass(frozen=True)
class Table:
    """A rank's segment, viewed: its round buffers and their ASCII flags, and its slice's table."""

    buffers: tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]
    flags: npt.NDArray[np.uint8]
    starts: npt.NDArray[Any]
    lengths: npt.NDArray[Any]


def _align(n: int) -> int:
    return -(-n // 8) * 8


def _view(mapping: Any, layout: _Layout) -> Table:
    round_bytes, starts_at, starts_dtype, lengths_at, lengths_dtype, n = layout
    buffers = (
        np.frombuffer(mapping, np.uint8, round_bytes, _HEAD),
        np.frombuffer(mapping, np.uint8, round_bytes, _HEAD + round_bytes),
    )
    starts = np.frombuffer(mapping, np.dtype(starts_dtype), n, starts_at)
    lengths = np.frombuffer(mapping, np.dtype(lengths_dtype), n, lengths_at)
    return Table(buffers, np.frombuffer(mapping, np.uint8, 2, 0), starts, lengths)


class Local:
    """This rank's segment and those of its host's ranks, mapped: made by every rank of ``net`` together.

    Args:
        net: the reader's collectives.
        starts: where each sample of this rank's slice starts (from the slice's start) and...
        lengths: ...its length, each in parts, back to back.
        dtypes: the table's widths: of the starts, and of the lengths (every rank's lengths have one).
        round_bytes: the most bytes of the slice a round reads.
        hosts: each rank's host (None: each rank's :func:`~rank_dataset.core.shm.host_key`, gathered).
    """

    def __init__(
        self,
        net: Collectives,
        starts: Sequence[npt.NDArray[Any]],
        lengths: Sequence[npt.NDArray[Any]],
        dtypes: tuple[np.dtype[Any], np.dtype[Any]],
        round_bytes: int,
        hosts: Sequence[Hashable] | None = None,
    ) -> None:
        w, rank = net.world_size, net.rank
        n = sum(p.size for p in starts)
        starts_at = _align(_HEAD + 2 * round_bytes)
        lengths_at = _align(starts_at + n * dtypes[0].itemsize)
        layout: _Layout = (round_bytes, starts_at, dtypes[0].str, lengths_at, dtypes[1].str, n)
        segment = shm.Segment(lengths_at + n * dtypes[1].itemsize + 8, name="rank_dataset_exchange")
        try:
            #: This rank's own segment, writable.
            mapping = segment.map()
            populate_map(mapping, 0, len(mapping))  # all of it is written: at once, not a fault a page
            self.mine = _view(mapping, layout)
            if n:  # the count's parts written once, into the table (every value fits its width)
                np.concatenate(starts, out=self.mine.starts, casting="unsafe")
                np.concatenate(lengths, out=self.mine.lengths, casting="unsafe")
            key = shm.host_key() if hosts is None else None
            every = net.all_gather_object((key, segment.handle, layout), "the hosts' shared segments")
            keys = [e[0] for e in every] if hosts is None else list(hosts)
            tables = {rank: self.mine}
            failed: OSError | None = None
            for r in range(w):
                if r != rank and keys[r] == keys[rank] and failed is None:
                    try:
                        tables[r] = _view(shm.attach(every[r][1]), every[r][2])
                    except OSError as exc:
                        failed = exc
            # Once every rank has mapped what it maps, the mappings alone hold the memory. The same
            # all-gather tells every rank the longest line of all (the lengths' width on the wire).
            longest = int(self.mine.lengths.max()) if n else 0
            told = net.all_gather(np.array([failed is None, longest], np.int64), "the hosts' shared segments")
            oks = told[:, 0]
        finally:
            segment.close()
        down = {keys[r] for r in range(w) if not oks[r]}
        groups: list[Hashable] = [("alone", r) if keys[r] in down else keys[r] for r in range(w)]
        if keys[rank] in down:
            tables = {rank: self.mine}
            if failed is not None:
                warnings.warn(
                    f"the collective reader cannot map the shared memory of another rank of this host ({failed}): "
                    "the ranks of this host exchange their lines through gloo",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self._tables = tables
        #: The ranks whose lines this rank copies from their segments (itself among them), in order.
        self.mapped = sorted(tables)
        #: For each rank, whether this rank maps its segment.
        self.mask = np.array([groups[r] == groups[rank] for r in range(w)], bool)
        #: Whether the lines of some rank travel over gloo (the ranks are on more than one host).
        self.remote = len(set(groups)) > 1
        #: The longest line of every rank's slice, in bytes.
        self.longest = int(told[:, 1].max())

    def lengths_of(
        self, request: npt.NDArray[Any], ask: npt.NDArray[np.int64], far: npt.NDArray[Any]
    ) -> npt.NDArray[Any]:
        """The length of each sample of ``request`` (grouped by owner: ``ask[o]`` of owner ``o``'s, back to
        back): a mapped owner's from its table, another's from ``far`` (what those owners told, in order)."""
        out = np.empty(request.size, self.mine.lengths.dtype)
        at = told = 0
        for o, m in enumerate(ask.tolist()):
            if m:
                if self.mask[o]:
                    np.take(self._tables[o].lengths, request[at : at + m], out=out[at : at + m])
                else:
                    out[at : at + m] = far[told : told + m]
                    told += m
            at += m
        return out

    def copy_round(
        self,
        k: int,
        per_round: int,
        request: npt.NDArray[Any],
        dest: npt.NDArray[Any],
        at: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        bounds: npt.NDArray[Any],
        data: npt.NDArray[np.uint8],
    ) -> bool:
        """Round ``k``'s lines of the mapped owners into the shard: owner ``o``'s samples
        ``request[at[o]:at[o] + counts[o]]`` (numbers within its slice), read into its buffer ``k % 2``,
        go to the rows ``dest[...]`` of the shard (``bounds`` into ``data``), one native pass an owner.
        Returns whether every round they came from was ASCII."""
        ascii_ = True
        for o in self.mapped:
            c = int(counts[o])
            if not c:
                continue
            table, a = self._tables[o], int(at[o])
            lo = int(table.starts[k * per_round]) if k else 0  # where the owner's round starts in its slice
            native.copy_lines(table.buffers[k % 2], lo, table.starts, request[a : a + c], dest[a : a + c], bounds, data)
            ascii_ = ascii_ and bool(table.flags[k % 2])
        return ascii_
