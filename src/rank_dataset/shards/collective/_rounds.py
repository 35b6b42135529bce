"""A build of the collective reader: the exchange of requests and lengths, then of the lines in rounds.

Every rank routes its plan's samples to their owners (``_routing``). It finds the lengths of its own
host's samples in their owners' shared tables (``_local``), and sends each owner on another host the
numbers it asks for, then learns their lengths: the lengths lay out its shard before any line moves. In
round ``k`` each owner reads the ``k``-th part of its slice (about :data:`ROUND` bytes of lines) in one
sequential read into its shared round buffer, checks it against the count, and sends each rank of
another host the lines it asked for, and every rank a status byte (:class:`Server`); each rank checks
every owner's status, then copies what it received, and what its host's owners read, straight into its
shard (:meth:`Exchange.build`). A line that is not UTF-8 is found by the rank that sends it over gloo,
or by the rank that copied it from its host's memory (then every rank learns it at the build's end).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import prefix_sums, ranges
from rank_dataset.core.shard import Shard, ShardWriter, offset_dtype
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.read.lines import check_utf8
from rank_dataset.shards._rows import RowsReading, RowsText
from rank_dataset.shards._text import Reading
from rank_dataset.shards.collective import _routing
from rank_dataset.shards.collective._dist import Collectives
from rank_dataset.shards.collective._local import Local, Table
from rank_dataset.shards.collective._slices import Slices
from rank_dataset.shards.collective._status import HEAD, OK, Failure, failure_of, raise_reported

__all__ = ["ROUND", "Exchange", "Server"]

ROUND = 4 << 20  # bytes of lines an owner reads and serves in a round of the exchange

_Ints = npt.NDArray[np.int64]


class Exchange:
    """How a rank's builds exchange lines with the other ranks of ``net``: through shared memory with the
    ranks of its host (``_local``), over gloo with the others.

    Args:
        net: the reader's collectives.
        slices: the slices, as counted.
        starts: where each sample of this rank's slice starts (from the slice's start) and...
        lengths: ...its length, as the count found them: each in parts, back to back.
        hosts: each rank's host (None: found, see :func:`~rank_dataset.core.shm.host_key`).
    """

    def __init__(
        self,
        net: Collectives,
        slices: Slices,
        starts: Sequence[npt.NDArray[Any]],
        lengths: Sequence[npt.NDArray[Any]],
        hosts: Sequence[Hashable] | None = None,
    ) -> None:
        self.net, self.slices = net, slices
        # What this rank serves: where each sample of its slice starts and its length, 4 bytes each
        # where the slices are under 4 GiB. Lengths and requests travel in one dtype on every rank.
        self.len_dtype = offset_dtype(int(np.diff(slices.cuts).max()))
        self.req_dtype = offset_dtype(int(slices.held.max()))
        # The exchange runs in rounds: in round k each owner reads and serves its samples
        # [k * per_round, (k + 1) * per_round), about ROUND bytes of lines.
        self.per_round, self.rounds = _routing.rounds_of(slices.held, slices.text_bytes, ROUND)
        held = int(slices.held[net.rank])
        firsts = _routing.take_parts(starts, np.arange(self.per_round, held, self.per_round, dtype=np.int64))
        edges = np.concatenate(([0], firsts, [slices.slice_bytes]))
        dtypes = (offset_dtype(slices.slice_bytes), self.len_dtype)
        self.local = Local(net, starts, lengths, dtypes, int(np.diff(edges).max()), hosts)
        # The table lives in the shared segment (its host's ranks look lengths up there), not twice.
        self.starts, self.lengths = self.local.mine.starts, self.local.mine.lengths
        # Lengths cross gloo a byte each where every line is under 256 bytes (most meta files), so that a
        # host's link carries little beyond the lines themselves; else in the table's width (gloo carries
        # no 2-byte integers).
        self.wire_dtype = np.dtype(np.uint8 if self.local.longest < 256 else self.len_dtype)

    def build(self, plan_of: Callable[[], _Ints], keep_ids: bool) -> tuple[Shard, dict[str, int]]:
        """The shard of the global sample numbers ``plan_of()`` gives (in their order; kept in it as its
        ids where ``keep_ids``), and the bytes this rank sent and received over gloo, and copied from its
        host's ranks. Every rank of the group calls it together. (The plan is made here, so that it is
        freed as soon as it is routed.)"""
        plan = plan_of()
        n, ids = plan.size, (plan if keep_ids else None)
        net, w, rounds, local = self.net, self.net.world_size, self.rounds, self.local
        owned, per_round = self.slices.owned, self.per_round
        # Each sample's owner and round, the requests grouped by (owner, round) in one native pass (a
        # counting sort), which also finds whether the plan repeats a sample: then each is asked for once.
        inverse = None
        routed = native.route_items(plan, owned, rounds, per_round, True, self.req_dtype)
        if routed is None:
            items, inverse = _routing.distinct(plan)
            routed = native.route_items(items, owned, rounds, per_round, False, self.req_dtype)
            del items
        del plan
        assert routed is not None
        flat_counts, order, request = routed
        del routed
        counts = flat_counts.reshape(w, rounds)
        ask = counts.sum(axis=1)
        # What goes over gloo: the requests to the owners this rank does not map (none on one host).
        far_counts = counts * ~local.mask[:, None]
        far_ask = far_counts.sum(axis=1)
        if local.remote:
            asked = net.all_to_all(far_counts.reshape(-1), np.full(w, rounds, np.int64), "the request sizes")
            asked = asked.reshape(w, rounds)
            asks = asked.sum(axis=1)
            # The requests to an owner go as a bitmap of its slice where that is smaller than their numbers
            # (a rank asking for more than 1/32 of a slice, as in a permutation over a few hosts' ranks);
            # then they are asked for, served and placed in the slice's order.
            held = self.slices.held
            far_request, send_req = self._far_requests(request, order, ask, far_ask)
            mine = np.full(w, held[net.rank])
            bitmap = _routing.bitmapped(mine, asks, request.itemsize)
            got_req = _routing.request_bytes(mine, asks, request.itemsize, bitmap)
            raw = net.all_to_all(far_request, send_req, "the requests", out_splits=got_req)
            del far_request
            requests = self._requests_of(raw, got_req, bitmap, int(held[net.rank]), request.dtype)
            req_sent, req_received = int(send_req.sum()), raw.nbytes
            del raw
            # Lengths (from what the count of lines found): the shard's offsets, before any line moves.
            send_lengths = self.lengths[requests]
            wire = send_lengths.astype(self.wire_dtype)
            far_lengths = net.all_to_all(wire, asks, "the line lengths", out_splits=far_ask)
            sent = far_counts.nbytes + req_sent + wire.nbytes
            del wire
            received = asked.nbytes + req_received + far_lengths.nbytes
        else:
            asked, asks = np.zeros((w, rounds), np.int64), np.zeros(w, np.int64)
            requests, send_lengths = np.zeros(0, self.req_dtype), np.zeros(0, self.len_dtype)
            far_lengths, sent, received = send_lengths, 0, 0
        got_lengths = local.lengths_of(request, ask, far_lengths)
        del far_lengths
        # What this rank sends each rank in each round, and the lengths it packs by: those it told them.
        send_sizes = _routing.split_sums(send_lengths.astype(np.int64), asked.reshape(-1)).reshape(w, rounds) + HEAD
        total = int(got_lengths.sum(dtype=np.int64))
        if inverse is None:  # item i is row i: the offsets straight from the lengths, in one pass
            writer = ShardWriter(n, total, ids=ids is not None, populate=True)
            key_bytes = native.scatter_bounds(got_lengths, order, flat_counts, writer.bounds).reshape(w, rounds)
            dest: npt.NDArray[Any] = order
        else:
            # A repeated sample's line goes to its first row; the rows that repeat it are copied from
            # there once every line is in.
            item_lengths = np.empty(got_lengths.size, self.len_dtype)
            item_lengths[order] = got_lengths
            key_bytes = _routing.split_sums(got_lengths.astype(np.int64), flat_counts).reshape(w, rounds)
            row_lengths = item_lengths[inverse]
            del item_lengths
            writer = ShardWriter(n, int(row_lengths.sum(dtype=np.int64)), ids=ids is not None, populate=True)
            writer.bounds[0] = 0
            np.cumsum(row_lengths, out=writer.bounds[1:], dtype=writer.bounds.dtype)
            del row_lengths
            first = np.empty(got_lengths.size, np.int64)
            first[inverse[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)
            dest = first[order]
            source = first[inverse]  # the row each row's line is copied from: itself, or the first to hold it
            del first
        del got_lengths
        far_bytes = key_bytes * ~local.mask[:, None]
        asked_at, counts_at = _routing.starts_of(asked), _routing.starts_of(counts)
        server = Server(self.slices, self.starts, self.lengths, self.per_round, local.mine)
        ascii_ = True
        try:
            for k in range(rounds):
                # The owners read round k into their buffers and serve the far ranks' lines, each part
                # of what they send headed by their status: when the all-to-all returns, every rank has
                # read round k, checked it against the count and said so, and copied round k - 1.
                send_bytes = send_sizes[:, k]
                send, failure = server.serve(k, requests, send_lengths, asked_at[:, k], asked[:, k], send_bytes)
                got_bytes = far_bytes[:, k] + HEAD
                got = net.all_to_all(send, send_bytes, "the lines", out_splits=got_bytes)
                sent, received = sent + send.nbytes, received + got.nbytes
                del send
                raise_reported(net, got[prefix_sums(got_bytes)[:-1]], failure)
                # Each far owner's lines, back to back after its header, to their rows; the mapped
                # owners' from their buffers.
                native.place_lines(
                    got, got_bytes, dest, counts_at[:, k], far_counts[:, k], HEAD, writer.bounds, writer.data
                )
                del got
                ascii_ &= local.copy_round(
                    k, per_round, request, dest, counts_at[:, k], counts[:, k], writer.bounds, writer.data
                )
        finally:
            server.close()
        if inverse is not None:
            repeats = np.flatnonzero(source != np.arange(n))
            src = writer.bounds[source[repeats]].astype(np.int64)
            dst = writer.bounds[repeats].astype(np.int64)
            native.copy_rows(writer.data, src, writer.bounds[repeats + 1] - dst, writer.data, dst)
            del source, repeats, src, dst
        # The lines from this host's ranks in rounds that were not all ASCII: checked here, and what
        # any rank found told to every rank (this collective also ends every copy out of the buffers).
        failure = None
        if not ascii_:
            try:
                check_utf8(lambda row: self._where(row, order, inverse, request, ask), writer.data, writer.bounds)
            except ValueError as exc:
                failure = failure_of(exc)
        status = net.all_gather(np.array([OK if failure is None else failure.kind], np.int64), "the lines' check")
        raise_reported(net, status[:, 0], failure)
        if writer.ids is not None and ids is not None:
            writer.ids[:] = ids
        shared = int(key_bytes[local.mask].sum())  # the bytes of lines copied from this host's ranks
        return writer.finish(), {"sent": int(sent), "received": int(received), "shared": shared}

    def _far_requests(
        self, request: npt.NDArray[Any], order: npt.NDArray[Any], ask: _Ints, far_ask: _Ints
    ) -> tuple[npt.NDArray[np.uint8], _Ints]:
        """What this rank sends each owner of another host, back to back as bytes, and how many bytes each:
        the numbers of its requests (grouped by round), or a bitmap of the owner's slice
        (:func:`~rank_dataset.shards.collective._routing.bitmapped`). For a bitmap, its part of ``request``
        and of ``order`` is put in the slice's order here (in place), as the owner serves it."""
        held, itemsize = self.slices.held, request.itemsize
        bitmap = _routing.bitmapped(held, far_ask, itemsize)
        sizes = _routing.request_bytes(held, far_ask, itemsize, bitmap)
        out = np.empty(int(sizes.sum()), np.uint8)
        starts, at = prefix_sums(ask), 0
        for o in np.flatnonzero(far_ask).tolist():
            a, m = int(starts[o]), int(ask[o])
            part = request[a : a + m]
            if bitmap[o]:
                bits = np.zeros(int(held[o]), bool)
                bits[part] = True
                where = np.empty(int(held[o]), np.int64)
                where[part] = np.arange(m)
                ordered = np.flatnonzero(bits)  # the requests in the slice's order (each sample once)
                order[a : a + m] = order[a : a + m][where[ordered]]
                request[a : a + m] = ordered
                out[at : at + int(sizes[o])] = np.packbits(bits, bitorder="little")
            else:
                out[at : at + int(sizes[o])] = part.view(np.uint8)
            at += int(sizes[o])
        return out, sizes

    @staticmethod
    def _requests_of(
        raw: npt.NDArray[np.uint8], sizes: _Ints, bitmap: npt.NDArray[np.bool_], held: int, dtype: Any
    ) -> npt.NDArray[Any]:
        """The numbers each rank asked this one for (in rank order, each rank's grouped by round), from what
        they sent (``sizes`` bytes each: where ``bitmap``, a bitmap of this slice; else numbers of ``dtype``)."""
        parts, at = [np.zeros(0, dtype)], 0
        for r, size in enumerate(sizes.tolist()):
            piece = raw[at : at + size]
            at += size
            if bitmap[r]:
                parts.append(np.flatnonzero(np.unpackbits(piece, count=held, bitorder="little")).astype(dtype))
            elif size:
                parts.append(piece.view(dtype))
        return np.concatenate(parts)

    def _where(
        self,
        row: int,
        order: npt.NDArray[Any],
        inverse: npt.NDArray[Any] | None,
        request: npt.NDArray[Any],
        ask: npt.NDArray[np.int64],
    ) -> str:
        """``path:line`` of the shard's row ``row`` of a build (its routing as :meth:`build` made it)."""
        item = row if inverse is None else int(inverse[row])
        at = int(np.flatnonzero(order == item)[0])  # where it is among the requests, grouped by owner
        owner = int(np.searchsorted(prefix_sums(ask), at, side="right")) - 1
        return self.slices.where(int(self.slices.owned[owner]) + int(request[at]))


