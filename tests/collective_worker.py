"""Run by test_collective.py as gloo ranks (tests/ranks.py): one rank of a gloo job comparing the
collective reader's shards with the file reader's (``identity``; ``identity-parquet`` for a Parquet file
alone and among text files, with its errors), serving DataLoader workers (``workers``), counting the
bytes it reads (``io``), reading meta files from object storage (``objects``, run by
test_object_collective.py), or meeting a fault (``fault-*``); with ``+rounds``, the exchange in rounds
of about 1 KiB; with ``+spacing``, compressed files' checkpoints every 64 KiB of text."""

from __future__ import annotations

import contextlib
import datetime
import gc
import hashlib
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist
from torch.utils.data import DataLoader

from rank_dataset import MetaFile, RandomSampler, RankDataset, Source, class_balanced
from rank_dataset.core import shm
from rank_dataset.core.shard import Shard
from rank_dataset.shards.collective import _rounds
from tests_helpers import write_rank_result


def digest(shard: Shard) -> str:
    h = hashlib.sha256(shard.bounds.tobytes() + shard.data.tobytes())
    if shard.ids is not None:
        h.update(shard.ids.tobytes())
    return h.hexdigest()


def compare(name: str, meta: Any, steps: list[tuple[int, int]], result: dict[str, Any], **kw: Any) -> None:
    """Build both readers' datasets of ``meta`` and compare their shards at each (epoch, mini_epoch_idx)."""
    file_ds = RankDataset(meta, **kw)
    coll = RankDataset(meta, reader="collective", **kw)
    same = coll.reader.fingerprint == file_ds.reader.fingerprint
    for epoch, idx in steps:
        file_ds.set_epoch(epoch, idx)
        coll.set_epoch(epoch, idx)
        same = same and digest(file_ds.shard) == digest(coll.shard)
        same = same and coll.indices.tolist() == file_ds.indices.tolist()
    if len(coll):
        i = int(coll.indices[-1])
        same = same and coll.reader.where(i) == file_ds.reader.where(i)
    result[name] = same
    result.setdefault("slices", [int(s) for s in coll.reader._slices.held])
    coll.close()


def identity(d: Path, result: dict[str, Any]) -> None:
    a, b, c = d / "a.txt", d / "b.txt", d / "c.txt"
    compare("plain", a, [(0, 0), (1, 0)], result, reload_cfg={"seed": 3})
    compare("mini_epochs", a, [(0, 0), (0, 2), (1, 1)], result, reload_cfg={"mini_epoch": 3, "seed": 1})
    compare("eval", [a, b, c], [(0, 0)], result, is_test=True)
    compare("files", [a, b, c], [(0, 0), (1, 0)], result, reload_cfg={"seed": 5})
    mix = [Source(a, weight={0: 1, 1: 3}), Source(b, repeat=2), Source(c, choose=7)]
    compare("mix_schedule", mix, [(0, 0), (1, 0), (2, 0)], result, reload_cfg={"seed": 2, "mini_epoch": 2})
    compare("mix_eval", mix, [(0, 0)], result, is_test=True)
    subsets = [Source(a, ids=range(0, 900, 3), weight=1), Source(a, ids=range(1, 300, 2), weight=1), Source(b)]
    compare("subsets", subsets, [(0, 0), (1, 0)], result, reload_cfg={"seed": 4})
    compare("class_balanced", class_balanced(a), [(0, 0), (3, 0)], result, reload_cfg={"seed": 6})
    compare("aug_repeats", a, [(0, 0), (1, 0)], result, reload_cfg={"seed": 7, "aug_repeats": 3})
    compare("exclude", a, [(0, 0), (1, 0)], result, reload_cfg={"seed": 9}, exclude=list(range(0, 900, 7)))
    compare("mix_exclude", mix, [(0, 0), (1, 0)], result, reload_cfg={"seed": 10}, exclude=[1, 5, 950, 1300])
    # Resume on another world size, through group=: saved by the whole world, loaded on a smaller group.
    state = RankDataset(a, reload_cfg={"seed": 8, "mini_epoch": 2}).state_dict(consumed=5)
    world = dist.get_world_size()
    small = dist.new_group(list(range(max(1, world - 1))))
    if dist.get_rank() < max(1, world - 1):
        file_ds = RankDataset(a, reload_cfg={"seed": 8, "mini_epoch": 2}, group=small)
        coll = RankDataset(a, reader="collective", reload_cfg={"seed": 8, "mini_epoch": 2}, group=small)
        file_ds.load_state_dict(state)
        coll.load_state_dict(state)
        result["resume_group"] = (coll.world_size, digest(coll.shard) == digest(file_ds.shard))
        coll.set_epoch(0, 1)
        file_ds.set_epoch(0, 1)
        result["resume_next"] = digest(coll.shard) == digest(file_ds.shard)
        coll.close()


