"""Datasets served by a meta server: ServerDataset (the whole file), RankServerDataset (a shard) and
the ServerReader that fills its shard; the HTTP they use is :mod:`rank_dataset.server.transport`."""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from rank_dataset.core.arrays import prefix_sums
from rank_dataset.core.checks import check_index
from rank_dataset.core.parsers import Parser, parse_line, resolve_parser
from rank_dataset.core.shard import Shard
from rank_dataset.plan.bounds import Bounds
from rank_dataset.plan.config import ReloadConfig
from rank_dataset.plan.sources import Source, as_sources
from rank_dataset.plan.spec import ShardSpec
from rank_dataset.server import protocol
from rank_dataset.server.transport import SAMPLES_PER_REQUEST, MetaServer, served_file, server_url
from rank_dataset.shards.audit import AuditMode
from rank_dataset.shards.reader import SampledReader, files_of
from rank_dataset.training._failures import OnError
from rank_dataset.training._options import timeout_seconds
from rank_dataset.training.dataset import DATASET_KEYWORDS, ShardedDataset

if TYPE_CHECKING:
    from rank_dataset.training.payloads import Payloads

__all__ = ["RankServerDataset", "ServerDataset", "ServerReader"]


class ServerDataset(Dataset[Any]):
    """Every sample of the files a meta server serves, as a map-style Dataset.

    ``ds.__getitems__(indices)``, which torch's DataLoader calls with each batch, fetches the whole
    batch in one request.

    Args:
        url: the server's base URL; or, in the original project's form, the meta file's path, with
            ``server_ip`` and ``server_port``.
        server_ip: the server's address (the original project's keyword). The server must serve a
            file of ``url``'s file name; the dataset then holds that file's samples (the server may
            serve others too).
        server_port: the server's port, an int or a str of digits (e.g. ``"10080"``).
        token: the server's token, if it has one.
        timeout: how long one request, and all the retries of one call together, may take: seconds (an int
            or a float) or a ``datetime.timedelta``, as every dataset takes it.
        retries: further attempts after a connection error, a timeout or a 5xx answer.
        parser: None (items are str), ``"json"``, ``"label"``, or a callable taking the str.

    Raises:
        ConnectionError: the server could not be reached within the retries (names the URL).
        PermissionError: the token is missing or wrong.
        ValueError: a malformed server_ip or server_port, or a server that serves no file of the
            meta file's name.

    Example (the original project's form and the URL form)::

        ds = ServerDataset("/path/to/meta", server_ip="10.10.10.10", server_port="10080")
        ds = ServerDataset("http://10.10.10.10:10080")
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        server_ip: str | None = None,
        server_port: int | str | None = None,
        *,
        token: str | None = None,
        timeout: float | datetime.timedelta = 30.0,
        retries: int = 5,
        parser: str | Parser | None = None,
    ) -> None:
        base, name = server_url(url, server_ip, server_port)
        self.server = MetaServer(base, token=token, timeout=timeout_seconds(timeout), retries=retries)  # type: ignore[arg-type]
        self._parser = resolve_parser(parser)
        self._len, self.fingerprint = self.server.num_samples()
        self._offset = 0  # the served sample number of item 0
        if name is not None:
            served, wanted = served_file(self.server, name)
            self._offset = sum(f.num_samples for f in served[: served.index(wanted)])
            self._len = wanted.num_samples

    def __len__(self) -> int:
        return self._len

    def _check_index(self, i: Any) -> int:
        return check_index(i, self._len, label="dataset index", of=f"{self._len} samples")

    def __getitem__(self, i: int) -> Any:
        index = self._check_index(i) + self._offset
        raw = self.server.get(protocol.sample_path(index))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            what = f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            raise ValueError(f"{self._where(index)}: {what}") from None
        return parse_line(self._parser, text, functools.partial(self._where, index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples ``indices``, fetched in one request."""
        wanted = np.array([self._check_index(i) for i in indices], dtype="<i8") + self._offset
        shard = self.server.samples(wanted)
        texts = shard.texts(range(len(shard)))
        return [parse_line(self._parser, t, functools.partial(self._where, i)) for t, i in zip(texts, wanted.tolist())]

    def _where(self, index: int) -> str:
        return f"{self.server.url} sample {index}"


