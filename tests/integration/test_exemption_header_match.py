"""An exemption matched by a header, through a real socket: the header's name is matched whatever its case (HTTP
names are case-insensitive), its value or prefix case-sensitively, character for character; with the header sent
more than once, the first line counts (User-Agent may not be sent twice at all). docs/rollout.md ("Exemptions") says the same."""

from __future__ import annotations

import json

import pytest

from gateway.rollout import FixedClock, parse_instant
from tests.board_fixtures import board_bytes
from tests.gateway_testlib import GatewayFactory, RecordingUpstream, parse_responses, raw_exchange
from tests.integration.board_testlib import board_config, json_responder

REMOVED = "2026-11-15T12:00:00Z"
EXEMPTIONS = [
    {"name": "nightly-sync", "phase": "full", "until": "2027-01-01",
     "header": {"name": "User-Agent", "prefix": "LegacySync/"}},
    {"name": "exact-client", "phase": "capped", "until": "2027-01-01", "header": {"name": "X-Client", "value": "Sync"}},
]


@pytest.mark.parametrize(("header_lines", "cards"), [
    ([b"User-Agent: LegacySync/2.1"], 150),  # the prefix: exempted onto "full"
    ([b"user-agent: LegacySync/2.1"], 150),  # the name in any case
    ([b"USER-AGENT: LegacySync/"], 150),  # the prefix alone is a match
    ([b"User-Agent: \t LegacySync/2.1  "], 150),  # spaces around a value are not part of it
    ([b"User-Agent: legacysync/2.1"], 0),  # the value's case counts
    ([b"User-Agent: LEGACYSYNC/2.1"], 0),
    ([b"User-Agent: LegacySync"], 0),  # shorter than the prefix
    ([b"User-Agent: MyLegacySync/2.1"], 0),  # a prefix, not a substring
    ([b"x-client: Sync"], 100),  # value: the whole value, exactly (the capped exemption)
    ([b"X-Client: sync"], 0),
    ([b"X-Client: Sync2"], 0),
    ([b"X-Client: Other", b"X-Client: Sync"], 0),  # the first line counts
    ([b"X-Client: Sync", b"X-Client: Other"], 100),
])
async def test_header_exemptions_match_the_name_in_any_case_and_the_value_exactly(
        upstream: RecordingUpstream, start_gateway: GatewayFactory, header_lines: list[bytes], cards: int) -> None:
    upstream.responder = json_responder(board_bytes(150), etag=None)
    gw = await start_gateway(board_config(upstream.url, rollout={"exemptions": EXEMPTIONS}),
                             clock=FixedClock(parse_instant(REMOVED)))
    request = (b"GET /api/latest/boards/1 HTTP/1.1\r\nHost: acme.test\r\nConnection: close\r\n"
               + b"".join(line + b"\r\n" for line in header_lines) + b"\r\n")
    [(status, _, body)] = parse_responses(await raw_exchange(gw.port, request))
    board = json.loads(body)
    assert status == 200
    assert len(board.get("cards", [])) == cards, header_lines
    assert ("cards_deprecation_message" in board) == (cards < 150)


async def test_a_repeated_user_agent_is_refused_before_any_exemption_is_read(
        upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    """User-Agent is a single-value header: aiohttp's parser refuses a request carrying it twice, so no first or last
    line is ever picked for a match."""
    gw = await start_gateway(board_config(upstream.url, rollout={"exemptions": EXEMPTIONS}),
                             clock=FixedClock(parse_instant(REMOVED)))
    request = (b"GET /api/latest/boards/1 HTTP/1.1\r\nHost: acme.test\r\nConnection: close\r\n"
               b"User-Agent: Other/1.0\r\nUser-Agent: LegacySync/2.1\r\n\r\n")
    [(status, _, body)] = parse_responses(await raw_exchange(gw.port, request))
    assert status == 400 and json.loads(body)["code"] == "MALFORMED_REQUEST"
    assert upstream.received == []
