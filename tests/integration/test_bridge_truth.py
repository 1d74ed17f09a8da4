"""The upload upgrade tells the truth about files and comments, keeps its caches apart, and fixes the smaller defects
of issue 27 ("Must have" 3 to 5), in front of the adversarial upstream:

- an upload whose answer is cut, unreadable or lost once the whole file went: the file the service stored is found on
  the card and deleted, the answer, the note and the metric say so, and the client's retry leaves one file, not two;
- a comment whose client leaves while it is on its way, or whose answer is lost, is named (answer, note, warning);
- the id cache serves no other company or Host, and no other token: a refused token gets the same answer and the
  same upstream requests whether or not someone else used the card;
- a part's media type keeps its parameters, the legacy field name is checked, a partial answer stays small, and a
  bridged request cut at shutdown gets the 503 its record says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest

from tests.adversarial_upstream import AdversarialUpstream, adversarial  # noqa: F401 - fixture
from tests.gateway_testlib import (
    GatewayFactory,
    LineCollector,
    RunningGateway,
    guarded_routes,
    make_config,
    multipart_body,
    until,
)
from tests.process_testlib import samples, start, wait_for

B = "truth-boundary"
MP = f"multipart/form-data; boundary={B}"
TOKEN = "Bearer a-token"


def _config(url: str, tenants: list[dict[str, Any]] | None = None, **upgrade: Any) -> dict[str, Any]:
    data = make_config(url, routes=guarded_routes(upgrade=upgrade))
    data["tenants"] = tenants or [{"name": "acme", "hosts": ["127.0.0.1"], "upstream": url, "created": "2026-06-01",
                                   "bridges": {"upload_upgrade": True}}]
    data["access_log"] = {"enabled": True}
    return data


async def _start(start_gateway: GatewayFactory, url: str, **kw: Any) -> tuple[RunningGateway, LineCollector]:
    lines = LineCollector()
    return await start_gateway(_config(url, **kw), access_log=lines), lines


def _file(content: bytes, name: str = "file", filename: str = "a.txt", media: str | None = None
          ) -> tuple[list[str], bytes]:
    head = [f'Content-Disposition: form-data; name="{name}"; filename="{filename}"']
    if media is not None:
        head.append(f"Content-Type: {media}")
    return head, content


def _text(text: str) -> tuple[list[str], bytes]:
    return ['Content-Disposition: form-data; name="text"'], text.encode()


async def _send(gw: RunningGateway, method: str, path: str, body: bytes, auth: str = TOKEN,
                host: str | None = None) -> tuple[int, Any, Any]:
    headers = {"Content-Type": MP, "Authorization": auth}
    if host is not None:
        headers["Host"] = host
    async with aiohttp.ClientSession() as client:
        async with client.request(method, gw.url + path, data=body, headers=headers) as resp:
            raw = await resp.read()
            try:
                return resp.status, resp.headers, json.loads(raw)
            except ValueError:
                return resp.status, resp.headers, raw


def _upgrades(gw: RunningGateway, outcome: str) -> float:
    """A company's series appears with its first count (issue 38): none yet is 0."""
    return samples(generate_latest(gw.metrics.registry).decode()).get(
        ("gateway_legacy_upload_upgrades_total", (("outcome", outcome), ("tenant", "acme"))), 0.0)



# --- files whose answer was lost --------------------------------------------------------------------------------


