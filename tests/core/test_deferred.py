"""Deferred: objects pickled apart from their owner, unpickled on first use, naming the owner's own objects."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from rank_dataset.core.deferred import Deferred


class _Book:
    def __init__(self, channel: list[str], reader: dict[str, int]) -> None:
        self.channel, self.reader = channel, reader


def _round_trip(deferred: Deferred, shared: dict[str, object]) -> object:
    copy = pickle.loads(pickle.dumps(deferred))
    copy.bind(shared)
    return copy.load()


def test_an_object_of_the_owner_is_named_not_copied() -> None:
    channel, reader = ["channel"], {"n": 3}
    book = _Book(channel, reader)
    deferred = Deferred({"book": book, "reader": reader}, {"channel": channel, "n": 3})
    worker_channel = ["the worker's channel"]
    loaded = _round_trip(deferred, {"channel": worker_channel, "n": 3})
    assert isinstance(loaded, dict)
    assert loaded["book"].channel is worker_channel  # the owner's, not a second one
    assert loaded["book"].reader is loaded["reader"] == {"n": 3}  # one pickle: shared objects stay shared


def test_plain_values_are_copied_even_where_the_owner_holds_an_equal_one() -> None:
    # A small int or a str is one object for many uses: naming it would tie the value to the owner's attribute.
    deferred = Deferred({"count": 7, "name": "meta.txt"}, {"seen": 7, "path": "meta.txt"})
    assert _round_trip(deferred, {"seen": 8, "path": "other"}) == {"count": 7, "name": "meta.txt"}


def test_a_name_the_owner_does_not_hold_is_an_error() -> None:
    channel = ["channel"]
    deferred = Deferred([channel], {"channel": channel})
    with pytest.raises(pickle.UnpicklingError, match="'channel'"):
        _round_trip(deferred, {})


def test_the_classes_modules_are_imported_on_load_only() -> None:
    # The module of what is deferred (here fractions) is imported by load, not by unpickling the owner.
    code = (
        "import pickle, sys\n"
        "from rank_dataset.core.deferred import Deferred\n"
        f"d = pickle.loads({pickle.dumps(Deferred(__import__('fractions').Fraction(1, 3), {}))!r})\n"
        "before = 'fractions' in sys.modules\n"
        "value = d.load()\n"
        "print(before, 'fractions' in sys.modules, value)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True", "1/3"]
