"""Command line: ``python -m sandbox --host 127.0.0.1 --port 8081``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime

from aiohttp import web

from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN, SandboxSettings, parse_instant

__all__ = ["NOW_ENV", "main", "parse_args", "settings_from_args"]

NOW_ENV = "SANDBOX_NOW"


def _instant(text: str) -> datetime:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rate(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a number of requests a second (1 or more): {text!r}")
    return int(text)


def _card_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a card count: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"card count must be 0 or more: {text!r}")
    return value


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
    parser.add_argument("--cards-cap-from", type=_instant, default=None, metavar="WHEN",
                        help="from then the board route returns at most 100 cards (2026-10-01 or an ISO instant)")
    parser.add_argument("--cards-removal-from", type=_instant, default=None, metavar="WHEN",
                        help="from then the board route returns no cards (2026-11-01 or an ISO instant)")
    # A string default goes through type= too, so a bad $SANDBOX_NOW is reported like a bad --now.
    parser.add_argument("--now", type=_instant, default=os.environ.get(NOW_ENV) or None, metavar="INSTANT",
                        help=f"fixed sandbox clock (default: ${NOW_ENV}, else real time)")
    parser.add_argument("--extra-board", type=_card_count, action="append", dest="extra_boards", metavar="N",
                        help="add a board (ids 4, 5, ...) holding N generated cards; repeatable")
    parser.add_argument("--rate-limit", type=_rate, default=None, metavar="N",
                        help="at most N requests a second per token (429 with Retry-After over it)")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> SandboxSettings:
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
        cards_cap_from=args.cards_cap_from,
        cards_removal_from=args.cards_removal_from,
        now=args.now,
        extra_boards=tuple(args.extra_boards or ()),
        rate_limit=args.rate_limit,
        **overrides,  # type: ignore[arg-type]
    )


async def _serve(args: argparse.Namespace) -> None:
    # access_log=None: aiohttp's access log prints the request line with its
    # query string, which would leak signed-link signatures. The sandbox
    # middleware logs every request without it.
    runner = web.AppRunner(create_app(settings_from_args(args)), access_log=None)
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
