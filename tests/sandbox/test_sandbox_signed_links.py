"""Serving files through signed links and public links."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient
from yarl import URL

from sandbox.settings import SandboxSettings
from sandbox.signing import link_signature, signed_path

from .sandbox_testlib import AUTH, SECRET, ClientFactory


async def seeded(client: TestClient[Any, Any], entity_type: str, name: str) -> dict[str, Any]:
    card = await (await client.get("/api/v1/cards/1", headers=AUTH)).json()
    return next(f for f in card["files"] if f.get("entity_type") == entity_type and f["name"] == name)


async def metadata(client: TestClient[Any, Any], file_id: str, query: str = "") -> dict[str, Any]:
    card_uid = (await (await client.get("/api/v1/cards/1", headers=AUTH)).json())["uid"]
    resp = await client.get(f"/api/v1/cards/{card_uid}/files/{file_id}{query}", headers=AUTH)
    assert resp.status == 200
    value: dict[str, Any] = await resp.json()
    return value


@pytest.mark.parametrize(
    ("name", "query", "disposition"),
    [
        ("plan.pdf", "", "inline"),
        ("plan.pdf", "?download=true", "attachment"),
        ("Отчёт ✓ 日本.txt", "", "attachment"),
    ],
)
async def test_signed_link_serves_content_with_disposition(
    client: TestClient[Any, Any], name: str, query: str, disposition: str
) -> None:
    record = await seeded(client, "card", name)
    meta = await metadata(client, record["id"], query)
    resp = await client.get(URL(meta["url"]).raw_path_qs)
    assert resp.status == 200
    body = await resp.read()
    assert len(body) == int(record["size"])
    header = resp.headers["Content-Disposition"]
    assert header.startswith(disposition + ";")
    assert f"filename*=UTF-8''{quote(name, safe='')}" in header
    assert header.isascii()
    assert resp.headers["Content-Type"].startswith(record["mime_type"])
    assert resp.headers["Cache-Control"] == "private, no-store"


async def test_signed_link_lifetime_follows_settings(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(signing_secret=SECRET, signed_link_ttl=60))
    record = await seeded(client, "card", "plan.pdf")
    expires = int(URL((await metadata(client, record["id"]))["url"]).query["expires"])
    assert time.time() + 55 < expires <= time.time() + 61


def link(file_id: str, *, expires: int, disposition: str = "inline", secret: bytes = SECRET) -> str:
    return signed_path(secret, file_id, expires=expires, disposition=disposition)  # type: ignore[arg-type]


async def test_crafted_valid_link_is_served(client: TestClient[Any, Any]) -> None:
    record = await seeded(client, "card", "plan.pdf")
    resp = await client.get(link(record["id"], expires=int(time.time()) + 30))
    assert resp.status == 200


async def test_expired_link_is_403(client: TestClient[Any, Any]) -> None:
    record = await seeded(client, "card", "plan.pdf")
    resp = await client.get(link(record["id"], expires=int(time.time()) - 1))
    assert resp.status == 403
    assert len(await resp.read()) < 100


async def test_link_signed_with_another_secret_is_403(client: TestClient[Any, Any]) -> None:
    record = await seeded(client, "card", "plan.pdf")
    resp = await client.get(link(record["id"], expires=int(time.time()) + 30, secret=b"other"))
    assert resp.status == 403


@pytest.mark.parametrize("tamper", ["signature", "disposition", "expires", "drop-signature", "file"])
async def test_tampered_link_is_403(client: TestClient[Any, Any], tamper: str) -> None:
    record = await seeded(client, "card", "plan.pdf")
    other = await seeded(client, "card", "Отчёт ✓ 日本.txt")
    expires = int(time.time()) + 30
    good = URL(link(record["id"], expires=expires, disposition="inline"))
    query = dict(good.query)
    path = good.path
    if tamper == "signature":
        signature = link_signature(SECRET, record["id"], expires, "inline")
        query["signature"] = signature[:-1] + ("1" if signature.endswith("0") else "0")
    elif tamper == "disposition":
        query["disposition"] = "attachment"
    elif tamper == "expires":
        query["expires"] = str(expires + 3600)
    elif tamper == "drop-signature":
        del query["signature"]
    else:
        path = f"/signed-files/{other['id']}"
    resp = await client.get(URL(path).with_query(query).raw_path_qs)
    assert resp.status == 403
    assert await resp.read() == b""


async def test_public_link_of_earlier_image_is_inline_without_token(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/public-files/2/diagram.png")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "image/png"
    assert resp.headers["Content-Disposition"].startswith("inline;")
    assert (await resp.read()).startswith(b"\x89PNG")


async def test_public_link_of_text_is_attachment(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/public-files/1/readme.txt")
    assert resp.headers["Content-Disposition"].startswith("attachment;")
    assert await resp.read() == b"Seeded earlier file: anyone with the link can open it.\n"


async def test_restricted_files_have_no_public_link(client: TestClient[Any, Any]) -> None:
    record = await seeded(client, "card", "plan.pdf")
    assert (await client.get(f"/public-files/{record['id']}/plan.pdf")).status == 404
