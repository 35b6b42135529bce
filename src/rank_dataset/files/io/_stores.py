"""The object store clients of one process, and what they share: the cap on concurrent requests and the
words of their errors.

A client (obstore's, a Rust HTTP client with its own connection pool and runtime) never crosses a fork:
a child would share the parent's sockets. So clients are made lazily, kept per process (a fork drops the
parent's, and a check of the pid catches a child made another way), and never pickled: what an
:class:`~rank_dataset.files.io.object.ObjectFile` carries across processes is its URL, its options
and its key, from which the other process makes its own client.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

__all__ = [
    "CLOUD_EXTRA",
    "acquire",
    "budget",
    "credential_request",
    "forked_from_client",
    "no_credentials",
    "object_store",
    "reason_of",
    "require_client",
    "retried",
    "retries_of",
    "split_url",
    "start_delay",
    "status_of",
]

CLOUD_EXTRA = "pip install 'rank-dataset[cloud]'"

#: Requests in flight at once in one process, by default (RANK_DATASET_OBJECT_REQUESTS sets it): with 8
#: ranks a node and a few DataLoader workers none of which reads the object, a node asks at most a few
#: dozen at a time, which no store throttles.
DEFAULT_REQUESTS = 4

#: The spread start: a process's first request waits a delay in a window of this many seconds a
#: process of the job (RANK_DATASET_OBJECT_SPREAD_MS sets it in milliseconds; 0: no wait), at most
#: :data:`SPREAD_MAX`: 512 ranks start over about 1 s, about 500 first requests a second, a tenth of
#: what S3 serves one prefix (about 5,500 GET and HEAD a second).
SPREAD_PER_PROCESS = 0.002
SPREAD_MAX = 4.0

_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "ALLOW_HTTP")

_lock = threading.Lock()
_pid = os.getpid()
_stores: dict[tuple[str, str], Any] = {}
_slots: threading.BoundedSemaphore | None = None
_used = False  # this process has run a client (and so obstore's runtime, its threads and sockets)
_forked_from: int | None = None  # the pid of the parent that had, in a child forked from it
_started = False  # this process has waited its spread start
_start_lock = threading.Lock()


def split_url(url: str) -> tuple[str, str]:
    """``(directory, name)``: the URL of the directory that a client is made for (one per bucket and
    prefix), and the object's name in it."""
    scheme, _, rest = url.partition("://")
    directory, _, name = rest.rpartition("/")
    if not directory or not name:
        raise ValueError(f"{url!r} names no object: give scheme://bucket/path/to/meta.txt")
    return f"{scheme}://{directory}", name


def _reset() -> None:
    """In a child after a fork: the parent's clients (and their sockets) are not this process's, and
    if the parent ran one, obstore's runtime (a global of the Rust library, whose threads a fork does
    not copy) cannot serve this process: a request would hang or crash, so it is refused instead."""
    global _pid, _slots, _lock, _forked_from, _used, _started, _start_lock
    if _used:
        _forked_from, _used = _pid, False
    _pid, _slots, _lock = os.getpid(), None, threading.Lock()
    _started, _start_lock = False, threading.Lock()
    _stores.clear()


os.register_at_fork(after_in_child=_reset)


def _obstore(directory: str) -> Any:
    """obstore's store module; without obstore, an ImportError naming ``directory`` and the extra."""
    try:
        import obstore.store
    except ImportError:
        raise ImportError(
            f"{directory}: reading from object storage (s3://, gs://, az://, https://) needs obstore, which is "
            f"not installed: {CLOUD_EXTRA}"
        ) from None
    return obstore.store


def object_store(directory: str, options: Mapping[str, Any], timeout: float) -> Any:
    """This process's client for the objects under ``directory``, with ``options`` (obstore's config
    keys, and ``client_options`` or ``retry_config``), retrying within ``timeout`` seconds."""
    if os.getpid() != _pid:
        _reset()
    # The environment the client read enters the key: a changed setting makes another client.
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    key = (directory, repr((sorted((k, repr(v)) for k, v in options.items()), timeout, env)))
    if _forked_from is not None:
        raise RuntimeError(
            f"{directory}: an object store client cannot run in a process forked (pid {os.getpid()}) from one "
            f"that ran one (pid {_forked_from}): obstore's runtime does not survive a fork. Read objects in "
            "the parent (DataLoader workers read shards, not the meta file), or start the process with "
            "spawn or forkserver"
        )
    global _used
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = _make(directory, options, timeout)
        _used = True
        return store


def forked_from_client() -> int | None:
    """The pid of the process this one was forked from, if that one had run an object store client
    (then this one cannot: see :func:`_reset`); else None."""
    if os.getpid() != _pid:
        _reset()
    return _forked_from


