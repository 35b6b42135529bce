"""Payloads: the files a meta file's lines name, read a batch at a time, from a local root and from a bucket
(SeaweedFS), through DataLoader workers of every start method; failures as samples' failures; hostile paths
never read; memory under max_bytes; the node's slots freed by a process's death."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from rank_dataset import PayloadError, Payloads, RankDataset
from rank_dataset.files.io import payloads as payload_io
from rank_dataset.files.io._slots import ByteBudget, NodeSlots
from tests_helpers import rank_results, run_ranks, start_methods, worker_env

N = 3000
BATCH = 64


def payload(i: int) -> bytes:
    """Sample ``i``'s bytes: 64 to 2,111 bytes, binary, its own."""
    seed = hashlib.blake2b(str(i).encode(), digest_size=32).digest()
    return (seed * 70)[: 64 + (i * 37) % 2048]


def name_of(i: int) -> str:
    return f"d{i % 10}/img_{i:05d}.bin"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root of N payloads and a meta file ``path label`` naming them."""
    root = tmp_path_factory.mktemp("payloads")
    for d in range(10):
        (root / f"d{d}").mkdir()
    for i in range(N):
        (root / name_of(i)).write_bytes(payload(i))
    (root / "meta.txt").write_text("".join(f"{name_of(i)} {i % 7}\n" for i in range(N)))
    return root


def _sample(meta: tuple[str, int]) -> int:
    return int(meta[0].rsplit("_", 1)[1].split(".")[0])


def _check(items: list[Any]) -> list[int]:
    """The samples of ``items`` ((path, label), bytes), each checked against its bytes."""
    out = []
    for meta, data in items:
        i = _sample(meta)
        assert type(data) is bytes and data == payload(i), i
        out.append(i)
    return out


def test_items_are_meta_and_bytes(tree: Path) -> None:
    plain = RankDataset(tree / "meta.txt", rank=1, world_size=3, reload_cfg={"seed": 4}, parser="label")
    ds = RankDataset(tree / "meta.txt", rank=1, world_size=3, reload_cfg={"seed": 4}, parser="label",
                     payloads=Payloads(tree))  # fmt: skip
    assert ds[5] == (plain[5], payload(int(plain.indices[5])))
    batch = ds.__getitems__(list(range(100, 100 + BATCH)))
    assert [m for m, _ in batch] == plain.__getitems__(list(range(100, 100 + BATCH)))  # in the batch's order
    assert _check(batch) == plain.indices[100 : 100 + BATCH].tolist()
    assert ds.payload_of(5) == str(tree / plain[5][0])
    # Without a parser: the line is the meta; a transform gets (meta, data).
    lines = RankDataset(tree / "meta.txt", rank=0, world_size=1, is_test=True, payloads=Payloads(tree),
                        transform=lambda item: (item[0], len(item[1])))  # fmt: skip
    assert lines[7] == (f"{name_of(7)} 0", len(payload(7)))


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "posix_fadvise"), reason="Linux preadv2")
def test_page_cache_hits_are_read_here_and_misses_by_the_pool(tmp_path: Path) -> None:
    """Files in the page cache are read in the thread that takes them; from a file that is not (evicted), the
    batch's files go to the pool: the same bytes in the same order, and held under max_bytes either way."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    names = [f"d/{i}.bin" for i in range(40)]
    for i, name in enumerate(names):
        (root / name).write_bytes(payload(i) * 8)
    (tmp_path / "meta.txt").write_text("".join(f"{name} {i}\n" for i, name in enumerate(names)))
    for name in names:  # into the page cache (written pages may still be dirty: read back, synced)
        (root / name).read_bytes()
    os.sync()
    ds = RankDataset(tmp_path / "meta.txt", is_test=True, payloads=Payloads(root, max_bytes=4096))
    before = dict(payload_io.COUNTS)
    items = ds.__getitems__(list(range(40)))
    assert [data for _, data in items] == [payload(i) * 8 for i in range(40)]
    if payload_io.COUNTS["pooled"] != before["pooled"]:
        pytest.skip("this file system cannot read without waiting (RWF_NOWAIT): every file goes to the pool")
    assert payload_io.COUNTS["files"] - before["files"] == 40
    for name in names[10:]:  # evicted: not in the page cache
        fd = os.open(root / name, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    before = dict(payload_io.COUNTS)
    items = ds.__getitems__(list(range(40)))
    assert [data for _, data in items] == [payload(i) * 8 for i in range(40)]
    assert payload_io.COUNTS["pooled"] - before["pooled"] == 30  # the first miss (item 10) and every file after it
    # Each payload is larger than max_bytes: held alone, by the pool's reads as by this thread's.
    assert ds.payloads.reader().budget.peak <= max(len(payload(i) * 8) for i in range(40))


@pytest.mark.parametrize("method", start_methods("fork", "spawn", "forkserver"))
def test_workers_read_payloads(tree: Path, method: str) -> None:
    ds = RankDataset(tree / "meta.txt", rank=0, world_size=2, reload_cfg={"seed": 1}, parser="label",
                     payloads=Payloads(tree, max_in_flight=16))  # fmt: skip
    ds[0]  # the parent read payloads before the workers start: its pool does not cross the fork
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=list, multiprocessing_context=method)
    seen = [_check(batch) for batch in loader]
    assert [i for b in seen for i in b] == ds.indices.tolist()
    assert all(len(b) == BATCH for b in seen[:-1])


