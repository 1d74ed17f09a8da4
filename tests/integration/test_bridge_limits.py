"""The card backfill within the service's limits on a token's requests, and shared by the readers of one board on one
token: through a real gateway process in front of the sandbox playing a service that allows a token 5 requests a
second (429 with Retry-After and X-RateLimit-*), and through the in-process gateway in front of an upstream that says
nothing but Retry-After. The sandbox withdrew cards (removal 2026-11-01); the client is exempted to the full phase with
the bridge on."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.core.http import token_fingerprint
from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN, SandboxSettings
from tests.gateway_testlib import BASE_CONFIG, GatewayFactory, make_config
from tests.process_testlib import Proc, start, wait_for

TOKEN = f"Bearer {DEFAULT_TOKEN}"
SECOND = "Bearer second-token"
BOARD = 4  # the first extra board: 2,000 cards, 20 pages of 100
CARDS = 2000
PAGES = 21  # page reads for them: each page overlaps the one before by one card
NOW = "2026-11-24T12:00:00Z"


def _sandbox_settings(**kw: Any) -> SandboxSettings:
    return SandboxSettings(extra_boards=(CARDS,), now=datetime(2026, 11, 24, 12, tzinfo=UTC),
                           cards_cap_from=datetime(2026, 10, 1, tzinfo=UTC),
                           cards_removal_from=datetime(2026, 11, 1, tzinfo=UTC),
                           tokens=frozenset({DEFAULT_TOKEN, "second-token"}), **kw)


def _config(url: str, backfill: dict[str, Any] | None = None) -> dict[str, Any]:
    exemptions = [{"name": f"legacy-{i}", "phase": "full", "until": "2099-01-01", "token_fingerprint":
                   token_fingerprint(token), "bridge": True} for i, token in enumerate((TOKEN, SECOND))]
    board = {**BASE_CONFIG["routes"][0], "chain": [{"board_cards": {"backfill": backfill or {}}}]}
    data = make_config(url, routes=[board], rollout={"now": NOW, "exemptions": exemptions},
                       access_log={"enabled": True})
    data["upstream"] = {"read_timeout": 30}
    return data


async def _read(url: str, auth: str = TOKEN, board: int = BOARD) -> tuple[int, Any, bytes, float]:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        async with client.get(f"{url}/api/latest/boards/{board}", headers={"Authorization": auth}) as resp:
            return resp.status, resp.headers, await resp.read(), time.monotonic() - started


async def _journal(sandbox: Any) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{sandbox.port}/_sandbox/journal") as resp:
            entries: list[dict[str, Any]] = await resp.json()
            return [e for e in entries if e["path"].startswith("/api/")]


async def _access_line(proc: Proc) -> dict[str, Any]:
    """The board request's access-log line (written within a fraction of a second)."""
    await wait_for(lambda: _async(any(line.get("route") == "board" for line in proc.access_lines())))
    (line,) = [line for line in proc.access_lines() if line.get("route") == "board"]
    return line


async def _async(value: bool) -> bool:
    return value


def _pages(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["path"] == "/api/latest/cards"]


@pytest.fixture
async def gateway_proc(tmp_path: Path) -> AsyncIterator[Any]:
    procs: list[Proc] = []

    async def run(url: str, **backfill: Any) -> Proc:
        proc = await start(_config(url, backfill), tmp_path, name=f"gateway{len(procs)}")
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        proc.stop()


async def test_a_20_page_board_is_backfilled_within_a_5_per_second_limit(aiohttp_server: Any,
                                                                          gateway_proc: Any) -> None:
    sandbox = await aiohttp_server(create_app(_sandbox_settings(rate_limit=5)))
    proc = await gateway_proc(f"http://127.0.0.1:{sandbox.port}")
    status, headers, body, took = await _read(proc.url)
    assert status == 200, body[:300]
    assert headers["X-Gateway-Backfill"] == f"done; cards={CARDS}; pages={PAGES}"
    assert len(json.loads(body)["cards"]) == CARDS
    assert took < 10  # the default timeout: 21 requests at 5 a second take 4 s or so
    entries = await _journal(sandbox)
    assert len(_pages(entries)) + 1 == len(entries)  # the board, then the pages (each once: none repeated)
    # Paced by the headers the service sends, the bridge never sent a request over the limit.
    assert [e for e in entries if e["status"] == 429] == []
    line = await _access_line(proc)
    assert line["notes"]["board_cards.backfill"].startswith(f"done cards={CARDS} pages={PAGES} waited=")


async def test_a_limit_too_low_for_the_timeout_answers_the_board_without_cards_in_time(aiohttp_server: Any,
                                                                                       gateway_proc: Any) -> None:
    sandbox = await aiohttp_server(create_app(_sandbox_settings(rate_limit=1)))
    proc = await gateway_proc(f"http://127.0.0.1:{sandbox.port}", timeout=3)
    status, headers, body, took = await _read(proc.url)
    assert status == 200 and headers["X-Gateway-Backfill"] == "rate_limited; retry_after=1"
    board = json.loads(body)
    assert "cards" not in board and "cards_deprecation_message" in board  # the service's board, as it came
    assert took < 3.5  # stopped once the next wait no longer fitted, within the timeout (3 s after the board came)
    entries = await _journal(sandbox)
    assert sum(e["status"] == 429 for e in entries) <= 1  # the first page's, before the limit was known
    line = await _access_line(proc)
    assert line["decisions"]["board_cards"] == "full(exemption):backfill_rate_limited"
    assert line["notes"]["board_cards.backfill"] == "rate_limited"
    metrics = await proc.metrics()
    assert metrics[("gateway_board_backfills_total", (("outcome", "rate_limited"), ("tenant", "acme")))] == 1
    assert metrics[("gateway_board_responses_total", (("action", "backfill_rate_limited"), ("phase", "full"),
                                                      ("tenant", "acme")))] == 1