class ServerReader(SampledReader):
    """Shards computed by a meta server (what :class:`RankServerDataset` reads): a
    :class:`~rank_dataset.shards.reader.ShardReader`.

    Args:
        server: the server.
        sources: for a mix, a Source or a list of them whose paths are names of served files (kept as
            ``sources``, a tuple); None: every served file, taken as one.

    Raises:
        ValueError: a source naming a file the server does not serve.
    """

    def __init__(self, server: MetaServer, sources: Source | Sequence[Source] | None = None) -> None:
        self.server = server
        self._num_samples, self._fingerprint = server.num_samples()
        self._source_files: list[tuple[str, ...]] | None = None
        self.sources = None if sources is None else as_sources(sources)
        what = f"the files served by {server.url}"
        if sources is None:
            self._sample(self._num_samples, Bounds([self._num_samples]).starts, None, None, what)
            return
        if self.sources is None:
            raise TypeError(f"sources must be a Source or a non-empty list of Source, got {sources!r}")
        sources = self.sources
        served = {f.name: f for f in server.files()}
        for i, source in enumerate(sources):
            if source.columns is not None:
                raise ValueError(
                    f"source {i} {source.name!r}: columns= is the server's choice (MetaFile(path, columns=...) "
                    "in create_app); a source of a meta server names served files only"
                )
            for name in source.paths:
                if name not in served:
                    raise ValueError(
                        f"source {i} {source.name!r}: {server.url} serves no file named {name!r} "
                        f"(it serves {', '.join(served)}); a source names served files by file name"
                    )
        self._source_files = [source.paths for source in sources]
        # Samples are numbered over the distinct files of the sources, in order of first appearance,
        # as RankDataset numbers them; sources over subsets (or a file in several sources) map their
        # plan numbers to those numbers, and are fetched by sample number (see build).
        names = files_of(sources)
        self._files = [served[name] for name in names]  # in sample order
        self._layout = Bounds([f.num_samples for f in self._files])
        self._num_samples = self._layout.total
        # Where each distinct file starts in the server's numbering (all its files, in its order).
        server_layout = Bounds([f.num_samples for f in served.values()])
        position = {name: i for i, name in enumerate(served)}
        self._server_starts = server_layout.starts[[position[name] for name in names]]
        self._sample(self._num_samples, self._layout.starts, sources, None, what)

    def __getstate__(self) -> dict[str, Any]:
        # A worker never builds: it needs no ids (those held in memory would be copied).
        return {**self.__dict__, "_sampling": None, "sources": None}

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def fingerprint(self) -> str | None:
        return self._fingerprint

    def source_fingerprints(self) -> tuple[str, ...]:
        assert self._sampling is not None
        return self._sampling.source_fingerprints([f.fingerprint for f in self._files])

    def build(self, spec: ShardSpec) -> Shard:
        if self.keeps_ids:
            return self._build_by_samples(spec)
        query = protocol.spec_to_query(spec, self._source_files if spec.mix is not None else None)
        # The plan, which the frame is checked against, is made while the server makes its own and
        # sends the frame, not before asking (its kernels release the GIL): a tenth of a fetch.
        with ThreadPoolExecutor(max_workers=1) as pool:
            planned = pool.submit(spec.indices)
            return self.server.shard(protocol.SHARD, planned=planned.result, fields=query)

    def _build_by_samples(self, spec: ShardSpec) -> Shard:
        """The shard of a mix over subsets: the plan mapped to sample numbers here (reading only the ids
        at this rank's positions), the samples fetched by number (``POST /samples``, in requests within
        the server's default body limit), the shard keeping the sample numbers."""
        assert self._sampling is not None
        samples = self._sampling.global_of(spec.indices(), spec.mix)
        if self._source_files is None:  # plain files, some left out: the server numbers samples as we do
            wanted = samples.astype("<i8")
        else:
            file = self._layout.part_of(samples)
            wanted = (samples - self._layout.starts[file] + self._server_starts[file]).astype("<i8")
        step = SAMPLES_PER_REQUEST
        parts = [self.server.samples(wanted[a : a + step]) for a in range(0, wanted.size, step)]
        if not parts:
            return Shard(np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64), ids=samples)
        first = [int(p.bounds[0]) for p in parts]
        shift = prefix_sums([p.text_bytes for p in parts])[:-1].tolist()
        data = np.concatenate([p.data[a : a + p.text_bytes] for p, a in zip(parts, first)])
        starts = np.concatenate([p.starts.astype(np.int64) - a + d for p, a, d in zip(parts, first, shift)])
        ends = np.concatenate([p.ends.astype(np.int64) - a + d for p, a, d in zip(parts, first, shift)])
        return Shard(data, starts, ends, ids=samples)

    def where(self, sample: int) -> str:
        if self._source_files is None:
            return f"{self.server.url} sample {sample}"
        file, local = self._layout.locate(sample)  # the served file holding it, and its sample number there
        return f"{self.server.url} file {self._files[file].name!r} sample {local}"


