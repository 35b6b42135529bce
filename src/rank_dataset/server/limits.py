"""The meta server's limits: what one client can cost it. One frozen value gives ``rank-dataset
serve`` its options and defaults, :func:`rank_dataset.server.app.serve` its ``limits``, and each uvicorn
worker process (the app and the connection guards of :mod:`rank_dataset.server._connection`) what it
enforces, through the environment. Imports no server dependency (the CLI reads it)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from rank_dataset.core.checks import check_int

__all__ = ["DEFAULT_LIMITS", "LIMITS_ENV", "ServerLimits", "limit_fields"]

#: The limits of ``serve``, as JSON, for each uvicorn worker process (app and connection protocol).
LIMITS_ENV = "RANK_DATASET_SERVE_LIMITS"


def _limit(default: Any, help: str) -> Any:
    # The help is what `rank-dataset serve --help` says of the limit (the CLI's options are these fields).
    return dataclasses.field(default=default, metadata={"help": help})


def limit_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The limits, in order, each with its default and ``metadata["help"]``."""
    return dataclasses.fields(ServerLimits)


@dataclass(frozen=True)
class ServerLimits:
    """Limits per server process, validated (see :func:`rank_dataset.server.app.serve` for each).

    Raises:
        TypeError, ValueError: a limit that is not a positive int (seconds: a positive number).
    """

    max_body_size: int = _limit(1 << 20, "Bytes in a request body (413).")  # 131,072 indices in a /samples request
    max_header_size: int = _limit(16 << 10, "Bytes in a request line and headers (400).")
    max_builds: int = _limit(4, "Shard builds (/shard, /samples) in progress at once (503 with Retry-After).")
    # about 0.8 GB of 34-byte lines, with their ids and offsets
    max_pass_samples: int = _limit(
        1 << 24, "Samples read in one pass shared by concurrent /shard requests of one plan (1: none shared)."
    )
    limit_concurrency: int = _limit(2048, "Connections and requests at once (uvicorn's limit: 503).")
    timeout_request: float = _limit(10.0, "Seconds for a whole request to arrive (the connection is closed).")
    timeout_send: float = _limit(30.0, "Seconds an answer waits for a client that reads none of it (closed).")
    timeout_keep_alive: int = _limit(5, "Seconds an idle connection is kept after an answer.")  # uvicorn's default
    backlog: int = _limit(2048, "Connections waiting to be accepted.")

    def __post_init__(self) -> None:
        for name in (f.name for f in limit_fields()):
            value = getattr(self, name)
            if name not in ("timeout_request", "timeout_send"):
                check_int(name, value, low=1)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")

    def to_env(self) -> None:
        """Hand these limits to the server's worker processes (see :meth:`from_env`)."""
        os.environ[LIMITS_ENV] = json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> ServerLimits:
        """The limits :meth:`to_env` set in this process or its parent; the defaults if none."""
        values: dict[str, Any] = json.loads(os.environ.get(LIMITS_ENV, "{}"))
        return cls(**values)


DEFAULT_LIMITS = ServerLimits()