def test_the_meta_server_reader_reads_payloads(tree: Path, tmp_path: Path, start_server: Any) -> None:
    """RankServerDataset with payloads: the items of RankDataset over the same file, failures alike."""
    from rank_dataset import RankServerDataset

    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"{name_of(i) if i % 30 != 4 else 'gone.bin'} {i % 7}\n" for i in range(300)))
    server = start_server([meta])
    kw: dict[str, Any] = {"reload_cfg": {"seed": 6}, "parser": "label", "rank": 1, "world_size": 2}
    kw.update(on_error="replace", max_failures=None, payloads=Payloads(tree))
    local, remote = RankDataset(meta, **kw), RankServerDataset(server.url, **kw)
    loader = DataLoader(remote, batch_size=BATCH, num_workers=2, collate_fn=list, multiprocessing_context="fork")
    got = [x for batch in loader for x in batch]
    assert got == local.__getitems__(list(range(len(local))))
    _check(got)
    assert [f.sample for f in remote.failures] == [f.sample for f in local.failures] != []


def test_keys_json_tuple_and_function(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"{i}.img").write_bytes(payload(i))
        (tmp_path / f"{i}.mask").write_bytes(payload(100 + i))
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"image": f"{i}.img", "mask": f"{i}.mask", "y": i}) + "\n" for i in range(6)))
    ds = RankDataset(meta, is_test=True, parser="json", payloads=Payloads(tmp_path, key=("image", "mask")))
    assert ds[2] == ({"image": "2.img", "mask": "2.mask", "y": 2}, (payload(2), payload(102)))
    by_field = RankDataset(meta, is_test=True, payloads=Payloads(tmp_path, key="mask"))
    assert by_field[3][1] == payload(103)
    by_function = RankDataset(meta, is_test=True, parser="json", payloads=Payloads(tmp_path, key=_image_of))
    assert by_function[4][1] == payload(4)
    text = tmp_path / "meta.txt"
    text.write_text("".join(f"{i} {i}.img {i}.mask\n" for i in range(6)))
    fields = RankDataset(text, is_test=True, payloads=Payloads(tmp_path, key=(2, 1)))
    assert fields.__getitems__([0, 5]) == [("0 0.img 0.mask", (payload(100), payload(0))),
                                           ("5 5.img 5.mask", (payload(105), payload(5)))]  # fmt: skip
    pickle.loads(pickle.dumps(Payloads(tmp_path, key=_image_of)))


