"""A new format touches its module and the registry only: a toy one, registered here (in the tests
alone), is detected, indexed with checkpoints, cached, read by MetaFile and grouped like gzip or zstd."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rank_dataset import MetaFile, group_by
from rank_dataset.files.formats import (
    GZIP,
    TEXT,
    Checkpoints,
    Decoder,
    Format,
    by_code,
    by_name,
    detect_path,
    register,
    unregister,
)
from rank_dataset.files.formats import base as formats_base
from rank_dataset.files.formats.base import Recognised, Stream
from rank_dataset.files.index.load import load_index, read_checkpoints

_MAGIC = b"TOY\x01"
_KEY = 0x5A


@contextlib.contextmanager
def registered(fmt: Format) -> Iterator[Format]:
    """``fmt`` registered within the ``with`` block."""
    register(fmt)
    try:
        yield fmt
    finally:
        unregister(fmt)


def _encode(raw: bytes) -> bytes:
    return _MAGIC + (np.frombuffer(raw, np.uint8) ^ _KEY).tobytes()


def _decode(data: bytes) -> bytes:
    return (np.frombuffer(data, np.uint8) ^ _KEY).tobytes()


class _ToyReader:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, a: int, b: int, until: int | None = None) -> tuple[bytes, int]:
        data = _decode(os.pread(self._fd, b - a, len(_MAGIC) + a))
        return data, len(data)

    def close(self) -> None:
        pass


class _Toy(Format):
    """Text whose every byte is XORed with 0x5A, after 4 magic bytes: output byte x is input byte x + 4,
    so a checkpoint can be anywhere."""

    value = "toy"
    code = 99
    compressed = True

    def recognise(self, found: Recognised) -> bool:
        return found.head[:4] == _MAGIC

    def stream(self, path: Path, fd: int, spacing: int, block: int) -> Stream:
        size = os.fstat(fd).st_size - len(_MAGIC)
        for at in range(0, size, block):
            yield _decode(os.pread(fd, min(block, size - at), len(_MAGIC) + at))
        outs = np.arange(0, max(size, 1), spacing, dtype=np.int64)
        return size, np.stack([outs, outs + np.where(outs > 0, len(_MAGIC), 0)], axis=1), b""

    def reader(self, path: Path, fd: int, checkpoints: Checkpoints) -> Decoder:
        return _ToyReader(fd)


TOY = _Toy()


def test_a_format_registered_in_a_test_is_read_through_the_index_and_metafile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [f"img_{i}.jpg {i % 7}" for i in range(5000)]
    path = tmp_path / "meta.toy"
    path.write_bytes(_encode(("\n".join(lines) + "\n").encode()))
    monkeypatch.setattr(formats_base, "SPACING", 10_000)  # several checkpoints
    with registered(TOY):
        assert detect_path(path) is TOY and by_name("toy") is TOY and by_code(99) is TOY
        mf = MetaFile(path)
        assert len(mf) == len(lines) and mf[1234] == lines[1234]
        order = np.random.default_rng(0).permutation(len(lines))
        shard = mf.read(order)
        assert shard.texts(range(len(order))) == [lines[i] for i in order]
        assert mf.where(4321) == f"{path.resolve()}:4322"
        index = load_index(path.resolve())  # from the cache MetaFile wrote
        assert index.format is TOY and index.cache is not None and index.size == path.stat().st_size - 4
        checkpoints = read_checkpoints(index)
        assert checkpoints.format is TOY and len(checkpoints.points) > 5
        assert Checkpoints.from_bytes(checkpoints.to_bytes()).format is TOY
        groups = group_by(path)
        assert {k: v.tolist() for k, v in groups.items()} == {
            k: [i for i in range(len(lines)) if i % 7 == k] for k in range(7)
        }
    # Undone: the file is text again, and its cache (of a format no longer known) is not trusted.
    assert detect_path(path) is TEXT
    with pytest.raises(ValueError, match="no meta file format is named 'toy'"):
        by_name("toy")
    assert load_index(path.resolve()).format is TEXT


def test_a_format_clashing_with_another_is_refused() -> None:
    class Clash(_Toy):
        value = "gzip"

    with pytest.raises(ValueError, match="clashes with 'gzip'"), registered(Clash()):
        pass
    assert by_name("gzip") is GZIP
