"""Shared passes: concurrent /shard requests of one plan, against a real server process on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests

from rank_dataset import MetaFile
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.server import protocol
from rank_dataset.server._passes import BuildSlots, Part, SharedPasses
from tests_helpers import rewrite


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads released together; their results (or the exceptions they raised)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _get_shard(url: str, **params: int) -> Callable[[], requests.Response]:
    return lambda: requests.get(f"{url}/shard", params=params, timeout=120)


def _alone(meta: Path, **fields: int) -> bytes:
    """The frame a lone request for this shard gets: MetaFile.read of the plan's indices, framed."""
    spec = ShardSpec(num_samples=len(MetaFile(meta)), **fields)
    return b"".join(protocol.encode_frame(MetaFile(meta).read(spec.indices())))


def _shard(frame: bytes) -> tuple[bytes, str, bytes, bytes]:
    """What a client decodes from ``frame``: its sample numbers, offsets (dtype and values) and lines.
    A frame cut from a shared pass lists its lines in file order, so it differs from the frame read
    alone, byte for byte; what it decodes to does not."""
    shard = protocol.decode_frame(frame)
    assert shard.ids is not None
    return shard.ids.tobytes(), shard.bounds.dtype.str, shard.bounds.tobytes(), shard.data.tobytes()


def _read_chars(server: Any) -> int:
    return int(psutil.Process(server.proc.pid).io_counters().read_chars)


@pytest.mark.parametrize("max_pass_samples", [None, "1"], ids=["shared", "alone"])
def test_concurrent_ranks_of_one_plan_share_one_read(write_meta, start_server, max_pass_samples) -> None:
    meta = write_meta(n=400_000)
    size, world = meta.stat().st_size, 16
    args = ("--max-pass-samples", max_pass_samples) if max_pass_samples else ()
    server = start_server([meta], *args)
    before = _read_chars(server)
    answers = _at_once([_get_shard(server.url, world_size=world, rank=r, seed=7, epoch=2) for r in range(world)])
    read = _read_chars(server) - before
    for rank, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        # What the rank gets alone, byte for byte (its sample numbers, offsets of its own dtype, lines).
        assert _shard(answer.content) == _shard(_alone(meta, world_size=world, rank=rank, seed=7, epoch=2)), rank
    # Each rank's samples are spread over the whole file: read alone, each request reads about all
    # of it (16x in all); shared, one pass waits for all 16 (about 1x; 2x if one came late).
    if max_pass_samples is None:
        assert read < 4 * size, read / size
    else:
        assert read > 10 * size, read / size


def test_ranks_get_what_rank_dataset_reads_with_two_plans_at_once(write_meta, start_server) -> None:
    from rank_dataset import RankDataset, RankServerDataset

    meta = write_meta(n=30_001)
    server = start_server([meta], "--max-pass-samples", "20000")  # two or more passes for each plan
    calls = [
        lambda r=r, s=s: RankServerDataset(server.url, reload_cfg={"seed": s, "mini_epoch": 2}, rank=r, world_size=6)
        for s in (0, 1)
        for r in range(6)
    ]
    for i, ds in enumerate(_at_once(calls)):
        seed, rank = divmod(i, 6)
        local = RankDataset(meta, reload_cfg={"seed": seed, "mini_epoch": 2}, rank=rank, world_size=6)
        assert not isinstance(ds, Exception), ds
        assert np.array_equal(ds.indices, local.indices)
        assert [ds[j] for j in range(len(ds))] == [local[j] for j in range(len(local))]