class RankServerDataset(ShardedDataset):
    """This rank's shard of the files a meta server serves: RankDataset's contract over HTTP.

    For the same files and settings it has exactly RankDataset's indices and samples. The shard is
    computed on the server with the same code, fetched in one streamed request, checked against the
    plan computed here, and held in the same compact form as RankDataset's.

    ``is_test``, ``reload_cfg``, ``rank``, ``world_size``, ``parser``, ``audit``, ``exclude``, ``transform``,
    ``on_error``, ``max_failures``, ``exclude_failures`` and ``payloads`` are RankDataset's; ``url``,
    ``server_ip``, ``server_port``, ``token``, ``timeout`` and ``retries`` are ServerDataset's (with
    ``server_ip``, the dataset reads the one file named, as a mix of it if the server serves others too).

    Args:
        sources: a mix of the served files: a list of :class:`~rank_dataset.plan.sources.Source` whose paths
            are names of served files (their file names, as ``GET /files`` lists them). None: every
            served file, taken as one. The shard is RankDataset's for the same mix of those files.

    Raises:
        ValueError: as RankDataset; a source naming a file the server does not serve; as ServerDataset
            for server_ip and server_port.

    Example (with a server started by ``rank-dataset serve meta.txt``)::

        ds = RankServerDataset("http://127.0.0.1:28889", reload_cfg={"seed": 0, "mini_epoch": 2})
        ds = RankServerDataset("meta.txt", server_ip="127.0.0.1", server_port="28889", reload_cfg={"seed": 0})
        mix = RankServerDataset(url, sources=[Source("a.txt", weight=2), Source("b.txt", repeat=0.5)])
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        is_test: bool = False,
        reload_cfg: ReloadConfig | Mapping[str, Any] | None = None,
        *,
        server_ip: str | None = None,
        server_port: int | str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        token: str | None = None,
        timeout: float | datetime.timedelta = 30.0,
        retries: int = 5,
        parser: str | Parser | None = None,
        sources: Source | Sequence[Source] | None = None,
        audit: AuditMode = "warn",
        exclude: Any = None,
        transform: Callable[[Any], Any] | None = None,
        on_error: OnError = "raise",
        max_failures: int | float | None = 0.01,
        exclude_failures: bool = False,
        payloads: Payloads | None = None,
    ) -> None:
        given = dict(locals())  # the parameters, before anything else is bound here
        base, name = server_url(url, server_ip, server_port)
        self.server = MetaServer(base, token=token, timeout=timeout_seconds(timeout), retries=retries)  # type: ignore[arg-type]
        if name is not None:
            if sources is not None:
                raise ValueError("give either a meta file name (with server_ip and server_port) or sources, not both")
            served, _ = served_file(self.server, name)
            if len(served) > 1:  # read that file alone: a mix of one source
                sources = Source(name)
        reader = ServerReader(self.server, sources)
        self.fingerprint = reader.fingerprint
        super().__init__(reader, sources=reader.sources, **{k: given[k] for k in DATASET_KEYWORDS})
