"""The wire protocol: frames, the ShardSpec <-> query codec (with a mix too), error bodies, files pinned by
fingerprint, /files and served names."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import requests

from rank_dataset import ProtocolError, RankServerDataset, ServerDataset
from rank_dataset.core.shard import Shard
from rank_dataset.plan import ResumePoint, ShardSpec
from rank_dataset.plan.mix import MixPlan
from rank_dataset.server import protocol
from rank_dataset.server.transport import MetaServer
from tests_helpers import shard_of

SPECS = [
    ShardSpec(100, 4, 3),
    ShardSpec(100, 3, 0, is_test=True),
    ShardSpec(1000, 8, 5, mini_epoch=4, mini_epoch_idx=2, seed=-7, epoch=9),
    ShardSpec(1000, 3, 1, mini_epoch=2, mini_epoch_idx=1, seed=1, epoch=2, resume=ResumePoint(4, 1, 37)),
    ShardSpec(1000, 6, 1, mini_epoch=2, seed=1, epoch=2, resume=ResumePoint(4, 1, 36), aug_repeats=2),
]


def spec_from_query(query: Mapping[str, str], num_samples: int, files: Mapping[str, int] | None = None) -> ShardSpec:
    """The ShardSpec a ``/shard`` query asks for (what the server takes of it)."""
    return protocol.shard_request_from_query(query, num_samples, files)[0]


@pytest.mark.parametrize("spec", SPECS)
def test_spec_round_trips_through_a_query(spec: ShardSpec) -> None:
    query = protocol.spec_to_query(spec)
    assert all(isinstance(v, str) for v in query.values())
    assert spec_from_query(query, spec.num_samples) == spec


def test_aug_repeats_travels_only_when_set() -> None:
    assert "aug_repeats" not in protocol.spec_to_query(ShardSpec(100, 4, 3))  # a default query is as before
    assert protocol.spec_to_query(ShardSpec(100, 4, 3, aug_repeats=4))["aug_repeats"] == "4"
    for raw, error in [("0", ValueError), ("x", ValueError)]:
        with pytest.raises(error, match="aug_repeats"):
            spec_from_query({"world_size": "2", "rank": "0", "aug_repeats": raw}, 100)
    with pytest.raises(ValueError, match=r"aug_repeats=2 .*eval mode"):
        spec_from_query({"world_size": "2", "rank": "0", "aug_repeats": "2", "is_test": "true"}, 100)


@pytest.mark.parametrize(
    ("query", "error", "message"),
    [
        ({"world_size": "2"}, ValueError, "the shard parameter 'rank' is required"),
        ({"world_size": "2", "rank": "x"}, ValueError, "rank must be an integer, got 'x'"),
        ({"world_size": "2", "rank": "0", "is_test": "maybe"}, ValueError, "is_test must be true or false"),
        ({"world_size": "2", "rank": "0", "bogus": "1"}, ValueError, "unknown shard parameter 'bogus'"),
        ({"world_size": "2", "rank": "0", "resume_offset": "3"}, ValueError, "resume_plan_world_size"),
        ({"world_size": "2", "rank": "0", "num_samples": "99"}, protocol.FilesMismatch, "this server's files hold 100"),
        ({"world_size": str(2**70), "rank": "0"}, ValueError, "world_size"),
    ],
)
def test_bad_queries(query: dict[str, str], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        spec_from_query(query, 100)


@pytest.mark.parametrize("offsets", [np.uint32, np.int64])
def test_frame_round_trip(offsets: type) -> None:
    lines = [b"a 1", b"", "é 3".encode(), b"x" * 5000]
    shard = shard_of(lines, ids=np.array([4, 0, 9, 2], np.int64))
    shard = Shard(shard.data, shard.starts.astype(offsets), shard.ends.astype(offsets), ids=shard.ids)
    body = b"".join(protocol.encode_frame(shard))
    assert len(body) == protocol.frame_size(shard)
    back = protocol.decode_frame(body)
    assert back.texts(range(4)) == [x.decode() for x in lines]
    assert back.ids is not None and back.ids.tolist() == [4, 0, 9, 2]


@pytest.mark.parametrize("seed", range(5))
def test_a_frame_in_another_order_decodes_to_the_shard_in_its_own(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    lines = [bytes(rng.integers(97, 123, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(n)]
    ids = rng.permutation(10 * n + 1)[:n].astype(np.int64)
    order = rng.permutation(n)  # the lines lie in the shard as shard[order[i]] = item i
    stored = shard_of([lines[i] for i in np.argsort(order)], ids=ids[np.argsort(order)])
    body = b"".join(protocol.encode_frame(stored, order))
    assert len(body) == protocol.frame_size(stored)
    back = protocol.decode_frame(body)
    assert back.texts(range(n)) == [x.decode() for x in lines]
    assert back.ids is not None and back.ids.tolist() == ids.tolist()
    assert back.bounds.tolist() == np.cumsum([0, *map(len, lines)]).tolist()
    with pytest.raises(ValueError, match="one entry per row"):
        list(protocol.encode_frame(stored, order[:-1] if n else np.zeros(1, np.intp)))
    # A shard that carries no sample numbers is given them, in the frame's order.
    assert b"".join(protocol.encode_frame(stored.without_ids(), order, ids)) == body
    with pytest.raises(ValueError, match="ids must have one entry per row"):
        list(protocol.encode_frame(stored.without_ids(), order, np.zeros(n + 1, np.int64)))


@pytest.mark.parametrize("seed", range(3))
def test_a_frame_of_a_plan_is_checked_and_kept_shareable(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    lines = [bytes(rng.integers(97, 123, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(n)]
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    order = rng.permutation(n)
    stored = shard_of([lines[i] for i in np.argsort(order)], ids=ids[np.argsort(order)])
    body = b"".join(protocol.encode_frame(stored, order))
    kept = protocol.decode_frame(body, planned=ids)
    assert kept.texts(range(n)) == [x.decode() for x in lines]
    assert kept.ids is None and kept.handle is not None  # in a segment, without the sample numbers
    assert kept.bounds.tolist() == protocol.decode_frame(body).bounds.tolist()
    kept.release()
    other = ids.copy()
    other[-1] += 1
    for wrong in (other, ids[:-1]):
        with pytest.raises(ProtocolError, match=f"the frame holds {n} samples that are not the {wrong.size} planned"):
            protocol.decode_frame(body, planned=wrong)


def _reader(body: bytes, piece: int) -> Any:
    """A ``readinto`` over ``body`` that gives at most ``piece`` bytes a call (as a socket may)."""
    at = 0

    def read_into(view: memoryview) -> int:
        nonlocal at
        n = min(len(view), piece, len(body) - at)
        view[:n] = body[at : at + n]
        at += n
        return n

    return read_into


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_a_frame_received_piece_by_piece_is_the_decoded_one(seed: int, piece: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300)) if seed else 0
    lines = [bytes(rng.integers(97, 123, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(n)]
    ids = rng.permutation(10 * n + 1)[:n].astype(np.int64)
    order = rng.permutation(n)
    alone = shard_of(lines, ids=ids)  # back to back: read straight into the segment
    cut = shard_of([lines[i] for i in np.argsort(order)], ids=ids[np.argsort(order)])  # packed
    for body in (b"".join(protocol.encode_frame(alone)), b"".join(protocol.encode_frame(cut, order))):
        calls: list[int] = []
        kept = protocol.receive_frame(_reader(body, piece), lambda calls=calls: calls.append(1) or ids, len(body))
        want = protocol.decode_frame(body, planned=ids)
        assert calls == [1] and kept.ids is None and kept.handle is not None
        assert kept.data.tobytes() == want.data.tobytes() and kept.bounds.tolist() == want.bounds.tolist()
        assert kept.texts(range(n)) == [x.decode() for x in lines]
        kept.release()
        # Cut short anywhere (in the header, the numbers, the lines), or running on: retried by the client.
        for stop in sorted({0, 5, protocol._HEADER.size + 3, len(body) - 1}):
            if stop < len(body):
                with pytest.raises(protocol.FrameError, match="incomplete frame"):
                    protocol.receive_frame(_reader(body[:stop], piece), ids)
        with pytest.raises(protocol.FrameError, match="runs past"):
            protocol.receive_frame(_reader(body + b"x", piece), ids)
        with pytest.raises(protocol.FrameError, match="its body 3"):
            protocol.receive_frame(_reader(body, piece), ids, 3)
        other = ids.copy()
        if n:
            other[-1] += 1
            with pytest.raises(ProtocolError, match=f"the frame holds {n} samples that are not the {n} planned"):
                protocol.receive_frame(_reader(body, piece), other)
        with pytest.raises(ProtocolError, match="not a rank-dataset frame"):
            protocol.receive_frame(_reader(b"HTTP" + body[4:], piece), ids)


def test_a_received_frame_with_offsets_outside_its_lines_is_malformed() -> None:
    shard = shard_of([b"ab", b"cd"], ids=np.array([3, 4], np.int64))
    body = bytearray(b"".join(protocol.encode_frame(shard, np.array([1, 0]))))
    ends_at = protocol._HEADER.size + 8 * 2 + 4 * 2
    body[ends_at : ends_at + 4] = (99).to_bytes(4, "little")  # the first sample's end past the lines
    with pytest.raises(protocol.FrameError, match="malformed frame"):
        protocol.receive_frame(_reader(bytes(body), 64), np.array([4, 3], np.int64))  # in the frame's order


def test_bad_frames() -> None:
    body = b"".join(protocol.encode_frame(shard_of([b"abc"], ids=np.array([0], np.int64))))
    with pytest.raises(protocol.FrameError, match="incomplete frame"):
        protocol.decode_frame(body[:-1])
    with pytest.raises(protocol.FrameError, match="shorter than its header"):
        protocol.decode_frame(body[:5])
    with pytest.raises(ProtocolError, match="not a rank-dataset frame"):
        protocol.decode_frame(b"HTTP" + body[4:])
    with pytest.raises(ValueError, match="must carry its sample numbers"):
        list(protocol.encode_frame(shard_of([b"abc"])))


def test_error_bodies_decode_to_python_errors() -> None:
    def body(kind: str) -> bytes:
        return json.dumps(protocol.error_body("the message", kind)).encode()

    with pytest.raises(PermissionError, match="u: the message"):
        protocol.raise_for_error("u", 401, body("auth"))
    with pytest.raises(IndexError, match="the message"):
        protocol.raise_for_error("u", 404, body("index"))
    with pytest.raises(ValueError, match="serves other meta files"):
        protocol.raise_for_error("u", 409, body("files"))
    with pytest.raises(ValueError, match="HTTP 400: the message"):
        protocol.raise_for_error("u", 400, body("request"))
    with pytest.raises(ValueError, match="HTTP 413: not json"):
        protocol.raise_for_error("u", 413, b"not json")


def test_a_server_restarted_on_other_files_is_refused(write_meta, start_server) -> None:
    meta, other = write_meta(n=200), write_meta([f"other_{i}.jpg {i}" for i in range(200)])
    server = start_server([meta])
    rds = RankServerDataset(server.url, reload_cfg={"seed": 1}, rank=0, world_size=2)
    sds = ServerDataset(server.url)
    port = server.port
    server.stop()
    start_server([other], port=port)  # same number of samples, other lines
    with pytest.raises(ValueError, match="serves other meta files than this client started with"):
        rds.set_epoch(1)
    with pytest.raises(ValueError, match="serves other meta files"):
        sds[3]
    with pytest.raises(ValueError, match="serves other meta files"):
        sds.__getitems__([1, 2])
    # the pin is the fingerprint header: without it, the same request is served
    assert requests.get(f"{server.url}/sample/3").status_code == 200
    pinned = {protocol.FINGERPRINT_HEADER: "0" * 32}
    answer = requests.get(f"{server.url}/sample/3", headers=pinned)
    assert answer.status_code == 409 and answer.json()["kind"] == "files"


def test_not_a_meta_server_is_a_protocol_error(start_server, write_meta) -> None:
    server = start_server([write_meta(n=10)])

    class Wrong(MetaServer):
        def get(self, path: str) -> bytes:
            return super().get(protocol.HEALTHZ)  # 200 "ok": not the JSON of /len

    with pytest.raises(ProtocolError, match="did not answer as a meta server does"):
        Wrong(server.url).num_samples()


def test_a_shard_of_another_plan_is_refused_naming_the_server(start_server, write_meta) -> None:
    server = start_server([write_meta(n=50)])
    spec = ShardSpec(50, 4, 1, seed=3)
    query = protocol.spec_to_query(spec)
    client = MetaServer(server.url)
    kept = client.shard(protocol.SHARD, planned=spec.indices(), fields=query)
    assert len(kept) == len(spec.indices()) and kept.handle is not None
    kept.release()
    other = ShardSpec(50, 4, 1, seed=4).indices()  # what a client of another permutation would expect
    with pytest.raises(ProtocolError, match=rf"{server.url}/shard: the frame holds 13 samples that are not the 13"):
        client.shard(protocol.SHARD, planned=other, fields=query)


FILES = {"a.txt": 10, "b.txt": 4, "c.txt": 3}


def test_a_mix_round_trips_through_the_query() -> None:
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
    assert spec_from_query(query, 17, FILES) == every
    with pytest.raises(ValueError, match="needs the names of each source's files"):
        protocol.spec_to_query(spec)
    assert "mix_changes" not in query  # a mix without schedules is as before
    scheduled = ShardSpec(14, 4, 3, seed=1, epoch=5, mix=MixPlan((7, 10), (5, 9), 14, ((2, (7, 7)), (9, (3, 11)))))
    query = protocol.spec_to_query(scheduled, [["c.txt", "b.txt"], ["a.txt"]])
    assert query["mix_changes"] == "[[2,[7,7]],[9,[3,11]]]"
    assert spec_from_query(query, 17, FILES) == scheduled


def test_mix_changes_come_with_a_mix() -> None:
    with pytest.raises(ValueError, match="mix_changes comes with the mix parameters"):
        spec_from_query({"world_size": "1", "rank": "0", "mix_changes": "[]"}, 17, FILES)


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
        ({"mix_changes": "[[2,[7,8]]]"}, ValueError, r"changes\[0\] counts must be 2 counts summing to epoch_size=14"),
        ({"mix_changes": "[[0,[7,7]]]"}, ValueError, r"changes\[0\] first epoch must be >= 1"),
        ({"mix_changes": '[["2",[7,7]]]'}, ValueError, r"changes\[0\] first epoch must be an int"),
        ({"mix_changes": "[[2,[7.0,7]]]"}, ValueError, r"changes\[0\] counts\[0\] must be an int"),
        ({"mix_changes": "[[2,7]]"}, ValueError, r"changes\[0\] counts must be a sequence"),
        ({"mix_changes": "{}"}, ValueError, r"mix_changes must be a JSON list of \[first_epoch, \[counts\]\]"),
        ({"mix_changes": "[[2"}, ValueError, r"mix_changes must be a JSON list"),
    ],
)
def test_bad_mix_queries(change: dict[str, str | None], error: type[Exception], message: str) -> None:
    spec = ShardSpec(14, 2, 0, mix=MixPlan((7, 10), (5, 9), 14))
    query = {**protocol.spec_to_query(spec, [["c.txt", "b.txt"], ["a.txt"]]), **change}
    with pytest.raises(error, match=message):
        spec_from_query({k: v for k, v in query.items() if v is not None}, 17, FILES)


def test_files_codec_and_names() -> None:
    files = [protocol.ServedFile("a.txt", 10, "f" * 32), protocol.ServedFile("b.txt", 4, "e" * 32)]
    assert protocol.files_from_body(json.dumps(protocol.files_body(files)).encode()) == files
    with pytest.raises(protocol.ProtocolError, match="/files did not answer as a meta server does"):
        protocol.files_from_body(b'{"num_samples": 3}')
    assert protocol.served_names(["/x/a.txt", "b.txt"]) == ["a.txt", "b.txt"]
    with pytest.raises(ValueError, match=r"two served files share the name 'a.txt' \(/x/a.txt and /y/a.txt\)"):
        protocol.served_names(["/x/a.txt", "/y/a.txt"])


@pytest.mark.parametrize("how", ["closed", "reset"])
def test_a_frame_cut_short_on_the_wire_is_fetched_again(how: str) -> None:
    # A real socket server on loopback whose first answer stops halfway through the frame's lines
    # (closed, or reset): the client reads the frame as it comes, finds it short, and asks again.
    ids = np.arange(5000, dtype=np.int64)
    body = b"".join(protocol.encode_frame(shard_of([b"line %d" % i for i in range(5000)], ids=ids)))
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {protocol.CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n"
    listener = socket.create_server(("127.0.0.1", 0))
    answered: list[int] = []

    def serve() -> None:
        for attempt in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)  # the request
                if attempt == 0:
                    conn.sendall(head.encode() + body[: len(body) - 1000])
                    if how == "reset":  # RST instead of FIN
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    conn.sendall(head.encode() + body)
                answered.append(attempt)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        shard = MetaServer(url, timeout=20, retries=2).shard("/shard", planned=ids)
        assert shard.texts([0, 4999]) == ["line 0", "line 4999"] and shard.handle is not None
        shard.release()
        thread.join(10)
        assert answered == [0, 1]
    finally:
        listener.close()
