"""The meta server's limits: what one client can cost it. One frozen value gives ``rank-dataset
serve`` its defaults, :func:`rank_dataset.server.app.serve` its parameters, and each uvicorn worker
process (the app and the connection protocol of :mod:`rank_dataset.server._connection`) what it enforces,
through the environment. No torch, no server dependencies."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from rank_dataset.core.checks import check_int

__all__ = ["DEFAULT_LIMITS", "LIMITS_ENV", "ServerLimits"]

#: The limits of ``serve``, as JSON, for each uvicorn worker process (app and connection protocol).
LIMITS_ENV = "RANK_DATASET_SERVE_LIMITS"


@dataclass(frozen=True)
class ServerLimits:
    """Limits per server process, validated (see :func:`rank_dataset.server.app.serve` for each).

    Raises:
        TypeError, ValueError: a limit that is not a positive int (seconds: a positive number).
    """

    max_body_size: int = 1 << 20  # 131,072 indices in a /samples request
    max_header_size: int = 16 << 10
    max_builds: int = 4
    max_pass_samples: int = 1 << 24  # about 0.8 GB of 34-byte lines, with their ids and offsets
    limit_concurrency: int = 2048
    timeout_request: float = 10.0
    timeout_send: float = 30.0
    timeout_keep_alive: int = 5  # uvicorn's default, whole seconds
    backlog: int = 2048

    def __post_init__(self) -> None:
        for name in (
            "max_body_size",
            "max_header_size",
            "max_builds",
            "max_pass_samples",
            "limit_concurrency",
            "timeout_keep_alive",
        ):
            check_int(name, getattr(self, name), low=1)
        check_int("backlog", self.backlog, low=1)
        for name in ("timeout_request", "timeout_send"):
            seconds = getattr(self, name)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")

    def to_env(self) -> None:
        """Hand these limits to the server's worker processes (see :meth:`from_env`)."""
        os.environ[LIMITS_ENV] = json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> ServerLimits:
        """The limits :meth:`to_env` set in this process or its parent; the defaults if none."""
        values: dict[str, Any] = json.loads(os.environ.get(LIMITS_ENV, "{}"))
        return cls(**values)


DEFAULT_LIMITS = ServerLimits()
