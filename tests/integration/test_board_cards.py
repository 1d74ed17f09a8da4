"""board_cards through real sockets: a recording upstream (and the sandbox) behind the gateway, clock fixed."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import json
import re
import zoneinfo
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.core.http import token_fingerprint
from gateway.rollout import FixedClock, parse_instant
from tests.board_fixtures import BIG_INT, board_bytes
from tests.gateway_testlib import GatewayFactory, Received, RecordingUpstream, parse_responses, raw_exchange
from tests.integration.board_testlib import board_config, json_responder

CAP_EPOCH = int(dt.datetime(2026, 10, 1, tzinfo=dt.UTC).timestamp())
FULL, CAPPED, REMOVED = "2026-09-15T12:00:00Z", "2026-10-15T12:00:00Z", "2026-11-15T12:00:00Z"


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",)) as session:
        yield session


async def start(start_gateway: GatewayFactory, upstream: RecordingUpstream, at: str, **kwargs: Any):
    return await start_gateway(board_config(upstream.url, **kwargs), clock=FixedClock(parse_instant(at)))


def counter(gw: Any, phase: str, action: str, tenant: str = "acme") -> float:
    labels = {"tenant": tenant, "phase": phase, "action": action}
    return gw.metrics.registry.get_sample_value("gateway_board_responses_total", labels) or 0.0


def cards_removed(gw: Any, tenant: str = "acme") -> float:
    return gw.metrics.registry.get_sample_value("gateway_board_cards_removed_total", {"tenant": tenant}) or 0.0


# --- Phases --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "local", "phase"),
    [
        ("UTC", "2026-09-30T23:59:59", "full"),
        ("UTC", "2026-10-01T00:00:01", "capped"),
        ("UTC", "2026-10-31T23:59:59", "capped"),
        ("UTC", "2026-11-01T00:00:01", "removed"),
        ("Europe/Berlin", "2026-09-30T23:59:59", "full"),
        ("Europe/Berlin", "2026-10-01T00:00:01", "capped"),
        ("Europe/Berlin", "2026-10-31T23:59:59", "capped"),
        ("Europe/Berlin", "2026-11-01T00:00:01", "removed"),
        ("America/Los_Angeles", "2026-09-30T23:59:59", "full"),
        ("America/Los_Angeles", "2026-11-01T00:00:01", "removed"),
    ],
)
async def test_each_phase_on_each_side_of_each_boundary(
    upstream: RecordingUpstream, start_gateway: GatewayFactory, client: aiohttp.ClientSession,
    tz: str, local: str, phase: str,
) -> None:
    body = board_bytes(150)
    upstream.responder = json_responder(body)
    instant = dt.datetime.fromisoformat(local).replace(tzinfo=zoneinfo.ZoneInfo(tz)).astimezone(dt.UTC)
    gw = await start_gateway(board_config(upstream.url, rollout={"timezone": tz}), clock=FixedClock(instant))
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert resp.status == 200
        got = await resp.read()
        headers = resp.headers
    cap_epoch = int(dt.datetime(2026, 10, 1, tzinfo=zoneinfo.ZoneInfo(tz)).timestamp())
    assert headers["Deprecation"] == f"@{cap_epoch}"
    assert '</api/latest/cards?board_id=1>; rel="successor-version"' in headers.getall("Link")
    if phase == "full":
        assert got == body
        assert headers["ETag"] == '"v1"'
    elif phase == "capped":
        doc = json.loads(got)
        assert [c["id"] for c in doc["cards"]] == list(range(1, 101))
        assert "GET /api/latest/cards?board_id=1&limit=100&offset=100" in doc["cards_deprecation_message"]
        assert headers["ETag"].startswith('W/"v1.cards-capped-')
    else:
        doc = json.loads(got)
        assert "cards" not in doc
        assert "GET /api/latest/cards?board_id=1&limit=100&offset=0" in doc["cards_deprecation_message"]
    assert counter(gw, phase, {"full": "untouched", "capped": "capped", "removed": "removed"}[phase]) == 1
    assert (upstream.received[-1].header("Accept-Encoding") == "identity") == (phase != "full")


@pytest.mark.parametrize(
    "path", ["/api/latest/boards/1", "/api/v1/boards/1", "/api/latest/spaces/9/boards/1", "/api/v1/spaces/9/boards/1"]
)
async def test_every_spelling_of_the_route_is_rewritten(upstream, start_gateway, client, path: str) -> None:
    upstream.responder = json_responder(board_bytes(120))
    gw = await start(start_gateway, upstream, REMOVED)
    async with client.get(gw.url + path) as resp:
        doc = json.loads(await resp.read())
    assert "cards" not in doc and "board_id=1&" in doc["cards_deprecation_message"]


# --- Fidelity ------------------------------------------------------------------------------------------------------


def expected_cap(body: bytes, n: int) -> dict[str, Any]:
    doc = json.loads(body)
    doc["cards"] = doc["cards"][:n]
    return doc


@pytest.mark.parametrize("count", [0, 100, 101, 10_000])
async def test_board_sizes_in_the_cap_phase(upstream, start_gateway, client, count: int) -> None:
    body = board_bytes(count)
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, CAPPED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        got = await resp.read()
        assert resp.headers["Content-Length"] == str(len(got))
    if count <= 100:
        assert got == body  # nothing excluded: the upstream's bytes
        assert counter(gw, "capped", "untouched") == 1
        return
    doc = json.loads(got)
    message = doc.pop("cards_deprecation_message")
    assert doc == expected_cap(body, 100)
    assert f"first 100 of {count} cards" in message and "offset=100" in message
    # Everything up to the 100th card is the upstream's bytes; so is everything after the cards array.
    cut = got.index(b',"cards_deprecation_message"')
    assert body.startswith(got[: cut - 1])
    assert body.endswith(got[got.index(b'"card_properties"') - 1 :])
    assert cards_removed(gw) == count - 100


@pytest.mark.parametrize("count", [0, 100, 101, 10_000])
async def test_board_sizes_in_the_removal_phase(upstream, start_gateway, client, count: int) -> None:
    body = board_bytes(count)
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, REMOVED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        got = await resp.read()
    doc = json.loads(got)
    assert list(doc) == ["id", "title", "created", "description", "columns", "lanes", "cards_deprecation_message",
                         "card_properties", "automove_cards", "weights"]
    before, after = body.split(b'"cards":', 1)
    assert got.startswith(before)
    assert got.endswith(after[after.index(b',"card_properties"'):])
    assert cards_removed(gw) == count


async def test_unicode_big_integers_and_floats_are_kept_as_written(upstream, start_gateway, client) -> None:
    body = board_bytes(150)
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, CAPPED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        got = await resp.read()
    assert str(BIG_INT).encode() in got
    assert b'"weights":[1.0,1.50,2e3,-0.0,1E+2,123456789012345678901234567890.5]' in got
    assert "Тест ✓ 日本".encode() in got and "🚀".encode() in got
    assert json.loads(got)["cards"][6]["size"] == BIG_INT


async def test_empty_array_mode(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(5))
    gw = await start(start_gateway, upstream, REMOVED, options={"removal": "empty_array", "page_limit": 50})
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        doc = json.loads(await resp.read())
    assert doc["cards"] == []
    assert "limit=50&offset=0" in doc["cards_deprecation_message"]


async def test_an_existing_deprecation_message_is_replaced_not_duplicated(upstream, start_gateway, client) -> None:
    body = b'{"id":1,"cards_deprecation_message":"old","cards":[{"id":1}],"lanes":[]}'
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, REMOVED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        got = await resp.read()
    assert got.count(b"cards_deprecation_message") == 1
    doc = json.loads(got)
    assert list(doc) == ["id", "cards_deprecation_message", "lanes"]
    assert doc["cards_deprecation_message"] != "old"


# --- What passes untouched -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [(401, b"Invalid token", "text/plain"), (403, b"", None), (404, b"", None), (500, b'{"cards":[1]}', "application/json")],
)
async def test_error_statuses_pass_untouched(upstream, start_gateway, client, status, body, content_type) -> None:
    async def responder(request, received):
        headers = {"Content-Type": content_type} if content_type else {}
        return web.Response(status=status, body=body, headers=headers)

    upstream.responder = responder
    gw = await start(start_gateway, upstream, REMOVED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert resp.status == status
        assert await resp.read() == body
        assert "Deprecation" not in resp.headers
    assert counter(gw, "removed", "not_ok") == 1


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b'{"cards": [1, 2', "application/json", "truncated"),
        (b'{"cards": [1, 2]} trailing', "application/json", "trailing"),
        (b"[1, 2, 3]", "application/json", "array"),
        (b'{"cards": [1]}', "text/html", "html"),
        (b'{"cards":[1],"cards":[2]}', "application/json", "duplicate key"),
        (b'{"cards": ["unterminated]}', "application/json", "string"),
        (b'{"cards": [{"a": [1}]}', "application/json", "mismatched"),
    ],
)
async def test_unparseable_bodies_pass_untouched_and_are_counted(
    upstream, start_gateway, client, caplog, body: bytes, content_type: str, reason: str
) -> None:
    upstream.responder = json_responder(body, headers={"Content-Type": content_type})
    gw = await start(start_gateway, upstream, REMOVED)
    with caplog.at_level("WARNING", logger="gateway.board_cards"):
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 200
            assert await resp.read() == body
    assert counter(gw, "removed", "passed_through_unparsed") == 1
    records = [r for r in caplog.records if r.name == "gateway.board_cards"]
    assert len(records) == 1
    assert body.decode(errors="replace") not in records[0].getMessage()


async def test_bodies_over_the_cap_pass_untouched(upstream, start_gateway, client) -> None:
    body = board_bytes(2000)
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, REMOVED, options={"max_body_bytes": 100_000})
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert await resp.read() == body
        assert resp.headers["ETag"] == '"v1"'
    assert counter(gw, "removed", "too_large") == 1


async def test_chunked_bodies_over_the_cap_pass_untouched(upstream, start_gateway, client) -> None:
    body = board_bytes(2000)

    async def responder(request, received):
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), 10_000):
            await resp.write(body[i : i + 10_000])
        await resp.write_eof()
        return resp

    upstream.responder = responder
    gw = await start(start_gateway, upstream, REMOVED, options={"max_body_bytes": 100_000})
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert await resp.read() == body
    assert counter(gw, "removed", "too_large") == 1


# --- Compression ---------------------------------------------------------------------------------------------------


async def test_gzip_from_the_upstream_is_decoded_and_the_client_gets_gzip(upstream, start_gateway, client) -> None:
    body = board_bytes(300)
    upstream.responder = json_responder(body, gzip_always=True)
    gw = await start(start_gateway, upstream, CAPPED)
    async with client.get(gw.url + "/api/latest/boards/1", headers={"Accept-Encoding": "gzip, br"}) as resp:
        raw = await resp.read()
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Length"] == str(len(raw))
        assert "Accept-Encoding" in resp.headers["Vary"]
    doc = json.loads(gzip.decompress(raw))
    assert len(doc["cards"]) == 100
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        plain = await resp.read()
        assert "Content-Encoding" not in resp.headers
    assert json.loads(plain) == doc


async def test_compress_min_bytes_and_level_decide_the_rewritten_boards_gzip(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(300))

    async def board(**options: Any) -> tuple[str | None, bytes]:
        gw = await start(start_gateway, upstream, CAPPED, options={"cap": 100, **options})
        async with client.get(gw.url + "/api/latest/boards/1", headers={"Accept-Encoding": "gzip"}) as resp:
            return resp.headers.get("Content-Encoding"), await resp.read()

    plain_encoding, plain = await board(compress_min_bytes=len(board_bytes(300)))  # more than the capped board
    assert plain_encoding is None and len(json.loads(plain)["cards"]) == 100
    fast_encoding, fast = await board(compress_level=1)
    best_encoding, best = await board(compress_level=9)
    assert fast_encoding == best_encoding == "gzip"
    assert gzip.decompress(fast) == gzip.decompress(best) == plain
    assert len(best) < len(fast)


async def test_a_compression_bomb_passes_through_as_too_large(upstream, start_gateway, client) -> None:
    bomb = gzip.compress(b'{"cards":[' + b" " * 5_000_000 + b"]}")

    async def responder(request, received):
        return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    upstream.responder = responder
    gw = await start(start_gateway, upstream, REMOVED, options={"max_body_bytes": 1_000_000})
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert await resp.read() == bomb
    assert counter(gw, "removed", "too_large") == 1


async def test_the_upstream_is_asked_for_identity_only_when_the_phase_rewrites(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(3))
    gw = await start(start_gateway, upstream, FULL)
    async with client.get(gw.url + "/api/latest/boards/1", headers={"Accept-Encoding": "gzip"}) as resp:
        await resp.read()
    assert upstream.received[-1].header("Accept-Encoding") == "gzip"


# --- Validators and conditional requests ---------------------------------------------------------------------------


async def test_conditional_requests_within_a_phase_and_across_a_phase_change(upstream, start_gateway, client) -> None:
    body = board_bytes(150)
    upstream.responder = json_responder(body, headers={"Last-Modified": "Tue, 01 Sep 2026 00:00:00 GMT"})
    full = await start(start_gateway, upstream, FULL)
    capped = await start(start_gateway, upstream, CAPPED)
    removed = await start(start_gateway, upstream, REMOVED)
    url = "/api/latest/boards/1"

    async with client.get(full.url + url) as resp:
        full_etag = resp.headers["ETag"]
        assert full_etag == '"v1"'
    # A copy from before the cap date is never confirmed by a 304 once cards are capped.
    async with client.get(capped.url + url, headers={"If-None-Match": full_etag,
                                                     "If-Modified-Since": "Tue, 01 Sep 2026 00:00:00 GMT"}) as resp:
        assert resp.status == 200
        capped_etag = resp.headers["ETag"]
        assert "Last-Modified" not in resp.headers
        assert len(json.loads(await resp.read())["cards"]) == 100
    assert upstream.received[-1].header("If-None-Match") is None
    assert upstream.received[-1].header("If-Modified-Since") is None
    # Within the phase, revalidation works: the upstream is asked with its own tag and answers 304.
    async with client.get(capped.url + url, headers={"If-None-Match": capped_etag}) as resp:
        assert resp.status == 304
        assert resp.headers["ETag"] == capped_etag
        assert resp.headers["Deprecation"] == f"@{CAP_EPOCH}"
    assert upstream.received[-1].header("If-None-Match") == '"v1"'
    assert counter(capped, "capped", "not_modified") == 1
    # After the removal date the capped copy is stale: 200 with the new representation.
    async with client.get(removed.url + url, headers={"If-None-Match": capped_etag}) as resp:
        assert resp.status == 200
        assert resp.headers["ETag"] != capped_etag
        assert "cards" not in json.loads(await resp.read())
    # A star still means "any representation".
    async with client.get(removed.url + url, headers={"If-None-Match": "*"}) as resp:
        assert resp.status == 304


async def test_range_requests_are_not_forwarded_when_rewriting(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(150))
    gw = await start(start_gateway, upstream, REMOVED)
    async with client.get(gw.url + "/api/latest/boards/1", headers={"Range": "bytes=0-99"}) as resp:
        assert resp.status == 200
        assert "cards" not in json.loads(await resp.read())
    assert upstream.received[-1].header("Range") is None


# --- HEAD ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", [FULL, CAPPED, REMOVED])
async def test_head_answers_like_get(upstream, start_gateway, at: str) -> None:
    body = board_bytes(150)
    upstream.responder = json_responder(body)
    gw = await start(start_gateway, upstream, at)
    get = await raw_exchange(gw.port, b"GET /api/latest/boards/1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    head = await raw_exchange(gw.port, b"HEAD /api/latest/boards/1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    (g_status, g_headers, g_body), = parse_responses(get)
    h_head, _, h_rest = head.partition(b"\r\n\r\n")
    assert h_rest == b""
    h_headers = dict(
        (k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in h_head.decode().split("\r\n")[1:])
    )
    for name in ("content-length", "etag", "deprecation", "link", "content-type"):
        assert h_headers.get(name) == g_headers.get(name), name
    assert int(h_headers["content-length"]) == len(g_body)
    if at != FULL:
        assert upstream.received[-1].method == "GET"


# --- Overrides, exemptions, brownouts --------------------------------------------------------------------------------


async def test_tenant_overrides_move_the_dates(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(150))
    gw = await start(start_gateway, upstream, "2026-09-02T00:00:01Z",
                     tenant_rollout={"board_cards_cap": "2026-08-01", "board_cards_removal": "2026-09-02"})
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        assert "cards" not in json.loads(await resp.read())
        assert resp.headers["Deprecation"] == f"@{int(dt.datetime(2026, 8, 1, tzinfo=dt.UTC).timestamp())}"
    async with client.get(gw.url + "/api/latest/boards/1", headers={"Host": "old.test"}) as resp:
        assert len(json.loads(await resp.read())["cards"]) == 150  # the other tenant keeps the defaults


async def test_exemption_by_token_fingerprint_until_its_date(upstream, start_gateway, client) -> None:
    body = board_bytes(150)
    upstream.responder = json_responder(body)
    token = "Bearer mobile-app-token"
    exemption = {"name": "mobile", "until": "2026-12-01", "token_fingerprint": token_fingerprint(token)}
    before = await start(start_gateway, upstream, REMOVED, rollout={"exemptions": [exemption]})
    after = await start(start_gateway, upstream, "2026-12-01T00:00:01Z", rollout={"exemptions": [exemption]})
    async with client.get(before.url + "/api/latest/boards/1", headers={"Authorization": token}) as resp:
        assert await resp.read() == body
        assert "Authorization" in resp.headers["Vary"]
    async with client.get(before.url + "/api/latest/boards/1", headers={"Authorization": "Bearer other"}) as resp:
        assert "cards" not in json.loads(await resp.read())
    async with client.get(after.url + "/api/latest/boards/1", headers={"Authorization": token}) as resp:
        assert "cards" not in json.loads(await resp.read())
    assert counter(before, "full", "untouched") == 1


async def test_exemption_by_header_keeps_the_capped_phase(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(150))
    exemption = {"name": "sync", "phase": "capped", "until": "2027-01-01",
                 "header": {"name": "User-Agent", "prefix": "LegacySync/"}}
    gw = await start(start_gateway, upstream, REMOVED, tenant_rollout={"exemptions": [exemption]})
    async with client.get(gw.url + "/api/latest/boards/1", headers={"User-Agent": "LegacySync/2.1"}) as resp:
        assert len(json.loads(await resp.read())["cards"]) == 100
        assert "User-Agent" in resp.headers["Vary"]
    async with client.get(gw.url + "/api/latest/boards/1", headers={"User-Agent": "Other/1"}) as resp:
        assert "cards" not in json.loads(await resp.read())


@pytest.mark.parametrize(("at", "cards"), [("2026-10-20T09:59:59", 100), ("2026-10-20T10:00:00", None),
                                           ("2026-10-20T11:59:59", None), ("2026-10-20T12:00:00", 100)])
async def test_brownout_window(upstream, start_gateway, client, at: str, cards: int | None) -> None:
    upstream.responder = json_responder(board_bytes(150))
    rollout = {"timezone": "Europe/Berlin",
               "brownouts": [{"start": "2026-10-20T10:00:00", "end": "2026-10-20T12:00:00"}]}
    instant = dt.datetime.fromisoformat(at).replace(tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    gw = await start_gateway(board_config(upstream.url, rollout=rollout), clock=FixedClock(instant))
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        doc = json.loads(await resp.read())
    if cards is None:
        assert "cards" not in doc
        assert counter(gw, "removed", "removed") == 1
    else:
        assert len(doc["cards"]) == cards


async def test_announcement_date_gates_the_signal_headers(upstream, start_gateway, client) -> None:
    body = board_bytes(3)
    upstream.responder = json_responder(body)
    rollout = {"board_cards_announcement": "2026-09-01"}
    early = await start(start_gateway, upstream, "2026-08-31T23:59:59Z", rollout=rollout)
    late = await start(start_gateway, upstream, "2026-09-01T00:00:00Z", rollout=rollout,
                       options={"deprecation_link": "https://docs.example.test/board-cards"})
    async with client.get(early.url + "/api/latest/boards/1") as resp:
        assert "Deprecation" not in resp.headers and "Link" not in resp.headers
        assert await resp.read() == body
    async with client.get(late.url + "/api/latest/boards/1") as resp:
        assert resp.headers["Deprecation"] == f"@{CAP_EPOCH}"
        links = resp.headers.getall("Link")
        assert '</api/latest/cards?board_id=1>; rel="successor-version"' in links
        assert '<https://docs.example.test/board-cards>; rel="deprecation"; type="text/html"' in links
        assert await resp.read() == body


async def test_decision_in_context_and_phase_gauge(upstream, start_gateway, client) -> None:
    upstream.responder = json_responder(board_bytes(150))
    gw = await start(start_gateway, upstream, CAPPED)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        await resp.read()
    def phase(behaviour: str, name: str) -> float | None:
        labels = {"tenant": "acme", "behaviour": behaviour, "phase": name}
        return gw.metrics.registry.get_sample_value("gateway_rollout_phase", labels)

    assert phase("board_cards", "capped") == 1
    assert phase("board_cards", "full") == 0
    assert phase("legacy_uploads", "forbidden") == 1


async def test_memo_is_only_used_for_identical_bodies(upstream, start_gateway, client) -> None:
    bodies = [board_bytes(150), board_bytes(160)]
    state = {"i": 0}

    async def responder(request, received):
        body = bodies[state["i"] % 2]
        return web.Response(body=body, content_type="application/json")

    upstream.responder = responder
    gw = await start(start_gateway, upstream, CAPPED)
    for i in range(4):
        state["i"] = i
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            doc = json.loads(await resp.read())
        assert f"of {150 if i % 2 == 0 else 160} cards" in doc["cards_deprecation_message"]
    assert cards_removed(gw) == 50 + 60 + 50 + 60


def pieces_responder(body: bytes, cuts: list[int]):
    """The body streamed (chunked) in pieces cut at ``cuts``, each write given its own turn of the loop."""

    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "ETag": '"v1"'})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for a, b in zip([0, *cuts], [*cuts, len(body)]):
            await resp.write(body[a:b])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    return responder


def awkward_cuts(body: bytes) -> list[int]:
    """Cut points inside multi-byte characters, escapes, big integers, the cards' commas and the array's end."""
    cuts = {body.index("日".encode()) + 1, body.index("🚀".encode()) + 2, body.index(b'\\"') + 1,
            body.index(str(BIG_INT).encode()) + 10, body.index(b"},{") + 1, body.rindex(b"]"),
            body.rindex(b"]") + 1, len(body) - 1}
    cuts |= set(range(4099, len(body), 4099))
    return sorted(c for c in cuts if 0 < c < len(body))


@pytest.mark.parametrize("at", [CAPPED, REMOVED])
async def test_a_board_read_in_awkward_pieces_is_cut_as_a_whole_one(upstream, start_gateway, client, at: str) -> None:
    body = board_bytes(150)
    body = body.replace(b'"title":"Board', rb'"title":"\u00e9\"\\\\\"\ud83d\ude80 Board', 1)
    gw = await start(start_gateway, upstream, at)
    upstream.responder = json_responder(body)
    async with client.get(gw.url + "/api/latest/boards/1") as resp:
        whole = await resp.read()
    upstream.responder = pieces_responder(body, awkward_cuts(body))
    async with client.get(gw.url + "/api/latest/boards/2") as resp:
        pieced = await resp.read()
    assert pieced == whole.replace(b"board_id=1", b"board_id=2")
    doc, original = json.loads(pieced), json.loads(body)
    if at == CAPPED:
        assert doc["cards"] == original["cards"][:100] and "first 100 of 150 cards" in doc["cards_deprecation_message"]
        assert pieced.startswith(body[: body.index(b'{"id":101,') - 1])  # the upstream's bytes up to the cut
    else:
        assert "cards" not in doc and doc["title"] == original["title"]
    assert pieced.endswith(body[body.index(b',"card_properties"'):])
    assert counter(gw, "capped" if at == CAPPED else "removed", "capped" if at == CAPPED else "removed") == 2


async def test_a_board_that_differs_from_the_kept_one_only_at_its_end(upstream, start_gateway, client) -> None:
    """The memo compares a new body as it arrives and reads it only once it differs: here in its last piece."""
    first = board_bytes(150)
    assert first.endswith(b"123456789012345678901234567890.5]}")
    changed = first[:-3] + b"6]}"  # ...890.6]} in place of ...890.5]}: the same length, the last byte but two
    gw = await start(start_gateway, upstream, CAPPED)
    for body in (first, first, changed, first[:-1], first):
        upstream.responder = pieces_responder(body, list(range(65_536, len(body), 65_536)))
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            got = await resp.read()
        if body == first[:-1]:
            assert got == body  # not JSON (cut short): passed through as it came
            continue
        doc = json.loads(got)
        assert doc["cards"] == json.loads(body)["cards"][:100]
        assert got.endswith(body[body.index(b',"card_properties"'):])
    assert counter(gw, "capped", "capped") == 4 and counter(gw, "capped", "passed_through_unparsed") == 1


# --- Against the sandbox -----------------------------------------------------------------------------------------


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    app_module = pytest.importorskip("sandbox.app")
    settings_module = pytest.importorskip("sandbox.settings")
    return await aiohttp_server(app_module.create_app(settings_module.SandboxSettings(gzip_boards=True)))


SANDBOX_AUTH = {"Authorization": "Bearer sandbox-token"}


async def test_sandbox_board_in_each_phase(sandbox, start_gateway, client) -> None:
    url = f"http://127.0.0.1:{sandbox.port}"
    for at, expect in ((FULL, 250), (CAPPED, 100), (REMOVED, None)):
        gw = await start_gateway(board_config(url), clock=FixedClock(parse_instant(at)))
        # The sandbox builds file links from X-Forwarded-Host: ask it directly as the gateway does.
        forwarded = {**SANDBOX_AUTH, "X-Forwarded-Host": f"127.0.0.1:{gw.port}", "X-Forwarded-Proto": "http"}
        async with client.get(url + "/api/latest/spaces/1/boards/1", headers=forwarded) as resp:
            direct = await resp.read()
        async with client.get(gw.url + "/api/latest/spaces/1/boards/1", headers=SANDBOX_AUTH) as resp:
            got = await resp.read()
        if expect == 250:
            assert got == direct
            continue
        doc = json.loads(got)
        reference = json.loads(direct)
        if expect is None:
            assert "cards" not in doc
            reference.pop("cards")
        else:
            assert len(doc["cards"]) == 100
            reference["cards"] = reference["cards"][:100]
        doc.pop("cards_deprecation_message")
        assert doc == reference
        assert str(12345678901234567890123).encode() in direct


async def test_sandbox_gzip_and_errors_through_the_gateway(sandbox, start_gateway, client) -> None:
    url = f"http://127.0.0.1:{sandbox.port}"
    gw = await start_gateway(board_config(url), clock=FixedClock(parse_instant(CAPPED)))
    async with client.get(gw.url + "/api/latest/boards/1", headers={**SANDBOX_AUTH, "Accept-Encoding": "gzip"}) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert len(json.loads(gzip.decompress(await resp.read()))["cards"]) == 100
    async with client.get(gw.url + "/api/latest/boards/2", headers=SANDBOX_AUTH) as resp:
        assert json.loads(await resp.read())["cards"] == []
    async with client.get(gw.url + "/api/latest/boards/3", headers=SANDBOX_AUTH) as resp:
        assert resp.status == 403 and await resp.read() == b""
    async with client.get(gw.url + "/api/latest/boards/999", headers=SANDBOX_AUTH) as resp:
        assert resp.status == 404 and await resp.read() == b""
    async with client.get(gw.url + "/api/latest/boards/1", headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401 and await resp.read() == b"Invalid token"


async def test_sandbox_conditional_get_across_the_removal_date(sandbox, start_gateway, client) -> None:
    url = f"http://127.0.0.1:{sandbox.port}"
    capped = await start_gateway(board_config(url), clock=FixedClock(parse_instant(CAPPED)))
    removed = await start_gateway(board_config(url), clock=FixedClock(parse_instant(REMOVED)))
    async with client.get(capped.url + "/api/latest/boards/1", headers=SANDBOX_AUTH) as resp:
        etag = resp.headers["ETag"]
        assert re.match(r'^W/".+\.cards-capped-[0-9a-f]{8}"$', etag)
    async with client.get(capped.url + "/api/latest/boards/1", headers={**SANDBOX_AUTH, "If-None-Match": etag}) as resp:
        assert resp.status == 304
    async with client.get(removed.url + "/api/latest/boards/1", headers={**SANDBOX_AUTH, "If-None-Match": etag}) as resp:
        assert resp.status == 200
        assert "cards" not in json.loads(await resp.read())
