"""Work split over threads: part 0 in the calling thread, errors after all parts, and what a helper
thread may keep resident (a build starts one only for large passes; its buffers are maps)."""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rank_dataset import MetaFile
from rank_dataset.core import native
from rank_dataset.core import threads as _threads
from rank_dataset.files import formats
from rank_dataset.files.formats import base as formats_base
from rank_dataset.files.formats import spans as spans_mod
from rank_dataset.files.io import pread as _pread
from rank_dataset.files.io.pread import Window
from rank_dataset.files.read import _gather as gather_mod
from rank_dataset.files.read import _visits as visits_mod
from rank_dataset.plan import permutation as permutation_mod
from rank_dataset.plan.permutation import permute

# What the threads decoded and kept is counted against what they were given in time: under a loaded
# machine a decoder thread runs behind, so these run alone (after make test's parallel part).
pytestmark = pytest.mark.alone


def test_part_zero_runs_in_the_calling_thread_the_others_in_helpers() -> None:
    seen: dict[tuple[int, int], int] = {}
    _threads.in_threads(lambda part: seen.__setitem__(part, threading.get_ident()), 3)
    assert sorted(seen) == [(0, 3), (1, 3), (2, 3)]
    assert seen[(0, 3)] == threading.get_ident()
    assert threading.get_ident() not in (seen[(1, 3)], seen[(2, 3)])


@pytest.mark.parametrize("failing", [0, 1])
def test_an_error_is_raised_once_every_part_is_done(failing: int) -> None:
    done: list[int] = []
    release = threading.Event()

    def work(part: tuple[int, int]) -> None:
        if part[0] == failing:
            release.set()
            raise ValueError(f"part {part[0]} failed")
        release.wait(5)  # the other part ends after the failure
        done.append(part[0])

    with pytest.raises(ValueError, match=f"part {failing} failed"):
        _threads.in_threads(work, 2)
    assert done == [1 - failing]


def _root(buf: Any) -> Any:
    """The object owning an array's memory, under numpy views and memoryviews."""
    while True:
        if isinstance(buf, np.ndarray) and buf.base is not None:
            buf = buf.base
        elif isinstance(buf, memoryview):
            buf = buf.obj
        else:
            return buf