class Server:
    """This rank's slice served round by round in one build: each round's part of it read once (a
    file's reading goes on from round to round), checked against the count, and packed for each rank."""

    def __init__(
        self, slices: Slices, starts: npt.NDArray[Any], lengths: npt.NDArray[Any], per_round: int, table: Table
    ) -> None:
        self._slices, self._starts, self._lengths, self._per_round = slices, starts, lengths, per_round
        self._table = table  # the round buffers it reads into, where its host's ranks copy from
        self._seen = np.zeros(len(slices.paths), np.int64)  # newlines of each file read so far
        self._readings: dict[int, Reading | RowsReading] = {}

    def serve(
        self, k: int, requests: npt.NDArray[Any], lengths: npt.NDArray[Any], at: _Ints, counts: _Ints, sizes: _Ints
    ) -> tuple[npt.NDArray[np.uint8], Failure | None]:
        """Round ``k``: what this rank sends each rank, back to back (``sizes`` bytes for each). Rank
        ``r``'s part is a status byte (``_status.OK`` or what went wrong), then its ``counts[r]``
        samples ``requests[at[r]:at[r] + counts[r]]`` (numbers within this slice, all in the round's
        part of it; their ``lengths`` as the requesters were told them), from one sequential read of
        the round's part of the slice, which is checked against the count. Also what went wrong (a file
        changed, or a line asked for is not valid UTF-8, naming file and line): then the lines' bytes
        are zeros, and are not packed anywhere.
        """
        held = self._starts.size
        first, stop = k * self._per_round, min((k + 1) * self._per_round, held)
        send = np.empty(int(sizes.sum()), np.uint8)
        pack = functools.partial(native.pack_requests, starts=self._starts, lengths=lengths, rows=requests, at=at)
        if k and first >= held:  # the slice has no samples in this round
            pack(np.zeros(0, np.uint8), 0, counts=counts, head=HEAD, status=OK, send=send)
            self._table.flags[k % 2] = 1
            return send, None
        # Bytes [lo, hi) of the slice (from its start): the round's samples, the first round from the
        # slice's start and the last to its end (so that every byte is read, and checked, once).
        lo = 0 if k == 0 else int(self._starts[first])
        hi = self._slices.slice_bytes if stop >= held else int(self._starts[stop])
        try:
            buf, parts, ascii_ = self._read(self._table.buffers[k % 2][: hi - lo], lo, first, stop)
            self._table.flags[k % 2] = ascii_
            pack(buf, lo, counts=counts, head=HEAD, status=OK, send=send)
            if not ascii_:
                # The lines without the status bytes, back to back, as the file reader checks them.
                which = ranges(at, counts)
                rows = requests[which]
                keep = np.ones(send.size, bool)
                keep[(prefix_sums(sizes)[:-1, None] + np.arange(HEAD)).ravel()] = False
                bounds = prefix_sums(lengths[which])
                line_at = self._starts[rows].astype(np.int64) - lo
                check_utf8(lambda r: self._line_of(buf, parts, int(line_at[r]), int(rows[r])), send[keep], bounds)
        except (MetaFileChangedError, ValueError) as exc:  # a CorruptMetaFileError is a ValueError
            failure = failure_of(exc)
            assert failure is not None
        else:
            return send, None
        pack(np.zeros(0, np.uint8), 0, counts=counts, head=HEAD, status=failure.kind, send=send)
        return send, failure

    def _read(
        self, buf: npt.NDArray[np.uint8], lo: int, first: int, stop: int
    ) -> tuple[npt.NDArray[np.uint8], list[tuple[int, int, int]], bool]:
        """Bytes ``[lo, lo + buf.size)`` of the slice (from its start), which hold its samples ``[first,
        stop)``: read into ``buf`` and checked against what the count of lines found. Also each file's
        part of them as ``(file, start in the buffer, newlines before it in the file)``, and whether all
        is ASCII."""
        slices, rank = self._slices, self._slices.rank
        base, hi = int(slices.cuts[rank]), lo + buf.size
        parts, ascii_, done = [], True, first
        for f, a, b in slices.pieces(base + lo, base + hi):
            path = slices.paths[f]
            at = int(slices.offsets[f]) + a - base - lo  # where the file's part starts in buf
            piece = buf[at : at + b - a]
            reading = self._reading(f)
            if isinstance(reading, Reading):
                # The lines checked where the count found them (the samples that start in the piece),
                # not found again: one native pass, which also counts the newlines.
                reading.read_into(piece, a, until=slices.piece(rank, f)[1])
                reading.check()
                m = int(np.searchsorted(self._starts[done:stop], lo + at + piece.size))
                last = a + piece.size == reading.text.size
                found = native.verify_lines(
                    piece, a, last, self._starts[done : done + m], lo + at, self._lengths[done : done + m]
                )
                same, newlines, ascii_piece = found[0] < 0, found[1], found[2]
            else:  # a Parquet file's rows, rendered from its row groups
                chunk = reading.lines(piece, a, until=slices.piece(rank, f)[1])
                reading.check()
                m, newlines, ascii_piece = chunk.starts.size, chunk.newlines, chunk.ascii
                same = (
                    done + m <= stop
                    and np.array_equal(chunk.starts + (lo + at), self._starts[done : done + m])
                    and np.array_equal(chunk.lengths, self._lengths[done : done + m])
                )
            if not same:
                counted = f"{int(slices.samples[rank, f]):,} counted in its bytes {slices.piece(rank, f)}"
                what = (
                    f"the samples in its bytes [{a:,}, {b:,}) are not those found when the dataset was made ({counted})"
                )
                raise MetaFileChangedError(path, what)
            parts.append((f, at, int(slices.newlines[:rank, f].sum()) + int(self._seen[f])))
            self._seen[f] += newlines
            ascii_ = ascii_ and ascii_piece
            done += m
        if done != stop:
            f = parts[-1][0] if parts else 0
            what = f"a slice of it holds {done - first:,} samples where it held {stop - first:,}"
            raise MetaFileChangedError(slices.paths[f], what)
        return buf, parts, ascii_

    def _line_of(self, buf: npt.NDArray[np.uint8], parts: list[tuple[int, int, int]], at: int, row: int) -> str:
        """``path:line`` of the line at ``buf[at]``, this slice's sample ``row`` (``parts`` as
        :meth:`_read` gives them)."""
        slices = self._slices
        f, start, before = next(p for p in reversed(parts) if p[1] <= at)
        if isinstance(slices.texts[f], RowsText):  # a row may hold newlines: named by its number
            return slices.where(int(slices.owned[slices.rank]) + row)
        return f"{slices.paths[f]}:{before + native.count_newlines(buf[start:at]) + 1}"

    def _reading(self, f: int) -> Reading | RowsReading:
        """File ``f``'s reading for this build: opened at its first use, closed as the build ends (a
        compressed file's decoder goes on from round to round)."""
        reading = self._readings.get(f)
        if reading is None:
            reading = self._readings[f] = self._slices.texts[f].reading()
        return reading

    def close(self) -> None:
        """Close the files' readings."""
        readings, self._readings = self._readings, {}
        for reading in readings.values():
            reading.close()
