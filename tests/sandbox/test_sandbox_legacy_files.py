"""Deprecated upload routes (forbid setting off) and other earlier-file routes."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from yarl import URL

from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, BOUNDARY, ClientFactory, raw_multipart

MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def path_of(url: str) -> str:
    return URL(url).raw_path


async def assert_public(client: TestClient[Any, Any], file_json: dict[str, Any], content: bytes) -> None:
    """An unprotected file: type 1, numeric id, anyone with the link can open it."""
    assert file_json["type"] == 1
    assert isinstance(file_json["id"], int)
    assert "entity_type" not in file_json
    resp = await client.get(path_of(file_json["url"]))  # no Authorization header
    assert resp.status == 200
    assert await resp.read() == content


async def card(client: TestClient[Any, Any], card_id: int = 1) -> dict[str, Any]:
    value: dict[str, Any] = await (await client.get(f"/api/v1/cards/{card_id}", headers=AUTH)).json()
    return value


@pytest.mark.parametrize("prefix", ["/api/v1", "/api/latest"])
async def test_put_upload_creates_unprotected_file(client: TestClient[Any, Any], prefix: str) -> None:
    body, headers = raw_multipart([("file", "hello.txt", "text/plain", b"hello world\n")])
    resp = await client.put(f"{prefix}/cards/2/files", data=body, headers={**headers, **AUTH})
    assert resp.status == 200
    created = await resp.json()
    assert created["name"] == "hello.txt"
    assert created["size"] == 12
    assert created["mime_type"] == "text/plain"
    assert created["card_id"] == 2
    await assert_public(client, created, b"hello world\n")
    assert [f["id"] for f in (await card(client, 2))["files"]] == [created["id"]]


async def test_put_upload_with_aiohttp_formdata_and_unicode_name(client: TestClient[Any, Any]) -> None:
    # quote_fields=False: raw UTF-8 filename, as browsers send it (aiohttp
    # would otherwise percent-encode it and the server keeps names verbatim).
    form = aiohttp.FormData(quote_fields=False)
    form.add_field("file", b"\x00\x01binary", filename="данные ✓.bin", content_type="application/octet-stream")
    resp = await client.put("/api/v1/cards/3/files", data=form, headers=AUTH)
    assert resp.status == 200
    created = await resp.json()
    assert created["name"] == "данные ✓.bin"
    await assert_public(client, created, b"\x00\x01binary")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (raw_multipart([("other", "a.txt", "text/plain", b"x")])[0], MULTIPART),
        (b'{"name": "a"}', "application/json"),
        (b"--nope\r\n", MULTIPART),
    ],
    ids=["no-file-field", "not-multipart", "malformed"],
)
async def test_put_upload_rejects_bad_bodies(client: TestClient[Any, Any], body: bytes, content_type: str) -> None:
    resp = await client.put("/api/v1/cards/2/files", data=body, headers={**AUTH, "Content-Type": content_type})
    assert resp.status == 400
    assert "message" in await resp.json()
    assert (await card(client, 2))["files"] == []


async def test_put_upload_to_unknown_card_is_404(client: TestClient[Any, Any]) -> None:
    body, headers = raw_multipart([("file", "a.txt", None, b"x")])
    resp = await client.put("/api/v1/cards/9999/files", data=body, headers={**headers, **AUTH})
    assert resp.status == 404


async def test_post_comment_with_json_text(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/api/v1/cards/2/comments", json={"text": "Привет ✓"}, headers=AUTH)
    assert resp.status == 200
    comment = await resp.json()
    assert comment["text"] == "Привет ✓"
    assert comment["files"] == []
    assert isinstance(comment["id"], int) and comment["uid"]
    assert [c["uid"] for c in (await card(client, 2))["comments"]] == [comment["uid"]]


async def test_post_comment_with_files_creates_unprotected_files(client: TestClient[Any, Any]) -> None:
    body, headers = raw_multipart([
        ("text", None, None, "see files ✓".encode()),
        ("files[]", "one.txt", "text/plain", b"first"),
        ("files[]", "two.png", "image/png", b"\x89PNG second"),
    ])
    resp = await client.post("/api/v1/cards/2/comments", data=body, headers={**headers, **AUTH})
    assert resp.status == 200
    comment = await resp.json()
    assert comment["text"] == "see files ✓"
    assert [f["name"] for f in comment["files"]] == ["one.txt", "two.png"]
    await assert_public(client, comment["files"][0], b"first")
    await assert_public(client, comment["files"][1], b"\x89PNG second")
    card_files = (await card(client, 2))["files"]
    assert [f["comment_id"] for f in card_files] == [comment["id"], comment["id"]]


async def test_post_comment_needs_text_or_files(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/api/v1/cards/2/comments", json={}, headers=AUTH)
    assert resp.status == 400
    resp = await client.post(
        "/api/v1/cards/2/comments", data=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert (await resp.json())["message"]


async def test_patch_comment_edits_text_and_attaches_files(client: TestClient[Any, Any]) -> None:
    comment = await (await client.post("/api/v1/cards/2/comments", json={"text": "v1"}, headers=AUTH)).json()
    url = f"/api/v1/cards/2/comments/{comment['id']}"
    edited = await (await client.patch(url, json={"text": "v2"}, headers=AUTH)).json()
    assert edited["text"] == "v2" and edited["files"] == []
    body, headers = raw_multipart([("files[]", "added.txt", "text/plain", b"added later")])
    resp = await client.patch(url, data=body, headers={**headers, **AUTH})
    assert resp.status == 200
    with_file = await resp.json()
    assert with_file["text"] == "v2"
    assert [f["name"] for f in with_file["files"]] == ["added.txt"]
    await assert_public(client, with_file["files"][0], b"added later")


async def test_patch_comment_by_uid(client: TestClient[Any, Any]) -> None:
    comment = (await card(client, 1))["comments"][0]
    resp = await client.patch(f"/api/v1/cards/1/comments/{comment['uid']}", json={"text": "edited"}, headers=AUTH)
    assert resp.status == 200
    assert (await card(client, 1))["comments"][0]["text"] == "edited"


async def test_rename_earlier_file_keeps_its_link(client: TestClient[Any, Any]) -> None:
    before = (await card(client, 1))["files"][0]
    resp = await client.patch("/api/v1/cards/1/files/1", json={"name": "renamed.txt"}, headers=AUTH)
    assert resp.status == 200
    renamed = await resp.json()
    assert renamed["id"] == 1 and renamed["name"] == "renamed.txt"
    assert renamed["url"].endswith("/public-files/1/renamed.txt")
    assert (await card(client, 1))["files"][0]["name"] == "renamed.txt"
    old = await client.get(path_of(before["url"]))
    assert old.status == 200
    assert 'filename="renamed.txt"' in old.headers["Content-Disposition"]


@pytest.mark.parametrize("payload", [{}, {"name": ""}, {"name": 5}, {"card_cover": "yes"}])
async def test_rename_validation(client: TestClient[Any, Any], payload: dict[str, object]) -> None:
    resp = await client.patch("/api/v1/cards/1/files/1", json=payload, headers=AUTH)
    assert resp.status == 400


async def test_attach_by_url_creates_earlier_record(client: TestClient[Any, Any]) -> None:
    resp = await client.post(
        "/api/v1/cards/2/files",
        json={"url": "https://example.org/docs/spec%20v2.pdf", "name": "Spec v2.pdf"},
        headers=AUTH,
    )
    assert resp.status == 200
    created = await resp.json()
    assert created["type"] == 1 and isinstance(created["id"], int)
    assert created["url"] == "https://example.org/docs/spec%20v2.pdf"
    assert created["name"] == "Spec v2.pdf"
    assert created["mime_type"] == "application/pdf"
    assert "entity_type" not in created
    assert [f["id"] for f in (await card(client, 2))["files"]] == [created["id"]]


@pytest.mark.parametrize("payload", [{"name": "x"}, {"url": "ftp://x/y"}, {"url": "/relative"}, {"url": 3}])
async def test_attach_by_url_validation(client: TestClient[Any, Any], payload: dict[str, object]) -> None:
    resp = await client.post("/api/v1/cards/2/files", json=payload, headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["message"]


async def test_get_and_delete_earlier_file(client: TestClient[Any, Any]) -> None:
    got = await client.get("/api/v1/cards/1/files/2", headers=AUTH)
    assert (await got.json())["name"] == "diagram.png"
    assert (await client.get("/api/v1/cards/2/files/2", headers=AUTH)).status == 404  # other card
    deleted = await client.delete("/api/v1/cards/1/files/2", headers=AUTH)
    assert deleted.status == 204
    assert (await client.get("/api/v1/cards/1/files/2", headers=AUTH)).status == 404
    assert (await client.get("/public-files/2/diagram.png")).status == 404


async def test_large_upload_keeps_only_size_and_hash(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(max_retained_file_bytes=1000))
    data = bytes(range(256)) * 40  # 10240 bytes
    body, headers = raw_multipart([("file", "big.bin", None, data)])
    resp = await client.put("/api/v1/cards/2/files", data=body, headers={**headers, **AUTH})
    created = await resp.json()
    assert created["size"] == len(data)
    download = await client.get(path_of(created["url"]))
    assert download.status == 410
    journal = await (await client.get("/_sandbox/journal")).json()
    put = next(e for e in journal if e["method"] == "PUT")
    assert put["uploads"] == [
        {"field": "file", "name": "big.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
         "retained": False}
    ]
