"""The collective reader's routing arithmetic (``shards/collective/_routing.py``), without torch and
without processes: property checks over many sizes and world sizes, and a whole exchange simulated in
numpy (every rank's requests, lengths and lines in rounds) that gives each rank its plan's lines. Also:
the collective reader imports without torch."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from rank_dataset.core.arrays import prefix_sums, ranges
from rank_dataset.shards.collective import _routing as routing
from tests_helpers import BLOCK_TORCH

Ints = npt.NDArray[np.int64]


def line_offsets(lengths: Ints, splits: Ints, head: int) -> Ints:
    """Where each line of ``lengths`` is in what one rank sends the others in a round (the layout the
    native ``pack_requests`` and ``place_lines`` keep): the part for rank ``r`` (``splits[r]`` lines) is
    ``head`` bytes of status, then its lines back to back."""
    return prefix_sums(lengths)[:-1] + head * np.repeat(np.arange(1, splits.size + 1, dtype=np.int64), splits)


WORLDS = [1, 2, 3, 4, 7, 16]
SEEDS = range(6)


def random_held(rng: np.random.Generator, w: int) -> Ints:
    """Samples a rank's slice holds: some ranks none (a slice inside one long line), some many."""
    held = rng.integers(0, 300, w)
    held[rng.random(w) < 0.25] = 0
    return held.astype(np.int64)


def random_plan(rng: np.random.Generator, total: int, *, repeat: bool) -> Ints:
    """A plan over ``total`` samples: a permutation of a subset, or with repeats (aug_repeats, a mix)."""
    n = int(rng.integers(0, 2 * total + 1))
    if repeat:
        return rng.integers(0, total, n).astype(np.int64)
    return rng.permutation(total)[: min(n, total)].astype(np.int64)


# -- back-to-back layouts ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_starts_of_are_the_running_sums(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for size in [0, 1, 2, 17, 300]:
        lengths = rng.integers(0, 50, size).astype(np.int64)
        at = prefix_sums(lengths)[:-1]
        assert at.dtype == np.int64 and at.tolist() == (np.cumsum(lengths) - lengths).tolist()
        ends = prefix_sums(lengths)
        assert ends.dtype == np.int64 and ends.tolist() == [0, *np.cumsum(lengths).tolist()]
        counts = lengths[: size - size % 3].reshape(-1, 3) if size >= 3 else lengths.reshape(-1, 1)
        starts = routing.starts_of(counts)
        assert starts.shape == counts.shape
        assert starts.reshape(-1).tolist() == prefix_sums(counts.reshape(-1))[:-1].tolist()
    assert prefix_sums([]).tolist() == [0]


