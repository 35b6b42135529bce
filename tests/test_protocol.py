"""The wire protocol's pure codecs: the /shard query with and without a mix, /files, served names."""

from __future__ import annotations

import pytest

from rank_dataset import protocol
from rank_dataset.mix import MixPlan
from rank_dataset.plan import ResumePoint, ShardSpec

FILES = {"a.txt": 10, "b.txt": 4, "c.txt": 3}


def test_spec_round_trips_through_the_query() -> None:
    plain = ShardSpec(17, 3, 1, mini_epoch=2, mini_epoch_idx=1, seed=-4, epoch=2, resume=ResumePoint(4, 1, 3))
    assert protocol.shard_request_from_query(protocol.spec_to_query(plain), 17, FILES) == (plain, None)
    assert "mix_files" not in protocol.spec_to_query(plain)  # a plain query is as before
    mix = MixPlan((7, 10), (5, 9), 14)  # sources: c.txt + b.txt, then a.txt
    spec = ShardSpec(14, 4, 3, mini_epoch=2, seed=1, epoch=5, mix=mix, resume=ResumePoint(2, 0, 1))
    query = protocol.spec_to_query(spec, [["c.txt", "b.txt"], ["a.txt"]])
    assert query["mix_files"] == '[["c.txt","b.txt"],["a.txt"]]' and query["mix_counts"] == "5,9"
    assert protocol.shard_request_from_query(query, 17, FILES) == (spec, [["c.txt", "b.txt"], ["a.txt"]])
    every = ShardSpec(17, 2, 0, is_test=True, mix=MixPlan.every_sample((7, 10)))
    query = protocol.spec_to_query(every, [["c.txt", "b.txt"], ["a.txt"]])
    assert protocol.spec_from_query(query, 17, FILES) == every
    with pytest.raises(ValueError, match="needs the names of each source's files"):
        protocol.spec_to_query(spec)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            {"mix_files": '[["d.txt"],["a.txt"]]'},
            ValueError,
            "no served file is named 'd.txt'; this server serves a.txt",
        ),
        ({"mix_files": '[["a.txt"]]'}, ValueError, "must name as many sources, got 1, 2 and 2"),
        ({"mix_files": "a.txt"}, ValueError, "mix_files must be a JSON list"),
        ({"mix_files": "[[]]"}, ValueError, "non-empty JSON list of non-empty lists"),
        ({"mix_sizes": "7,x"}, ValueError, "mix_sizes must be integers separated by commas"),
        ({"mix_sizes": "8,10"}, protocol.FilesMismatch, r"source 0 \(c.txt, b.txt\) was expected to hold 8 samples"),
        ({"mix_counts": "0,14"}, ValueError, r"counts\[0\] must be >= 1"),
        (
            {"num_samples": "17"},
            ValueError,
            r"num_samples=17 must be the mix's epoch size, the sum of mix_counts \(14\)",
        ),
        ({"mix_counts": None}, ValueError, "the mix parameters come together: mix_counts missing"),
    ],
)
def test_bad_mix_queries(change: dict[str, str | None], error: type[Exception], message: str) -> None:
    spec = ShardSpec(14, 2, 0, mix=MixPlan((7, 10), (5, 9), 14))
    query = {**protocol.spec_to_query(spec, [["c.txt", "b.txt"], ["a.txt"]]), **change}
    with pytest.raises(error, match=message):
        protocol.spec_from_query({k: v for k, v in query.items() if v is not None}, 17, FILES)


def test_files_codec_and_names() -> None:
    files = [protocol.ServedFile("a.txt", 10, "f" * 32), protocol.ServedFile("b.txt", 4, "e" * 32)]
    import json

    assert protocol.files_from_body(json.dumps(protocol.files_body(files)).encode()) == files
    with pytest.raises(protocol.ProtocolError, match="/files did not answer as a meta server does"):
        protocol.files_from_body(b'{"num_samples": 3}')
    assert protocol.served_names(["/x/a.txt", "b.txt"]) == ["a.txt", "b.txt"]
    with pytest.raises(ValueError, match=r"two served files share the name 'a.txt' \(/x/a.txt and /y/a.txt\)"):
        protocol.served_names(["/x/a.txt", "/y/a.txt"])
