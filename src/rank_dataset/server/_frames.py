"""A frame as an ASGI response: cut into its chunks (views of the shard's memory) once, in a worker
thread, then sent from the event loop one after the other, waiting whenever the connection's buffer
is full. Unlike Starlette's StreamingResponse, no chunk goes through the thread pool and no task
listens for a disconnect beside it; a client that leaves stops nothing but the sending.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from starlette.types import Receive, Scope, Send

from rank_dataset.core.shard import Shard
from rank_dataset.server import protocol

__all__ = ["FrameResponse"]


class FrameResponse:
    """The frame of ``shard`` (see :func:`~rank_dataset.server.protocol.encode_frame`: ``order`` and
    ``ids`` as there), its chunks made at construction: construct it off the event loop.

    Raises:
        ValueError: ``order`` or ``ids`` of the wrong shape, or a shard without sample numbers and no ``ids``.
    """

    def __init__(
        self, shard: Shard, order: npt.NDArray[np.intp] | None = None, ids: npt.NDArray[np.int64] | None = None
    ) -> None:
        self.chunks: list[Any] = list(protocol.encode_frame(shard, order, ids))
        self.headers = [
            (b"content-type", protocol.CONTENT_TYPE.encode()),
            (b"content-length", str(protocol.frame_size(shard)).encode()),
            (b"x-sample-count", str(len(shard)).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        last = len(self.chunks) - 1
        for i, chunk in enumerate(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < last})
        self.chunks.clear()  # the shard's memory is free to go once sent