@pytest.mark.parametrize("seed", SEEDS)
def test_take_parts_is_the_joined_parts_taken(seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 1000, int(rng.integers(0, 5))).astype(np.uint32) for _ in range(int(rng.integers(1, 8)))]
    joined = np.concatenate(parts)
    rows = rng.integers(0, max(joined.size, 1), int(rng.integers(0, 20))) if joined.size else np.zeros(0, np.int64)
    got = routing.take_parts(parts, rows)
    assert got.dtype == np.int64 and got.tolist() == joined[rows].tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_ranges_are_the_ranges_back_to_back(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for parts in [0, 1, 5, 40]:
        starts = rng.integers(0, 1000, parts).astype(np.int64)
        counts = rng.integers(0, 9, parts).astype(np.int64)
        want = [i for s, c in zip(starts.tolist(), counts.tolist()) for i in range(s, s + c)]
        assert ranges(starts, counts).tolist() == want


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("w", WORLDS)
def test_split_sums_and_line_offsets_lay_out_what_a_rank_sends(seed: int, w: int) -> None:
    rng = np.random.default_rng(seed)
    splits = rng.integers(0, 6, w).astype(np.int64)
    lengths = rng.integers(0, 40, int(splits.sum())).astype(np.int64)
    sums = routing.split_sums(lengths, splits)
    assert sums.tolist() == [int(p.sum()) for p in np.split(lengths, np.cumsum(splits)[:-1])]
    assert int(sums.sum()) == int(lengths.sum())  # the split sums equal the total
    for head in (0, 1, 3):
        sizes = sums + head
        heads = prefix_sums(sizes)[:-1]
        at = line_offsets(lengths, splits, head)
        # Each rank's part: its head, then its lines back to back; every byte once.
        owner = np.repeat(np.arange(w), splits)
        assert (at >= heads[owner] + head).all()
        covered = np.zeros(int(sizes.sum()), np.int64)
        for r in range(w):
            covered[heads[r] : heads[r] + head] += 1
        for a, n in zip(at.tolist(), lengths.tolist()):
            covered[a : a + n] += 1
        assert (covered == 1).all()
        ends = at + lengths
        assert (ends <= heads[owner] + sizes[owner]).all()


# -- the slices -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("w", WORLDS)
def test_the_slices_pieces_partition_every_file(seed: int, w: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 500, int(rng.integers(1, 6)))
    sizes[rng.random(sizes.size) < 0.2] = 0  # empty files
    offsets = prefix_sums(sizes)
    total = int(offsets[-1])
    cuts = np.concatenate([[0], np.sort(rng.integers(0, total + 1, w - 1)), [total]]).astype(np.int64)
    for f, size in enumerate(sizes.tolist()):
        got = [routing.piece(offsets, cuts, r, f) for r in range(w)]
        # In rank order, back to back, from 0 to the file's size.
        at = 0
        for lo, hi in got:
            assert lo <= hi
            if lo < hi:
                assert lo == at
                at = hi
        assert at == size
    for r in range(w):
        found = list(routing.pieces(offsets, int(cuts[r]), int(cuts[r + 1])))
        want = [(f, *routing.piece(offsets, cuts, r, f)) for f in range(sizes.size)]
        assert found == [p for p in want if p[1] < p[2]]
        assert sum(b - a for _, a, b in found) == int(cuts[r + 1] - cuts[r])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("w", WORLDS)
def test_rounds_cover_the_largest_slice_and_no_more(seed: int, w: int) -> None:
    rng = np.random.default_rng(seed)
    held = random_held(rng, w)
    for text_bytes in [0, 1, int(held.sum()) * 40, 10**12]:
        for round_bytes in [1, 1 << 10, 4 << 20]:
            per_round, rounds = routing.rounds_of(held, text_bytes, round_bytes)
            assert per_round >= 1 and rounds >= 1
            assert per_round * rounds >= held.max()  # every sample of every slice in a round
            assert rounds == 1 or (rounds - 1) * per_round < held.max()  # and no round past them


# -- a build's requests -----------------------------------------------------------------------------

# -- the routing of a build's requests, as the exchange kernel does it (core.native.route_items) -------------


def repeats(plan: Ints, total: int) -> bool:
    """Whether some sample number of ``plan`` (numbers below ``total``) occurs more than once."""
    if plan.size < 2:
        return False
    if total <= 8 * plan.size:  # a flag a sample, no more than 8 bytes a row: no sort
        seen = np.zeros(total, bool)
        seen[plan] = True
        return int(np.count_nonzero(seen)) < plan.size
    ordered = np.sort(plan)
    return bool((ordered[1:] == ordered[:-1]).any())


def _key_dtype(size: int) -> type[np.unsignedinteger[Any]]:
    """The smallest unsigned dtype for keys below ``size`` (up to 16 bits numpy sorts them by radix)."""
    return np.uint8 if size <= 1 << 8 else np.uint16 if size <= 1 << 16 else np.uint32


def route(items: Ints, owned: Ints, rounds: int, per_round: int) -> tuple[npt.NDArray[np.intp], Ints]:
    """Each of ``items`` (global sample numbers) routed: its key ``owner * rounds + round`` and its
    number within its owner's slice (rank ``r`` owns ``[owned[r], owned[r + 1])``, and serves its
    sample ``j`` in round ``j // per_round``). Computed in place where it can be: the caller frees
    ``items`` once it has these."""
    key = np.searchsorted(owned[1:], items, side="right")  # the owner, for now
    local = items - owned[key]
    key *= rounds
    key += local // per_round
    return key, local


def group(key: npt.NDArray[np.intp], parts: int) -> tuple[Ints, npt.NDArray[np.signedinteger[Any]]]:
    """``(counts, order)``: the items of each key below ``parts``, and the order that groups them by key
    (stable: by one radix sort of keys of 1 or 2 bytes where they fit), in 4 bytes an item where it
    fits (at W = 4 a rank's temporaries of 8 bytes a row are as large as its shard)."""
    counts = np.bincount(key, minlength=parts).astype(np.int64)
    order: npt.NDArray[np.signedinteger[Any]] = np.argsort(key.astype(_key_dtype(parts)), kind="stable")
    if key.size < 1 << 31:
        order = order.astype(np.int32)
    return counts, order


@pytest.mark.parametrize("seed", SEEDS)
def test_distinct_is_numpys_unique_and_repeats_says_whether_it_shrinks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for total in [1, 2, 10, 1000, 100_000]:
        for repeat in (False, True):
            plan = random_plan(rng, total, repeat=repeat)
            values, inverse = routing.distinct(plan)
            want, want_inverse = np.unique(plan, return_inverse=True)
            assert values.tolist() == want.tolist()
            assert inverse.tolist() == want_inverse.reshape(-1).tolist()
            assert values[inverse].tolist() == plan.tolist()  # the round trip
            # Both of repeats' ways: a flag a sample (total small against the plan), or a sort.
            assert repeats(plan, total) is (values.size < plan.size)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("w", WORLDS)
@pytest.mark.parametrize("repeat", [False, True])
def test_every_requested_sample_goes_to_exactly_its_owner_in_its_round(seed: int, w: int, repeat: bool) -> None:
    rng = np.random.default_rng(seed)
    held = random_held(rng, w)
    if held.sum() == 0:
        held[-1] = 1
    owned = prefix_sums(held)
    total = int(owned[-1])
    per_round, rounds = routing.rounds_of(held, total * int(rng.integers(1, 80)), int(rng.integers(1, 4000)))
    plan = random_plan(rng, total, repeat=repeat)
    items = routing.distinct(plan)[0] if repeats(plan, total) else plan
    key, local = route(items.copy(), owned, rounds, per_round)
    owner, round_ = key // rounds, key % rounds
    # Exactly one owner: the rank whose samples [owned[r], owned[r + 1]) hold the item.
    assert ((owned[owner] <= items) & (items < owned[owner + 1])).all()
    assert (held[owner] > 0).all()
    assert (local == items - owned[owner]).all()
    assert (round_ == local // per_round).all() and (round_ < rounds).all()
    counts, order = group(key, w * rounds)
    assert counts.tolist() == np.bincount(key, minlength=w * rounds).tolist()
    assert int(counts.sum()) == items.size
    assert order.dtype == np.int32
    assert np.sort(order).tolist() == list(range(items.size))  # a permutation of the items
    grouped = key[order]
    assert (np.diff(grouped) >= 0).all()  # grouped by (owner, round)
    same = grouped[1:] == grouped[:-1]
    assert (np.diff(order)[same] > 0).all()  # stable: in plan order within a group
    # The rounds partition each owner's requests: round k's are the samples it serves in round k.
    counts = counts.reshape(w, rounds)
    at = routing.starts_of(counts)
    seen = []
    for k in range(rounds):
        idx = order[ranges(at[:, k], counts[:, k])]
        assert (local[idx] // per_round == k).all()
        assert (owner[idx] == np.repeat(np.arange(w), counts[:, k])).all()
        seen.append(idx)
    assert np.sort(np.concatenate([np.zeros(0, np.int32), *seen])).tolist() == list(range(items.size))


def all_to_all(values: list[Ints], splits: list[Ints]) -> list[Ints]:
    """What ``all_to_all_single`` gives each rank: rank ``r``'s values cut by ``splits[r]``, one part to
    each rank, received in rank order."""
    w = len(values)
    parts = [np.split(v, np.cumsum(s)[:-1]) for v, s in zip(values, splits)]
    return [np.concatenate([parts[src][dst] for src in range(w)]) for dst in range(w)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("w", WORLDS)
@pytest.mark.parametrize("repeat", [False, True])
def test_a_simulated_exchange_gives_every_rank_its_plans_lines(seed: int, w: int, repeat: bool) -> None:
    # The exchange of a build with the collectives simulated in numpy: each rank asks every owner for
    # its samples round by round, learns their lengths, and places the lines that arrive, headed by a
    # status byte, in its shard: which must hold its plan's lines, in its order.
    rng = np.random.default_rng(seed)
    head = 1
    held = random_held(rng, w)
    if held.sum() == 0:
        held[0] = 1
    owned = prefix_sums(held)
    total = int(owned[-1])
    lines = [bytes(rng.integers(97, 123, int(n)).astype(np.uint8)) for n in rng.integers(0, 30, total)]
    length_of = np.array([len(x) for x in lines], np.int64)
    # What each owner holds: its slice's bytes, where each of its samples starts and its length.
    slices = [b"".join(lines[owned[r] : owned[r + 1]]) for r in range(w)]
    starts = [prefix_sums(length_of[owned[r] : owned[r + 1]])[:-1] for r in range(w)]
    lengths = [length_of[owned[r] : owned[r + 1]] for r in range(w)]
    per_round, rounds = routing.rounds_of(held, int(length_of.sum()), int(rng.integers(1, 200)))
    plans = [random_plan(rng, total, repeat=repeat) for _ in range(w)]
    state: list[dict[str, Any]] = []
    for plan in plans:
        items, inverse = routing.distinct(plan) if repeats(plan, total) else (plan, None)
        key, local = route(items, owned, rounds, per_round)
        counts, order = group(key, w * rounds)
        state.append({"items": items, "inverse": inverse, "counts": counts, "order": order, "local": local})
    asked = all_to_all([s["counts"] for s in state], [np.full(w, rounds, np.int64)] * w)
    asked = [a.reshape(w, rounds) for a in asked]
    counts = [s["counts"].reshape(w, rounds) for s in state]
    requests = all_to_all([s["local"][s["order"]] for s in state], [c.sum(axis=1) for c in counts])
    got_lengths = all_to_all([lengths[r][requests[r]] for r in range(w)], [a.sum(axis=1) for a in asked])
    item_lengths = []
    for r, s in enumerate(state):
        il = np.empty(got_lengths[r].size, np.int64)
        il[s["order"]] = got_lengths[r]
        assert il.tolist() == length_of[s["items"]].tolist()  # each item's length came back to it
        item_lengths.append(il)
    row_lengths = [il if s["inverse"] is None else il[s["inverse"]] for il, s in zip(item_lengths, state)]
    bounds = [prefix_sums(rl) for rl in row_lengths]
    shards = [np.zeros(int(b[-1]), np.uint8) for b in bounds]
    asked_at, counts_at = [routing.starts_of(a) for a in asked], [routing.starts_of(c) for c in counts]
    rows_of: list[list[list[int]]] = []  # each rank's rows of each item
    for s, plan in zip(state, plans):
        rows_of.append([[] for _ in range(s["items"].size)])
        for row, i in enumerate(range(plan.size) if s["inverse"] is None else s["inverse"].tolist()):
            rows_of[-1][i].append(row)
    for k in range(rounds):
        sends, send_sizes = [], []
        for r in range(w):  # owner r serves round k
            rows = requests[r][ranges(asked_at[r][:, k], asked[r][:, k])]
            first, stop = k * per_round, min((k + 1) * per_round, int(held[r]))
            assert ((first <= rows) & (rows < max(stop, first))).all()  # only the round's samples
            ls = lengths[r][rows]
            sizes = routing.split_sums(ls, asked[r][:, k]) + head
            send = np.full(int(sizes.sum()), 255, np.uint8)
            send[prefix_sums(sizes)[:-1]] = 0  # the status byte: OK
            data = np.frombuffer(slices[r], np.uint8)
            for a, s_, n in zip(line_offsets(ls, asked[r][:, k], head).tolist(), starts[r][rows], ls):
                send[a : a + n] = data[s_ : s_ + n]
            sends.append(send)
            send_sizes.append(sizes)
        received = all_to_all(sends, send_sizes)
        for r, s in enumerate(state):
            idx = s["order"][ranges(counts_at[r][:, k], counts[r][:, k])]
            ls = item_lengths[r][idx]
            got_bytes = routing.split_sums(ls, counts[r][:, k]) + head
            got = received[r]
            assert got.size == int(got_bytes.sum())
            assert (got[prefix_sums(got_bytes)[:-1]] == 0).all()  # every owner's status, read where it is
            at = line_offsets(ls, counts[r][:, k], head)
            for i, a, n in zip(idx.tolist(), at.tolist(), ls.tolist()):
                for row in rows_of[r][i]:
                    shards[r][bounds[r][row] : bounds[r][row] + n] = got[a : a + n]
    for r, plan in enumerate(plans):
        assert shards[r].tobytes() == b"".join(lines[i] for i in plan.tolist())


# -- no torch ---------------------------------------------------------------------------------------


def test_importing_the_collective_reader_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import rank_dataset.shards.collective\n"
        "from rank_dataset.shards.collective import CollectiveError, CollectiveReader\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_every_shards_module_imports_with_torch_blocked_and_a_reader_needs_it() -> None:
    code = BLOCK_TORCH + (
        "import importlib, pkgutil\n"
        "import rank_dataset.shards as shards\n"
        "names = [m.name for m in pkgutil.walk_packages(shards.__path__, 'rank_dataset.shards.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(','.join(names), 'torch' in sys.modules)\n"
        "from rank_dataset.shards.collective import CollectiveReader\n"
        "CollectiveReader(['meta.txt'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    names, torch = out.stdout.split()
    assert {"rank_dataset.shards.collective._dist", "rank_dataset.shards.reader"} <= set(names.split(","))
    assert torch == "False", out.stdout
    assert out.returncode != 0 and "torch is blocked" in out.stderr  # made, a reader imports torch