def identity_parquet(d: Path, result: dict[str, Any]) -> None:
    """a.parquet (path, label and note; rows with tabs, newlines, or nothing at all) read with two of
    its columns, alone and as sources among text files; with all its columns among the text files b.txt
    and c.txt and the empty e.parquet; and columns the file reader refuses (n.parquet: nested)."""
    a, b, c, e = d / "a.parquet", d / "b.txt", d / "c.txt", d / "e.parquet"
    cols = ["path", "label"]
    compare("plain", a, [(0, 0), (1, 0)], result, reload_cfg={"seed": 3}, columns=cols)
    compare("mini_epochs", a, [(0, 0), (0, 2), (1, 1)], result, reload_cfg={"mini_epoch": 3, "seed": 1}, columns=cols)
    compare("metafile", MetaFile(a, columns=["label", "path"]), [(0, 0)], result, reload_cfg={"seed": 2})
    compare("eval", [a, b, c, e], [(0, 0)], result, is_test=True)
    compare("files", [b, a, e, c], [(0, 0), (1, 0)], result, reload_cfg={"seed": 5})
    mix = [Source(a, weight={0: 1, 1: 3}, columns=cols), Source(b, repeat=2), Source(c, choose=7)]
    compare("mix_schedule", mix, [(0, 0), (1, 0), (2, 0)], result, reload_cfg={"seed": 2, "mini_epoch": 2})
    subsets = [Source(a, ids=range(0, 900, 3), weight=1, columns=cols), Source(a, ids=range(1, 300, 2), columns=cols)]
    compare("subsets", [*subsets, Source(b)], [(0, 0), (1, 0)], result, reload_cfg={"seed": 4})
    compare("aug_repeats", a, [(0, 0), (1, 0)], result, reload_cfg={"seed": 7, "aug_repeats": 3}, columns=cols)
    compare("exclude", [a, b], [(0, 0)], result, reload_cfg={"seed": 9}, exclude=list(range(0, 900, 7)))
    # Bad columns: the collective reader's error is the file reader's.
    for name, meta, bad in [("missing", a, ["path", "nope"]), ("nested", d / "n.parquet", ["tags"]), ("text", b, cols)]:
        errors = []
        for reader in ("file", "collective"):
            try:
                RankDataset(meta, reader=reader, columns=bad).close()
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        result[name] = errors


def workers(d: Path, result: dict[str, Any]) -> None:
    """Persistent workers under each start method on rank 0 (every rank calls set_epoch together)."""
    ds = RankDataset(d / "a.txt", reader="collective", reload_cfg={"seed": 1}, audit="error")
    for method in ("fork", "spawn", "forkserver"):
        loader = None
        if dist.get_rank() == 0:
            sampler = RandomSampler(ds, seed=0)
            loader = DataLoader(
                ds,
                batch_size=64,
                sampler=sampler,
                num_workers=1,
                persistent_workers=True,
                multiprocessing_context=method,
            )
        ok = True
        for epoch in range(2):
            ds.set_epoch(epoch)
            if loader is not None:
                items = [x for batch in loader for x in batch]
                ok = ok and sorted(items) == sorted(ds.shard.texts(range(len(ds))))
        if loader is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ds.set_epoch(2)  # audits the last pass
            result[method] = ok and all(p.read == p.drawn for p in ds.audit())
            # Stop the workers and free the loader's queues now: a spawn or forkserver context's
            # semaphores are named ones, unlinked when collected.
            if loader._iterator is not None:
                loader._iterator._shutdown_workers()
            del loader
            gc.collect()
        else:
            ds.set_epoch(2)
    ds.close()


