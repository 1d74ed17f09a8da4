"""Clients that go away in the middle of an upgraded upload, at each stage: no upload is left started on their
behalf (an upload missing its end makes no file; a file already made for them is deleted), no temporary file is
left, and the access log and the metrics say so."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sandbox.app import create_app
from sandbox.state import JOURNAL
from tests.gateway_testlib import GatewayFactory, LineCollector, RunningGateway, multipart_body, until
from tests.integration.upload_upgrade_testlib import (  # noqa: F401 - fixtures
    MP,
    TOKEN,
    B,
    KiB,
    MiB,
    add_fault,
    config,
    file_part,
    journal,
    public_card,
    restricted,
    sandbox,
    spool,
    start,
    store_of,
    text_part,
    upgrades,
)


async def abort_midway(gw: RunningGateway, method: str, target: str, body: bytes, sent: int,
                       ready: Callable[[], bool | Awaitable[bool]]) -> None:
    """Send the head (announcing all of ``body``) and ``sent`` bytes of it, wait for ``ready``, then reset."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {TOKEN}\r\nContent-Type: {MP}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:sent])
    await writer.drain()
    await until(ready)
    writer.transport.abort()


def record_of(lines: LineCollector) -> dict[str, Any]:
    (record,) = [json.loads(line) for line in lines.lines]
    assert isinstance(record, dict)
    return record


async def finished(gw: RunningGateway, lines: LineCollector) -> dict[str, Any]:
    await until(lambda: upgrades(gw, "aborted") == 1 and len(lines.lines) == 1)
    record = record_of(lines)
    assert record["status"] == 499 and record["decisions"]["legacy_upload_guard"] == "upgrade_aborted"
    assert record["notes"]["legacy_upload_guard.upgrade"].startswith("aborted reason=client_gone")
    return record


async def upload_started(sandbox: Any, path: str) -> bool:
    return any(e["path"] == path for e in await journal(sandbox))


@pytest.fixture
async def watched(aiohttp_server: Any) -> Any:
    """A sandbox that notes each request as it arrives (its journal has it only once answered)."""
    arrived: list[tuple[str, str]] = []

    @web.middleware
    async def note(request: web.Request, handler: Any) -> web.StreamResponse:
        arrived.append((request.method, request.path))
        response: web.StreamResponse = await handler(request)
        return response

    app = create_app()
    app.middlewares.insert(0, note)
    server = await aiohttp_server(app)
    server.arrived = arrived
    return server


