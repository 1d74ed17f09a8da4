"""The upload upgrade's options no other test sets, each set and its effect seen through real sockets: the service's
routes and form field names, the card id cache's size and lifetime, the time limits of the lookup and of the
bridge's other requests, the bound on an answer read, and how much of a failed comment's body is read on to list
its file parts."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp
from aiohttp import web

from tests.adversarial_upstream import AdversarialUpstream, adversarial  # noqa: F401 - fixture
from tests.gateway_testlib import (
    GatewayFactory,
    Received,
    RecordingUpstream,
    RunningGateway,
    guarded_routes,
    make_config,
    multipart_body,
)

B = "options-boundary"
MP = f"multipart/form-data; boundary={B}"
TOKEN = "Bearer a-token"


def _config(url: str, **upgrade: Any) -> dict[str, Any]:
    data = make_config(url, routes=guarded_routes(upgrade=upgrade))
    data["tenants"] = [{"name": "acme", "hosts": ["127.0.0.1"], "upstream": url, "created": "2026-06-01",
                        "bridges": {"upload_upgrade": True}}]
    return data


def _file(content: bytes, name: str = "file", filename: str = "a.txt") -> tuple[list[str], bytes]:
    return [f'Content-Disposition: form-data; name="{name}"; filename="{filename}"'], content


def _text(text: str, name: str = "text") -> tuple[list[str], bytes]:
    return [f'Content-Disposition: form-data; name="{name}"'], text.encode()


async def _send(gw: RunningGateway, method: str, path: str, body: bytes) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as client, client.request(
            method, gw.url + path, data=body, headers={"Content-Type": MP, "Authorization": TOKEN}) as resp:
        raw = await resp.read()
        try:
            return resp.status, resp.headers, json.loads(raw)
        except ValueError:
            return resp.status, resp.headers, raw


def _requests(upstream: AdversarialUpstream | RecordingUpstream) -> list[tuple[str, str]]:
    return [(r.method, r.raw_path) for r in upstream.received]


async def test_the_services_routes_are_the_configured_ones(adversarial: AdversarialUpstream,  # noqa: F811
                                                           start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(_config(adversarial.url, card_lookup="/api/latest/cards/{card_id}",
                                     card_upload="/api/latest/cards/{card_uid}/files",
                                     comment_upload="/api/latest/cards/{card_uid}/comments/{comment_uid}/files"))
    status, _, _ = await _send(gw, "PUT", "/api/v1/cards/42/files", multipart_body([_file(b"x" * 100)], B))
    assert status == 200
    assert _requests(adversarial) == [("GET", "/api/latest/cards/42"), ("POST", "/api/latest/cards/uid-127-42/files")]
    adversarial.received.clear()
    body = multipart_body([_text("hello"), _file(b"y" * 100, name="files[]")], B)
    status, _, answer = await _send(gw, "POST", "/api/v1/cards/7/comments", body)
    assert status == 200
    comment = answer["uid"]
    assert _requests(adversarial)[-1] == ("POST", f"/api/latest/cards/uid-127-7/comments/{comment}/files")


async def test_the_legacy_and_the_restricted_field_names_are_the_configured_ones(
        adversarial: AdversarialUpstream, start_gateway: GatewayFactory) -> None:  # noqa: F811
    gw = await start_gateway(_config(adversarial.url, legacy_field="attachment"))
    status, _, _ = await _send(gw, "PUT", "/api/v1/cards/42/files",
                               multipart_body([_file(b"x" * 100, name="attachment")], B))
    assert status == 200 and len(adversarial.files("127.0.0.1", 42)) == 1
    status, _, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", multipart_body([_file(b"x" * 100)], B))
    assert status == 400 and "'attachment'" in answer["message"]  # "file" is not the legacy route's field now
    # The restricted upload's field: the service (which wants "file") is sent "upload", and refuses it.
    gw = await start_gateway(_config(adversarial.url, upload_field="upload"))
    adversarial.received.clear()
    status, _, _ = await _send(gw, "PUT", "/api/v1/cards/43/files", multipart_body([_file(b"x" * 100)], B))
    upload = next(r for r in adversarial.received if r.method == "POST")
    assert b'name="upload"' in upload.body and b'name="file"' not in upload.body
    assert status != 200 and adversarial.files("127.0.0.1", 43) == []


async def test_the_comments_text_field_is_the_configured_one(adversarial: AdversarialUpstream,  # noqa: F811
                                                             start_gateway: GatewayFactory) -> None:
    """A comment of files alone is created with an empty text field of that name (the service needs one)."""
    gw = await start_gateway(_config(adversarial.url, text_field="note"))
    status, _, _ = await _send(gw, "POST", "/api/v1/cards/7/comments",
                               multipart_body([_file(b"y" * 100, name="files[]")], B))
    assert status == 200
    created = next(r for r in adversarial.received if r.raw_path == "/api/v1/cards/7/comments")
    assert b'name="note"' in created.body and b'name="text"' not in created.body


async def test_the_id_cache_size_and_lifetime(adversarial: AdversarialUpstream,  # noqa: F811
                                              start_gateway: GatewayFactory) -> None:
    """Each upload needs the card's uid: looked up once while the cache keeps it (id_cache_ttl), every time
    without a cache (id_cache_size 0)."""
    body = multipart_body([_file(b"x" * 100)], B)

    async def lookups(gw: RunningGateway, card: int, pause: float = 0.0) -> int:
        adversarial.received.clear()
        for _ in range(2):
            status, _, _ = await _send(gw, "PUT", f"/api/v1/cards/{card}/files", body)
            assert status == 200
            await asyncio.sleep(pause)
        return sum(1 for method, path in _requests(adversarial) if method == "GET" and path.endswith(f"/{card}"))

    assert await lookups(await start_gateway(_config(adversarial.url)), 1) == 1
    assert await lookups(await start_gateway(_config(adversarial.url, id_cache_size=0)), 2) == 2
    short = await start_gateway(_config(adversarial.url, id_cache_ttl=0.2))
    assert await lookups(short, 3, pause=0.4) == 2


def _slow(route: re.Pattern[str], seconds: float, answer: dict[str, Any]) -> Any:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        if route.fullmatch(received.raw_path):
            await asyncio.sleep(seconds)
        return web.json_response(answer if received.method == "GET" else
                                 {"id": "f1", "name": "a.txt", "size": 100, "url": "https://files.test/f1"})

    return responder


async def test_lookup_timeout_and_request_timeout_bound_the_bridges_requests(upstream: RecordingUpstream,
                                                                             start_gateway: GatewayFactory) -> None:
    card = {"id": 42, "uid": "card-uid-42", "files": [], "comments": []}
    body = multipart_body([_file(b"x" * 100)], B)
    upstream.responder = _slow(re.compile(r"/api/v1/cards/42"), 2.0, card)
    gw = await start_gateway(_config(upstream.url, lookup_timeout=0.3))
    started = time.monotonic()
    status, headers, _ = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
    assert status == 504 and time.monotonic() - started < 1.5
    assert "lookup" in headers["X-Gateway-Upload-Upgrade"]
    # The comment's own request (the bridge's, not the client's upload): request_timeout.
    upstream.responder = _slow(re.compile(r"/api/v1/cards/42/comments"), 2.0, card)
    gw = await start_gateway(_config(upstream.url, request_timeout=0.3))
    started = time.monotonic()
    status, headers, _ = await _send(gw, "POST", "/api/v1/cards/42/comments",
                                     multipart_body([_text("slow"), _file(b"y" * 100, name="files[]")], B))
    assert status in (502, 504) and time.monotonic() - started < 1.5, status
    assert "reason=comment" in headers["X-Gateway-Upload-Upgrade"], headers["X-Gateway-Upload-Upgrade"]


async def test_max_answer_bytes_bounds_an_answer_of_the_service(upstream: RecordingUpstream,
                                                                start_gateway: GatewayFactory) -> None:
    card = {"id": 42, "uid": "card-uid-42", "files": [], "comments": [], "pad": "p" * 100_000}
    upstream.responder = _slow(re.compile(r"never"), 0, card)
    body = multipart_body([_file(b"x" * 100)], B)
    status, _, _ = await _send(await start_gateway(_config(upstream.url)), "PUT", "/api/v1/cards/42/files", body)
    assert status == 200
    gw = await start_gateway(_config(upstream.url, max_answer_bytes=65536))
    status, headers, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
    assert status == 502 and "65536" in answer["message"], answer
    assert [r.method for r in upstream.received].count("POST") == 1  # no upload after the lookup's answer


async def test_rest_bytes_bounds_what_is_read_on_to_list_a_failed_comments_files(
        adversarial: AdversarialUpstream, start_gateway: GatewayFactory) -> None:  # noqa: F811
    # Files large enough that the rest of the body is still to be read when the third one is refused.
    parts = [_text("many")] + [_file(b"f" * 300_000, name="files[]", filename=f"{i}.txt") for i in range(10)]
    body = multipart_body(parts, B)
    gw = await start_gateway(_config(adversarial.url, max_files=2))
    status, _, answer = await _send(gw, "POST", "/api/v1/cards/7/comments", body)
    assert status == 400 and answer["reason"] == "too_many_files"
    assert answer["files_not_listed"] == 7  # the whole body read on: every file part counted
    gw = await start_gateway(_config(adversarial.url, max_files=2, rest_bytes=0))
    status, _, answer = await _send(gw, "POST", "/api/v1/cards/8/comments", body)
    assert status == 400 and answer["reason"] == "too_many_files"
    assert [f["status"] for f in answer["files"]] == ["uploaded", "uploaded", "not_sent"]
    # Only the file parts already read are counted (what the reads before brought with them): not the 7.
    assert answer["files_not_listed"] < 3, answer