def test_a_helper_threads_window_is_a_map_the_main_threads_a_heap_array(tmp_path: Path) -> None:
    # glibc keeps the top of a helper thread's arena resident for good: its buffers are maps there.
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    starts = np.arange(0, 1 << 20, 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        here = Window().load(fd, starts, starts + 100, 1 << 20)[0]
        there: list[np.ndarray] = []
        thread = threading.Thread(target=lambda: there.append(Window().load(fd, starts, starts + 100, 1 << 20)[0]))
        thread.start()
        thread.join()
    finally:
        os.close(fd)
    assert not isinstance(_root(here), mmap.mmap)  # a few KiB: joined reads on the heap
    assert isinstance(_root(there[0]), mmap.mmap)
    assert there[0][:100].tobytes() == here[:100].tobytes() == bytes(range(100))
    assert _pread._small() == _pread._SMALL


def _threads_asked(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[int]:
    asked: list[int] = []
    real: Callable[..., None] = module.in_threads

    def counting(work: Callable[[tuple[int, int]], None], k: int = _threads.THREADS) -> None:
        asked.append(k)
        real(work, k)

    monkeypatch.setattr(module, "in_threads", counting)
    return asked


def test_a_read_below_helped_items_starts_no_thread_and_above_it_the_same_lines(
    write_meta: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = write_meta(n=5000)
    mf = MetaFile(meta)
    indices = np.random.default_rng(0).permutation(len(mf))[:3000]
    asked = _threads_asked(monkeypatch, gather_mod)
    monkeypatch.setattr(visits_mod, "THREADED_ROWS", 1000)  # the maps of a large read, still
    alone = mf.read(indices)
    assert asked and set(asked) == {1}
    monkeypatch.setattr(visits_mod, "HELPED_ITEMS", 1000)
    monkeypatch.setattr(visits_mod, "THREADS", 2)
    asked.clear()
    helped = mf.read(indices)
    assert set(asked) == {2}
    assert helped.texts(range(len(helped))) == alone.texts(range(len(alone)))
    assert helped.ids is not None and (helped.ids == indices).all()
    lines = meta.read_text().splitlines()
    assert alone.texts(range(len(alone))) == [lines[i] for i in indices.tolist()]


def _decompressed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The output bytes each SpanSource decoded, as it closes."""
    decompressed: list[int] = []
    close = formats.SpanSource.close

    def counting_close(self: formats.SpanSource) -> None:
        decompressed.append(self.decompressed)
        close(self)

    monkeypatch.setattr(formats.SpanSource, "close", counting_close)
    return decompressed


def _lagging_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather's helper thread copies each batch late, as a descheduled thread does."""
    main, copy_rows = threading.get_ident(), native.copy_rows

    def lagging(*args: Any) -> None:
        if threading.get_ident() != main:
            time.sleep(0.002)
        copy_rows(*args)

    monkeypatch.setattr(native, "copy_rows", lagging)


def _one_frame_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[MetaFile, list[str], bytes]:
    """A one-frame zstd file of 60,000 lines, its MetaFile (spans of 40 KB), its lines and its text;
    reads on two threads in batches of 500 rows (a few batches a span)."""
    import zstandard

    lines = [f"train/n{i % 1000:08d}/img_{i}.JPEG {i % 1000}" for i in range(60_000)]
    raw = "".join(f"{line}\n" for line in lines).encode()
    path = tmp_path / "one.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
    monkeypatch.setattr(spans_mod, "SPAN", 40_000)  # spans of one frame
    mf = MetaFile(path)
    monkeypatch.setattr(visits_mod, "THREADS", 2)
    monkeypatch.setattr(visits_mod, "BATCH_ROWS", 500)
    return mf, lines, raw


def test_the_threads_reading_a_one_frame_zstd_file_share_its_decoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its one checkpoint is its start: a decoder a thread would each decompress the whole file. One
    # decoder thread decodes it in order, once; two threads copy its lines, each taking the next
    # batch as it finishes one, so even one that lags stays with the other (with a part each, it
    # asked for spans the source had let go of, decoded again from the frame's start).
    mf, lines, raw = _one_frame_file(tmp_path, monkeypatch)
    monkeypatch.setattr(visits_mod, "HELPED_ITEMS", 1000)
    asked = _threads_asked(monkeypatch, gather_mod)
    decompressed = _decompressed(monkeypatch)
    _lagging_helper(monkeypatch)
    # And twice the helper stalls after taking a batch, before loading it, while the other thread
    # goes on many spans (more than the source keeps): the batch's spans are pinned, not let go of.
    main, load_and_copy, calls = threading.get_ident(), gather_mod._copy_file_rows, itertools.count()

    def stalling(*args: Any) -> bool:
        if threading.get_ident() != main and next(calls) in (3, 9):
            time.sleep(0.2)
        return load_and_copy(*args)

    monkeypatch.setattr(gather_mod, "_copy_file_rows", stalling)
    kept = _kept_spans(monkeypatch)
    monkeypatch.setattr(spans_mod, "READ_AHEAD", 4)
    indices = np.random.default_rng(0).permutation(len(mf))[: len(mf) // 2]
    shard = mf.read(indices)
    assert shard.texts(range(len(shard))) == [lines[i] for i in indices.tolist()]
    assert asked[-1] == 2 and sum(decompressed) == len(raw)
    # The spans kept: the source's few, those pinned by the two batches in hand (a span or two each),
    # and the first spans read ahead during the first pass, until the batches reach them.
    assert max(kept) <= spans_mod._KEPT_SPANS + 2 * 3 + 4
    assert max(kept[len(kept) // 2 :]) <= spans_mod._KEPT_SPANS + 2 * 3


def _kept_spans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many spans each SpanSource keeps, after each span it keeps."""
    counts: list[int] = []
    keep = formats.SpanSource._keep

    def counting(self: formats.SpanSource, k: int, data: bytes) -> None:
        keep(self, k, data)
        counts.append(len(self._kept))

    monkeypatch.setattr(formats.SpanSource, "_keep", counting)
    return counts


def test_sparse_rows_of_a_one_frame_zstd_file_are_read_by_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch of sparse rows spans many spans: two threads would pin them all (the whole file kept),
    # and their batches, far apart, could not both be decoded in order. One thread reads them, the
    # source keeping its few spans.
    mf, lines, raw = _one_frame_file(tmp_path, monkeypatch)
    monkeypatch.setattr(visits_mod, "HELPED_ITEMS", 100)
    monkeypatch.setattr(gather_mod, "_SHARED_SPAN", 4 * 40_000)  # dense: a batch within 4 spans
    asked = _threads_asked(monkeypatch, gather_mod)
    decompressed = _decompressed(monkeypatch)
    kept = _kept_spans(monkeypatch)
    indices = np.random.default_rng(0).permutation(len(mf))[: len(mf) // 100]
    shard = mf.read(indices)
    assert shard.texts(range(len(shard))) == [lines[i] for i in indices.tolist()]
    # Decoded once, at most: to the last row read at least, to the end if the decoder ran ahead.
    last_end = sum(len(line) + 1 for line in lines[: int(indices.max()) + 1])
    assert asked[-1] == 1 and last_end <= sum(decompressed) <= len(raw), (last_end, sum(decompressed), len(raw))
    assert max(kept) <= spans_mod._KEPT_SPANS


@pytest.mark.parametrize("name", ["members.gz", "frames.zst"])
def test_the_threads_of_a_compressed_files_read_decode_each_span_about_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Each thread takes a run of batches: the spans between checkpoints it decodes are its own, but
    # at the runs' ends. (Taking every other batch, both asked for every span, and one that lagged
    # decoded again those the source had let go of: 1.25x the file at W = 8 in bench_formats.)
    from tests_helpers import COMPRESSORS

    lines = [f"train/n{i % 1000:08d}/img_{i}.JPEG {i % 1000}" for i in range(60_000)]
    raw = "".join(f"{line}\n" for line in lines).encode()
    path = tmp_path / name
    path.write_bytes(COMPRESSORS[name](raw))
    monkeypatch.setattr(formats_base, "SPACING", 40_000)
    monkeypatch.setattr(spans_mod, "SPAN", 40_000)
    monkeypatch.setenv("RANK_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    mf = MetaFile(path)
    monkeypatch.setattr(visits_mod, "HELPED_ITEMS", 1000)
    monkeypatch.setattr(visits_mod, "THREADS", 2)
    monkeypatch.setattr(visits_mod, "BATCH_ROWS", 500)  # a few batches a span
    asked = _threads_asked(monkeypatch, gather_mod)
    decompressed = _decompressed(monkeypatch)
    _lagging_helper(monkeypatch)
    indices = np.random.default_rng(0).permutation(len(mf))[: len(mf) // 2]
    shard = mf.read(indices)
    assert shard.texts(range(len(shard))) == [lines[i] for i in indices.tolist()]
    assert asked[-1] == 2
    # Runs: 1.02x-1.1x (spans decoded again where the runs meet, and where the two threads' spans
    # push each other's out of the source's few); every other batch: 1.86x-1.94x.
    assert sum(decompressed) <= 1.25 * len(raw)


def test_permutation_helped_only_from_helped_items(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _threads_asked(monkeypatch, permutation_mod)
    alone = permute(10**6, seed=3, epoch=1, positions=np.arange(300_000))
    assert asked == [1]
    monkeypatch.setattr(permutation_mod, "HELPED_ITEMS", 1000)
    monkeypatch.setattr(permutation_mod, "THREADS", 2)
    assert (permute(10**6, seed=3, epoch=1, positions=np.arange(300_000)) == alone).all()
    assert asked == [1, 2]
