"""Restricted access file routes for cards, comments and custom properties."""

from __future__ import annotations

import re

import pytest
from yarl import URL

from .sandbox_testlib import AUTH, raw_multipart

KINDS = ["card", "comment", "custom_property"]
METADATA_FIELDS = ["id", "name", "size", "mime_type", "entity_type", "created", "updated", "card_uid",
                   "author_uid", "card_cover", "url"]
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


async def card_one(client) -> dict:
    return await (await client.get("/api/v1/cards/1", headers=AUTH)).json()


async def base_path(client, kind: str, prefix: str = "/api/v1") -> str:
    card = await card_one(client)
    base = f"{prefix}/cards/{card['uid']}"
    if kind == "comment":
        return f"{base}/comments/{card['comments'][0]['uid']}/files"
    if kind == "custom_property":
        return f"{base}/custom-properties/{card['custom_properties'][0]['uid']}/files"
    return f"{base}/files"


async def upload(client, base: str, name: str = "doc.pdf", data: bytes = b"%PDF-1.4 test",
                 content_type: str | None = "application/pdf") -> dict:
    body, headers = raw_multipart([("file", name, content_type, data)])
    resp = await client.post(base, data=body, headers={**headers, **AUTH})
    assert resp.status == 200, await resp.text()
    return await resp.json()


def local(url: str) -> str:
    """Path and query of a signed link, to fetch it through the test client."""
    return str(URL(url).relative())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prefix", ["/api/v1", "/api/latest"])
async def test_upload_returns_spec_metadata_and_signed_link(client, kind, prefix):
    base = await base_path(client, kind, prefix)
    meta = await upload(client, base, data=b"%PDF-1.4 " + kind.encode())
    assert list(meta) == METADATA_FIELDS
    assert UUID_RE.fullmatch(meta["id"])
    assert meta["name"] == "doc.pdf"
    assert meta["size"] == str(len(b"%PDF-1.4 " + kind.encode()))
    assert meta["mime_type"] == "application/pdf"
    assert meta["entity_type"] == kind
    assert TIME_RE.fullmatch(meta["created"]) and TIME_RE.fullmatch(meta["updated"])
    card = await card_one(client)
    assert meta["card_uid"] == card["uid"]
    assert UUID_RE.fullmatch(meta["author_uid"])
    assert meta["card_cover"] is False
    assert URL(meta["url"]).path == f"/signed-files/{meta['id']}"
    download = await client.get(local(meta["url"]))  # no token needed
    assert download.status == 200
    assert await download.read() == b"%PDF-1.4 " + kind.encode()
    listed = next(f for f in card["files"] if f["id"] == meta["id"])
    assert listed["type"] == 11 and listed["entity_type"] == kind


@pytest.mark.parametrize("kind", KINDS)
async def test_get_metadata(client, kind):
    base = await base_path(client, kind)
    meta = await upload(client, base, name="photo.jpg", data=b"\xff\xd8jpeg", content_type="image/jpeg")
    resp = await client.get(f"{base}/{meta['id']}", headers=AUTH)
    assert resp.status == 200
    got = await resp.json()
    assert {k: v for k, v in got.items() if k != "url"} == {k: v for k, v in meta.items() if k != "url"}
    assert resp.headers["Cache-Control"] == "no-store"
    assert await (await client.get(local(got["url"]))).read() == b"\xff\xd8jpeg"


@pytest.mark.parametrize("kind", KINDS)
async def test_update_name_and_cover(client, kind):
    base = await base_path(client, kind)
    meta = await upload(client, base)
    resp = await client.patch(f"{base}/{meta['id']}", json={"name": "renamed.pdf", "card_cover": True}, headers=AUTH)
    assert resp.status == 200
    updated = await resp.json()
    assert updated["name"] == "renamed.pdf" and updated["card_cover"] is True
    again = await (await client.get(f"{base}/{meta['id']}", headers=AUTH)).json()
    assert again["name"] == "renamed.pdf" and again["card_cover"] is True
    download = await client.get(local(again["url"]))
    assert "renamed.pdf" in download.headers["Content-Disposition"]


async def test_one_cover_per_card(client):
    base = await base_path(client, "card")
    first = await upload(client, base, name="a.png", content_type="image/png")
    second = await upload(client, base, name="b.png", content_type="image/png")
    await client.patch(f"{base}/{first['id']}", json={"card_cover": True}, headers=AUTH)
    await client.patch(f"{base}/{second['id']}", json={"card_cover": True}, headers=AUTH)
    covers = [f["id"] for f in (await card_one(client))["files"] if f["card_cover"]]
    assert covers == [second["id"]]


