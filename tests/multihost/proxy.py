"""An HTTP proxy in front of the bed's store: it counts the requests and the body bytes it passes by method,
and, when told to, fails every ``n``-th request to the store with a 503 (S3's "slow down", which clients
retry) before it reaches the store.

Control (never passed on): ``GET /__bed/stats`` (``{"GET": {"requests": .., "bytes": ..}, ..., "failed": ..}``),
``/__bed/reset`` (the counts to zero, no failures), ``/__bed/fail?every=N`` (fail every N-th request; 0: none).

Usage: python proxy.py LISTEN_HOST:PORT UPSTREAM_HOST:PORT
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_lock = threading.Lock()
_stats: dict[str, Any] = {}
_fail = {"every": 0, "seen": 0}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def _reset() -> None:
    _stats.clear()
    _stats["failed"] = 0
    _fail.update(every=0, seen=0)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line a request is noise in the bed's logs

    def _control(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        with _lock:
            if url.path == "/__bed/reset":
                _reset()
            elif url.path == "/__bed/fail":
                _fail.update(every=int(query.get("every", "0")), seen=0)
            body = json.dumps(_stats).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self) -> None:
        if self.path.startswith("/__bed/"):
            self._control()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        with _lock:
            _fail["seen"] += 1
            fail = _fail["every"] > 0 and _fail["seen"] % _fail["every"] == 0
            if fail:
                _stats["failed"] += 1
        if fail:
            msg = b"<Error><Code>SlowDown</Code><Message>the bed's proxy fails this one</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        sent = 0
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            self.send_response_only(resp.status, resp.reason)
            chunked = resp.getheader("Content-Length") is None and self.command != "HEAD"
            for key, value in resp.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while self.command != "HEAD":
                chunk = resp.read(1 << 16)
                if not chunk:
                    break
                sent += len(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        finally:
            conn.close()
            with _lock:  # a body the client stopped reading counts what was sent of it
                entry = _stats.setdefault(self.command, {"requests": 0, "bytes": 0})
                entry["requests"] += 1
                entry["bytes"] += sent

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


def main(listen: str, upstream: str) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.rsplit(":", 1)
    Handler.upstream = (up_host, int(up_port))
    _reset()
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:3])
