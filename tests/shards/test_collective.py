"""The collective reader with real gloo processes (tests/ranks.py, as torchrun runs them): its shards are
the file reader's byte for byte (every plan kind, resume on another world size, group=), DataLoader
workers under every start method, the bytes it reads, and faults (every rank ends with the same clear
error)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest
import zstandard

from collective_helpers import write_texts
from rank_dataset import RankDataset
from tests_helpers import run_ranks, worker_env

pytestmark = pytest.mark.slow


def compress(path: Path, fmt: str, *, frame: int = 32 << 10) -> None:
    """Rewrite ``path`` compressed under the same name (the format is told by content): ``gz`` one gzip
    member, ``gz-members`` a member per ``frame`` bytes of text (as BGZF), ``zst`` a zstd frame per
    ``frame`` bytes, ``zst-one`` one zstd frame."""
    raw = path.read_bytes()
    pieces = [raw[i : i + frame] for i in range(0, len(raw), frame)] or [b""]
    if fmt == "gz":
        out = gzip.compress(raw, 6)
    elif fmt == "gz-members":
        out = b"".join(gzip.compress(p, 6) for p in pieces)
    elif fmt == "zst":
        out = b"".join(zstandard.ZstdCompressor(level=3).compress(p) for p in pieces)
    else:
        out = zstandard.ZstdCompressor(level=3).compress(raw)
    path.write_bytes(out)


def write_parquet(path: Path, n: int, *, row_group_size: int) -> None:
    """A Parquet meta file of ``n`` rows in row groups of ``row_group_size``: a path (some empty, null,
    holding a tab, a newline or a carriage return, non-ASCII or long), an integer label (some null)
    and a note; where path and label are both null, the row's line (of those two) is empty."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths: list[str | None] = []
    for i in range(n):
        name = f"img_{i}{'é' if i % 11 == 0 else ''}{'x' * (3000 if i % 401 == 0 else 0)}.jpg"
        odd = {0: None, 1: "", 2: "a\tb", 3: "a\nb\n", 4: "img\r", 5: " \t"}
        paths.append(odd.get(i % 37, name) if i % 37 < 6 else name)
    labels = [None if i % 37 == 0 else i % 5 for i in range(n)]
    notes = [f"note {i}" if i % 3 else None for i in range(n)]
    table = pa.table({"path": pa.array(paths, pa.string()), "label": pa.array(labels, pa.int64()), "note": notes})
    pq.write_table(table, path, row_group_size=row_group_size)


def run(mode: str, w: int, d: Path, *, check: bool = True) -> list[dict[str, Any]]:
    proc = run_ranks("collective_worker.py", w, mode, d, env=worker_env(), timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((d / f"result.{r}.json").read_text()) for r in range(w)]


@pytest.mark.parametrize(("w", "rounds"), [(2, False), (3, False), (4, False), (3, True)])
def test_shards_are_the_file_readers_byte_for_byte(tmp_path: Path, w: int, rounds: bool) -> None:
    write_texts(tmp_path)
    results = run("identity" + ("+rounds" if rounds else ""), w, tmp_path)
    cases = ["plain", "mini_epochs", "eval", "files", "mix_schedule", "mix_eval", "subsets", "class_balanced"]
    for res in results:
        for case in [*cases, "aug_repeats", "exclude", "mix_exclude"]:
            assert res[case] is True, (res["rank"], case)
    for res in results[: max(1, w - 1)]:  # the ranks of the smaller group
        assert res["resume_group"] == [max(1, w - 1), True]
        assert res["resume_next"] is True