@pytest.mark.parametrize("cached", [False, True], ids=["looked_up", "id_cached"])
@pytest.mark.parametrize("fault", ["cut", "garbage", "dropped"])
async def test_a_file_stored_behind_a_lost_answer_is_deleted_and_a_retry_leaves_one(
    adversarial: AdversarialUpstream, start_gateway: GatewayFactory, fault: str, cached: bool  # noqa: F811
) -> None:
    gw, lines = await _start(start_gateway, adversarial.url)
    body = multipart_body([_file(b"the report " * 1000, filename="report.txt")], B)
    kept = 0
    if cached:
        # An earlier upload to the card: its uid is in the id cache, and the card holds a file of the same name and
        # size (which must not be taken for the lost one).
        status, _, _ = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
        assert status == 200
        kept = 1
    adversarial.upload_faults = [fault]
    status, headers, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
    assert status == 502 and answer["code"] == "LEGACY_UPLOAD_UPGRADE_FAILED"
    assert "was found (id " in answer["message"] and "deleted" in answer["message"]
    reason = "upload_answer" if fault != "dropped" else "upload_"
    assert headers["X-Gateway-Upload-Upgrade"].startswith(f"rolled_back; reason={reason}")
    assert len(adversarial.files("127.0.0.1", 42)) == kept
    deletes = [r for r in adversarial.received if r.method == "DELETE"]
    assert len(deletes) == 1 and deletes[0].header("Authorization") == TOKEN
    await until(lambda: len(lines.lines) == 1 + kept)
    note = json.loads(lines.lines[-1])["notes"]["legacy_upload_guard.upgrade"]
    assert note.startswith("rolled_back reason=") and "rolled_back=1" in note
    assert _upgrades(gw, "rolled_back") == 1 and _upgrades(gw, "failed") == 0
    # The legacy client sends it again: one file on the card, not two.
    status, _, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
    assert status == 200
    assert [f.name for f in adversarial.files("127.0.0.1", 42)] == ["report.txt"] * (kept + 1)


async def test_a_file_that_cannot_be_deleted_is_named_with_its_id(adversarial: AdversarialUpstream,  # noqa: F811
                                                                  start_gateway: GatewayFactory,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    gw, _ = await _start(start_gateway, adversarial.url)
    adversarial.upload_faults = ["garbage"]
    original = adversarial._file_route

    async def no_delete(request: Any, *args: Any) -> Any:
        if request.method == "DELETE":
            from aiohttp import web
            return web.Response(status=500)
        return await original(request, *args)

    adversarial._file_route = no_delete  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="gateway.legacy_upload_guard"):
        status, headers, answer = await _send(gw, "PUT", "/api/v1/cards/42/files",
                                              multipart_body([_file(b"x" * 5000)], B))
    (stored,) = adversarial.files("127.0.0.1", 42)
    assert status == 502 and headers["X-Gateway-Upload-Upgrade"] == "left_stored; reason=upload_answer"
    assert f"(id {stored.id})" in answer["message"] and "do not send it again" in answer["message"]
    assert _upgrades(gw, "left_stored") == 1
    assert any(stored.id in r.getMessage() for r in caplog.records)


async def test_a_file_whose_deletion_gets_no_answer_is_named_with_its_id(adversarial: AdversarialUpstream,  # noqa: F811
                                                                         start_gateway: GatewayFactory) -> None:
    # The deletion of the file found behind a lost answer breaks off before its answer: the file stays on the
    # service, and the client is told so (502, left_stored, its id), not answered 500 by the gateway.
    gw, lines = await _start(start_gateway, adversarial.url)
    adversarial.upload_faults = ["garbage"]
    original = adversarial._file_route

    async def dropped_delete(request: Any, *args: Any) -> Any:
        if request.method == "DELETE":
            request.transport.abort()
            from aiohttp import web
            return web.Response(status=204)
        return await original(request, *args)

    adversarial._file_route = dropped_delete  # type: ignore[method-assign]
    status, headers, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", multipart_body([_file(b"x" * 5000)], B))
    (stored,) = adversarial.files("127.0.0.1", 42)
    assert status == 502 and headers["X-Gateway-Upload-Upgrade"] == "left_stored; reason=upload_answer"
    assert f"(id {stored.id})" in answer["message"] and "do not send it again" in answer["message"]
    await until(lambda: len(lines.lines) == 1)
    assert "rollback_failed=1" in json.loads(lines.lines[0])["notes"]["legacy_upload_guard.upgrade"]
    assert _upgrades(gw, "left_stored") == 1


# --- comments -----------------------------------------------------------------------------------------------------


