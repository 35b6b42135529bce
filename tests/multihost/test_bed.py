"""Many hosts, for real: jobs under torchrun across the bed's hosts (network namespaces on a bridge, each
with its own ``/dev/shm``, ``/tmp`` and cache directory; a shared directory; a bucket behind a proxy that
counts and fails requests). 2 hosts x 2 ranks here; ``python tests/multihost/bed.py --hosts 4`` runs them
at 4 x 2.

Each test is one job of K torchruns (an agent and L ranks a host, each importing torch), 30-70 s on 2 cores:
they run in ``make test`` alone, after its parallel part, and not in ``make test-quick``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from multihost import worker
from multihost.bed import Bed, Host, Size
from rank_dataset import RankDataset, StepSampler
from tests_helpers import imagenet_line

pytestmark = [pytest.mark.alone, pytest.mark.slow]

WORKER = Path(worker.__file__)
LINES = 40_000
SERVER_PORT = 28889


@pytest.fixture(scope="module")
def meta(bed: Bed) -> Path:
    """A meta file on the shared directory (the same bytes are the bucket's ``meta.txt``)."""
    path = bed.shared / "meta.txt"
    data = "".join(f"{imagenet_line(i)}\n" for i in range(LINES)).encode()
    path.write_bytes(data)
    bed.put("meta.txt", data)
    return path


@pytest.fixture(scope="module")
def expected(meta: Path, size: Size, tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    """Each rank's digests at epochs 0 and 1, planned in this one process (rank=, world_size=), from a copy
    of the file: an index cached beside the shared one would be every host's."""
    copy = tmp_path_factory.mktemp("one-process") / meta.name
    copy.write_bytes(meta.read_bytes())
    out = []
    for rank in range(size.world):
        ds = RankDataset(copy, reload_cfg={"seed": worker.SEED}, rank=rank, world_size=size.world)
        digests = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            digests.append(worker.items_digest(ds))
        out.append(digests)
    return out


@pytest.fixture(scope="module")
def server(bed: Bed, meta: Path) -> Iterator[str]:
    """The meta server of the shared file, on the first host, for every host's ranks (its index cached in a
    directory of its own, as a server's on a machine of its own: the host's cache directory is its ranks')."""
    host = bed.hosts[0]
    cmd = [sys.executable, "-m", "rank_dataset", "serve", str(meta), "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    env = {"RANK_DATASET_CACHE_DIR": str(host.dir / "server-cache")}
    proc = host.popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://{host.ip}:{SERVER_PORT}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the meta server did not start: {proc.communicate()[1][-2000:]}") from None
            time.sleep(0.3)
    yield url
    proc.kill()
    proc.communicate()


def job(
    bed: Bed,
    size: Size,
    name: str,
    *args: object,
    env: dict[str, str] | None = None,
    hosts: Sequence[Host] | None = None,
) -> list[dict[str, Any]]:
    """Run the worker on every host (or ``hosts``) and return each rank's result, in rank order."""
    out = bed.scratch / name
    chosen = list(hosts or bed.hosts)
    done = bed.torchrun(WORKER, args[0], out, *args[1:], ranks=size.ranks, env=env, hosts=chosen)
    logs = "\n".join(f"--- {chosen[i].name}: {d.returncode}\n{d.stderr[-3000:]}" for i, d in enumerate(done))
    assert all(d.returncode == 0 for d in done), logs
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(len(chosen) * size.ranks)]


def test_every_reader_across_hosts_gives_the_shards_of_one_process(
    bed: Bed, size: Size, meta: Path, expected: list[list[str]], server: str
) -> None:
    readers = ["file", "collective", "server", "object-file", "object-collective"]
    results = job(bed, size, "shards", "shards", ",".join(readers), meta, f"s3://meta/{meta.name}", server)
    assert sorted({r["host"] for r in results}) == sorted(h.name for h in bed.hosts)
    for rank, result in enumerate(results):
        for reader in readers:
            assert result[reader] == expected[rank], (reader, rank, result["host"])
    # Each host built the index of the shared file and of the object once, in its own cache directory;
    # none went to the shared directory (read-only to the job, as a data set's directory usually is).
    for host in bed.hosts:
        caches = sorted(p.relative_to(host.cache_dir).as_posix() for p in host.cache_dir.rglob("*.rdidx"))
        assert len(caches) == 2, (host.name, caches)
        assert [c.startswith("rank-dataset/objects/") for c in caches].count(True) == 1, caches
    assert not [p for p in bed.shared.rglob("*") if ".rdidx" in p.name], list(bed.shared.rglob("*"))
    # Counted, not inferred from the files left (a second build replaces the first's file): the library records
    # each build (logger `rank_dataset.index`), and each host's ranks made one of each file, into its cache.
    url = f"s3://meta/{meta.name}"
    for host in bed.hosts:
        made = [b for r in results if r["host"] == host.name for b in r["builds"]]
        assert sorted(b["source"] for b in made) == sorted([str(meta), url]), (host.name, made)
        assert all(b["cache"] and Path(b["cache"]).is_relative_to(host.cache_dir) for b in made), (host.name, made)
    # The collective reader reads the file once per build for the whole job: at the shared directory (the
    # bytes every rank's process read in epoch 1's set_epoch) and at the store (GET bytes through the proxy).
    file_size = meta.stat().st_size
    read = sum(r["collective/read_chars"] for r in results)
    assert file_size <= read <= 1.05 * file_size + size.world * (1 << 20), (read / file_size, read)
    before, after = results[0]["object-collective/store"]
    get_bytes = after["GET"]["bytes"] - before.get("GET", {}).get("bytes", 0)
    gets = after["GET"]["requests"] - before.get("GET", {}).get("requests", 0)
    assert file_size <= get_bytes <= 1.05 * file_size + size.world * (64 << 10), (get_bytes / file_size, get_bytes)
    assert gets <= size.world + file_size // (32 << 20) + 1, gets  # a GET of up to 32 MiB a rank's slice
    where = f"{size.hosts}x{size.ranks}"
    print(f"collective, one build on {where}: the ranks read {read / file_size:.3f}x the file", end="; ")
    print(f"the store sent {get_bytes / file_size:.3f}x it in {gets} GETs")


def test_the_monitor_names_a_slow_hosts_ranks(bed: Bed, size: Size, meta: Path) -> None:
    slow_host = bed.hosts[-1].name
    results = job(bed, size, "slow", "slow", meta, slow_host)
    slow = sorted(r["rank"] for r in results if r["host"] == slow_host)
    assert len(slow) == size.ranks
    summaries = results[0]["summaries"]
    assert len(summaries) >= 4, summaries
    for summary in summaries[1:]:  # the first window holds the job's start
        assert summary["slowest"]["rank"] in slow, summary["slowest"]
        data = {r["rank"]: r["data_ms"] for r in summary["ranks"]}
        fastest_slow = min(data[r] for r in slow)
        assert all(data[r] < fastest_slow for r in data if r not in slow), data


def test_a_bucket_failing_one_request_in_five_changes_no_shard(
    bed: Bed, size: Size, meta: Path, expected: list[list[str]]
) -> None:
    # A new object of the same bytes, so that its index is built (through the failures) in this job; its
    # cache asked for on the shared directory: one for the job, none on the hosts.
    url = bed.put("again.txt", meta.read_bytes())
    cache = bed.scratch / "cache"
    before = {h.name: sorted(h.cache_dir.rglob("*.rdidx")) for h in bed.hosts}
    bed.proxy_call("fail", every=5)
    try:
        env = {"RANK_DATASET_CACHE_DIR": str(cache)}
        results = job(bed, size, "faults", "shards", "object-file,object-collective", meta, url, "-", env=env)
        failed = bed.proxy_call("stats")["failed"]
    finally:
        bed.proxy_call("fail", every=0)
    assert failed >= 5, failed
    for rank, result in enumerate(results):
        assert result["object-file"] == expected[rank], rank
        assert result["object-collective"] == expected[rank], rank
    assert len(list(cache.glob("*.rdidx"))) == 1, list(cache.iterdir())
    made = [b for r in results for b in r["builds"]]  # one builder for the whole job, through the failures
    assert [(b["source"], Path(str(b["cache"])).parent) for b in made] == [(url, cache)], made
    assert {h.name: sorted(h.cache_dir.rglob("*.rdidx")) for h in bed.hosts} == before


@pytest.mark.parametrize("layout", ["steps", "epoch"])
def test_a_host_lost_mid_epoch_resumes_on_the_others_from_the_saved_state(
    bed: Bed, size: Size, layout: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Training until the last host is lost at step KILL_AT (SIGKILL of all its processes), mid-epoch; the job
    # restarted on the hosts left (K - 1 of them here) from the last saved state trains the definition's rest.
    if size.hosts < 2:
        pytest.skip("a host lost needs two hosts or more")
    # By steps the restart takes the most hosts left whose world size divides the global batch size (the
    # guide's advice); the epoch layout resumes on any world size.
    fits = [n for n in range(1, size.hosts) if layout == "epoch" or worker.BATCH % (n * size.ranks) == 0]
    if not fits:
        pytest.skip(f"no world size of {size.ranks} ranks a host under {size.world} divides {worker.BATCH}")
    # 2,000 samples: 41.7 global batches of 48 an epoch (by steps, to step 60); mini-epochs of 1,000 (the epoch
    # layout reads the first to its end).
    kill_at, last = 17, 60 if layout == "steps" else 10**6
    small = bed.shared / "small.txt"
    if not small.exists():
        small.write_text("".join(f"{imagenet_line(i)}\n" for i in range(2_000)))
    state = bed.scratch / f"{layout}.state.json"
    victim, survivors = bed.hosts[-1], bed.hosts[: max(fits)]
    lost, resumed = bed.scratch / f"{layout}-lost", bed.scratch / f"{layout}-resumed"
    args = ("train", lost, layout, small, state, victim.name, kill_at, last)
    procs = bed.torchrun_start(WORKER, *args, ranks=size.ranks)
    deadline = time.monotonic() + 240
    while not Path(f"{lost}.victim").exists():
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
        assert time.monotonic() < deadline, "the job did not reach the step where the host is lost"
        time.sleep(0.2)
    victim.kill_all()
    ended = bed.wait(bed.hosts, procs, timeout=180)
    assert all(e.returncode != 0 for e in ended[:-1]), [e.stderr[-2000:] for e in ended]
    saved = json.loads(state.read_text())
    job(bed, size, f"{layout}-resumed", "train", layout, small, state, "-", -1, last, hosts=survivors)
    # The last state saved is of the last step every rank finished before the loss (saved every SAVE_EVERY).
    start = kill_at // worker.SAVE_EVERY * worker.SAVE_EVERY
    world = len(survivors) * size.ranks
    copy = tmp_path_factory.mktemp("node-loss") / small.name
    copy.write_bytes(small.read_bytes())
    before, after = trained(lost, size.world), trained(resumed, world)
    if layout == "steps":
        assert saved["step"] == start, saved
        # The definition: global batches 0 .. last - 1, planned in one process.
        ds = RankDataset(copy, reload_cfg=worker.CFG, rank=0, world_size=1)
        loader = DataLoader(ds, batch_sampler=StepSampler(ds, worker.BATCH), collate_fn=list)
        plan = [batch for _, batch in zip(range(last), loader)]
        glob_before, glob_after = global_batches(before), global_batches(after)
        assert list(glob_after) == list(range(start, last))
        assert all(glob_after[t] == plan[t] for t in glob_after), [t for t in glob_after if glob_after[t] != plan[t]]
        # Before the loss, every step up to the saved one was the definition's too: with the steps after the
        # restart, the samples trained are the definition's, none repeated or skipped.
        assert all(glob_before[t] == plan[t] for t in range(start)), [
            t for t in range(start) if glob_before[t] != plan[t]
        ]
        kept = [x for t in range(start) for x in glob_before[t]] + [x for t in glob_after for x in glob_after[t]]
        assert kept == [x for batch in plan for x in batch]
    else:
        consumed = start * worker.EPOCH_BATCH
        assert (saved["consumed"], saved["consumed_positions"]) == (consumed, consumed * size.world), saved
        # The definition: each rank's shard of the first mini-epoch on W ranks, and of its rest on W' ranks
        # from the saved state, planned in one process.
        shards = [
            items(RankDataset(copy, reload_cfg=worker.CFG, rank=r, world_size=size.world)) for r in range(size.world)
        ]
        for r in range(size.world):
            assert [x for t in range(start) for x in before[r][t]] == shards[r][:consumed], r
        rest = [x for shard in shards for x in shard[consumed:]]
        for r in range(world):
            ds = RankDataset(copy, reload_cfg=worker.CFG, rank=r, world_size=world)
            ds.load_state_dict(saved)
            assert [x for t in sorted(after[r]) for x in after[r][t]] == items(ds), r
        # None skipped, none repeated but the padding that evens the ranks' shares of the rest (under W').
        done = [x for r in range(world) for t in sorted(after[r]) for x in after[r][t]]
        assert set(done) == set(rest) and len(set(done)) == len(rest)
        assert 0 <= len(done) - len(rest) < world
        assert not set(done) & {x for shard in shards for x in shard[:consumed]}


def trained(out: Path, ranks: int) -> list[dict[int, list[str]]]:
    """What each rank logged it trained: its batch at each step."""
    logs = [Path(f"{out}.trained.{r}").read_text().splitlines() for r in range(ranks)]
    return [{e["step"]: e["batch"] for e in map(json.loads, log)} for log in logs]


def global_batches(by_rank: list[dict[int, list[str]]]) -> dict[int, list[str]]:
    """Each step's global batch (the ranks' batches in rank order), for the steps every rank logged."""
    steps = set.intersection(*(set(steps) for steps in by_rank))
    return {t: [x for batch in by_rank for x in batch[t]] for t in sorted(steps)}


def items(ds: RankDataset) -> list[str]:
    """A dataset's samples, in order."""
    return [ds[i] for i in range(len(ds))]