@pytest.mark.parametrize(("fmt", "w"), [("gz", 3), ("gz-members", 2), ("zst", 3), ("zst-one", 2)])
def test_compressed_files_shards_are_the_file_readers_byte_for_byte(tmp_path: Path, fmt: str, w: int) -> None:
    # a.txt and b.txt compressed (under their names: the format is told by content), c.txt plain; the
    # checkpoints every 64 KiB of text, so that a.txt's slices (of 0.5 MB) start at several of them.
    write_texts(tmp_path, 20_000)
    compress(tmp_path / "a.txt", fmt)
    compress(tmp_path / "b.txt", "gz" if fmt.startswith("zst") else "zst")
    results = run("identity+spacing", w, tmp_path)
    for res in results:
        for case in ["plain", "mini_epochs", "eval", "files", "mix_schedule", "subsets", "class_balanced", "exclude"]:
            assert res[case] is True, (res["rank"], case, fmt)
    assert results[0]["resume_group"] == [max(1, w - 1), True]
    slices = results[0]["slices"]  # samples each rank's slice of a.txt holds (cut at checkpoints)
    if fmt == "zst-one":  # one frame is one checkpoint: rank 0 reads it all
        assert max(slices) >= 20_000, slices
    else:
        assert min(slices) > 0, slices


@pytest.mark.parametrize(("w", "rounds"), [(2, False), (3, True)])
def test_parquet_files_shards_are_the_file_readers_byte_for_byte(tmp_path: Path, w: int, rounds: bool) -> None:
    # a.parquet in row groups of 97 rows (31 of them), b.txt gzip: each rank renders its own row
    # groups; with rounds of about 1 KiB a round stops inside a row group and the next goes on in it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_texts(tmp_path)
    compress(tmp_path / "b.txt", "gz")
    write_parquet(tmp_path / "a.parquet", 3000, row_group_size=97)
    pq.write_table(pa.table({"path": pa.array([], pa.string())}), tmp_path / "e.parquet")
    pq.write_table(pa.table({"tags": [["a", "b"]]}), tmp_path / "n.parquet")
    results = run("identity-parquet" + ("+rounds" if rounds else ""), w, tmp_path)
    for res in results:
        for case in ["plain", "mini_epochs", "metafile", "eval", "files", "mix_schedule", "subsets", "aug_repeats"]:
            assert res[case] is True, (res["rank"], case)
        assert res["exclude"] is True, res["rank"]
        for case in ["missing", "nested", "text"]:  # refused, as the file reader words it
            file_error, collective_error = res[case]
            assert file_error is not None and collective_error == file_error, (case, res[case])
    assert min(results[0]["slices"]) > 0, results[0]["slices"]  # every rank holds row groups of a.parquet


def test_persistent_workers_under_every_start_method(tmp_path: Path) -> None:
    write_texts(tmp_path)
    results = run("workers", 2, tmp_path)
    assert {m: results[0][m] for m in ("fork", "spawn", "forkserver")} == dict.fromkeys(
        ("fork", "spawn", "forkserver"), True
    )


@pytest.mark.parametrize(("w", "rounds"), [(2, False), (4, False), (8, False), (4, True)])
def test_a_build_reads_the_files_about_once_across_the_ranks(tmp_path: Path, w: int, rounds: bool) -> None:
    # read_chars of every rank together: the first build (the dataset's making, which counts lines
    # first) at most 2.05x the file, every later build at most 1.05x, each plus 1 MiB a rank.
    (tmp_path / "big.txt").write_text(
        "".join(f"train/n{i % 1000:08d}/img_{i:08d}.JPEG {i % 1000}\n" for i in range(200_000))
    )
    results = run("io" + ("+rounds" if rounds else ""), w, tmp_path)
    size = results[0]["size"]
    first = sum(r["first"] for r in results)
    assert first <= 2.05 * size + w * (1 << 20), (first / size, w)
    for build in range(2):
        later = sum(r["later"][build] for r in results)
        assert later <= 1.05 * size + w * (1 << 20), (later / size, w)
        assert later >= size  # every byte of the file was read (by one rank)


@pytest.mark.parametrize("fmt", ["gz", "gz-members", "zst"])
def test_a_build_of_a_compressed_file_reads_it_about_once_across_the_ranks(tmp_path: Path, fmt: str) -> None:
    # Compressed bytes read (read_chars) by every rank together: each rank decompresses its own slice,
    # from the checkpoint it starts at, and the few bytes past its end that finish its last line
    # (which may cost a read of the decoder's, 64 KiB for gzip, 128 KiB for zstd). In rounds of about
    # 1 KiB: each round's read goes on from where the round before stopped, not from a checkpoint.
    rng = random.Random(0)
    big = tmp_path / "big.txt"
    big.write_text("".join(f"train/{rng.getrandbits(64):016x}/img_{i}.JPEG {i % 1000}\n" for i in range(100_000)))
    compress(big, fmt, frame=256 << 10)
    w = 4
    results = run("io+rounds+spacing", w, tmp_path)
    size = results[0]["size"]
    for build in range(2):
        later = sum(r["later"][build] for r in results)
        assert size <= later <= 1.05 * size + w * (128 << 10), (later / size, fmt)


