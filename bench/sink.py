"""Upload sink for the benchmark: reads every request body to the end, discards it, answers with the byte count.

    python bench/sink.py --listen 127.0.0.1:18084

Answers ``200`` with the number of body bytes received as a plain-text body (and ``X-Received-Bytes``), so the
benchmark can check that a proxied upload arrived whole. When the request declares a Content-Length and fewer
bytes arrive, it answers ``400``. It answers ``Expect: 100-continue`` itself.

Why not nginx: ``return 200`` answers before the body is read (nginx discards it afterwards), so an upload would
be timed to its first bytes and its size could not be checked; ``dav_methods PUT`` writes the body to disk, which
would measure the disk. A small aiohttp server reading with ``readany()`` is slower than nginx, but the "direct"
row of the upload table shows its ceiling, which is well above what the proxies reach.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web


async def handle(request: web.BaseRequest) -> web.Response:
    if request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    received = 0
    content = request.content
    while chunk := await content.readany():
        received += len(chunk)
    declared = request.content_length
    status = 400 if declared is not None and declared != received else 200
    return web.Response(status=status, text=f"{received}\n", headers={"X-Received-Bytes": str(received)})


async def serve(host: str, port: int) -> None:
    runner = web.ServerRunner(web.Server(handle, read_bufsize=256 * 1024), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"sink listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:18084", help="host:port")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host, int(port)))


if __name__ == "__main__":
    main()
