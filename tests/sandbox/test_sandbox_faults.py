"""``/_sandbox/faults``: matching requests answer an injected status, late,
a given number of times."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from .sandbox_testlib import AUTH

FAULTS = "/_sandbox/faults"
INJECTED = {"message": "injected fault"}


async def add_fault(client: TestClient[Any, Any], **fields: Any) -> dict[str, Any]:
    resp = await client.post(FAULTS, json=fields)
    assert resp.status == 201, await resp.text()
    value: dict[str, Any] = await resp.json()
    return value


async def faults(client: TestClient[Any, Any]) -> list[dict[str, Any]]:
    resp = await client.get(FAULTS)
    assert resp.status == 200
    value: list[dict[str, Any]] = await resp.json()
    return value


async def get_cards(client: TestClient[Any, Any], query: str, prefix: str = "/api/latest") -> ClientResponse:
    return await client.get(f"{prefix}/cards?{query}", headers=AUTH)


async def test_fault_answers_once_then_the_real_page(client: TestClient[Any, Any]) -> None:
    fault = await add_fault(client, method="GET", path="/api/latest/cards", query={"offset": "100"}, status=500)
    assert fault == {"id": 1, "method": "GET", "path": "/api/latest/cards", "query": {"offset": "100"},
                     "status": 500, "delay": 0.0, "times": 1, "remaining": 1}
    assert (await get_cards(client, "board_id=1&offset=0")).status == 200
    failed = await get_cards(client, "board_id=1&limit=100&offset=100")
    assert failed.status == 500
    assert failed.content_type == "application/json"
    assert await failed.json() == INJECTED
    ok = await get_cards(client, "board_id=1&limit=100&offset=100")
    assert ok.status == 200
    assert [c["id"] for c in await ok.json()] == list(range(101, 201))
    assert await faults(client) == []


async def test_times_counts_down(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", status=503, times=3)
    statuses = []
    for n in range(4):
        statuses.append((await get_cards(client, "board_id=1")).status)
        if n == 0:
            assert [f["remaining"] for f in await faults(client)] == [2]
    assert statuses == [503, 503, 503, 200]


async def test_method_and_path_must_match_exactly(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="post", path="/api/latest/cards", status=500)
    await add_fault(client, method="GET", path="/api/latest/cards/1", status=500)
    assert [f["method"] for f in await faults(client)] == ["POST", "GET"]
    assert (await get_cards(client, "board_id=1")).status == 200  # method differs
    assert (await get_cards(client, "board_id=1", "/api/v1")).status == 200  # path differs
    assert (await client.get("/api/v1/cards/1", headers=AUTH)).status == 200  # prefix differs
    assert (await client.head("/api/latest/cards/1", headers=AUTH)).status == 200  # HEAD is not GET
    assert (await client.get("/api/latest/cards/1", headers=AUTH)).status == 500


async def test_every_given_query_parameter_must_match(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", query={"board_id": "1", "offset": 100},
                    status=502)
    assert (await faults(client))[0]["query"] == {"board_id": "1", "offset": "100"}
    assert (await get_cards(client, "board_id=2&offset=100")).status == 200
    assert (await get_cards(client, "offset=100")).status == 200
    assert (await get_cards(client, "board_id=1&offset=10")).status == 200
    assert (await get_cards(client, "board_id=1&offset=100&limit=50")).status == 502  # others are ignored


async def test_delay_then_status(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", status=504, delay=0.3)
    started = time.monotonic()
    resp = await get_cards(client, "board_id=1")
    assert resp.status == 504
    assert time.monotonic() - started >= 0.3


async def test_delay_alone_serves_the_real_answer_late(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", delay=0.3)
    started = time.monotonic()
    resp = await get_cards(client, "board_id=1&limit=2")
    assert time.monotonic() - started >= 0.3
    assert resp.status == 200
    assert [c["id"] for c in await resp.json()] == [1, 2]


async def test_concurrent_requests_never_share_one_use(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", status=500, delay=0.2)
    first, second = await asyncio.gather(get_cards(client, "board_id=1"), get_cards(client, "board_id=1"))
    assert sorted([first.status, second.status]) == [200, 500]


async def test_oldest_matching_fault_applies_first(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/boards/1", status=500)
    await add_fault(client, method="GET", path="/api/latest/boards/1", status=502)
    assert [f["id"] for f in await faults(client)] == [1, 2]
    statuses = [(await client.get("/api/latest/boards/1", headers=AUTH)).status for _ in range(3)]
    assert statuses == [500, 502, 200]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/latest/boards/1"),
        ("GET", "/api/v1/spaces/1/boards/2"),
        ("HEAD", "/api/latest/boards/1"),
        ("GET", "/api/v1/cards/1/comments"),
        ("GET", "/public-files/1/readme.txt"),
    ],
)
async def test_faults_reach_every_route(client: TestClient[Any, Any], method: str, path: str) -> None:
    await add_fault(client, method=method, path=path, status=503)
    resp = await client.request(method, path, headers=AUTH)
    assert resp.status == 503
    if method == "GET":
        assert await resp.json() == INJECTED
    assert (await client.request(method, path, headers=AUTH)).status == 200


async def test_faulted_write_does_nothing(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="POST", path="/api/v1/cards/2/comments", status=500)
    resp = await client.post("/api/v1/cards/2/comments", json={"text": "lost"}, headers=AUTH)
    assert resp.status == 500
    comments = await (await client.get("/api/v1/cards/2/comments", headers=AUTH)).json()
    assert comments == []


async def test_fault_comes_before_the_token_check(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/boards/1", status=500)
    assert (await client.get("/api/latest/boards/1")).status == 500
    assert (await client.get("/api/latest/boards/1")).status == 401


async def test_journal_records_the_injected_status(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", status=429)
    await get_cards(client, "board_id=1&offset=100")
    entries = await (await client.get("/_sandbox/journal")).json()
    assert [(e["path"], e["query_string"], e["status"]) for e in entries] == [
        ("/api/latest/cards", "board_id=1&offset=100", 429)
    ]


async def test_controls_are_never_faulted(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/_sandbox/journal", status=500)
    await add_fault(client, method="GET", path=FAULTS, status=500)
    assert (await client.get("/_sandbox/journal")).status == 200
    assert len(await faults(client)) == 2


async def test_clear(client: TestClient[Any, Any]) -> None:
    await add_fault(client, method="GET", path="/api/latest/cards", status=500, times=5)
    await add_fault(client, method="GET", path="/api/latest/boards/1", status=500)
    assert len(await faults(client)) == 2
    resp = await client.delete(FAULTS)
    assert resp.status == 204
    assert await faults(client) == []
    assert (await get_cards(client, "board_id=1")).status == 200
    assert (await client.get("/api/latest/boards/1", headers=AUTH)).status == 200


async def test_controls_need_no_token(client: TestClient[Any, Any]) -> None:
    resp = await client.post(FAULTS, json={"method": "GET", "path": "/x", "status": 500},
                             headers={"Authorization": "Bearer wrong"})
    assert resp.status == 201


VALID = '"method": "GET", "path": "/api/latest/cards"'


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "[]",
        '{"path": "/api/latest/cards", "status": 500}',
        '{"method": "GET", "status": 500}',
        '{"method": "G E T", "path": "/api/latest/cards", "status": 500}',
        '{"method": 5, "path": "/api/latest/cards", "status": 500}',
        '{"method": "GET", "path": "api/latest/cards", "status": 500}',
        '{"method": "GET", "path": "/api/latest/cards?offset=100", "status": 500}',
        '{"method": "GET", "path": 7, "status": 500}',
        f"{{{VALID}}}",
        f'{{{VALID}, "status": 200}}',
        f'{{{VALID}, "status": 600}}',
        f'{{{VALID}, "status": "500"}}',
        f'{{{VALID}, "status": true}}',
        f'{{{VALID}, "status": 500.5}}',
        f'{{{VALID}, "status": 500, "times": 0}}',
        f'{{{VALID}, "status": 500, "times": -1}}',
        f'{{{VALID}, "status": 500, "times": 1.5}}',
        f'{{{VALID}, "status": 500, "times": "2"}}',
        f'{{{VALID}, "status": 500, "delay": -1}}',
        f'{{{VALID}, "status": 500, "delay": "1"}}',
        f'{{{VALID}, "status": 500, "delay": true}}',
        f'{{{VALID}, "status": 500, "delay": NaN}}',
        f'{{{VALID}, "status": 500, "delay": 301}}',
        f'{{{VALID}, "delay": 0}}',
        f'{{{VALID}, "status": 500, "query": []}}',
        f'{{{VALID}, "status": 500, "query": "offset=1"}}',
        f'{{{VALID}, "status": 500, "query": {{"offset": ["1"]}}}}',
        f'{{{VALID}, "status": 500, "query": {{"offset": true}}}}',
        f'{{{VALID}, "status": 500, "query": {{"offset": null}}}}',
        f'{{{VALID}, "statuss": 500}}',
    ],
)
async def test_bad_input_is_400_and_registers_nothing(client: TestClient[Any, Any], body: str) -> None:
    resp = await client.post(FAULTS, data=body.encode(), headers={"Content-Type": "application/json"})
    assert resp.status == 400, body
    assert resp.content_type == "application/json"
    payload = await resp.json()
    assert set(payload) == {"message"} and payload["message"]
    assert await faults(client) == []
