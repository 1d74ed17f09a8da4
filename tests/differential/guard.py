"""The guard's real decision on a body, in-process: the legacy_upload_guard policy of the comment update route (or of
another guarded route of ``ROUTES``), built
from the test config as the gateway builds it, with tests/policy_testlib.py's stand-in for the proxy core (which runs
the request-body filter with the core's own pipeline). Tenant ``acme`` has the forbid setting on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import StreamReader, web

from gateway.core.exchange import Policy
from gateway.ops.metrics import Metrics
from gateway.policies.legacy_upload_guard import DISABLED_CODE, NAME
from gateway.core.multipart import Ambiguous, MalformedValue, form_data_boundary, parse_media_type
from gateway.policies.legacy_upload_guard.multipart_sniffer import MultipartSniffer
from tests.gateway_testlib import guarded_routes, make_config
from tests.differential.parsers import Protocol as _Protocol
from tests.policy_testlib import Terminal, build_policy, config_of, exchange_for, mocked_request

__all__ = ("Decision", "Guard")

ROUTE = "legacy_comment_update"
TARGET = "/api/v1/cards/7/comments/9"
# The route each decision is asked of: (route, method, target, path parameters). Besides the comment update: a
# restricted upload route's path with the card's number where its uid belongs (a legacy upload, config/gateway.yaml).
ROUTES = {
    "legacy_comment_update": ("PATCH", TARGET, {"card_id": "7", "comment_id": "9"}),
    "legacy_id_card_file_upload": ("POST", "/api/v1/cards/7/files", {"card_id": "7"}),
}


@dataclass(frozen=True, slots=True)
class Decision:
    status: int
    code: str | None  # the JSON code of a gateway answer
    rule: str | None  # the refusal rule
    forwarded: bool
    exact: bool  # forwarded byte for byte

    @property
    def blocked(self) -> bool:
        return self.status == 403 and self.code == DISABLED_CODE

    @property
    def label(self) -> str:
        if self.forwarded:
            return "forwarded" if self.exact else "forwarded ALTERED"
        return "403" if self.blocked else f"{self.status} {self.rule}"


class Guard:
    def __init__(self, route: str = ROUTE) -> None:
        config = config_of(make_config("http://127.0.0.1:1", routes=guarded_routes()))
        self._config = config
        self._route = route
        self._method, self._target, self._params = ROUTES[route]
        self._policy: Policy = build_policy(config, route, NAME, "2026-07-01T00:00:00+00:00", Metrics())
        options = dict(config.chains[route])[NAME]
        self._file_fields = options.file_fields
        self._max_header_bytes = options.max_part_header_bytes
        self._look_ahead = options.look_ahead_bytes
        self._template: web.BaseRequest | None = None
        self._clones = 0

    async def decide(self, ct: str, body: bytes, chunks: Sequence[int] = ()) -> Decision:
        """The answer to the route's request (``PATCH`` of a comment by default) with this body; ``chunks``: the sizes
        it arrives in (all at once by default), each delivered after the guard has read the one before."""
        first = body[: chunks[0]] if chunks else body
        request = self._request(ct, first, eof=not chunks)
        exchange = exchange_for(self._config, request, self._route, dict(self._params), request_id="r")
        feeder = asyncio.create_task(self._trickle(request.content, body, chunks)) if chunks else None
        core = Terminal()
        try:
            reply = await self._policy(exchange, core)
        finally:
            if feeder is not None:
                feeder.cancel()
        answer = json.loads(await reply.read(1 << 16)) if core.forwarded == 0 else {}
        return Decision(reply.status, answer.get("code"), answer.get("rule"), core.forwarded > 0, core.body == body)

    def _request(self, ct: str, first: bytes, eof: bool) -> web.BaseRequest:
        # mocked_request makes a dozen mocks per call (5 ms): one is made, then cloned with each body's headers and
        # stream (BaseRequest.clone keeps the stream it was made with, hence the private attribute). Its mocks record
        # every call made on them, so a new one is made now and then.
        if self._template is None or self._clones >= 1000:
            self._template = mocked_request(self._method, self._target, [], b"")
            self._clones = 0
        self._clones += 1
        request = self._template.clone(headers={"Content-Type": ct})
        stream = StreamReader(_Protocol(asyncio.get_running_loop()), 2**16, loop=asyncio.get_running_loop())
        stream.feed_data(first)
        if eof:
            stream.feed_eof()
        request._payload = stream
        return request

    @staticmethod
    async def _trickle(content: object, body: bytes, chunks: Sequence[int]) -> None:
        pos = chunks[0]
        for size in chunks[1:]:
            await asyncio.sleep(0)
            content.feed_data(body[pos : pos + size])  # type: ignore[attr-defined]
            pos += size
        await asyncio.sleep(0)
        if pos < len(body):
            content.feed_data(body[pos:])  # type: ignore[attr-defined]
        content.feed_eof()  # type: ignore[attr-defined]

    def finding(self, ct: str, body: bytes) -> str | None:
        """Why the guard's own reader takes a part of this body for a file part (whatever else it finds wrong with
        the body), or None."""
        try:
            boundary = form_data_boundary(parse_media_type(ct))
        except (Ambiguous, MalformedValue):
            return None
        sniffer = MultipartSniffer(boundary, max_header_bytes=self._max_header_bytes, file_fields=self._file_fields)
        try:
            sniffer.feed(body[: self._look_ahead])
        except Ambiguous:
            pass
        return sniffer.finding.reason if sniffer.finding is not None else None
