"""The collective reader: one read of the meta files per job, whatever the world size.

Each rank of a process group reads one contiguous 1/W of the bytes of the files (taken as one, in
order), cut at line boundaries, sequentially, :data:`~rank_dataset.shards._text.READ` bytes at a time,
and keeps where each of its samples starts and its length. Line numbers come from an all-gather of each
slice's sample and newline counts per file (a few numbers per file and rank): no index is read or
written. At each build every rank computes its plan's sample numbers (as the file reader does) and
groups them by owner and round (one counting sort, native). The ranks of one host (``_local``) share
memory: each finds the lengths of its host's samples in their owners' tables, in shared segments mapped
at the making, and copies their lines straight out of the owners' round buffers. With the ranks of
other hosts it exchanges with ``all_to_all_single`` on a gloo group over the same ranks: the requests,
then their lengths (which lay out the shard), then the lines in rounds. In round k each owner reads the
k-th part of its slice (about :data:`~rank_dataset.shards.collective._rounds.ROUND` bytes of lines) into
its round buffer, checks it against the count and sends each rank of another host the lines it asked
for, and every rank a status byte; each rank checks every owner's status, then copies what it received
and what its host's owners read straight into its shareable segment: the shard is the file reader's,
byte for byte. A host's network traffic is its ranks' share of the other hosts' lines (with their
requests and lengths).

A Parquet file's text is its rows' lines (:mod:`rank_dataset.shards._rows`): its slices are cut at row
groups by their sizes in the footer, before the count, and the all-gather of what each rank rendered
places them; a row is a sample whatever it holds.

Every collective runs on the reader's own gloo group (created over the ranks of the group given, with
``timeout``), named with the epoch in the error a failed or timed-out collective raises on each rank.
A file changed under any slice (:class:`~rank_dataset.errors.MetaFileChangedError`) and a line that is
not UTF-8 (a ValueError naming ``file:line``) travel as a status word ahead of each round's lines, so
every rank raises the same error and no rank returns a shard holding a line of a changed file.

The modules, bottom to top: ``_routing`` (the arithmetic of slices, owners and rounds: pure numpy, no
torch, no I/O), ``_dist`` (every torch.distributed call, and the only one that imports torch, when a
reader is made), ``_status`` (the status words and the error every rank raises), ``_slices`` (the cut
and the count), ``_local`` (the shared segments of a host's ranks), ``_rounds`` (a build's exchange and
the serving of each round), ``_reader``
(:class:`CollectiveReader`). The fingerprints, the checkpoints and the UTF-8 check are the file
reader's own (:mod:`rank_dataset.files`). Importing this package imports no torch.
"""

from __future__ import annotations

from rank_dataset.errors import CollectiveError
from rank_dataset.shards.collective._reader import CollectiveReader

__all__ = ["CollectiveError", "CollectiveReader"]
