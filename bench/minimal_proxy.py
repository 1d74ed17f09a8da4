"""The floor any Python proxy starts from: a minimal aiohttp pass-through proxy, for the benchmark only.

One pooled ClientSession, no decompression, request and response bodies streamed, hop-by-hop headers dropped,
no access log, no metrics, no policy.

    python bench/minimal_proxy.py --listen 127.0.0.1:18082 --upstream http://127.0.0.1:18081 [--loop uvloop]

``--loop uvloop`` runs it on the event loop the gateway runs on by default (``server.event_loop: auto``), so that the
two are compared on the same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "expect"}
)  # fmt: skip


def make_handler(
    session: aiohttp.ClientSession, upstream: str
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with session.request(
            request.method, upstream + request.raw_path, headers=headers, allow_redirects=False,
            data=request.content if request.body_exists else None,
        ) as up:  # fmt: skip
            response = web.StreamResponse(status=up.status, reason=up.reason)
            for name, value in up.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    return handle


async def serve(host: str, port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1000), auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60),
    )  # fmt: skip
    runner = web.ServerRunner(web.Server(make_handler(session, upstream.rstrip("/"))), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"minimal proxy listening on http://{host}:{port} -> {upstream}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:18082", help="host:port")
    parser.add_argument("--upstream", default="http://127.0.0.1:18081", help="base URL of the upstream")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="event loop (default asyncio)")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(host, int(port), args.upstream))
    else:
        asyncio.run(serve(host, int(port), args.upstream))


if __name__ == "__main__":
    main()
