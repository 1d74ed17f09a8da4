"""The upload upgrade bridge of the legacy upload guard through real sockets, in front of the sandbox service.

The company (acme, created after 2026-05-21) forbids legacy uploads; its bridge performs them on the restricted access
routes instead. The file bytes the sandbox stored are read back through its signed links and compared by SHA-256."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from gateway.core.http import token_fingerprint
from sandbox.settings import READONLY_TOKEN
from tests.gateway_testlib import AdminFactory, GatewayFactory, LineCollector, multipart_body
from tests.integration.upload_upgrade_testlib import (  # noqa: F401 - fixtures
    add_fault,
    AUTH,
    B,
    chunked,
    download,
    file_part,
    guard_decisions,
    journal,
    KiB,
    MiB,
    MP,
    public_card,
    restricted,
    sandbox,
    send,
    sha,
    spool,
    start,
    store_of,
    text_part,
    TOKEN,
    upgrades,
    UUID,
)


# --- the card route -----------------------------------------------------------------------------------------------


async def test_a_legacy_put_is_uploaded_to_the_restricted_route(sandbox: Any, spool: Path,
                                                                start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    content = os.urandom(3 * MiB + 12345)
    legacy_before = len(store_of(sandbox).legacy_files)
    assert upgrades(gw, "upgraded") == 0 and upgrades(gw, "aborted", "oldco") == 0
    body = multipart_body([file_part(content, "report.pdf", name="file", media="application/pdf")], B)
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", chunked(body))
    assert status == 200, answer
    # The legacy shape, with what differs: the id is a UUID, url a temporary signed link.
    assert UUID.fullmatch(answer["id"]) and answer["uid"] == answer["id"]
    assert answer["type"] == 11 and answer["size"] == len(content) and answer["card_id"] == card.id
    assert answer["comment_id"] is None and answer["entity_type"] == "card" and answer["card_uid"] == card.uid
    assert answer["name"] == "report.pdf" and answer["mime_type"] == "application/pdf"
    assert f"/signed-files/{answer['id']}?" in answer["url"]
    assert sha(await download(answer["url"])) == sha(content)
    assert headers["Deprecation"] == "@1779321600"
    assert headers["Link"] == f'</api/v1/cards/{card.uid}/files>; rel="successor-version"'
    assert headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1"
    assert headers["Cache-Control"] == "no-store"
    stored = store_of(sandbox).restricted_files[answer["id"]]
    assert stored.content.sha256 == sha(content) and stored.card_id == card.id
    assert len(store_of(sandbox).legacy_files) == legacy_before  # nothing through the deprecated route
    entries = await journal(sandbox)
    assert [(e["method"], e["path"]) for e in entries] == [
        ("GET", f"/api/v1/cards/{card.id}"), ("POST", f"/api/v1/cards/{card.uid}/files")]
    assert entries[1]["uploads"][0]["sha256"] == sha(content) and entries[1]["uploads"][0]["field"] == "file"
    assert upgrades(gw, "upgraded") == 1
    assert guard_decisions(gw, "legacy_card_file_upload", "bridged") == 1
    assert guard_decisions(gw, "legacy_card_file_upload", "blocked") == 0

    # The id mapping is cached: the next upload to the card goes straight to the restricted route.
    status, _, second = await send("PUT", f"{gw.url}/api/latest/cards/{card.id}/files",
                                   multipart_body([file_part(b"small", "b.txt", name="file", media="text/csv")], B))
    assert status == 200 and second["id"] != answer["id"]
    assert sha(await download(second["url"])) == sha(b"small")
    assert [(e["method"], e["path"]) for e in (await journal(sandbox))[2:]] == [
        ("POST", f"/api/v1/cards/{card.uid}/files")]
    # The stored file, read through the restricted route's metadata and its redirect to a fresh signed link.
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{sandbox.port}/api/v1/cards/{card.uid}/files/{answer['id']}"
                              "?redirect=true&download=true", headers=AUTH) as resp:
            assert resp.status == 200 and sha(await resp.read()) == sha(content)


async def test_without_the_bridge_the_put_is_blocked_as_before(sandbox: Any, spool: Path,
                                                               start_gateway: GatewayFactory) -> None:
    # The company's bridge is off; an exemption turns it on for one client (by its token's fingerprint).
    exemption = {"name": "old-uploader", "behaviour": "legacy_uploads", "phase": "forbidden", "until": "2099-01-01",
                 "token_fingerprint": token_fingerprint(TOKEN), "bridge": True}
    gw = await start(start_gateway, sandbox, spool, tenant_bridge=False, exemptions=[exemption])
    card = public_card(sandbox)
    body = multipart_body([file_part(b"bytes", name="file")], B)
    other = "Bearer someone-else"
    status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body, auth=other)
    assert status == 403 and answer["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
    assert await journal(sandbox) == []
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
    assert status == 200 and headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1"
    assert upgrades(gw, "upgraded") == 1


# --- a restricted route's path with an earlier id (config/gateway.yaml's legacy_id_* routes) ------------------------


async def test_a_post_with_the_cards_number_is_uploaded_to_its_restricted_route(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory
) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    content = os.urandom(200 * KiB)
    body = multipart_body([file_part(content, "scan.png", name="file", media="image/png")], B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/files", chunked(body, size=7000))
    assert status == 200 and headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1", answer
    assert answer["type"] == 11 and answer["card_uid"] == card.uid and answer["card_id"] == card.id
    assert await download(answer["url"]) == content
    assert [(e["method"], e["path"]) for e in await journal(sandbox)] == [
        ("GET", f"/api/v1/cards/{card.id}"), ("POST", f"/api/v1/cards/{card.uid}/files")]
    assert guard_decisions(gw, "legacy_id_card_file_upload", "bridged") == 1 and upgrades(gw, "upgraded") == 1


async def test_a_comment_upload_with_numbers_goes_to_the_comments_restricted_route(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory
) -> None:
    gw = await start(start_gateway, sandbox, spool)
    store = store_of(sandbox)
    card = store.cards[1]
    (comment,) = store.card_comments(card)[:1]
    body = multipart_body([file_part(b"minutes", "minutes.txt", name="file", media="text/plain")], B)
    for path in (f"/api/v1/cards/{card.id}/comments/{comment.id}/files",
                 f"/api/v1/cards/{card.id}/comments/{comment.uid}/files"):
        status, headers, answer = await send("POST", gw.url + path, body)
        assert status == 200 and headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1", answer
        assert answer["entity_type"] == "comment" and answer["type"] == 11 and answer["card_id"] == card.id
        assert headers["Link"] == f"</api/v1/cards/{card.uid}/comments/{comment.uid}/files>; rel=\"successor-version\""
    uploads = [e["path"] for e in await journal(sandbox) if e["method"] == "POST"]
    assert uploads == [f"/api/v1/cards/{card.uid}/comments/{comment.uid}/files"] * 2
    # The card by its uid and the comment by its number: the comment's uid cannot be looked up (the card lookup
    # takes the card's number).
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.uid}/comments/{comment.id}/files", body)
    assert (status, answer["code"], answer["rule"]) == (400, "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", "card_id")


async def test_what_the_bridge_does_not_take_on_a_restricted_path(sandbox: Any, spool: Path,
                                                                 start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    before = restricted(sandbox)
    upload = multipart_body([file_part(b"x", name="file")], B)
    # A custom property's file: no flow (nothing the service answers turns a property's number into its uid).
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/custom-properties/1/files", upload)
    assert (status, answer["code"]) == (403, "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED")
    assert "X-Gateway-Upload-Upgrade" not in headers
    # A card named neither by its number nor by its uid.
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/my-card/files", upload)
    assert (status, answer["rule"]) == (400, "card_id")
    # A _method after the file part (the edge watches for one; the bridge takes the body over from it): the one file
    # part alone is the upload, anything after it is refused, before the upload's end is sent.
    late = multipart_body([file_part(b"y" * 1000, name="file"), text_part("PUT", name="_method")], B)
    cut = late.index(b"y" * 1000) + 500

    async def slowly() -> AsyncIterator[bytes]:
        yield late[:cut]
        await asyncio.sleep(0.2)  # the edge has seen the file part and watches on; the guard hands over to the bridge
        yield late[cut:]

    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/files", slowly())
    assert (status, answer["rule"]) == (400, "several_parts")
    # Nothing else reached the service but the lookup and one upload, broken off before its end: no file was made.
    sent = [(e["method"], e["path"], e["status"]) for e in await journal(sandbox)]
    assert [(m, p) for m, p, _ in sent] == [("GET", f"/api/v1/cards/{card.id}"), ("POST", f"/api/v1/cards/{card.uid}/files")]
    assert sent[-1][2] != 200 and restricted(sandbox) == before
    # JSON with a URL is not an upload: it passes, whatever the bridge.
    link = json.dumps({"url": "https://e.test/a.pdf", "name": "a.pdf"}).encode()
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/files", link,
                                         content_type="application/json")
    assert status == 200 and answer["type"] == 1 and "X-Gateway-Upload-Upgrade" not in headers


# --- within the service's limits on the client's token -------------------------------------------------------------


async def _limited_sandbox(aiohttp_server: Any, rate: int) -> Any:
    from sandbox.app import create_app
    from sandbox.settings import SandboxSettings

    return await aiohttp_server(create_app(SandboxSettings(rate_limit=rate)))


async def test_uploads_wait_for_the_services_limit_when_the_wait_fits(aiohttp_server: Any, spool: Path,
                                                                      start_gateway: GatewayFactory) -> None:
    sandbox = await _limited_sandbox(aiohttp_server, 2)  # the lookup and one upload a second
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    body = multipart_body([file_part(b"paced", name="file")], B)
    for _ in range(3):
        status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
        assert status == 200 and headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1", answer
    sent = await journal(sandbox)
    assert [e["status"] for e in sent] == [200] * 4  # one lookup (then the id cache), three uploads: no 429
    assert upgrades(gw, "upgraded") == 3


async def test_the_bridges_own_caps_pace_its_requests(sandbox: Any, spool: Path,
                                                      start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool, rate_per_token=2, rate_per_company=3)
    card = public_card(sandbox)
    body = multipart_body([file_part(b"capped", name="file")], B)
    for _ in range(3):
        status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
        assert status == 200, answer
    times = [datetime.fromisoformat(e["received_at"].replace("Z", "+00:00")).timestamp()
             for e in await journal(sandbox)]
    assert len(times) == 4  # the lookup, three uploads: two a second at most
    assert times[2] - times[0] >= 0.99 and times[3] - times[1] >= 0.99
    assert upgrades(gw, "upgraded") == 3


async def test_a_wait_longer_than_the_stage_allows_is_answered_429_with_retry_after(
    aiohttp_server: Any, spool: Path, start_gateway: GatewayFactory
) -> None:
    sandbox = await _limited_sandbox(aiohttp_server, 1)
    lines = LineCollector()
    gw = await start(start_gateway, sandbox, spool, lookup_timeout=0.3, access_log=lines)
    card = public_card(sandbox)
    async with aiohttp.ClientSession() as client:  # the client's token spends its request of this second elsewhere
        async with client.get(f"http://127.0.0.1:{sandbox.port}/api/v1/cards/{card.id}", headers=AUTH) as resp:
            assert resp.status == 200
    body = multipart_body([file_part(b"later", name="file")], B)
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
    assert (status, answer["code"]) == (429, "LEGACY_UPLOAD_UPGRADE_RATE_LIMITED"), answer
    assert headers["Retry-After"] == "1" and "send the upload again in 1 s" in answer["message"]
    assert headers["X-Gateway-Upload-Upgrade"] == "rate_limited; reason=lookup_rate_limited"
    assert [e["status"] for e in await journal(sandbox)] == [200, 429]  # the lookup's 429: no upload went
    assert upgrades(gw, "rate_limited") == 1 and guard_decisions(gw, "legacy_card_file_upload", "bridged") == 1
    line = json.loads(lines.lines[-1])
    assert line["decisions"]["legacy_upload_guard"] == "upgrade_rate_limited"
    assert line["notes"]["legacy_upload_guard.upgrade"] == "rate_limited reason=lookup_rate_limited"


async def test_an_upload_answered_429_is_not_sent_twice(sandbox: Any, spool: Path,
                                                        start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    before = restricted(sandbox)
    await add_fault(sandbox, method="POST", path=f"/api/v1/cards/{card.uid}/files", status=429, times=1)
    body = multipart_body([file_part(os.urandom(64 * KiB), name="file")], B)
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
    assert (status, answer["code"], headers["Retry-After"]) == (429, "LEGACY_UPLOAD_UPGRADE_RATE_LIMITED", "1")
    assert headers["X-Gateway-Upload-Upgrade"] == "rate_limited; reason=upload_rate_limited"
    uploads = [e for e in await journal(sandbox) if e["method"] == "POST"]
    assert [e["status"] for e in uploads] == [429] and restricted(sandbox) == before


# --- what is not upgraded -----------------------------------------------------------------------------------------


async def test_ambiguous_bodies_are_refused_as_without_the_bridge(sandbox: Any, spool: Path,
                                                                 start_gateway: GatewayFactory) -> None:
    # The bridged client and another client of the company side by side (the exemption names the bridged token).
    exemption = {"name": "bridged", "behaviour": "legacy_uploads", "phase": "forbidden", "until": "2099-01-01",
                 "token_fingerprint": token_fingerprint(TOKEN), "bridge": True}
    gw = await start(start_gateway, sandbox, spool, tenant_bridge=False, exemptions=[exemption])
    card = public_card(sandbox)
    comments = f"{gw.url}/api/v1/cards/{card.id}/comments"
    bare_lf = multipart_body([text_part("t"), file_part(b"x")], B).replace(b"\r\n", b"\n")
    for auth in (TOKEN, "Bearer another"):
        status, headers, answer = await send("POST", comments, bare_lf, auth=auth)
        assert (status, answer["code"], answer["rule"]) == (400, "LEGACY_UPLOAD_AMBIGUOUS", "line_endings")
        assert "X-Gateway-Upload-Upgrade" not in headers
    status, _, answer = await send("POST", comments, multipart_body([file_part(b"x")], B),
                                   content_type=f"multipart/mixed; boundary={B}")
    assert (status, answer["rule"]) == (400, "multipart_subtype")
    # A rule broken in an earlier part's headers: a file part after it gets the 403 without the bridge, but is never
    # translated with it.
    folded = multipart_body([(['Content-Disposition: form-data;', ' name="text"'], b"t"), file_part(b"x")], B)
    status, _, answer = await send("POST", comments, folded, auth="Bearer another")
    assert (status, answer["code"]) == (403, "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED")
    status, _, answer = await send("POST", comments, folded)
    assert (status, answer["rule"]) == (400, "folded_header")
    # The card route reads its body with the bridge: the same rules apply.
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", bare_lf)
    assert (status, answer["code"], answer["rule"]) == (400, "LEGACY_UPLOAD_AMBIGUOUS", "line_endings")
    assert "X-Gateway-Upload-Upgrade" not in headers and "Deprecation" not in headers  # the guard's own answer
    assert [e["method"] for e in await journal(sandbox)] == ["GET"]  # the lookup, no upload
    # An ambiguity after the file part, once its upload has started: the upload is broken off, no file is made.
    before = restricted(sandbox)
    late = multipart_body([file_part(os.urandom(512 * KiB), name="file")], B, close=b"\r\n") + \
        b'Content-Disposition: form-data; name="x"\nX: y\r\n\r\nz\r\n--' + B.encode() + b"--\r\n"
    status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", chunked(late))
    assert (status, answer["rule"]) == (400, "line_endings")
    upload = (await journal(sandbox))[-1]
    assert (upload["method"], upload["path"]) == ("POST", f"/api/v1/cards/{card.uid}/files")
    assert upload["status"] != 200 and upload["uploads"] == []
    assert restricted(sandbox) == before
    # Counted for the bridged client only (the other one is not bridged): two comments and two puts refused by the
    # guard's rules, one comment refused from its head.
    assert upgrades(gw, "refused") == 5 and upgrades(gw, "upgraded") == 0
    assert guard_decisions(gw, "legacy_comment_create", "refused") == 4
    assert guard_decisions(gw, "legacy_card_file_upload", "refused") == 2


async def test_a_token_without_access_gets_the_services_answer_and_uploads_nothing(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory
) -> None:
    gw = await start(start_gateway, sandbox, spool)
    store = store_of(sandbox)
    async with aiohttp.ClientSession() as client:  # a card on the private board 3 (its cards answer 403)
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/boards/3/cards", json={"position": "end"}):
            pass
    private = next(c for c in store.all_cards() if store.boards[c.board_id].private)
    card = public_card(sandbox)
    body = multipart_body([file_part(os.urandom(256 * KiB), name="file")], B)
    before = restricted(sandbox)
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{private.id}/files", body)
    assert status == 403 and headers["X-Gateway-Upload-Upgrade"] == "denied; reason=lookup_status_403"
    status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/99999999/files", body)
    assert status == 404
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{private.id}/comments",
                                   multipart_body([text_part("t"), file_part(b"x")], B))
    assert status == 403
    status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body, auth="Bearer nope")
    assert status == 401
    # A token that may read the card but not write: the upload itself is refused by the service, early.
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", chunked(body),
                                         auth=f"Bearer {READONLY_TOKEN}")
    assert status == 403 and headers["X-Gateway-Upload-Upgrade"] == "denied; reason=upload_status_403"
    # The card's uid came from a lookup the service answered, but the client was refused: it is not told the uid.
    assert card.uid not in str(headers)
    # Once a client who may write has had the id mapping cached, a client who may not gets exactly what it got
    # before (issue 27: the cache is kept per token, so the answer and the requests sent do not tell it that someone
    # used the card): its own lookup, refused; no upload; nothing of the card from the gateway.
    status, headers, _ = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body)
    assert status == 200
    uploaded = restricted(sandbox)
    before = len(await journal(sandbox))
    status, headers, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body, auth="Bearer nope")
    assert status == 401 and headers["X-Gateway-Upload-Upgrade"] == "denied; reason=lookup_status_401"
    assert [(e["method"], e["path"]) for e in (await journal(sandbox))[before:]] == [
        ("GET", f"/api/v1/cards/{card.id}")]
    text = answer.decode() if isinstance(answer, bytes) else json.dumps(answer)
    assert card.uid not in str(headers) and card.uid not in text
    assert restricted(sandbox) == uploaded
    assert upgrades(gw, "denied") == 6


async def test_bad_input_gets_a_clear_4xx(sandbox: Any, spool: Path, start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    before = restricted(sandbox)
    one_file = multipart_body([file_part(b"x", name="file")], B)
    cases: list[tuple[str, str, bytes, str | None, int, str]] = [
        ("PUT", "/api/v1/cards/abc/files", one_file, MP, 400, "card_id"),
        ("PUT", f"/api/v1/cards/{card.uid}/files", one_file, MP, 400, "card_id"),
        ("POST", "/api/v1/cards/x1/comments", multipart_body([file_part(b"x")], B), MP, 400, "card_id"),
        ("PUT", f"/api/v1/cards/{card.id}/files", multipart_body([text_part("no file")], B), MP, 400,
         "not_a_file_part"),
        ("PUT", f"/api/v1/cards/{card.id}/files", f"--{B}--\r\n".encode(), MP, 400, "no_file_part"),
        ("PUT", f"/api/v1/cards/{card.id}/files", b'{"file": "x"}', "application/json", 400, "no_file_part"),
        ("PUT", f"/api/v1/cards/{card.id}/files", multipart_body([file_part(b"1", name="file"),
                                                                 file_part(b"2", name="file")], B), MP, 400,
         "several_parts"),
        ("PUT", f"/api/v1/cards/{card.id}/files", multipart_body([file_part(b"1", name="file"), text_part("t")], B),
         MP, 400, "several_parts"),
    ]
    for method, path, body, content_type, status_wanted, rule in cases:
        status, headers, answer = await send(method, gw.url + path, body, content_type=content_type)
        assert (status, answer["code"], answer["rule"]) == (status_wanted, "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", rule)
        assert answer["message"].startswith("This legacy upload cannot be upgraded")
        assert headers["X-Gateway-Upload-Upgrade"] == f"refused; reason={rule}" and "Deprecation" in headers
    assert restricted(sandbox) == before
    assert upgrades(gw, "refused") == len(cases)
    assert guard_decisions(gw, "legacy_card_file_upload", "refused") == len(cases) - 1


async def test_the_access_log_and_the_usage_report_show_the_bridged_client(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory, start_admin: AdminFactory
) -> None:
    lines = LineCollector()
    gw = await start(start_gateway, sandbox, spool, access_log=lines)
    admin = await start_admin(gw)
    card = public_card(sandbox)
    body = multipart_body([file_part(b"logged", name="file")], B)
    status, _, answer = await send("PUT", f"{gw.url}/api/v1/cards/{card.id}/files", body,
                                   **{"User-Agent": "legacy-uploader/1.0"})
    assert status == 200
    (record,) = [json.loads(line) for line in lines.lines]
    assert record["decisions"]["legacy_upload_guard"] == "upgraded"
    assert record["notes"]["legacy_upload_guard.upgrade"] == "upgraded uploaded=1"
    assert record["client"] == token_fingerprint(TOKEN)
    assert answer["url"].split("?")[1] not in json.dumps(record)  # never the signed link
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{admin}/deprecations") as resp:
            report = await resp.json()
    text = json.dumps(report)
    assert '"upgraded": 1' in text and "legacy-uploader/1.0" in text and token_fingerprint(TOKEN) in text