def test_a_build_of_a_parquet_file_reads_it_about_once_across_the_ranks(tmp_path: Path) -> None:
    # Bytes read (read_chars) by every rank together: each rank reads its own row groups (their column
    # chunks) and the footer, which every rank reads at each build (so up to 64 KiB a rank besides).
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    paths = [f"train/{rng.getrandbits(64):016x}/img_{i}.JPEG" for i in range(100_000)]
    table = pa.table({"path": paths, "label": [i % 1000 for i in range(100_000)]})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=5000)
    w = 4
    results = run("io+rounds", w, tmp_path)
    size = results[0]["size"]
    for build in range(2):
        later = sum(r["later"][build] for r in results)
        assert 0.95 * size <= later <= 1.05 * size + w * (64 << 10), (later / size, [r["later"] for r in results])


def test_reader_collective_needs_a_process_group(tmp_path: Path) -> None:
    write_texts(tmp_path)
    with pytest.raises(ValueError, match=r"initialised torch\.distributed process group"):
        RankDataset(tmp_path / "a.txt", reader="collective")
    with pytest.raises(ValueError, match="reader must be 'file', 'collective' or a ShardReader, got 'mmap'"):
        RankDataset(tmp_path / "a.txt", reader="mmap")


def fault_run(kind: str, w: int, d: Path) -> list[str]:
    """The error each surviving rank ended with (the last rank is the one at fault, where one is)."""
    run_ranks("collective_worker.py", w, f"fault-{kind}", d, env=worker_env(), timeout=300)
    files = [d / f"result.{r}.json" for r in range(w)]
    return [json.loads(f.read_text())["error"] if f.exists() else "(none)" for f in files]


def test_a_rank_that_dies_or_stays_away_ends_every_other_rank_with_the_collective_and_epoch(tmp_path: Path) -> None:
    write_texts(tmp_path)
    for kind in ("dies", "absent"):
        errors = fault_run(kind, 3, tmp_path)
        survivors = errors[:2]
        assert survivors[0] == survivors[1], errors
        assert survivors[0].startswith("CollectiveError: the collective reader's exchange of "), errors
        assert "of epoch 1 did not complete on every one of the 3 ranks" in survivors[0]
        for r in range(3):
            (tmp_path / f"result.{r}.json").unlink(missing_ok=True)