def test_parquet_column_key(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for i in range(5):
        (tmp_path / f"{i}.bin").write_bytes(payload(i))
    pq.write_table(pa.table({"label": list(range(5)), "file": [f"{i}.bin" for i in range(5)]}), tmp_path / "m.parquet")
    ds = RankDataset(tmp_path / "m.parquet", is_test=True, payloads=Payloads(tmp_path, key="file"))
    assert ds[3] == ("3\t3.bin", payload(3))


def _image_of(meta: dict[str, Any]) -> str:
    return str(meta["image"])


def test_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        Payloads(tmp_path / "none")
    with pytest.raises(ValueError, match=r"give allow=\[...\] the prefixes"):
        Payloads(None)
    with pytest.raises(ValueError, match="allow= goes with root=None"):
        Payloads(tmp_path, allow=["s3://b/"])
    with pytest.raises(ValueError, match="names no bucket"):
        Payloads(None, allow=["s3://"])
    with pytest.raises(TypeError, match="key must be an int"):
        Payloads(tmp_path, key=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key must be a field number >= 0"):
        Payloads(tmp_path, key=-1)
    with pytest.raises(TypeError, match="must be picklable"):
        Payloads(tmp_path, key=lambda m: m)
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        Payloads(tmp_path, max_in_flight=0)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        Payloads(tmp_path, max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Payloads(tmp_path, timeout=0)
    with pytest.raises(TypeError, match="payloads must be a Payloads"):
        (tmp_path / "m.txt").write_text("a\n")
        RankDataset(tmp_path / "m.txt", payloads=str(tmp_path))  # type: ignore[arg-type]


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A root with two good files, a secret outside it, and JSON lines naming paths out of the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"SECRET")
    (root / "good.bin").write_bytes(b"good")
    (root / "sub").mkdir()
    (root / "sub" / "inner.bin").write_bytes(b"inner")
    (root / "link.bin").symlink_to(outside / "secret.bin")
    (root / "dirlink").symlink_to(outside)
    (root / "inlink.bin").symlink_to(root / "sub" / "inner.bin")  # a link that stays inside: read
    paths = [
        "good.bin",
        "../outside/secret.bin",
        str(outside / "secret.bin"),
        "link.bin",
        "dirlink/secret.bin",
        "sub/../../outside/secret.bin",
        "s3://bucket/secret.bin",
        "good.bin\0../../outside/secret.bin",
        "inlink.bin",
        "missing.bin",
        "sub",
    ]
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    return root, meta, paths


def test_hostile_paths_are_failures_never_read(hostile: tuple[Path, Path, list[str]]) -> None:
    root, meta, paths = hostile
    reasons = {
        1: "'..' component", 2: "absolute path", 3: "outside the root", 4: "outside the root",
        5: "'..' component", 6: "a URL", 7: "NUL byte", 9: "no such file", 10: "not a regular file",
    }  # fmt: skip
    before = payload_io.COUNTS["files"]
    for i, reason in reasons.items():
        ds = RankDataset(meta, is_test=True, payloads=Payloads(root, key="path"))
        with pytest.raises(PayloadError, match=rf"sample {i} \({meta}:{i + 1}\): payload .*{reason}") as info:
            ds[i]
        assert info.value.where and (str(root) in info.value.path or i == 2)
    assert payload_io.COUNTS["files"] == before  # none of them was read (10: opened, found a directory, not read)
    ds = RankDataset(meta, is_test=True, payloads=Payloads(root, key="path"), on_error="replace", max_failures=None)
    items = ds.__getitems__(list(range(len(paths))))
    assert all(data in (b"good", b"inner") for _, data in items)  # substitutes: the readable ones
    assert items[0][1] == b"good" and items[8][1] == b"inner"
    failures = ds.failures
    assert [f.sample for f in failures] == sorted(reasons)
    for f in failures:
        assert f.where == f"{meta}:{f.sample + 1}" and reasons[f.sample] in f.error
        assert f.error.startswith("PayloadError")


def test_replace_is_recorded_as_a_failing_transform(tree: Path, tmp_path: Path) -> None:
    """Missing payloads are replaced and recorded as a transform that raises would be: the same substitutes,
    the same records, max_failures and exclude_failures alike."""
    lines = [f"{name_of(i)} {i % 7}" if i % 50 != 7 else f"gone/{i}.bin {i % 7}" for i in range(600)]
    meta = tmp_path / "meta.txt"
    meta.write_text("".join(line + "\n" for line in lines))
    bad = {i for i in range(600) if i % 50 == 7}

    def run(**kw: Any) -> tuple[list[Any], list[Any], RankDataset]:
        ds = RankDataset(meta, rank=0, world_size=2, reload_cfg={"seed": 3}, parser="label", on_error="replace",
                         max_failures=None, exclude_failures=True, **kw)  # fmt: skip
        loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=list, multiprocessing_context="fork")
        return [x for b in loader for x in b], ds.failures, ds

    got, failures, ds = run(payloads=Payloads(tree))
    want, want_failures, _ = run(transform=_FailLike(bad))
    assert [_sample(m) for m, _ in got] == want
    _check(got)
    records = [(f.sample, f.where, f.position) for f in failures]
    assert records == [(f.sample, f.where, f.position) for f in want_failures]
    assert {f.sample for f in failures} == bad & set(ds.indices.tolist())
    assert all("no such file" in f.error and "gone/" in f.error for f in failures)
    state = ds.state_dict(consumed=0)
    ds.set_epoch(1)
    assert ds.num_samples - ds.spec.num_samples == len(failures)  # exclude_failures left them out
    assert not {f.sample for f in failures} & set(ds.indices.tolist())
    again = RankDataset(meta, rank=0, world_size=2, reload_cfg={"seed": 3}, parser="label", on_error="replace",
                        payloads=Payloads(tree), max_failures=2)  # fmt: skip
    again.load_state_dict(state)
    assert {f.sample for f in again.failures} == {f.sample for f in failures}  # resumed with its records
    strict = RankDataset(meta, rank=0, world_size=1, is_test=True, parser="label", on_error="replace",
                         payloads=Payloads(tree), max_failures=2)  # fmt: skip
    from rank_dataset import TooManyFailuresError

    with pytest.raises(TooManyFailuresError, match="past max_failures=2"):
        strict.__getitems__(list(range(600)))


class _FailLike:
    """The transform a dataset without payloads is given: raises for the bad samples, as a payload would."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __call__(self, meta: tuple[str, int]) -> int:
        if meta[0].startswith("gone/"):
            raise OSError("gone")
        return _sample(meta)


def test_memory_stays_under_max_bytes(tree: Path) -> None:
    """The bytes read and not yet handed out stay under max_bytes, also when a batch holds more, and a
    payload larger than max_bytes is read alone."""
    small = Payloads(tree, max_bytes=8_000, max_in_flight=32)
    ds = RankDataset(tree / "meta.txt", is_test=True, parser="label", payloads=small,
                     transform=lambda item: (item[0], item[1]))  # fmt: skip
    total = 0
    for start in range(0, 1024, 256):
        batch = ds.__getitems__(list(range(start, start + 256)))
        total += sum(len(d) for _, d in batch)
        _check(batch)
    reader = ds.payloads.reader()  # type: ignore[union-attr]
    assert total > 50 * 8_000 and 0 < reader.budget.peak <= 8_000 and reader.budget.held == 0
    tiny = RankDataset(tree / "meta.txt", is_test=True, parser="label", payloads=Payloads(tree, max_bytes=10))
    _check(tiny.__getitems__(list(range(40))))
    assert tiny.payloads.reader().budget.peak == max(len(payload(i)) for i in range(40))  # type: ignore[union-attr]


def test_budget_orders_reservations() -> None:
    budget = ByteBudget(100)
    a, b, c = budget.tickets(3)
    assert not budget.try_reserve(b, 10)  # not its turn
    budget.skip(a)
    assert budget.try_reserve(b, 90) and not budget.try_reserve(c, 20)  # no room
    budget.release(90)
    assert budget.try_reserve(c, 200) and budget.peak == 200  # alone: a payload larger than the budget


def test_budget_wakes_each_waiter_in_its_turn() -> None:
    """A reservation that must wait is made, in ticket order, by the thread that makes its room; one that
    gives up waiting is skipped, and the tickets behind it go on."""
    budget = ByteBudget(100)
    a, b, c, d = budget.tickets(4)
    woken: list[str] = []
    assert not budget.reserve_or_wait(c, 10, lambda: woken.append("c"))  # b's turn first
    assert not budget.reserve_or_wait(b, 60, lambda: woken.append("b"))
    assert budget.try_reserve(a, 50) and woken == []  # a in, b does not fit beside it
    budget.release(50)
    assert woken == ["b", "c"] and budget.held == 70  # a's room made: b, then c, reserved by release()
    assert not budget.reserve_or_wait(d, 40, lambda: woken.append("d"))
    assert budget.give_up(d) and woken == ["b", "c"]  # never reserved: skipped
    e = budget.tickets(1)[0]
    assert budget.try_reserve(e, 30) and budget.held == 100  # e's turn came after d's skip
    budget.release(100)
    f, g = budget.tickets(2)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(budget.reserve(g, 10, time.monotonic() + 60)))
    waiter.start()
    budget.skip(f)  # g's turn: the waiting thread is woken
    waiter.join(30)
    assert done == [True] and budget.held == 10
    h = budget.tickets(1)[0]
    assert budget.try_reserve(h, 95) is False and budget.reserve(h, 95, time.monotonic()) is False  # no room
    assert budget.try_reserve(budget.tickets(1)[0], 90)  # h skipped by its deadline


def test_node_slot_waiters_are_woken_by_a_release(tmp_path: Path) -> None:
    slots = NodeSlots(str(tmp_path / "slots" / "w"), 2)
    held = [slots.acquire(time.monotonic() + 60) for _ in range(2)]
    assert sorted(held) == [0, 1] and slots.acquire(time.monotonic()) is None  # full: None at the deadline
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(time.monotonic() + 60)))
    waiter.start()
    slots.release(held[1])
    waiter.join(30)
    assert got == [held[1]] and slots.held() == 2


def _hold_slots(path: str, n: int, conn: Any) -> None:
    slots = NodeSlots(path, n)
    conn.send([slots.try_acquire() for _ in range(n)])
    signal.pause()


def test_node_slots_are_shared_and_freed_by_death(tmp_path: Path) -> None:
    path = str(tmp_path / "slots" / "s")
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    holder = context.Process(target=_hold_slots, args=(path, 3, theirs))
    holder.start()
    try:
        assert sorted(ours.recv()) == [0, 1, 2]
        mine = NodeSlots(path, 3)
        assert mine.try_acquire() is None  # all held by the other process
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
        got = [mine.try_acquire() for _ in range(4)]
        assert sorted(got[:3]) == [0, 1, 2] and got[3] is None and mine.held() == 3
        mine.release(got[0])
        assert mine.try_acquire() == got[0]
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join()


# -- objects ------------------------------------------------------------------------------------------

M = 2000


def _options(server: Any, secret: str | None = None) -> dict[str, Any]:
    from s3_helpers import ACCESS_KEY, REGION, SECRET_KEY

    return {"endpoint": server.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": secret or SECRET_KEY,
            "region": REGION, "allow_http": True}  # fmt: skip


@pytest.fixture(scope="module")
def bucket(s3_server: Any) -> str:
    """M payloads in the bucket beside their meta file (URLs in s3://meta/pl/); the meta file's URL."""
    import obstore

    store = s3_server.store()

    async def put_all() -> None:
        limit = asyncio.Semaphore(32)

        async def put(i: int) -> None:
            async with limit:
                await obstore.put_async(store, f"pl/{name_of(i)}", payload(i))

        await asyncio.gather(*(put(i) for i in range(M)))

    asyncio.run(put_all())
    return s3_server.put("pl/meta.txt", "".join(f"{name_of(i)} {i % 7}\n" for i in range(M)).encode())


@pytest.mark.parametrize("method", start_methods("fork", "spawn", "forkserver"))
def test_workers_read_objects_after_the_parent_did(s3_server: Any, bucket: str, method: str) -> None:
    """The parent reads the meta file from the bucket (its object store client runs) before the workers
    start; workers of every start method read the payloads (a forked one through its helper)."""
    options = _options(s3_server)
    ds = RankDataset(bucket, rank=1, world_size=2, reload_cfg={"seed": 2}, parser="label",
                     storage_options=options, payloads=Payloads("s3://meta/pl", storage_options=options))  # fmt: skip
    assert ds[3][1] == payload(_sample(ds[3][0]))  # the parent reads payloads too
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=list, multiprocessing_context=method)
    seen = [i for batch in loader for i in _check(batch)]
    assert seen == ds.indices.tolist()


def test_object_failures(s3_server: Any, bucket: str, tmp_path: Path) -> None:
    options = _options(s3_server)
    meta = tmp_path / "meta.txt"
    meta.write_text(f"{name_of(1)} 1\nnone/x.bin 2\n../{name_of(2)} 3\n{name_of(3)} 4\n")
    ds = RankDataset(meta, is_test=True, parser="label", payloads=Payloads("s3://meta/pl/", storage_options=options))
    assert ds[0][1] == payload(1) and ds[3][1] == payload(3)
    missing = rf"sample 1 \({meta}:2\): payload s3://meta/pl/none/x.bin: no such object \(HTTP 404"
    with pytest.raises(PayloadError, match=missing):
        ds[1]
    with pytest.raises(PayloadError, match=rf"sample 2 \({meta}:3\): payload s3://meta/pl/\.\./.*'\.\.' component"):
        ds[2]
    wrong = Payloads("s3://meta/pl", storage_options=_options(s3_server, "wrong"), timeout=20)
    refused = RankDataset(meta, is_test=True, parser="label", on_error="replace", max_failures=None, payloads=wrong)
    from rank_dataset import TooManyFailuresError

    with pytest.raises(TooManyFailuresError, match=r"access denied \(HTTP 403"):
        refused.__getitems__([0, 3])
    lax = RankDataset(meta, is_test=True, parser="label", on_error="replace", max_failures=None,
                      payloads=Payloads("s3://meta/pl", storage_options=options))  # fmt: skip
    assert [d for _, d in lax.__getitems__([0, 1, 2, 3])] == [payload(1), payload(3), payload(3), payload(3)]
    assert [(f.sample, "404" in f.error or "'..'" in f.error) for f in lax.failures] == [(1, True), (2, True)]


def test_full_urls_under_allowed_prefixes(s3_server: Any, bucket: str, tmp_path: Path) -> None:
    options = _options(s3_server)
    meta = tmp_path / "meta.txt"
    meta.write_text(f"s3://meta/pl/{name_of(5)}\ns3://other/{name_of(5)}\ns3://meta/plx/a.bin\n")
    ds = RankDataset(meta, is_test=True, payloads=Payloads(None, allow=["s3://meta/pl/"], storage_options=options))
    assert ds[0][1] == payload(5)
    for i in (1, 2):
        with pytest.raises(PayloadError, match=rf"sample {i} .*not under any allowed prefix"):
            ds[i]


def test_collective_file_and_steps_readers(tree: Path, tmp_path: Path) -> None:
    """Two gloo ranks: the file and the collective reader, and StepSampler, each through 2 fork workers."""
    out = tmp_path / "out"
    proc = run_ranks("payloads_worker.py", 2, tree, out, env=worker_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = rank_results(out, 2)
    for r in results:
        for name in ("file", "collective", "steps"):
            got = r[name]
            assert got["seen"] == got["planned"], name
            assert got["ok"], name
    assert results[0]["file"]["planned"] == results[0]["collective"]["planned"]


def test_monitor_times_fetch_and_names_a_stalled_payload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The payload wait is the fetch stage; a read that stalls (a server that stops sending a body) is
    dumped with its URL, and fails within the timeout naming it."""
    import rank_dataset
    from http_helpers import range_server

    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"{i}.bin {i}\n" for i in range(8)))
    with range_server() as server:
        for i in range(8):
            server.objects[f"s/{i}.bin"] = payload(i)
        ds = RankDataset(meta, is_test=True, parser="label", payloads=Payloads(server.url("s"), timeout=6))
        loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=list, multiprocessing_context="fork")
        with rank_dataset.monitor(loader, every=1000) as m:
            assert [len(b) for b in m] == [4, 4]
        fetch = m.stages.rows()[1]
        from rank_dataset.core.stages import FETCH

        assert fetch[FETCH] > 0 and fetch[FETCH + 1] == 8
        server.stall = "body"
        with (
            caplog.at_level("WARNING", logger="rank_dataset.monitor"),
            rank_dataset.monitor(loader, every=1000, stall_after=1.0) as m,
            pytest.raises(PayloadError, match=r"sample 0 .*payload http://127.0.0.1:\d+/s/0.bin"),
        ):
            for _ in m:
                pass
        stalls = m.stalls
        del m  # its iterator (the raise left it unfinished), so that its worker ends now
        gc.collect()
    assert stalls >= 1
    assert re.search(r"payload http://127.0.0.1:\d+/s/0.bin\), in fetch, its batch started", caplog.text), caplog.text


def test_faults_change_nothing(s3_server: Any, bucket: str, tmp_path: Path) -> None:
    """Through a proxy that adds latency and fails one GET in five (a 503, a reset or a body cut short, in
    turn), the batches and the failure records (the missing objects alone) are those of a run without faults."""
    from fault_proxy import running_proxy

    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"{name_of(i) if i % 40 != 9 else f'gone/{i}.bin'} {i % 7}\n" for i in range(400)))

    def run(endpoint: str) -> tuple[list[list[Any]], list[Any]]:
        options = {**_options(s3_server), "endpoint": endpoint}
        payloads = Payloads("s3://meta/pl", storage_options=options, timeout=60)
        ds = RankDataset(meta, rank=0, world_size=1, reload_cfg={"seed": 9}, parser="label", on_error="replace",
                         max_failures=None, payloads=payloads)  # fmt: skip
        loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=list, multiprocessing_context="fork")
        return [list(b) for b in loader], [(f.sample, f.where, f.position, f.error) for f in ds.failures]

    want_batches, want_failures = run(s3_server.endpoint)
    assert len(want_failures) == 10 and all("no such object (HTTP 404" in f[3] for f in want_failures)
    with running_proxy(("127.0.0.1", s3_server.port), latency=0.005, every=5) as proxy:
        batches, failures = run(proxy.endpoint)
        stats = proxy.stats()
    assert batches == want_batches and failures == want_failures
    assert all(stats["faults"][kind] > 0 for kind in ("503", "reset", "short")), stats