def test_a_client_gone_while_waiting_costs_the_others_nothing(write_meta, start_server) -> None:
    meta = write_meta(n=200_000)
    server = start_server([meta], "--max-builds", "1")
    world = 8

    def gone() -> None:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(f"GET /shard?world_size={world}&rank=3 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        # closed before any answer: its pass reads its rows and drops them

    calls: list[Callable[[], Any]] = [_get_shard(server.url, world_size=world, rank=r) for r in range(world)]
    calls[3] = gone
    calls += [gone, gone]
    answers = _at_once(calls)
    for rank in (0, 1, 2, 4, 5, 6, 7):
        assert answers[rank].status_code == 200, answers[rank].text
        assert _shard(answers[rank].content) == _shard(_alone(meta, world_size=world, rank=rank))
    # The passes let go of the only build slot: the next request is served, not answered 503.
    again = requests.get(f"{server.url}/shard", params={"world_size": world, "rank": 3}, timeout=30)
    assert again.status_code == 200 and _shard(again.content) == _shard(_alone(meta, world_size=world, rank=3))


LINES = [f"img_{i}.jpg {i % 10}" for i in range(60_000)]


def test_a_file_changed_under_a_shared_pass_is_409_for_every_waiter(write_meta, start_server) -> None:
    meta = write_meta(LINES)
    server = start_server([meta])
    world = 8
    frames = {r: _alone(meta, world_size=world, rank=r) for r in range(world)}
    # Rewritten while the requests are under way: each gets its exact shard or the 409 it would get
    # alone, never other bytes and never a 500.
    calls: list[Callable[[], Any]] = [_get_shard(server.url, world_size=world, rank=r) for r in range(world)]
    calls.append(lambda: rewrite(meta, LINES[::-1]))
    answers = _at_once(calls)
    for rank, answer in enumerate(answers[:world]):
        assert answer.status_code in (200, 409), answer.text
        if answer.status_code == 200:
            assert _shard(answer.content) == _shard(frames[rank])
        else:
            assert answer.json()["kind"] == "files"
    # Afterwards, all at once: every waiter of the shared pass gets the 409.
    answers = _at_once([_get_shard(server.url, world_size=world, rank=r) for r in range(world)])
    for answer in answers:
        assert answer.status_code == 409 and answer.json()["kind"] == "files", answer.text
        assert str(meta) in answer.json()["error"]
    assert requests.get(f"{server.url}/healthz", timeout=30).status_code == 200


def test_one_ranks_bad_line_fails_that_rank_alone(write_meta, start_server) -> None:
    lines = [f"é_{i}.jpg {i % 10}" for i in range(20_000)]  # not ASCII: lines are checked as UTF-8
    meta = write_meta(lines)
    world, bad = 4, 12_345
    data = bytearray(meta.read_bytes())
    at = data.index(f"é_{bad}.jpg".encode())
    data[at : at + 2] = b"\xff\xfe"  # not UTF-8, same length: the index still fits
    meta.write_bytes(bytes(data))
    MetaFile(meta)  # indexes it as it is now (the server would too)
    server = start_server([meta])
    owner = next(r for r in range(world) if bad in ShardSpec(20_000, world, r).indices())
    answers = _at_once([_get_shard(server.url, world_size=world, rank=r) for r in range(world)])
    for rank, answer in enumerate(answers):
        if rank == owner:
            assert answer.status_code == 400 and "not valid UTF-8" in answer.json()["error"], answer.text
            assert f"{meta}:{bad + 1}" in answer.json()["error"]
        else:
            assert answer.status_code == 200, answer.text
            assert _shard(answer.content) == _shard(_alone(meta, world_size=world, rank=rank))


def test_client_mistakes_stay_4xx_among_shared_requests(write_meta, start_server) -> None:
    meta = write_meta(n=5000)
    server = start_server([meta])
    calls = [_get_shard(server.url, world_size=4, rank=r) for r in range(4)]
    calls += [_get_shard(server.url, world_size=4, rank=4), _get_shard(server.url, world_size=4, rank=0, mini_epoch=0)]
    calls.append(lambda: requests.post(f"{server.url}/shard", params={"world_size": 4, "rank": 0}, timeout=30))
    answers = _at_once(calls)
    assert [a.status_code for a in answers] == [200] * 4 + [400, 400, 405]


@pytest.mark.slow  # several real server processes
def test_several_server_processes_each_share_what_they_accept(write_meta, start_server) -> None:
    meta = write_meta(n=50_000)
    server = start_server([meta], "--workers", "2")
    world = 8
    answers = _at_once([_get_shard(server.url, world_size=world, rank=r, epoch=1) for r in range(world)])
    for rank, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        assert _shard(answer.content) == _shard(_alone(meta, world_size=world, rank=rank, epoch=1))
    assert server.stop() == 0  # SIGTERM: uvicorn stops its worker processes too


@pytest.mark.parametrize("value", [0, -3, 1.5, True])
def test_max_pass_samples_must_be_a_positive_int(value) -> None:
    from rank_dataset.server.limits import ServerLimits

    with pytest.raises((TypeError, ValueError), match="max_pass_samples"):
        ServerLimits(max_pass_samples=value)


def _asking(
    meta: Path,
    world: int,
    arrivals: list[float],
    linger: float,
    max_linger: float,
    events: list[str] | None = None,
    marks: tuple[float, ...] = (),
) -> list[tuple[float, Part]]:
    """Ranks ``0..len(arrivals)-1`` of a plan of ``world`` ranks ask for their shards ``arrivals[r]``
    seconds from now (in one event loop, as in a server); when each got its answer (seconds from
    now), and the answer. ``events`` gets, in the order they happened, ``asked r``, ``answered r``
    and ``mark m`` when ``m`` seconds (of ``marks``) had passed: an order to assert, not a time."""
    mf = MetaFile(meta)
    specs = [ShardSpec(len(mf), world, r, seed=3) for r in range(world)]
    log = events if events is not None else []

    async def main() -> list[tuple[float, Part]]:
        passes = SharedPasses(BuildSlots(4, 10.0), 1 << 20, linger=linger, max_linger=max_linger)
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def mark(seconds: float) -> None:
            await asyncio.sleep(seconds)
            log.append(f"mark {seconds:g}")

        async def ask(rank: int, delay: float) -> tuple[float, Part]:
            await asyncio.sleep(delay)
            log.append(f"asked {rank}")
            async with passes.shard("plan", mf, specs[rank].indices(), ranks=world) as part:
                log.append(f"answered {rank}")
                return loop.time() - start, part

        timers = [asyncio.ensure_future(mark(m)) for m in marks]
        try:
            return list(await asyncio.gather(*(ask(r, d) for r, d in enumerate(arrivals))))
        finally:
            for timer in timers:
                timer.cancel()

    answers = asyncio.run(main())
    for rank, (_, part) in enumerate(answers):  # each decodes to the shard it would get alone
        framed = b"".join(protocol.encode_frame(part.shard, part.order, part.ids))
        assert _shard(framed) == _shard(b"".join(protocol.encode_frame(mf.read(specs[rank].indices())))), rank
    return answers


def _one_pass(parts: list[Part]) -> bool:
    """Whether ``parts`` were cut from one pass (their lines are views of one buffer)."""

    def owner(a: Any) -> Any:
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a

    return all(owner(p.shard.data) is owner(parts[0].shard.data) for p in parts[1:])


def test_a_pass_waits_for_the_ranks_of_its_plan_and_starts_when_all_are_in(write_meta) -> None:
    meta = write_meta(n=20_000)
    events: list[str] = []
    answers = _asking(meta, 4, [0.0, 0.1, 0.2, 0.3], linger=10.0, max_linger=30.0, events=events, marks=(10.3,))
    assert _one_pass([part for _, part in answers])
    assert all(part.order is not None and part.shard.ids is None for _, part in answers)  # in file order, no ids
    # Nobody answered before the 4th came, and all were answered then, not a linger (10 s) later.
    assert events[:4] == [f"asked {r}" for r in range(4)] and sorted(events[4:]) == [f"answered {r}" for r in range(4)]
    assert all(t >= 0.3 for t, _ in answers), [t for t, _ in answers]


@pytest.mark.slow  # waits out the passes' lingers
def test_a_pass_stops_waiting_a_linger_after_the_last_rank_came(write_meta) -> None:
    meta = write_meta(n=20_000)
    events: list[str] = []
    answers = _asking(meta, 4, [0.0, 0.1, 0.2, 5.0], linger=0.5, max_linger=10.0, events=events)
    first, late = [part for _, part in answers[:3]], answers[3][1]
    assert _one_pass(first) and not _one_pass([first[0], late])
    # The first three were answered a linger after the third came (a lower bound), before the 4th came.
    assert all(t >= 0.7 for t, _ in answers[:3]), [t for t, _ in answers]
    assert events.index("asked 3") > max(events.index(f"answered {r}") for r in range(3)), events
    assert answers[3][0] >= 5.0


@pytest.mark.slow  # waits out the passes' lingers
def test_a_pass_waits_at_most_max_linger_from_its_first_rank(write_meta) -> None:
    meta = write_meta(n=20_000)
    # A linger of 10 s would keep the first pass open for the rank that comes at 3 s; max_linger
    # (0.5 s from the first rank) closes it before.
    events: list[str] = []
    answers = _asking(meta, 8, [0.0, 0.2, 0.4, 3.0], linger=10.0, max_linger=0.5, events=events)
    times = [t for t, _ in answers]
    assert all(t >= 0.5 for t in times), times  # a lower bound
    assert events.index("asked 3") > max(events.index(f"answered {r}") for r in range(3)), events
    assert _one_pass([part for _, part in answers[:3]]) and not _one_pass([answers[0][1], answers[3][1]])


def test_a_plan_of_one_rank_waits_for_nothing(write_meta) -> None:
    meta = write_meta(n=20_000)
    events: list[str] = []
    ((_, part),) = _asking(meta, 1, [0.0], linger=30.0, max_linger=60.0, events=events, marks=(30.0,))
    assert events == ["asked 0", "answered 0"]  # not a linger (30 s) later: the mark never came
    assert part.order is None  # read alone: framed as it lies