async def test_readers_of_one_board_on_one_token_share_one_backfill(aiohttp_server: Any,
                                                                    start_gateway: GatewayFactory) -> None:
    sandbox = await aiohttp_server(create_app(_sandbox_settings()))
    gw = await start_gateway(_config(f"http://127.0.0.1:{sandbox.port}", {"share_seconds": 2}))
    answers = await asyncio.gather(*(_read(gw.url) for _ in range(20)))
    assert {(status, body) for status, _, body, _ in answers} == {(200, answers[0][2])}  # identical, whole
    assert len(json.loads(answers[0][2])["cards"]) == CARDS
    entries = await _journal(sandbox)
    assert len(_pages(entries)) == PAGES  # one backfill's page reads
    assert sum("shared" in headers["X-Gateway-Backfill"] for _, headers, _, _ in answers) == 19
    # Kept a moment for the same key: a reader just after reads no page either; after share_seconds, it does.
    await _read(gw.url)
    assert len(_pages(await _journal(sandbox))) == PAGES
    await asyncio.sleep(2.1)
    await _read(gw.url)
    assert len(_pages(await _journal(sandbox))) == 2 * PAGES


async def test_two_tokens_never_share_a_backfill(aiohttp_server: Any, start_gateway: GatewayFactory) -> None:
    sandbox = await aiohttp_server(create_app(_sandbox_settings()))
    gw = await start_gateway(_config(f"http://127.0.0.1:{sandbox.port}"))
    answers = await asyncio.gather(*(_read(gw.url, auth) for auth in (TOKEN, SECOND) * 5))
    assert all(status == 200 for status, _, _, _ in answers)
    # Two backfills, each read with its own token (the journal redacts the token: the pages' count says it).
    assert len(_pages(await _journal(sandbox))) == 2 * PAGES
    assert sum("shared" not in headers["X-Gateway-Backfill"] for _, headers, _, _ in answers) == 2


def _most_in_a_second(entries: list[dict[str, Any]]) -> int:
    """The most requests the service received within any one second (less the jitter between sending a request and
    its arrival: 50 ms)."""
    times = sorted(datetime.fromisoformat(e["received_at"].replace("Z", "+00:00")).timestamp() for e in entries)
    return max((sum(1 for t in times if start <= t < start + 0.95) for start in times), default=0)


async def test_the_bridges_own_caps_pace_its_pages_per_token_and_per_company(aiohttp_server: Any,
                                                                             start_gateway: GatewayFactory) -> None:
    """No limit at the service: the caps alone. Two tokens read board 1 (250 cards, pages of 50: 9 page reads each, the
    last wave of 4 reading past the end),
    at most 3 page requests a second per token and 4 per company; a backfill over share_bytes is not kept."""
    sandbox = await aiohttp_server(create_app(_sandbox_settings()))
    gw = await start_gateway(_config(f"http://127.0.0.1:{sandbox.port}", {
        "page_size": 50, "rate_per_token": 3, "rate_per_company": 4, "share_bytes": 1000}))
    started = time.monotonic()
    answers = await asyncio.gather(_read(gw.url, TOKEN, 1), _read(gw.url, SECOND, 1))
    took = time.monotonic() - started
    assert [headers["X-Gateway-Backfill"] for _, headers, _, _ in answers] == ["done; cards=250; pages=9"] * 2
    pages = _pages(await _journal(sandbox))
    assert len(pages) == 18 and _most_in_a_second(pages) <= 4
    assert took >= 3.5  # 18 requests, 4 a second
    await _read(gw.url, TOKEN, 1)  # over share_bytes: not kept, read again
    assert len(_pages(await _journal(sandbox))) == 27


# --- a service that says nothing but Retry-After --------------------------------------------------------------------


class _Limited:
    """A board of 2,000 withdrawn cards and its card list; at most 5 requests a second per token (windows of one
    second of the event loop's clock), a 429 with Retry-After alone over it. Records each 429's window."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[int, int]] = {}
        self.limited: list[int] = []
        self.pages = 0
        self.cards = [{"id": i, "board_id": BOARD, "title": f"card {i}"} for i in range(1, CARDS + 1)]

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        second = math.floor(loop.time())
        token = request.headers.get("Authorization", "")
        start, used = self.windows.get(token, (second, 0))
        if start != second:
            start, used = second, 0
        if used >= 5:
            self.limited.append(second)
            return web.json_response({"message": "slow down"}, status=429,
                                     headers={"Retry-After": str(math.ceil(second + 1 - loop.time()))})
        self.windows[token] = (start, used + 1)
        if request.path.startswith("/api/latest/boards/"):
            return web.json_response({"id": BOARD, "title": "b", "columns": [], "lanes": [],
                                      "cards_deprecation_message": "Cards are no longer returned."})
        self.pages += 1
        offset, limit = int(request.query["offset"]), int(request.query["limit"])
        return web.json_response(self.cards[offset : offset + limit])


async def test_a_service_that_says_only_retry_after_gets_at_most_one_429_a_window(aiohttp_raw_server: Any,
                                                                                 start_gateway: GatewayFactory) -> None:
    upstream = _Limited()
    server = await aiohttp_raw_server(upstream.handle)
    gw = await start_gateway(_config(f"http://127.0.0.1:{server.port}"))
    status, headers, body, took = await _read(gw.url)
    assert status == 200 and headers["X-Gateway-Backfill"] == f"done; cards={CARDS}; pages={PAGES}", body[:300]
    assert took < 10
    # Each 429 the bridge met taught it the window's size: no window saw a second one from its own pacing.
    assert len(upstream.limited) == len(set(upstream.limited)) and len(upstream.limited) <= 5