def budget(timeout: float) -> dict[str, timedelta]:
    """How a read's ``timeout`` (the dataset's) is spent, so that a read ends within it, its bytes or
    an error naming the URL: one attempt of a request may take a quarter of it (a connection at most
    10 s of that, a body that sends nothing for 30 s is cut), obstore retries it with backoff and
    jitter for another quarter, and a body cut short is asked again only in the read's first half."""
    quarter = timedelta(seconds=timeout / 4)
    return {
        "attempt": quarter,
        "connect": min(quarter, timedelta(seconds=10)),
        "stall": min(quarter, timedelta(seconds=30)),
        "retries": quarter,
        "reasks": 2 * quarter,
    }


def _make(directory: str, options: Mapping[str, Any], timeout: float) -> Any:
    """A client of ``directory`` with ``options``; settings obstore refuses are a ValueError naming
    the directory and the setting, never its value."""
    try:
        return _client(directory, options, timeout)
    except (KeyboardInterrupt, SystemExit, ImportError):
        raise
    except BaseException as exc:  # obstore's errors, and its PanicException (a BaseException)
        said = str(exc).split("\n", 1)[0][:300]
        for value in options.values():  # never a secret in a message
            if isinstance(value, str) and len(value) >= 4:
                said = said.replace(value, "***")
        raise ValueError(
            f"storage_options for {directory} were refused by obstore ({type(exc).__name__}: {said}); give "
            "obstore's config keys for the store, e.g. endpoint, access_key_id, secret_access_key, region "
            "and allow_http for S3 (see the object storage guide)"
        ) from None


#: obstore's client settings (ClientConfig): given among storage_options, they go to the client.
_CLIENT_KEYS = frozenset(
    [
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "default_headers",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "root_certificate",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    ]
)


def _client(directory: str, options: Mapping[str, Any], timeout: float) -> Any:
    module = _obstore(directory)
    config = {k: v for k, v in options.items() if k.lower() not in _CLIENT_KEYS}
    spend = budget(timeout)
    client: dict[str, Any] = {
        "connect_timeout": spend["connect"],
        "timeout": spend["attempt"],
        "read_timeout": spend["stall"],
    }
    # Client options given replace those of the environment: keep the one the environment says.
    for name in ("AWS_ALLOW_HTTP", "GOOGLE_ALLOW_HTTP", "AZURE_ALLOW_HTTP", "ALLOW_HTTP"):
        if os.environ.get(name, "").lower() in ("1", "true", "yes"):
            client["allow_http"] = True
    if str(config.get("endpoint", config.get("aws_endpoint", ""))).startswith("http://"):
        client["allow_http"] = True  # an endpoint given as http:// is meant
    client.update(config.pop("client_options", {}))
    client.update({k.lower(): v for k, v in options.items() if k.lower() in _CLIENT_KEYS})
    # Exponential backoff with jitter (obstore's), for 5xx, timeouts and dropped connections, all
    # within the dataset's timeout.
    retry = {
        "max_retries": 10,
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15), "base": 2},
        "retry_timeout": spend["retries"],
        **config.pop("retry_config", {}),
    }
    if directory.lower().startswith("http://"):
        client["allow_http"] = True  # a URL given as http:// is meant
    if directory.split("://", 1)[0].lower() in ("http", "https"):
        return module.HTTPStore.from_url(directory, client_options=client, retry_config=retry)
    return module.from_url(directory, config=config or None, client_options=client, retry_config=retry)


def start_delay(rank: int, world_size: int, pid: int, per_process: float = SPREAD_PER_PROCESS) -> float:
    """Seconds the first request of process ``pid`` of rank ``rank`` (of ``world_size``) waits: the
    window ``min(per_process * world_size, SPREAD_MAX)`` cut in one slot a rank, in rank order (the
    ranks' first requests come evenly over it), and a place in the slot drawn from ``(rank, pid)``
    (processes of one rank, or of one node where RANK is unset, do not start together)."""
    world = max(int(world_size), 1)
    window = min(max(per_process, 0.0) * world, SPREAD_MAX)
    place = hashlib.blake2b(f"{rank} {pid}".encode(), digest_size=8).digest()
    within = int.from_bytes(place, "little") / 2.0**64  # in [0, 1)
    return window * ((int(rank) % world) + within) / world


def _spread_start() -> None:
    """Before this process's first request: wait its :func:`start_delay` (rank and world size from
    the environment torchrun sets), once; the other threads that want to start wait with it."""
    global _started
    if _started:
        return
    with _start_lock:
        if not _started:
            per = _number("RANK_DATASET_OBJECT_SPREAD_MS", SPREAD_PER_PROCESS * 1000) / 1000
            rank, world = int(_number("RANK", 0)), int(_number("WORLD_SIZE", 1))
            delay = start_delay(rank, world, os.getpid(), per)
            if delay > 0:
                time.sleep(delay)
            _started = True