def io(d: Path, result: dict[str, Any]) -> None:
    """``read_chars`` of the first build (the dataset's making) and of later builds of big.txt (or of
    big.parquet, where the test wrote that)."""
    me = psutil.Process()
    big = d / "big.parquet" if (d / "big.parquet").exists() else d / "big.txt"
    before = me.io_counters().read_chars
    ds = RankDataset(big, reader="collective", reload_cfg={"seed": 1})
    first = me.io_counters().read_chars - before
    later = []
    for epoch in range(1, 3):
        before = me.io_counters().read_chars
        ds.set_epoch(epoch)
        later.append(me.io_counters().read_chars - before)
    result.update(first=first, later=later, size=os.path.getsize(big))
    ds.close()


def fault(kind: str, d: Path, result: dict[str, Any]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    timeout = datetime.timedelta(seconds=20)
    meta = d / "a.parquet" if (d / "a.parquet").exists() else d / "a.txt"  # where a Parquet test wrote one
    try:
        if kind == "disagree":
            ds = RankDataset(meta, reader="collective", reload_cfg={"seed": rank}, timeout=20.0)  # seconds too
        elif kind == "badline":
            ds = RankDataset(d / "bad.txt", reader="collective", reload_cfg={"seed": 1}, timeout=timeout)
        else:
            ds = RankDataset(meta, reader="collective", reload_cfg={"seed": 1}, timeout=timeout)
            dist.barrier()
            if kind == "changed" and rank == world - 1:
                data = meta.read_bytes()
                meta.write_bytes(data[: len(data) - 40] + b"x" * 40)
            if kind == "absent" and rank == world - 1:
                # Never calls set_epoch; its process stays until the others are done.
                others = [d / f"result.{r}.json" for r in range(world - 1)]
                deadline = time.monotonic() + 120
                while not all(p.exists() for p in others) and time.monotonic() < deadline:
                    time.sleep(0.2)
                result["error"] = "absent"
                write_rank_result_plain(d, rank, result)
                return
            if kind == "dies" and rank == world - 1:
                os._exit(0)  # gone without a word (exit code 0: the launcher, as torchrun, would end the others)
            if kind == "changed":
                dist.barrier()  # the file changed before any rank builds again
            ds.set_epoch(1)
        result["error"] = None
    except Exception as exc:  # what each rank ended with is the point
        result["error"] = f"{type(exc).__name__}: {exc}"
    write_rank_result_plain(d, rank, result)


def objects(d: Path, result: dict[str, Any]) -> None:
    """The same meta files as objects (their URLs in RANK_DATASET_TEST_URLS, in the order a, b, c):
    the collective reader and the file reader of the objects against the file reader of the local
    files, shard for shard; then DataLoader workers under each start method over the collective
    reader's shard (they read the shard, never the object)."""
    url_a, url_b, url_c = os.environ["RANK_DATASET_TEST_URLS"].split()
    a, b, c = d / "a.txt", d / "b.txt", d / "c.txt"
    cases: list[tuple[str, Any, Any, dict[str, Any], list[tuple[int, int]]]] = [
        ("plain", url_a, a, {"reload_cfg": {"seed": 3}}, [(0, 0), (1, 0)]),
        ("files", [url_a, url_b, url_c], [a, b, c], {"reload_cfg": {"seed": 5, "mini_epoch": 2}}, [(0, 0), (0, 1)]),
        ("mixed", [url_a, b], [a, b], {"is_test": True}, [(0, 0)]),
    ]
    for name, remote, local, kw, steps in cases:
        here = RankDataset(local, **kw)
        coll = RankDataset(remote, reader="collective", **kw)
        there = RankDataset(remote, **kw)
        same = coll.reader.fingerprint == here.reader.fingerprint == there.reader.fingerprint
        for epoch, idx in steps:
            for ds in (here, coll, there):
                ds.set_epoch(epoch, idx)
            same = same and digest(here.shard) == digest(coll.shard) == digest(there.shard)
        result[name] = same
        coll.close()
    ds = RankDataset(url_a, reader="collective", reload_cfg={"seed": 1})
    for method in ("fork", "spawn", "forkserver"):
        ok = True
        for epoch in range(2):
            ds.set_epoch(epoch)
            if dist.get_rank() == 0:
                loader = DataLoader(ds, batch_size=64, num_workers=1, multiprocessing_context=method)
                items = [x for batch in loader for x in batch]
                ok = ok and sorted(items) == sorted(ds.shard.texts(range(len(ds))))
                del loader
                gc.collect()
        result[method] = ok
    ds.close()


def segments(d: Path, result: dict[str, Any]) -> None:
    """The exchange's shared segments this process maps (``/proc/self/maps``) and has open
    (``/proc/self/fd``) while a dataset lives, after its close, and after a second dataset's close; and
    the bytes its builds received over gloo and copied from its host's ranks."""

    def held() -> dict[str, int]:
        maps = Path("/proc/self/maps").read_text().splitlines()
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        return {  # segments by their inode (a segment is one mapping, or a few where split)
            "mapped": len({line.split()[4] for line in maps if "rank_dataset_exchange" in line}),
            "open": sum("rank_dataset_exchange" in f for f in fds),
        }

    ds = RankDataset(d / "a.txt", reader="collective", reload_cfg={"seed": 1})
    result["making"] = held()
    ds.set_epoch(1)
    result["stats"] = dict(ds.reader.stats)
    result["built"] = held()
    ds.close()
    gc.collect()
    result["closed"] = held()
    again = RankDataset(d / "a.txt", reader="collective", reload_cfg={"seed": 2})
    again.close()
    del again
    gc.collect()
    result["closed_again"] = held()
    result["shard"] = int(ds.shard.nbytes)
    result["lines"] = int(ds.shard.bounds[-1])


def write_rank_result_plain(d: Path, rank: int, result: dict[str, Any]) -> None:
    """Write this rank's result without a collective (the group may be broken)."""
    import json

    (d / f"result.{rank}.json").write_text(json.dumps(result))


def main(mode: str, d: str) -> None:
    if mode.endswith("+hosts2"):
        # Ranks 2h and 2h + 1 stand for host h: each pair shares memory, pairs exchange through gloo.
        os.environ[shm.HOST_ENV] = f"host{int(os.environ['RANK']) // 2}"
        mode = mode.removesuffix("+hosts2")
    if mode.endswith("+spacing"):
        # Checkpoints of compressed files every 64 KiB of text (4 MiB otherwise): the test files'
        # indexes (made here, by rank 0) hold several, and the slices start at them.
        from rank_dataset.files.formats import Decompression

        assert Decompression.__init__.__kwdefaults__ is not None
        Decompression.__init__.__kwdefaults__["spacing"] = 64 << 10
        mode = mode.removesuffix("+spacing")
    if mode.endswith("+rounds"):
        # Rounds of about 1 KiB of lines: the test files' exchanges take dozens of rounds, each window
        # of a slice read, checked and served on its own. The read tests' files of megabytes (plain text
        # or Parquet) in rounds of 16 KiB: still over a hundred rounds a rank and build, not thousands.
        _rounds.ROUND = 16 << 10 if mode == "io+rounds" else 1 << 10
        mode = mode.removesuffix("+rounds")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    result: dict[str, Any] = {"rank": dist.get_rank()}
    if mode.startswith("fault-"):
        fault(mode[6:], Path(d), result)
        os._exit(0)  # the group may be broken: leave without its teardown
    modes = {
        "identity": identity,
        "identity-parquet": identity_parquet,
        "workers": workers,
        "io": io,
        "objects": objects,
        "segments": segments,
    }
    modes[mode](Path(d), result)
    write_rank_result(str(Path(d) / "result"), result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