@pytest.mark.parametrize("rounds", [False, True])
def test_a_file_changed_under_a_slice_is_the_same_error_on_every_rank(tmp_path: Path, rounds: bool) -> None:
    write_texts(tmp_path)
    errors = fault_run("changed" + ("+rounds" if rounds else ""), 3, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(f"MetaFileChangedError: meta file {tmp_path / 'a.txt'} changed: it was modified")


@pytest.mark.parametrize("fmt", ["gz", "zst"])
def test_a_compressed_file_changed_or_corrupt_is_the_same_error_on_every_rank(tmp_path: Path, fmt: str) -> None:
    write_texts(tmp_path, 20_000)
    a = tmp_path / "a.txt"
    compress(a, fmt)
    errors = fault_run("changed+spacing", 3, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(f"MetaFileChangedError: meta file {a} changed: it was modified"), errors
    for r in range(3):
        (tmp_path / f"result.{r}.json").unlink()
    # Corrupt from the start: the index (made by rank 0, one decompression) finds it, and every rank
    # ends with its error, naming the file and the compressed offset.
    write_texts(tmp_path, 20_000)
    compress(a, fmt)
    data = bytearray(a.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(16)
    a.write_bytes(bytes(data))
    errors = fault_run("corrupt+spacing", 3, tmp_path)
    assert len(set(errors)) == 1, errors
    prefix = f"CorruptMetaFileError: meta file {a} cannot be decoded at or after compressed byte "
    assert errors[0].startswith(prefix), errors


def test_a_parquet_file_changed_under_a_slice_is_the_same_error_on_every_rank(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", 3000, row_group_size=200)
    errors = fault_run("changed", 3, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(f"MetaFileChangedError: meta file {tmp_path / 'a.parquet'} changed: it was modified")


def test_a_truncated_parquet_file_is_refused_on_every_rank(tmp_path: Path) -> None:
    meta = tmp_path / "a.parquet"
    write_parquet(meta, 3000, row_group_size=200)
    meta.write_bytes(meta.read_bytes()[:-100])  # no footer: not a Parquet file, and not text either
    errors = fault_run("truncated", 2, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(f"CorruptMetaFileError: meta file {meta} "), errors
    assert "ends without its footer (truncated?)" in errors[0], errors


@pytest.mark.parametrize("rounds", [False, True])
def test_a_bad_line_from_another_slice_is_named_on_every_rank(tmp_path: Path, rounds: bool) -> None:
    lines = [f"img_{i}.jpg {i % 5}".encode() for i in range(3000)]
    lines[1700] = b"img_\xff.jpg 1"  # not UTF-8; line 1702 of the file (two blank lines before it)
    (tmp_path / "bad.txt").write_bytes(b"\n\n" + b"\n".join(lines) + b"\n")
    (tmp_path / "a.txt").write_text("x\n")
    errors = fault_run("badline" + ("+rounds" if rounds else ""), 3, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0] == (
        f"ValueError: {tmp_path / 'bad.txt'}:1703: line is not valid UTF-8 (invalid start byte at byte 4)"
    )


def test_ranks_that_disagree_meet_the_agreement_check_first(tmp_path: Path) -> None:
    write_texts(tmp_path)
    errors = fault_run("disagree", 3, tmp_path)
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("RanksDisagreeError: ranks disagree on seed: 0 on ranks [0], 1 on ranks [1]"), errors


@pytest.mark.parametrize(("w", "mode"), [(4, "identity+hosts2"), (4, "identity+rounds+hosts2")])
def test_shards_across_two_hosts_are_the_file_readers_byte_for_byte(tmp_path: Path, w: int, mode: str) -> None:
    # 2 hosts x 2 ranks (RANK_DATASET_TEST_HOST): each pair shares memory, the pairs exchange over gloo.
    write_texts(tmp_path)
    for res in run(mode, w, tmp_path):
        for case in ["plain", "mini_epochs", "eval", "files", "mix_schedule", "mix_eval", "subsets", "class_balanced"]:
            assert res[case] is True, (res["rank"], case)
        for case in ["aug_repeats", "exclude", "mix_exclude"]:
            assert res[case] is True, (res["rank"], case)


@pytest.mark.parametrize(("w", "mode", "per_host"), [(8, "segments", 8), (4, "segments+hosts2", 2)])
def test_the_ranks_of_a_host_map_each_others_memory_and_free_it_at_close(
    tmp_path: Path, w: int, mode: str, per_host: int
) -> None:
    # While a dataset lives each rank maps the segment of every rank of its host (Python's mmap keeps
    # a descriptor of each mapping: the segments have no name anywhere, and the kernel frees them with
    # the last mapping, even after a SIGKILL); its close unmaps them. On one host no line crosses gloo
    # (only a status byte a rank and round); on two, about half of them do.
    write_texts(tmp_path, 20_000)
    results = run(mode, w, tmp_path)
    for res in results:
        assert res["making"] == res["built"] == {"mapped": per_host, "open": per_host}, res
        assert res["closed"] == res["closed_again"] == {"mapped": 0, "open": 0}, res
        stats, lines = res["stats"], res["lines"]
        if per_host == w:
            assert stats["shared"] == lines and stats["sent"] == stats["received"] < 100 * w, stats
        else:
            assert 0.3 * lines < stats["shared"] < 0.7 * lines, stats
            assert lines - stats["shared"] < stats["received"] < 1.5 * (lines - stats["shared"]), stats