def _number(name: str, default: float) -> float:
    """The environment variable ``name`` as a number >= 0 (``default`` if unset)."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"the environment variable {name} must be a number >= 0, got {text!r}")
    return value


def acquire() -> threading.BoundedSemaphore:
    """The semaphore that caps this process's requests in flight (a ``with`` holds one slot), after
    the process's spread start."""
    global _slots
    if os.getpid() != _pid:
        _reset()
    _spread_start()
    with _lock:
        if _slots is None:
            n = int(_number("RANK_DATASET_OBJECT_REQUESTS", DEFAULT_REQUESTS))
            _slots = threading.BoundedSemaphore(max(n, 1))
        return _slots


_STATUS = re.compile(r"status code: (\d{3}[^:]*)")
_RETRIES = re.compile(r"\bretries: (\d+),")
_REQUEST = re.compile(r"Error performing [A-Z]+ (\S+)")
_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_KINDS = {"Timeout": "timed out", "Connect": "could not connect", "Request": "the request failed"}
#: Where a client without credentials asks for some (AWS's instance metadata and ECS task roles,
#: GCP's metadata server, Azure's managed identity): a failed request there is about credentials,
#: not about the object.
_CREDENTIAL_PATHS = (
    "/latest/api/token",
    "/latest/meta-data/iam/security-credentials",
    "/v2/credentials",
    "/computeMetadata/v1/instance/service-accounts",
    "/metadata/identity/oauth2/token",
)


def status_of(exc: BaseException) -> str:
    """The HTTP status in obstore's error, in words (``"HTTP 404 Not Found"``), else the error's kind."""
    found = _STATUS.search(str(exc))
    if found:
        return f"HTTP {found.group(1).strip()}"
    first = str(exc).split("\n", 1)[0]
    return f"{type(exc).__name__}: {first[:200]}"


def retries_of(exc: BaseException) -> int | None:
    """How many times obstore retried the request that ``exc`` reports (None if it does not say)."""
    found = _RETRIES.search(str(exc))
    return int(found.group(1)) if found else None


def credential_request(exc: BaseException) -> str | None:
    """The URL of the request that failed, if it asked a credential service (the instance metadata
    service that a client with no credentials given falls back to) rather than the store."""
    found = _REQUEST.search(str(exc))
    if found is None:
        return None
    url = found.group(1)
    return url if any(part in url for part in _CREDENTIAL_PATHS) else None


def reason_of(exc: BaseException) -> str:
    """Why a request failed, in words: its HTTP status, else the kind of its failure (``timed out``,
    ``could not connect``), else what the client said of it."""
    if _STATUS.search(str(exc)):
        return status_of(exc)
    kind = _KIND.search(str(exc))
    if kind is not None and kind.group(1) in _KINDS:
        return _KINDS[kind.group(1)]
    first = str(exc).split("\n", 1)[0]
    return first.rpartition(" - ")[2].strip()[:200] or status_of(exc)


def retried(exc: BaseException, timeout: float) -> str:
    """What obstore did with the request ``exc`` reports, as its error says, to follow its reason: a 4xx,
    or a request past the retries' share of the timeout, is not retried (empty if the error does not say)."""
    retries = retries_of(exc)
    if retries is None:
        return ""
    if retries:
        return f", {retries} retries within timeout={timeout:g} s"
    if reason_of(exc) == "timed out":
        return f", not retried: an attempt may take a quarter of timeout={timeout:g} s"
    return ", not retried"


def no_credentials(exc: BaseException, timeout: float) -> str | None:
    """If ``exc`` is a failed request for credentials (none were given, and the instance metadata service
    gave none), that said in words (the URL it asked, the reason, the retries); else None."""
    asked = credential_request(exc)
    if asked is None:
        return None
    return (
        "access denied: no credentials were found (storage_options and the environment, e.g. AWS_ACCESS_KEY_ID "
        f"and AWS_SECRET_ACCESS_KEY, give none), and the instance metadata service gave none ({reason_of(exc)} "
        f"from {asked}{retried(exc, timeout)}); give the store's credentials (see the object storage guide)"
    )


def require_client(url: str) -> None:
    """Raise the ImportError naming the cloud extra if obstore, which reads ``url``, is not installed.
    obstore is found, not imported: a process forked from this one then still makes its own client
    (a fork of a process that imported obstore reads through a helper, see :mod:`.payloads`)."""
    try:
        found = importlib.util.find_spec("obstore") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        _obstore(url)  # the ImportError naming the extra