async def test_a_comment_saved_after_its_client_left_is_named(adversarial: AdversarialUpstream,  # noqa: F811
                                                              start_gateway: GatewayFactory,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The client leaves while the comment is on its way: the service saves it all the same. The record names it
    (the code before cancelled the request half way and logged ``not_sent=1`` with no comment and no warning)."""
    gw, lines = await _start(start_gateway, adversarial.url)
    adversarial.comment_faults = ["slow"]
    adversarial.slow_seconds = 0.5
    body = multipart_body([_text("left behind"), _file(b"y" * 1000, name="files[]")], B)
    with caplog.at_level(logging.WARNING, logger="gateway.legacy_upload_guard"):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(f"POST /api/v1/cards/7/comments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {TOKEN}\r\n"
                     f"Content-Type: {MP}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        await until(lambda: any(r.method == "POST" for r in adversarial.received))
        writer.transport.abort()
        await until(lambda: len(lines.lines) == 1, 5)
    (comment,) = adversarial.card("127.0.0.1", 7).comments
    record = json.loads(lines.lines[0])
    assert record["status"] == 499
    assert record["notes"]["legacy_upload_guard.upgrade"] == f"aborted reason=client_gone comment={comment.uid} " \
                                                             "not_sent=1"
    assert any(comment.uid in r.getMessage() for r in caplog.records)


async def test_a_comment_whose_answer_is_lost_is_found_on_the_card(adversarial: AdversarialUpstream,  # noqa: F811
                                                                   start_gateway: GatewayFactory) -> None:
    gw, _ = await _start(start_gateway, adversarial.url)
    adversarial.comment_faults = ["dropped"]
    body = multipart_body([_text("lost answer"), _file(b"z" * 1000, name="files[]")], B)
    status, headers, answer = await _send(gw, "POST", "/api/v1/cards/7/comments", body)
    (comment,) = adversarial.card("127.0.0.1", 7).comments
    assert status == 502 and answer["code"] == "LEGACY_UPLOAD_UPGRADE_PARTIAL"
    assert answer["comment"] == {"id": comment.id, "uid": comment.uid}
    assert [f["status"] for f in answer["files"]] == ["not_sent"]
    assert headers["X-Gateway-Upload-Upgrade"].startswith("partial; reason=comment_")


# --- caches that cross nothing ------------------------------------------------------------------------------------


async def test_the_id_cache_serves_no_other_company(adversarial: AdversarialUpstream,  # noqa: F811
                                                    start_gateway: GatewayFactory) -> None:
    """Two companies behind one upstream, one tenant for ``*.multi.test`` with ``preserve_host``: each one's card 42
    is its own (the code before sent acme's upload to globex's card, 404 for the cache's whole TTL)."""
    tenants = [{"name": "acme", "hosts": ["*.multi.test"], "upstream": adversarial.url, "created": "2026-06-01",
                "preserve_host": True, "bridges": {"upload_upgrade": True}}]
    gw, _ = await _start(start_gateway, adversarial.url, tenants=tenants)
    body = multipart_body([_file(b"q" * 100)], B)
    for company in ("globex", "acme"):
        status, _, answer = await _send(gw, "PUT", "/api/v1/cards/42/files", body, host=f"{company}.multi.test")
        assert status == 200, answer
        assert answer["card_uid"] == f"uid-{company}-42"
        assert len(adversarial.files(f"{company}.multi.test", 42)) == 1


async def test_a_refused_token_learns_nothing_of_another_tokens_use_of_a_card(
    adversarial: AdversarialUpstream, start_gateway: GatewayFactory  # noqa: F811
) -> None:
    gw, _ = await _start(start_gateway, adversarial.url)
    adversarial.denied.add(("Bearer b-token", 42))
    body = multipart_body([_file(b"secret" * 100)], B)
    seen: list[tuple[int, str, list[tuple[str, str]]]] = []
    for auth in ("Bearer b-token", TOKEN, "Bearer b-token"):
        before = len(adversarial.received)
        status, headers, _ = await _send(gw, "PUT", "/api/v1/cards/42/files", body, auth=auth)
        requests = [(r.method, r.raw_path) for r in adversarial.received[before:]]
        seen.append((status, headers.get("X-Gateway-Upload-Upgrade", ""), requests))
    assert seen[1][0] == 200
    # Before and after another token used the card: the same answer, the same requests (its own lookup, no upload).
    assert seen[0] == seen[2] == (403, "denied; reason=lookup_status_403", [("GET", "/api/v1/cards/42")])


# --- the smaller ones ---------------------------------------------------------------------------------------------


async def test_a_parts_media_type_keeps_its_parameters(adversarial: AdversarialUpstream,  # noqa: F811
                                                       start_gateway: GatewayFactory) -> None:
    gw, _ = await _start(start_gateway, adversarial.url)
    body = multipart_body([_file("café".encode("latin-1"), media='text/plain; charset="iso-8859-1"')], B)
    status, _, _ = await _send(gw, "PUT", "/api/v1/cards/42/files", body)
    assert status == 200
    (stored,) = adversarial.files("127.0.0.1", 42)
    assert stored.media == 'text/plain; charset="iso-8859-1"'


async def test_the_legacy_field_name_is_checked_as_the_service_would(adversarial: AdversarialUpstream,  # noqa: F811
                                                                     start_gateway: GatewayFactory) -> None:
    gw, _ = await _start(start_gateway, adversarial.url)
    status, headers, answer = await _send(gw, "PUT", "/api/v1/cards/42/files",
                                          multipart_body([_file(b"x", name="files[]")], B))
    assert (status, answer["code"], answer["rule"]) == (400, "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", "field_name")
    assert "named 'file'" in answer["message"]
    assert [r.method for r in adversarial.received] == ["GET"]  # the lookup; no upload
    assert adversarial.files("127.0.0.1", 42) == []


async def test_a_partial_answer_stays_small(adversarial: AdversarialUpstream,  # noqa: F811
                                            start_gateway: GatewayFactory) -> None:
    """After too_many_files the rest of the body is read to count its file parts: at most max_files + 1 are listed
    (the code before listed all of them: a 38 MB body gave a 75 MB answer)."""
    gw, _ = await _start(start_gateway, adversarial.url, max_files=2)
    long_name = "n" * 2000 + ".txt"
    parts = [_text("many")] + [_file(b"f", name="files[]", filename=long_name) for _ in range(5000)]
    status, _, answer = await _send(gw, "POST", "/api/v1/cards/7/comments", multipart_body(parts, B))
    assert status == 400 and answer["reason"] == "too_many_files"
    assert [f["status"] for f in answer["files"]] == ["uploaded", "uploaded", "not_sent"]
    assert answer["files_not_listed"] == 4997 and answer["files_complete"] is False
    assert all(len(f["filename"]) <= 255 for f in answer["files"])
    assert len(json.dumps(answer)) < 4096


async def test_a_bridged_request_cut_at_shutdown_gets_the_503_its_record_says(adversarial: AdversarialUpstream,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    data = _config(adversarial.url)
    data["server"] = {"shutdown_timeout": 1}
    proc = await start(data, tmp_path)
    try:
        body = multipart_body([_file(b"s" * 2_000_000)], B)
        reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
        writer.write(f"PUT /api/v1/cards/42/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {TOKEN}\r\n"
                     f"X-Request-Id: cut-1\r\nContent-Type: {MP}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body[:500_000])  # then the upload stalls
        await writer.drain()
        await wait_for(lambda: _true(any(r.method == "GET" for r in adversarial.received)), 5)
        await asyncio.sleep(0.2)
        proc.proc.send_signal(signal.SIGTERM)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:300]
        assert json.loads(payload)["code"] == "SHUTTING_DOWN"
        assert await asyncio.get_running_loop().run_in_executor(None, proc.proc.wait, 10) == 0
        (line,) = [entry for entry in proc.access_lines() if entry["request_id"] == "cut-1"]
        assert line["status"] == 503 and line["notes"]["cut"] == "shutdown"
        assert line["notes"]["legacy_upload_guard.upgrade"].startswith("aborted reason=shutdown")
        assert adversarial.files("127.0.0.1", 42) == []
    finally:
        proc.stop()


async def _true(value: bool) -> bool:
    return value
