"""A small HTTP server for the object storage tests: it serves bytes with Range, ETag and If-Match
(python's http.server honours none of them), and can stall. The proxy that injects faults between a
client and a real server is tests/fault_proxy.py.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass


class RangeServer:
    """Serves ``objects`` (name -> bytes) at ``http://127.0.0.1:port/name``, with ranges and ETags."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests = 0
        #: "head": HEADs are never answered; "body": a GET's body stops halfway and the connection
        #: stays open (a stalled read); None: every request is answered.
        self.stall: str | None = None
        self.stalled = 0  # requests held so far
        self._release = threading.Event()
        owner = self

        class Handler(_Quiet):
            def _hold(self) -> None:
                owner.stalled += 1
                owner._release.wait(120)  # until the server closes
                self.close_connection = True

            def _answer(self, body: bool) -> None:
                owner.requests += 1
                if owner.stall == "head" and not body:
                    self._hold()
                    return
                data = owner.objects.get(self.path.lstrip("/"))
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                etag = '"' + hashlib.md5(data).hexdigest() + '"'
                match = self.headers.get("If-Match")
                if match is not None and match != etag:
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lo, hi, status = 0, len(data), 200
                ask = self.headers.get("Range")
                if ask and ask.startswith("bytes="):
                    a, _, b = ask[6:].partition("-")
                    lo, hi, status = int(a), min(int(b) + 1 if b else len(data), len(data)), 206
                self.send_response(status)
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", "Sun, 06 Dec 2026 10:00:00 GMT")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(hi - lo))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{len(data)}")
                self.end_headers()
                if body and owner.stall == "body":
                    self.wfile.write(data[lo : lo + (hi - lo) // 2])
                    self.wfile.flush()
                    self._hold()
                elif body:
                    self.wfile.write(data[lo:hi])

            def do_GET(self) -> None:
                self._answer(True)

            def do_HEAD(self) -> None:
                self._answer(False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def range_server() -> Iterator[RangeServer]:
    server = RangeServer()
    try:
        yield server
    finally:
        server.close()
