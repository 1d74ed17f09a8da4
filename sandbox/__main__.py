"""Command line: ``python -m sandbox --host 127.0.0.1 --port 8081``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN, SandboxSettings

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox", description="Simulated upstream work-management service."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    parser.add_argument("--token", action="append", dest="tokens", metavar="TOKEN",
                        help=f"valid API token; repeatable (default: {DEFAULT_TOKEN})")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--gzip", action="store_true", help="gzip board responses for clients that accept it")
    parser.add_argument("--seed", type=int, default=SandboxSettings().seed)
    parser.add_argument("--public-base-url", default=None, help="base of URLs in responses (default: from request)")
    parser.add_argument("--signed-link-ttl", type=int, default=300, help="seconds")
    parser.add_argument("--signing-secret", default=None, help="fixed secret for signed links (default: random)")
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> SandboxSettings:
    overrides: dict[str, object] = {}
    if args.tokens:
        overrides["tokens"] = frozenset(args.tokens)
    if args.signing_secret:
        overrides["signing_secret"] = args.signing_secret.encode()
    return SandboxSettings(
        seed=args.seed,
        gzip_boards=args.gzip,
        public_base_url=args.public_base_url,
        signed_link_ttl=args.signed_link_ttl,
        **overrides,  # type: ignore[arg-type]
    )


async def _serve(args: argparse.Namespace) -> None:
    # access_log=None: aiohttp's access log prints the request line with its
    # query string, which would leak signed-link signatures. The sandbox
    # middleware logs every request without it.
    runner = web.AppRunner(create_app(_settings(args)), access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        host = f"[{host}]" if ":" in host else host
        print(f"sandbox listening on http://{host}:{port}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
