"""The request journal and the request log."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from yarl import URL

from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, TOKEN, ClientFactory, raw_multipart


async def journal(client: TestClient[Any, Any]) -> list[dict[str, Any]]:
    resp = await client.get("/_sandbox/journal")
    assert resp.status == 200
    value: list[dict[str, Any]] = await resp.json()
    return value


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_journal_records_request_with_redacted_authorization(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/cards?board_id=1&limit=2&title=%D0%A2", headers={**AUTH, "X-Trace": "t1"})
    assert resp.status == 200
    entries = await journal(client)
    assert len(entries) == 1
    entry = entries[0]
    assert entry["method"] == "GET"
    assert entry["path"] == "/api/latest/cards"
    assert entry["query_string"] == "board_id=1&limit=2&title=%D0%A2"
    assert entry["status"] == 200
    assert entry["body_length"] == 0 and entry["body_sha256"] == sha(b"")
    headers = {name.lower(): value for name, value in entry["headers"]}
    assert headers["authorization"] == "<redacted>"
    assert headers["x-trace"] == "t1"
    assert TOKEN not in json.dumps(entries)


async def test_journal_hashes_json_body_as_received(client: TestClient[Any, Any]) -> None:
    body = '{"text": "тело ✓"}'.encode()
    await client.post("/api/v1/cards/2/comments", data=body, headers={**AUTH, "Content-Type": "application/json"})
    entry = (await journal(client))[-1]
    assert entry["body_length"] == len(body)
    assert entry["body_sha256"] == sha(body)
    assert entry["body_truncated"] is False


async def test_journal_hashes_streamed_multipart_exactly(client: TestClient[Any, Any]) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    body, headers = raw_multipart([("file", "random.bin", "application/octet-stream", data)])

    async def chunks() -> AsyncIterator[bytes]:  # chunked transfer, no Content-Length
        for start in range(0, len(body), 100_003):
            yield body[start : start + 100_003]

    card = await (await client.get("/api/v1/cards/1", headers=AUTH)).json()
    resp = await client.post(f"/api/v1/cards/{card['uid']}/files", data=chunks(), headers={**headers, **AUTH})
    assert resp.status == 200
    meta = await resp.json()
    entry = (await journal(client))[-1]
    assert entry["body_length"] == len(body)
    assert entry["body_sha256"] == sha(body)
    assert entry["uploads"][0]["sha256"] == sha(data)
    assert entry["uploads"][0]["size"] == len(data)
    download = await client.get(URL(meta["url"]).raw_path_qs)
    assert sha(await download.read()) == sha(data)


async def test_journal_hashes_bodies_of_rejected_requests(client: TestClient[Any, Any]) -> None:
    body = b"x" * 5000
    resp = await client.put("/api/v1/cards/1/files", data=body, headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    entry = (await journal(client))[-1]
    assert entry["status"] == 401
    assert entry["body_length"] == 5000 and entry["body_sha256"] == sha(body)


async def test_journal_caps_unread_bodies(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(journal_body_cap=1024))
    body = bytes(range(256)) * 20
    resp = await client.post("/api/v1/unknown", data=body, headers=AUTH)
    assert resp.status == 404
    entry = (await journal(client))[-1]
    assert entry["body_truncated"] is True
    assert entry["body_length"] == 1024
    assert entry["body_sha256"] == sha(body[:1024])


async def test_journal_is_bounded_and_clearable(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(journal_size=3))
    for n in range(5):
        await client.get(f"/api/v1/cards/{n + 1}", headers=AUTH)
    entries = await journal(client)
    assert [e["path"] for e in entries] == ["/api/v1/cards/3", "/api/v1/cards/4", "/api/v1/cards/5"]
    assert [e["seq"] for e in entries] == [3, 4, 5]
    assert (await client.delete("/_sandbox/journal")).status == 204
    assert await journal(client) == []


async def test_journal_does_not_record_itself(client: TestClient[Any, Any]) -> None:
    await journal(client)
    await client.delete("/_sandbox/journal")
    assert await journal(client) == []


async def test_log_lines_omit_query_strings_and_tokens(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sandbox")
    card = await (await client.get("/api/v1/cards/1", headers=AUTH)).json()
    file_id = next(f["id"] for f in card["files"] if f.get("entity_type") == "card")
    meta = await (await client.get(f"/api/v1/cards/1/files/{file_id}", headers=AUTH)).json()
    signed = URL(meta["url"])
    assert (await client.get(signed.raw_path_qs)).status == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "sandbox"]
    assert any(line.startswith(f"GET /signed-files/{file_id} 200") for line in lines)
    text = "\n".join(lines)
    assert signed.query["signature"] not in text
    assert "expires=" not in text
    assert TOKEN not in text
