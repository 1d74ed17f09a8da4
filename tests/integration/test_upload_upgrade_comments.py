"""The upload upgrade bridge on the comment routes: the comment saved with its text parts, then one upload per file
part to the comment, in order; file parts before the text spooled; an upload that fails after the comment exists
named in the answer, the access log and the metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sandbox.store import LegacyFile, RestrictedFile
from tests.gateway_testlib import GatewayFactory, LineCollector, multipart_body
from tests.integration.upload_upgrade_testlib import (  # noqa: F401 - fixtures
    UUID,
    B,
    KiB,
    MiB,
    add_fault,
    chunked,
    download,
    file_part,
    guard_decisions,
    journal,
    public_card,
    sandbox,
    send,
    sha,
    spool,
    start,
    store_of,
    text_part,
    upgrades,
)


def comment_files(sandbox: Any, comment_id: int) -> list[RestrictedFile]:
    store = store_of(sandbox)
    found = store.comment_files(store.comments[comment_id])
    assert not any(isinstance(f, LegacyFile) for f in found)
    return [f for f in found if isinstance(f, RestrictedFile)]


@pytest.mark.parametrize("order", ["text_first", "text_last", "text_between"])
async def test_a_comment_with_files_is_saved_then_each_file_uploaded_in_order(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory, order: str
) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    contents = [os.urandom(n) for n in (200 * KiB + 7, 0, 1 * MiB + 3)]
    files = [file_part(c, f"f{i}.bin") for i, c in enumerate(contents)]
    text = text_part("Here are the files – ünïcode too")
    parts = {"text_first": [text, *files], "text_last": [*files, text],
             "text_between": [files[0], text, files[1], files[2]]}[order]
    body = multipart_body(parts, B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", chunked(body))
    assert status == 200, answer
    assert answer["text"] == "Here are the files – ünïcode too" and answer["card_id"] == card.id
    assert [f["name"] for f in answer["files"]] == ["f0.bin", "f1.bin", "f2.bin"]
    for record, content in zip(answer["files"], contents, strict=True):
        assert UUID.fullmatch(record["id"]) and record["type"] == 11 and record["size"] == len(content)
        assert record["comment_id"] == answer["id"] and record["entity_type"] == "comment"
        assert sha(await download(record["url"])) == sha(content)
    stored = comment_files(sandbox, answer["id"])
    assert [f.name for f in stored] == ["f0.bin", "f1.bin", "f2.bin"]
    assert [f.content.sha256 for f in stored] == [sha(c) for c in contents]
    assert headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=3"
    assert headers["Link"] == f'</api/v1/cards/{card.uid}/comments/{answer["uid"]}/files>; rel="successor-version"'
    uploads = [e for e in await journal(sandbox) if e["method"] == "POST"]
    assert [e["path"] for e in uploads] == [f"/api/v1/cards/{card.id}/comments"] + \
        [f"/api/v1/cards/{card.uid}/comments/{answer['uid']}/files"] * 3
    assert [e["uploads"][0]["name"] for e in uploads[1:]] == ["f0.bin", "f1.bin", "f2.bin"]
    assert uploads[0]["uploads"] == []  # the comment itself carries no file
    assert list(spool.iterdir()) == []
    assert upgrades(gw, "upgraded") == 1
    assert guard_decisions(gw, "legacy_comment_create", "bridged") == 1


async def test_a_comment_update_with_files_and_with_files_alone(sandbox: Any, spool: Path,
                                                                start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    store = store_of(sandbox)
    comment = store.add_comment(card, "before", store.default_author_id, store.cards[card.id].created)
    url = f"{gw.url}/api/v1/cards/{card.id}/comments/{comment.id}"
    status, _, answer = await send("PATCH", url, multipart_body([text_part("after"), file_part(b"one", "1.txt")], B))
    assert status == 200, answer
    assert answer["text"] == "after" and [f["name"] for f in answer["files"]] == ["1.txt"]
    # Files alone: the comment is not touched, its uid comes from the card lookup.
    status, headers, answer = await send("PATCH", url, multipart_body([file_part(b"two", "2.txt")], B))
    assert status == 200, answer
    assert answer["text"] == "after" and answer["uid"] == comment.uid
    assert [f["name"] for f in answer["files"]] == ["1.txt", "2.txt"]
    assert [f.name for f in comment_files(sandbox, comment.id)] == ["1.txt", "2.txt"]
    assert headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1"
    # The first update: lookup, comment, upload; the second: the lookup again (for the comment), upload.
    assert [e["method"] for e in await journal(sandbox)] == ["GET", "PATCH", "POST", "GET", "POST"]
    # An unknown comment: nothing is uploaded.
    status, _, answer = await send("PATCH", f"{gw.url}/api/v1/cards/{card.id}/comments/999999",
                                   multipart_body([file_part(b"three")], B))
    assert status == 404 and answer["code"] == "LEGACY_UPLOAD_UPGRADE_NOT_FOUND"
    assert len(comment_files(sandbox, comment.id)) == 2
    assert upgrades(gw, "upgraded") == 2 and upgrades(gw, "denied") == 1


async def test_text_only_comments_pass_through_untouched(sandbox: Any, spool: Path,
                                                         start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    body = multipart_body([text_part("just words")], B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", body)
    assert status == 200 and answer["text"] == "just words" and "X-Gateway-Upload-Upgrade" not in headers
    (entry,) = await journal(sandbox)
    assert entry["body_sha256"] == sha(body)  # forwarded byte for byte, as without the bridge
    assert upgrades(gw, "upgraded") == 0


async def test_an_upload_that_fails_after_the_comment_exists_is_named(sandbox: Any, spool: Path,
                                                                      start_gateway: GatewayFactory) -> None:
    lines = LineCollector()
    gw = await start(start_gateway, sandbox, spool, access_log=lines)
    card = public_card(sandbox)
    uploads = "/api/v1/cards/*/comments/*/files"
    # The first upload goes through (a fault that only delays it), the second answers 500.
    await add_fault(sandbox, method="POST", path=uploads, delay=0.01)
    await add_fault(sandbox, method="POST", path=uploads, status=500)
    body = multipart_body([text_part("three files"), file_part(b"1" * 1000, "a.txt"), file_part(b"2" * 1000, "b.txt"),
                           file_part(b"3" * 1000, "c.txt")], B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", body,
                                         **{"X-Request-Id": "partial-1"})
    assert status == 502
    assert answer["code"] == "LEGACY_UPLOAD_UPGRADE_PARTIAL" and answer["reason"] == "upload_status"
    assert answer["request_id"] == "partial-1"
    comment = store_of(sandbox).comments[answer["comment"]["id"]]
    assert answer["comment"] == {"id": comment.id, "uid": comment.uid} and comment.text == "three files"
    (uploaded,) = comment_files(sandbox, comment.id)
    assert answer["files"] == [
        {"index": 0, "field": "files[]", "filename": "a.txt", "status": "uploaded", "id": uploaded.id},
        {"index": 1, "field": "files[]", "filename": "b.txt", "status": "failed", "upstream_status": 500},
        {"index": 2, "field": "files[]", "filename": "c.txt", "status": "not_sent"},
    ]
    assert answer["files_complete"] is True  # the rest of the body was read to list every file part
    assert answer["replacement"] == f"POST /api/v1/cards/{card.uid}/comments/{comment.uid}/files"
    assert "was saved" in answer["message"]
    assert headers["X-Gateway-Upload-Upgrade"] == "partial; reason=upload_status"
    assert upgrades(gw, "partial") == 1 and upgrades(gw, "upgraded") == 0
    (record,) = [json.loads(line) for line in lines.lines]
    assert record["decisions"]["legacy_upload_guard"] == "upgrade_partial"
    note = record["notes"]["legacy_upload_guard.upgrade"]
    assert note == f"partial reason=upload_status comment={comment.uid} uploaded=1 failed=1 not_sent=1"
    assert "signed" not in json.dumps(record) and "Bearer" not in json.dumps(record)


async def test_an_upload_the_services_limit_refuses_after_the_comment_is_partial_with_retry_after(
    sandbox: Any, spool: Path, start_gateway: GatewayFactory
) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    uploads = "/api/v1/cards/*/comments/*/files"
    await add_fault(sandbox, method="POST", path=uploads, delay=0.01)
    await add_fault(sandbox, method="POST", path=uploads, status=429)
    body = multipart_body([text_part("two files"), file_part(b"1" * 1000, "a.txt"), file_part(b"2" * 1000, "b.txt")],
                          B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", body)
    assert (status, answer["code"], answer["reason"]) == (429, "LEGACY_UPLOAD_UPGRADE_PARTIAL", "rate_limited")
    assert headers["Retry-After"] == "1" and headers["X-Gateway-Upload-Upgrade"] == "partial; reason=rate_limited"
    assert [f["status"] for f in answer["files"]] == ["uploaded", "failed"]
    assert [e["status"] for e in await journal(sandbox) if e["method"] == "POST"][-1] == 429  # not sent twice
    assert upgrades(gw, "partial") == 1


async def test_a_comment_the_service_refuses_creates_nothing(sandbox: Any, spool: Path,
                                                             start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    await add_fault(sandbox, method="POST", path=f"/api/v1/cards/{card.id}/comments", status=503)
    before = len(store_of(sandbox).comments)
    # A file part first (spooled), then the text: the comment is refused, the spooled file never leaves.
    body = multipart_body([file_part(os.urandom(300 * KiB)), text_part("hello")], B)
    status, headers, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", body)
    assert status == 503 and answer == {"message": "injected fault"}  # the service's own answer, passed on
    assert headers["X-Gateway-Upload-Upgrade"] == "failed; reason=comment_status_503"
    assert len(store_of(sandbox).comments) == before and list(spool.iterdir()) == []
    assert [e["path"] for e in await journal(sandbox)][-1] == f"/api/v1/cards/{card.id}/comments"
    assert upgrades(gw, "failed") == 1


async def test_bounds_of_a_comment(sandbox: Any, spool: Path, start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool, spool_bytes=100 * KiB, max_files=2, max_field_bytes=2048)
    card = public_card(sandbox)
    url = f"{gw.url}/api/v1/cards/{card.id}/comments"
    comments = len(store_of(sandbox).comments)
    # Over the spool bound: refused, nothing created, no temporary file left.
    status, _, answer = await send("POST", url, multipart_body([file_part(b"x" * (150 * KiB)), text_part("t")], B))
    assert (status, answer["code"], answer["rule"]) == (413, "LEGACY_UPLOAD_UPGRADE_TOO_LARGE", "spool_limit")
    # Text parts over their bound.
    status, _, answer = await send("POST", url, multipart_body([text_part("t" * 4096), file_part(b"x")], B))
    assert (status, answer["rule"]) == (413, "fields_too_large")
    assert len(store_of(sandbox).comments) == comments and list(spool.iterdir()) == []
    # More file parts than max_files, all before the text: refused before anything is created.
    status, _, answer = await send("POST", url, multipart_body([file_part(b"1"), file_part(b"2"), file_part(b"3"),
                                                                text_part("t")], B))
    assert (status, answer["code"], answer["rule"]) == (400, "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", "too_many_files")
    assert len(store_of(sandbox).comments) == comments
    # After the comment was saved, the same is a partial answer: the comment and the files that went are named.
    status, _, answer = await send("POST", url, multipart_body([text_part("t"), file_part(b"1"), file_part(b"2"),
                                                                file_part(b"3")], B))
    assert (status, answer["code"], answer["reason"]) == (400, "LEGACY_UPLOAD_UPGRADE_PARTIAL", "too_many_files")
    assert [f["status"] for f in answer["files"]] == ["uploaded", "uploaded", "not_sent"]
    assert len(comment_files(sandbox, answer["comment"]["id"])) == 2
    assert list(spool.iterdir()) == []
    assert upgrades(gw, "refused") == 3 and upgrades(gw, "partial") == 1


async def test_the_text_bound_is_named_as_configured(sandbox: Any, spool: Path, start_gateway: GatewayFactory) -> None:
    """Several text parts over max_field_bytes together: the answer names the bound, not what was left of it."""
    gw = await start(start_gateway, sandbox, spool, max_field_bytes=2048)
    card = public_card(sandbox)
    body = multipart_body([text_part("t" * 1500), text_part("u" * 1500, name="extra"), file_part(b"x")], B)
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", body)
    assert (status, answer["code"], answer["rule"]) == (413, "LEGACY_UPLOAD_UPGRADE_TOO_LARGE", "fields_too_large")
    assert "text parts are over 2048 bytes" in answer["message"]
    assert upgrades(gw, "refused") == 1 and (await journal(sandbox))[-1]["method"] == "GET"  # the lookup alone


async def test_spool_bytes_0_refuses_a_file_before_the_text(sandbox: Any, spool: Path,
                                                           start_gateway: GatewayFactory) -> None:
    gw = await start(start_gateway, sandbox, spool, spool_bytes=0)
    card = public_card(sandbox)
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments",
                                   multipart_body([file_part(b"x"), text_part("t")], B))
    assert (status, answer["rule"]) == (413, "spool_limit")
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments",
                                   multipart_body([text_part("t"), file_part(b"x")], B))
    assert status == 200 and len(answer["files"]) == 1


async def test_an_upload_refused_early_still_lists_every_file(sandbox: Any, spool: Path,
                                                              start_gateway: GatewayFactory) -> None:
    """The service answers the second upload before reading its (large) file: the upload is broken off, and the rest
    of the body is still read to name the file parts that were not sent."""
    gw = await start(start_gateway, sandbox, spool)
    card = public_card(sandbox)
    uploads = "/api/v1/cards/*/comments/*/files"
    await add_fault(sandbox, method="POST", path=uploads, delay=0.01)
    await add_fault(sandbox, method="POST", path=uploads, status=413)
    body = multipart_body([text_part("t"), file_part(b"1", "a.txt"), file_part(os.urandom(6 * MiB), "b.bin"),
                           file_part(os.urandom(2 * MiB), "c.bin"), text_part("late", name="x"),
                           file_part(b"4", "d.txt")], B)
    status, _, answer = await send("POST", f"{gw.url}/api/v1/cards/{card.id}/comments", chunked(body))
    assert status == 502 and answer["reason"] == "upload_status"
    assert [(f["filename"], f["status"]) for f in answer["files"]] == [
        ("a.txt", "uploaded"), ("b.bin", "failed"), ("c.bin", "not_sent"), ("d.txt", "not_sent")]
    assert answer["files"][1]["upstream_status"] == 413 and answer["files_complete"] is True
    assert len(comment_files(sandbox, answer["comment"]["id"])) == 1
    assert upgrades(gw, "partial") == 1
