"""The byte source seam (LocalFile) and the public helpers the collective reader shares with the file
reader: fingerprints, the exact positional read, a compressed file's checkpoints, the UTF-8 check."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.index.fingerprints import FINGERPRINT_BYTES, fingerprints
from rank_dataset.files.index.load import checkpoints_of, load_index, read_checkpoints
from rank_dataset.files.io import FileKey, LocalFile, read_exact
from rank_dataset.files.read.lines import check_utf8


def _old_fingerprints(files: list[tuple[int, bytes]]) -> tuple[str, tuple[str, ...]]:
    # What MetaFile computed before the helper (and the collective reader computes): kept byte for byte.
    whole, each = hashlib.sha256(), []
    for count, data in files:
        n = min(len(data), FINGERPRINT_BYTES)
        part = struct.pack("<qq", count, len(data)) + (data[:n] + data[len(data) - n :] if data else b"")
        whole.update(part)
        each.append(hashlib.sha256(part).hexdigest()[:32])
    return whole.hexdigest()[:32], tuple(each)


def test_fingerprints_are_metafiles_and_the_bytes_they_always_were(tmp_path: Path) -> None:
    big = "".join(f"img_{i}.jpg {i % 9}\n" for i in range(40_000)).encode()  # over 2 x 64 KiB
    small = b"a 1\nb 2\n"
    paths = [tmp_path / "big.txt", tmp_path / "small.txt"]
    for path, data in zip(paths, [big, small]):
        path.write_bytes(data)
    mf = MetaFile(paths)
    keys = [FileKey.of(os.stat(p)) for p in paths]
    found = fingerprints([(p.resolve(), k, n, None) for p, k, n in zip(paths, keys, [40_000, 2])])
    assert found == (mf.fingerprint, mf.file_fingerprints) == _old_fingerprints([(40_000, big), (2, small)])


def test_a_local_file_reads_exactly_and_tells_a_change(tmp_path: Path) -> None:
    path = tmp_path / "meta.txt"
    path.write_bytes(b"0123456789")
    with LocalFile(path) as source:
        assert source.read(2, 3) == b"234" and b"".join(source.stream(1, 9, block=3)) == b"12345678"
        out = np.empty(4, np.uint8)
        source.read_into(out, 6)
        assert out.tobytes() == b"6789"
        with pytest.raises(MetaFileChangedError, match="shrank"):
            read_exact(source.fd, path, 8, 5)
        key = source.key
    path.write_bytes(b"0123")
    with pytest.raises(MetaFileChangedError, match="size changed from 10 to 4"):
        LocalFile(path, key)
    path.unlink()
    with pytest.raises(MetaFileChangedError, match="deleted or moved"):
        LocalFile(path, key)
    with pytest.raises(FileNotFoundError):
        LocalFile(path)


def test_checkpoints_of_a_compressed_file_are_its_indexs_and_checked_against_the_key(tmp_path: Path) -> None:
    path = tmp_path / "meta.txt.gz"
    path.write_bytes(gzip.compress("".join(f"x{i} 1\n" for i in range(1000)).encode()))
    index = load_index(path)
    assert checkpoints_of(path, index.key).to_bytes() == read_checkpoints(index).to_bytes()
    other = dataclasses.replace(index.key, size=index.key.size + 1)
    with pytest.raises(MetaFileChangedError, match="size changed"):
        checkpoints_of(path, other)


def test_check_utf8_names_the_row() -> None:
    rows = [b"ok", "caf\u00e9".encode(), b"bad \xff here"]
    data = np.frombuffer(b"".join(rows), np.uint8)
    bounds = np.cumsum([0, *map(len, rows)])
    check_utf8(lambda row: f"row {row}", data[: bounds[2]], bounds[:3])
    with pytest.raises(ValueError, match=r"row 2: line is not valid UTF-8 \(invalid start byte at byte 4\)"):
        check_utf8(lambda row: f"row {row}", data, bounds)
