"""An adversarial service for the bridges' tests (and anyone's): a small stand-in for the spec's service that records
every request it gets and whose answers can be made hostile on demand.

It serves, per company (the request's Host, so that several companies can share one upstream as with
``preserve_host``): the board route (without ``cards``, as after 2026-11-01), the paginated card list, the get-card
route (``uid``, ``files``, ``comments`` with theirs), restricted uploads to a card or a comment (one part named
``file``, as the spec says), file metadata and deletion, and comment creates and updates. A token named in
``denied`` gets 403 on a card; no token gets 401.

What can be made hostile:

- **pages** (``Board``): as many cards as wanted, each padded to a size; a first page holding millions of ids
  whatever its limit; a card of another board; bodies that are not JSON, gzip-coded, cut off mid-answer, or slow;
  streamed as they are made, so the test process never holds a huge page;
- **answers after the work is done** (``upload_faults``, ``comment_faults``, consumed in order): the file or comment
  is stored, then its answer is ``cut`` mid-body, ``garbage`` (not JSON), ``dropped`` (the connection closed
  without an answer) or ``slow`` (answered after ``slow_seconds``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.gateway_testlib import Received

__all__ = ("AdversarialUpstream", "Board", "StoredFile", "adversarial")

_CARD = re.compile(r"^/api/(?:v1|latest)/cards/(\d+)$")
_CARD_FILES = re.compile(r"^/api/(?:v1|latest)/cards/([^/]+)/files(?:/([^/]+))?$")
_COMMENT_FILES = re.compile(r"^/api/(?:v1|latest)/cards/([^/]+)/comments/([^/]+)/files(?:/([^/]+))?$")
_COMMENTS = re.compile(r"^/api/(?:v1|latest)/cards/(\d+)/comments(?:/(\d+))?$")
_BOARD = re.compile(r"^/api/(?:v1|latest)/boards/(\d+)$")
_LIST = re.compile(r"^/api/(?:v1|latest)/cards$")


def _now() -> str:
    moment = dt.datetime.now(dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class StoredFile:
    id: str
    name: str
    size: int
    sha256: str
    media: str | None  # the part's Content-Type as the service received it
    entity_type: str
    card_uid: str
    comment_uid: str | None = None
    created: str = field(default_factory=_now)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "type": 11, "name": self.name, "size": str(self.size),
                "mime_type": (self.media or "application/octet-stream").split(";")[0].strip(),
                "entity_type": self.entity_type, "created": self.created, "updated": self.created,
                "card_uid": self.card_uid, "author_uid": "author-1", "card_cover": False,
                "comment_uid": self.comment_uid}


@dataclass
class Comment:
    id: int
    uid: str
    text: str
    files: list[StoredFile] = field(default_factory=list)
    created: str = field(default_factory=_now)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "text": self.text, "created": self.created,
                "files": [f.json() for f in self.files]}


@dataclass
class Card:
    id: int
    uid: str
    board_id: int
    files: list[StoredFile] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "board_id": self.board_id, "title": f"card {self.id}",
                "files": [f.json() for f in self.files], "comments": [c.json() for c in self.comments]}


@dataclass
class Board:
    """What the card list answers for one board."""

    cards: int = 0
    pad: int = 0  # bytes of "description" in each card
    other_board_at: int | None = None  # this card (0-based) says it belongs to another board
    huge_first_page: int = 0  # the first page holds this many {"id": n} whatever the limit
    not_json: bool = False
    gzip: bool = False  # pages are gzip-coded (Content-Encoding: gzip)
    cut: bool = False  # pages are cut off mid-answer
    delay: float = 0.0  # between each piece of a page
    piece: int = 256 << 10
    declare_length: bool = True  # a Content-Length, or chunked


@dataclass
class Company:
    cards: dict[int, Card] = field(default_factory=dict)
    boards: dict[int, Board] = field(default_factory=dict)


class AdversarialUpstream:
    def __init__(self) -> None:
        self.url = ""
        self.port = 0
        self.received: list[Received] = []
        self.companies: dict[str, Company] = {}
        self.denied: set[tuple[str, int]] = set()  # (Authorization, card id): 403
        self.upload_faults: list[str] = []
        self.comment_faults: list[str] = []
        self.slow_seconds = 0.3
        self.comment_ids = iter(range(1000, 10**9))
        self.page_requests = 0
        # Pages made ahead of time (``prepare``): served without making them while a test measures the gateway.
        self.prepared: dict[tuple[str, int, int, int], bytes] = {}

    # --- the company's data -------------------------------------------------------------------------------------

    def company(self, host: str | None) -> tuple[str, Company]:
        name = (host or "default").split(":")[0].split(".")[0]
        return name, self.companies.setdefault(name, Company())

    def card(self, host: str | None, card_id: int, board_id: int = 1) -> Card:
        name, company = self.company(host)
        found = company.cards.get(card_id)
        if found is None:
            found = company.cards[card_id] = Card(card_id, f"uid-{name}-{card_id}", board_id)
        return found

    def files(self, host: str | None, card_id: int) -> list[StoredFile]:
        return self.card(host, card_id).files

    def board(self, host: str | None, board_id: int, spec: Board) -> None:
        self.company(host)[1].boards[board_id] = spec

    def prepare(self, host: str | None, board_id: int, limit: int, offsets: range | list[int]) -> None:
        """Make these pages now, so that serving them costs the test process nothing but the writes."""
        name, company = self.company(host)
        spec = company.boards[board_id]
        for offset in offsets:
            self.prepared[(name, board_id, limit, offset)] = b"".join(_page_pieces(spec, board_id, limit, offset))

    # --- serving ------------------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        self.received.append(Received(request.method, request.raw_path, tuple(request.version),  # type: ignore[arg-type]
                                      list(request.raw_headers), len(body), hashlib.sha256(body).hexdigest(), True,
                                      body[: 1 << 20]))
        host = request.headers.get("Host")
        auth = request.headers.get("Authorization")
        path = request.path
        if _LIST.match(path) and request.method == "GET":
            return await self._page(request, host)
        if (m := _BOARD.match(path)) and request.method in ("GET", "HEAD"):
            return web.json_response({"id": int(m.group(1)), "title": "board", "columns": [], "lanes": [],
                                      "cards_deprecation_message": "Cards are no longer returned."})
        if (m := _CARD.match(path)) and request.method == "GET":
            card_id = int(m.group(1))
            if (denied := self._access(auth, card_id)) is not None:
                return denied
            return web.json_response(self.card(host, card_id).json())
        if (m := _COMMENT_FILES.match(path)) is not None:
            return await self._comment_file(request, host, auth, m, body)
        if (m := _CARD_FILES.match(path)) is not None and not m.group(1).isdigit():
            return await self._card_file(request, host, auth, m, body)
        if (m := _COMMENTS.match(path)) and request.method in ("POST", "PATCH"):
            return await self._comment(request, host, auth, int(m.group(1)), m.group(2), body)
        return web.json_response({"method": request.method, "path": request.raw_path})

    def _access(self, auth: str | None, card_id: int) -> web.Response | None:
        if not auth:
            return web.Response(status=401, text="invalid token")
        if (auth, card_id) in self.denied:
            return web.Response(status=403)
        return None

    def _card_by_uid(self, host: str | None, uid: str) -> Card | None:
        _, company = self.company(host)
        return next((c for c in company.cards.values() if c.uid == uid), None)

    async def _card_file(self, request: web.BaseRequest, host: str | None, auth: str | None, m: re.Match[str],
                         body: bytes) -> web.StreamResponse:
        card = self._card_by_uid(host, m.group(1))
        if card is None:
            return web.Response(status=404)
        if (denied := self._access(auth, card.id)) is not None:
            return denied
        return await self._file_route(request, card.files, card, None, m.group(2), body)

    async def _comment_file(self, request: web.BaseRequest, host: str | None, auth: str | None, m: re.Match[str],
                            body: bytes) -> web.StreamResponse:
        card = self._card_by_uid(host, m.group(1))
        comment = next((c for c in card.comments if c.uid == m.group(2)), None) if card is not None else None
        if card is None or comment is None:
            return web.Response(status=404)
        if (denied := self._access(auth, card.id)) is not None:
            return denied
        return await self._file_route(request, comment.files, card, comment, m.group(3), body)

    async def _file_route(self, request: web.BaseRequest, files: list[StoredFile], card: Card,
                          comment: Comment | None, file_id: str | None, body: bytes) -> web.StreamResponse:
        if file_id is not None:
            found = next((f for f in files if f.id == file_id), None)
            if found is None:
                return web.Response(status=404)
            if request.method == "DELETE":
                files.remove(found)
                return web.Response(status=204)
            return web.json_response({**found.json(), "url": f"https://files.test/signed/{found.id}?sig=x"})
        if request.method != "POST":
            return web.Response(status=405)
        parts = _multipart(request.headers.get("Content-Type", ""), body)
        if parts is None or len(parts) != 1 or parts[0][0].get("name") != "file":
            return web.json_response({"message": "Exactly one form field named file is required"}, status=400)
        meta, content = parts[0]
        stored = StoredFile(str(uuid.uuid4()), meta.get("filename") or "file", len(content),
                            hashlib.sha256(content).hexdigest(), meta.get("content-type"),
                            "comment" if comment is not None else "card", card.uid,
                            comment.uid if comment is not None else None)
        files.append(stored)
        answer = {**stored.json(), "url": f"https://files.test/signed/{stored.id}?sig=x"}
        return await self._after_work(request, answer, self.upload_faults)

    async def _comment(self, request: web.BaseRequest, host: str | None, auth: str | None, card_id: int,
                       comment_id: str | None, body: bytes) -> web.StreamResponse:
        if (denied := self._access(auth, card_id)) is not None:
            return denied
        card = self.card(host, card_id)
        parts = _multipart(request.headers.get("Content-Type", ""), body) or []
        text = next((c.decode() for meta, c in parts if meta.get("name") == "text"), None)
        if comment_id is None:
            n = next(self.comment_ids)
            comment = Comment(n, f"comment-{n}", text or "")
            card.comments.append(comment)
        else:
            found = next((c for c in card.comments if c.id == int(comment_id)), None)
            if found is None:
                return web.Response(status=404)
            comment = found
            if text is not None:
                comment.text = text
        return await self._after_work(request, comment.json(), self.comment_faults)

    async def _after_work(self, request: web.BaseRequest, answer: dict[str, Any], faults: list[str]
                          ) -> web.StreamResponse:
        """The work is done (stored); the answer, as the next fault says."""
        fault = faults.pop(0) if faults else None
        data = json.dumps(answer).encode()
        if fault == "slow":
            await asyncio.sleep(self.slow_seconds)
        if fault == "garbage":
            return web.Response(body=b"<html>upstream trouble</html>", content_type="text/html")
        if fault in ("cut", "dropped"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(data)
            if fault == "dropped":
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.prepare(request)
            await response.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.abort()
            return response
        return web.json_response(answer)

    async def _page(self, request: web.BaseRequest, host: str | None) -> web.StreamResponse:
        self.page_requests += 1
        query = request.query
        board_id, limit, offset = int(query["board_id"]), int(query["limit"]), int(query["offset"])
        name, company = self.company(host)
        spec = company.boards.get(board_id, Board())
        if spec.not_json:
            return web.Response(body=b"<html>not a list</html>", content_type="application/json")
        ready = self.prepared.get((name, board_id, limit, offset))
        pieces = [ready] if ready is not None else (
            list(_page_pieces(spec, board_id, limit, offset)) if spec.declare_length or spec.gzip else None)
        if spec.gzip:
            data = gzip.compress(b"".join(pieces or []))
            return web.Response(body=data, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if pieces is not None:
            response.content_length = sum(map(len, pieces))
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        sent = 0
        for chunk in (pieces if pieces is not None else _page_pieces(spec, board_id, limit, offset)):
            for at in range(0, len(chunk), spec.piece):
                await response.write(chunk[at : at + spec.piece])
                sent += 1
                if spec.cut and sent >= 2:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if spec.delay:
                    await asyncio.sleep(spec.delay)
        await response.write_eof()
        return response


def _page_pieces(spec: Board, board_id: int, limit: int, offset: int) -> Iterator[bytes]:
    """A page's bytes, a card at a time (or 64 KiB of ids at a time for a huge one)."""
    if spec.huge_first_page and offset == 0:
        yield b"["
        for start in range(0, spec.huge_first_page, 8192):
            batch = b", ".join(b'{"id": %d}' % n for n in range(start, min(spec.huge_first_page, start + 8192)))
            yield (b", " if start else b"") + batch
        yield b"]"
        return
    ids = range(offset, min(offset + limit, spec.cards))
    yield b"["
    pad = b"x" * spec.pad
    for i, n in enumerate(ids):
        card_board = board_id + 1 if spec.other_board_at == n else board_id
        card = b'{"id": %d, "board_id": %d, "title": "card %d", "description": "%s"}' % (n + 1, card_board, n + 1, pad)
        yield (b"," if i else b"") + card
    yield b"]"


def _multipart(content_type: str, body: bytes) -> list[tuple[dict[str, str], bytes]] | None:
    """The parts of a simple multipart/form-data body (as the gateway writes them): (headers, content)."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/form-data") or m is None:
        return None
    delimiter = b"--" + m.group(1).encode()
    if not body.startswith(delimiter):
        return None
    out: list[tuple[dict[str, str], bytes]] = []
    for chunk in body[len(delimiter):].split(b"\r\n" + delimiter):
        if chunk.startswith(b"--"):
            break
        head, _, content = chunk[2:].partition(b"\r\n\r\n")
        meta: dict[str, str] = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "content-disposition":
                for key, val in re.findall(r';\s*([\w*]+)="([^"]*)"', value):
                    meta[key] = val
            elif name.lower() == "content-type":
                meta["content-type"] = value.strip()
        out.append((meta, content))
    return out


@pytest.fixture
async def adversarial(aiohttp_raw_server: Any) -> AdversarialUpstream:
    service = AdversarialUpstream()
    server = await aiohttp_raw_server(service.handle, auto_decompress=False)
    service.port = server.port
    service.url = f"http://127.0.0.1:{server.port}"
    return service