@pytest.mark.parametrize("stage", ["lookup", "mid_file", "after_the_file_part"])
async def test_a_put_abandoned_at_each_stage_uploads_nothing(watched: Any, spool: Path, start_gateway: GatewayFactory,
                                                            stage: str) -> None:
    sandbox = watched
    lines = LineCollector()
    gw = await start(start_gateway, sandbox, spool, access_log=lines)
    card = public_card(sandbox)
    before = restricted(sandbox)
    body = multipart_body([file_part(os.urandom(4 * MiB), name="file"), text_part("late")], B)
    lookup = ("GET", f"/api/v1/cards/{card.id}")
    upload = ("POST", f"/api/v1/cards/{card.uid}/files")
    if stage == "lookup":
        # The lookup is slow: the client leaves while it is in flight, after sending the start of its body.
        await add_fault(sandbox, method="GET", path=lookup[1], delay=0.5)
        sent = 100
        ready = lambda: lookup in sandbox.arrived  # noqa: E731
    elif stage == "mid_file":
        # Half the file sent: the upload is streaming to the sandbox when the client leaves.
        sent = 2 * MiB
        ready = lambda: upload in sandbox.arrived  # noqa: E731
    else:
        # The whole file part and the start of another part: the file is complete, the body is not.
        sent = body.index(b'name="text"') + 5
        loop = asyncio.get_running_loop()
        at = loop.time() + 0.3
        ready = lambda: upload in sandbox.arrived and loop.time() > at  # noqa: E731
    await abort_midway(gw, "PUT", f"/api/v1/cards/{card.id}/files", body, sent, ready)
    await finished(gw, lines)
    if stage == "lookup":
        await until(lambda: lookup in [(e["method"], e["path"]) for e in sandbox.app[JOURNAL].entries()])
        assert upload not in sandbox.arrived
    else:
        # The upload reached the sandbox and was broken off there: no file.
        await until(lambda: upload_started(sandbox, upload[1]))
        (broken,) = [e for e in await journal(sandbox) if e["path"] == upload[1]]
        assert broken["status"] != 200 and broken["uploads"] == []
    assert restricted(sandbox) == before
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("stage", ["spooling", "comment_saved_mid_file", "second_file", "spooled_then_streamed"])
async def test_a_comment_abandoned_at_each_stage_leaves_no_upload(sandbox: Any, spool: Path,
                                                                  start_gateway: GatewayFactory, stage: str) -> None:
    lines = LineCollector()
    gw = await start(start_gateway, sandbox, spool, access_log=lines)
    store = store_of(sandbox)
    card = public_card(sandbox)
    comments_before = set(store.comments)
    files_before = restricted(sandbox)
    first, second = os.urandom(1 * MiB), os.urandom(4 * MiB)

    def new_comments() -> list[Any]:
        return [c for i, c in store.comments.items() if i not in comments_before]

    def comment_has_files(n: int) -> Callable[[], bool]:
        return lambda: any(len(store.comment_files(c)) >= n for c in new_comments())

    if stage == "spooling":
        body = multipart_body([file_part(second), text_part("text")], B)
        sent = 2 * MiB

        def ready() -> bool:
            return any(spool.iterdir())
    elif stage == "comment_saved_mid_file":
        body = multipart_body([text_part("text"), file_part(second)], B)
        sent = 2 * MiB
        ready = lambda: bool(new_comments())  # noqa: E731
    elif stage == "second_file":
        body = multipart_body([text_part("text"), file_part(first, "1.bin"), file_part(second, "2.bin")], B)
        sent = len(first) + 2 * MiB
        ready = comment_has_files(1)
    else:
        body = multipart_body([file_part(first, "1.bin"), text_part("text"), file_part(second, "2.bin")], B)
        sent = len(first) + 2 * MiB
        ready = comment_has_files(1)
    await abort_midway(gw, "POST", f"/api/v1/cards/{card.id}/comments", body, sent, ready)
    record = await finished(gw, lines)
    note = record["notes"]["legacy_upload_guard.upgrade"]
    created = new_comments()
    if stage == "spooling":
        assert created == [] and note == "aborted reason=client_gone not_sent=1"
    else:
        # The comment stays (the service has no route to delete one); every file made for it was deleted.
        (comment,) = created
        assert store.comment_files(comment) == []
        assert f"comment={comment.uid}" in note
        if stage in ("second_file", "spooled_then_streamed"):
            assert "rolled_back=1" in note
    assert restricted(sandbox) == files_before
    assert list(spool.iterdir()) == []


async def test_a_body_that_stops_arriving_after_the_comment_was_saved(sandbox: Any, spool: Path,
                                                                      start_gateway: GatewayFactory) -> None:
    """The client is still there: it is told what was saved, and that the files made for it were deleted."""
    conf = config(sandbox, spool)
    conf["server"] = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "client_body_timeout": 0.5}
    gw = await start_gateway(conf)
    store = store_of(sandbox)
    card = public_card(sandbox)
    first = os.urandom(300 * KiB)
    body = multipart_body([text_part("text"), file_part(first, "1.bin"), file_part(b"x" * MiB, "2.bin")], B)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"POST /api/v1/cards/{card.id}/comments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {TOKEN}\r\n"
                 f"Content-Type: {MP}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:len(first) + 4096])
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
    doc = json.loads(payload)
    assert doc["code"] == "LEGACY_UPLOAD_UPGRADE_PARTIAL" and doc["reason"] == "body_timeout"
    assert [f["status"] for f in doc["files"]] == ["rolled_back", "not_sent"] and doc["files_complete"] is False
    comment = store.comments[doc["comment"]["id"]]
    assert store.comment_files(comment) == [] and comment.text == "text"
    assert upgrades(gw, "aborted") == 1
