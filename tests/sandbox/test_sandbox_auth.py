"""Authentication, permission and not-found answers."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, READONLY, ClientFactory, raw_multipart

PREFIXES = ["/api/v1", "/api/latest"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic sandbox-token"}, {"Authorization": "Bearer "}],
    ids=["missing", "unknown", "wrong-scheme", "empty"],
)
async def test_invalid_token_is_401_with_string_body(client: TestClient[Any, Any], prefix: str,
                                                    headers: dict[str, str]) -> None:
    resp = await client.get(f"{prefix}/boards/1", headers=headers)
    assert resp.status == 401
    assert resp.content_type == "text/plain"
    assert await resp.text() == "Invalid token"


async def test_auth_is_checked_before_routing(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/v1/no-such-thing")
    assert resp.status == 401


async def test_configured_tokens_replace_the_default(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(tokens=frozenset({"custom"})))
    assert (await client.get("/api/v1/boards/1", headers={"Authorization": "Bearer custom"})).status == 200
    assert (await client.get("/api/v1/boards/1", headers=AUTH)).status == 401


async def test_bearer_scheme_is_case_insensitive(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/v1/boards/2", headers={"Authorization": "bearer sandbox-token"})
    assert resp.status == 200


async def test_readonly_token_reads(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/boards/1", headers=READONLY)
    assert resp.status == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/cards/1/comments"),
        ("PATCH", "/api/v1/cards/1/files/1"),
        ("DELETE", "/api/v1/cards/1/files/1"),
        ("PUT", "/api/v1/cards/1/files"),
    ],
)
async def test_readonly_token_cannot_write(client: TestClient[Any, Any], method: str, path: str) -> None:
    resp = await client.request(method, path, headers=READONLY, json={"text": "x", "name": "y"})
    assert resp.status == 403
    assert await resp.read() == b""
    card = await (await client.get("/api/v1/cards/1", headers=AUTH)).json()
    assert [f["name"] for f in card["files"]][:2] == ["readme.txt", "diagram.png"]
    assert len(card["comments"]) == 1


async def test_readonly_upload_creates_nothing(client: TestClient[Any, Any]) -> None:
    body, headers = raw_multipart([("file", "a.txt", "text/plain", b"hello")])
    before = await (await client.get("/api/v1/cards/2", headers=AUTH)).json()
    resp = await client.put("/api/v1/cards/2/files", data=body, headers={**headers, **READONLY})
    assert resp.status == 403
    after = await (await client.get("/api/v1/cards/2", headers=AUTH)).json()
    assert after["files"] == before["files"] == []


@pytest.mark.parametrize("headers", [AUTH, READONLY])
@pytest.mark.parametrize("path", ["/api/latest/boards/3", "/api/v1/spaces/1/boards/3", "/api/latest/cards?board_id=3"])
async def test_private_board_is_403_without_body(client: TestClient[Any, Any], headers: dict[str, str],
                                                path: str) -> None:
    resp = await client.get(path, headers=headers)
    assert resp.status == 403
    assert await resp.read() == b""


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/latest/boards/999"),
        ("GET", "/api/latest/boards/abc"),
        ("GET", "/api/v1/cards/9999"),
        ("GET", "/api/v1/cards/00000000-0000-4000-8000-000000000000"),
        ("GET", "/api/v1/cards/1/files/999"),
        ("GET", "/api/v1/cards/1/files/00000000-0000-4000-8000-000000000000"),
        ("PATCH", "/api/v1/cards/1/comments/999"),
        ("GET", "/api/v1/nothing/here"),
        ("DELETE", "/api/latest/boards/1"),
        ("GET", "/completely/unknown"),
        ("GET", "/public-files/999/x.txt"),
    ],
)
async def test_not_found_is_404_without_body(client: TestClient[Any, Any], method: str, path: str) -> None:
    resp = await client.request(method, path, headers=AUTH, json={"text": "x"})
    assert resp.status == 404
    assert await resp.read() == b""
