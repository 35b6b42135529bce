"""A TCP delay line: every byte that crosses it, in either direction, is passed on a fixed delay after it
arrived, so that each round trip through it gains twice the delay while its throughput stays the link's (the
bed's latency, where ``netem`` is not in the kernel). Bytes pass unchanged and in order; a half-close is
passed on, delayed as the bytes before it.

Usage: python delay.py LISTEN_HOST:PORT UPSTREAM_HOST:PORT DELAY_MS
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

_CHUNK = 1 << 16
# Chunks in flight a direction: a delay's worth of a fast link (64 MiB), beyond which the reader waits.
_IN_FLIGHT = 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Pass what ``reader`` gets to ``writer``, each chunk ``delay`` seconds after it arrived; its end too."""
    loop = asyncio.get_running_loop()
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_IN_FLIGHT)

    async def take() -> None:
        while True:
            data = await reader.read(_CHUNK)
            await line.put((loop.time() + delay, data))
            if not data:
                return

    async def give() -> None:
        while True:
            due, data = await line.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(take(), give())


async def _serve(listen: tuple[str, int], upstream: tuple[str, int], delay: float) -> None:
    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_pump(client_r, up_w, delay), _pump(up_r, client_w, delay))
        except (ConnectionError, OSError):
            pass  # one side went away: both are closed below
        finally:
            for w in (up_w, client_w):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

    server = await asyncio.start_server(connection, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    asyncio.run(_serve(_address(argv[0]), _address(argv[1]), float(argv[2]) / 1000))


if __name__ == "__main__":
    main(sys.argv[1:])