@pytest.mark.parametrize("payload", [{}, {"name": ""}, {"name": ["x"]}, {"card_cover": 1}])
async def test_update_validation(client, payload):
    base = await base_path(client, "card")
    meta = await upload(client, base)
    resp = await client.patch(f"{base}/{meta['id']}", json=payload, headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["message"]


@pytest.mark.parametrize("kind", KINDS)
async def test_delete(client, kind):
    base = await base_path(client, kind)
    meta = await upload(client, base)
    resp = await client.delete(f"{base}/{meta['id']}", headers=AUTH)
    assert resp.status == 204
    assert await resp.read() == b""
    assert (await client.get(f"{base}/{meta['id']}", headers=AUTH)).status == 404
    assert (await client.get(local(meta["url"]))).status == 404
    assert meta["id"] not in [f["id"] for f in (await card_one(client))["files"]]
    assert (await client.delete(f"{base}/{meta['id']}", headers=AUTH)).status == 404


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "parts",
    [
        [("file", "a.txt", "text/plain", b"a"), ("file", "b.txt", "text/plain", b"b")],
        [("attachment", "a.txt", "text/plain", b"a")],
        [("text", None, None, b"hi"), ("file", "a.txt", "text/plain", b"a")],
        [],
    ],
    ids=["two-files", "wrong-name", "extra-field-first", "no-parts"],
)
async def test_upload_needs_exactly_one_file_part(client, kind, parts):
    base = await base_path(client, kind)
    before = len((await card_one(client))["files"])
    body, headers = raw_multipart(parts)
    resp = await client.post(base, data=body, headers={**headers, **AUTH})
    assert resp.status == 400
    assert (await resp.json())["message"]
    assert len((await card_one(client))["files"]) == before


@pytest.mark.parametrize("kind", ["comment", "custom_property"])
async def test_non_multipart_upload_is_400(client, kind):
    base = await base_path(client, kind)
    resp = await client.post(base, json={"url": "https://example.org/a.pdf"}, headers=AUTH)
    assert resp.status == 400


async def test_unknown_parents_are_404(client):
    card = await card_one(client)
    body, headers = raw_multipart([("file", "a.txt", "text/plain", b"a")])
    zero = "00000000-0000-4000-8000-000000000000"
    for base in [
        f"/api/v1/cards/{zero}/files",
        f"/api/v1/cards/{card['uid']}/comments/{zero}/files",
        f"/api/v1/cards/{card['uid']}/custom-properties/{zero}/files",
    ]:
        resp = await client.post(base, data=body, headers={**headers, **AUTH})
        assert resp.status == 404, base
        assert await resp.read() == b""


async def test_file_is_only_reachable_under_its_own_parent(client):
    card = await card_one(client)
    card_file = next(f for f in card["files"] if f.get("entity_type") == "card")
    comment_base = await base_path(client, "comment")
    assert (await client.get(f"{comment_base}/{card_file['id']}", headers=AUTH)).status == 404
    other_card = await (await client.get("/api/v1/cards/2", headers=AUTH)).json()
    resp = await client.get(f"/api/v1/cards/{other_card['uid']}/files/{card_file['id']}", headers=AUTH)
    assert resp.status == 404


@pytest.mark.parametrize(
    ("name", "content_type", "query", "expected"),
    [
        ("doc.pdf", "application/pdf", "redirect=true", "inline"),
        ("doc.pdf", "application/pdf", "redirect=true&download=true", "attachment"),
        ("clip.mp4", "video/mp4", "redirect=1", "inline"),
        ("data.csv", "text/csv", "redirect=true", "attachment"),
    ],
)
async def test_redirect_to_signed_link(client, name, content_type, query, expected):
    base = await base_path(client, "card")
    meta = await upload(client, base, name=name, data=b"payload", content_type=content_type)
    resp = await client.get(f"{base}/{meta['id']}?{query}", headers=AUTH, allow_redirects=False)
    assert resp.status == 302
    location = resp.headers["Location"]
    assert URL(location).path == f"/signed-files/{meta['id']}"
    assert URL(location).query["disposition"] == expected
    followed = await client.get(local(location))
    assert followed.status == 200
    assert await followed.read() == b"payload"
    assert followed.headers["Content-Disposition"].startswith(expected + ";")
    assert followed.headers["Content-Type"].startswith(content_type)


async def test_download_without_redirect_sets_attachment_link(client):
    base = await base_path(client, "card")
    meta = await upload(client, base, name="pic.png", content_type="image/png")
    inline = await (await client.get(f"{base}/{meta['id']}", headers=AUTH)).json()
    attachment = await (await client.get(f"{base}/{meta['id']}?download=true", headers=AUTH)).json()
    assert URL(inline["url"]).query["disposition"] == "inline"
    assert URL(attachment["url"]).query["disposition"] == "attachment"


async def test_client_following_redirect_gets_file(client):
    base = await base_path(client, "card")
    meta = await upload(client, base, name="notes.txt", data=b"followed", content_type="text/plain")
    resp = await client.get(f"{base}/{meta['id']}?redirect=true", headers=AUTH)
    assert resp.status == 200
    assert await resp.read() == b"followed"


async def test_bad_boolean_query_is_400(client):
    base = await base_path(client, "card")
    meta = await upload(client, base)
    resp = await client.get(f"{base}/{meta['id']}?redirect=maybe", headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["message"]


async def test_restricted_routes_accept_numeric_card_id(client):
    meta = await upload(client, "/api/v1/cards/4f2e42af-43d7-4092-a74f-f556bf0f95d0/files")
    resp = await client.get(f"/api/v1/cards/1/files/{meta['id']}", headers=AUTH)
    assert resp.status == 200
    assert (await resp.json())["entity_type"] == "card"


async def test_a_multipart_post_naming_the_card_by_its_number_makes_an_earlier_file(client):
    """As the service answers the clients that upload so (an MCP server): an ordinary attachment with a public link,
    not a restricted file."""
    meta = await upload(client, "/api/v1/cards/1/files")
    assert meta["type"] == 1 and isinstance(meta["id"], int) and "/public-files/" in meta["url"]
    assert "entity_type" not in meta
