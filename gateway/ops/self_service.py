"""What an integrator sees of its own usage: ``GET <usage.self_service.prefix>deprecations`` on the public listener,
with its own token, answered by the edge before any route (``edge.serve``), and a ``Link: <...>; rel="deprecation"``
(RFC 9745) to it on the answers to its deprecated calls.

The document is that token's own: its fingerprint's rows of the company the request's Host names, nothing of another
client or company; which deprecated behaviour it still uses, how often, an example of its call, its state, and what
changes for it when (its own schedule: exemptions, brownouts, bridges, ramps, a freeze). Its cost is bounded: an
answer is kept for a minute per client (at most ``_CACHED`` clients), identical requests share one read, and at most
``_READING`` reads run at once (more: ``503``), each one an indexed lookup on the ledger's reader thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import hdrs
from cachetools import TTLCache
from multidict import CIMultiDict

from ..config.ledger import ClientNames, ReadinessConfig, SelfServiceConfig
from ..core.exchange import Exchange, Reply
from ..core.reply import internal_error
from ..rollout import Clock, RolloutPlan
from .ledger import Ledger, LedgerUnavailable
from .ledger.readiness import ClientReadiness, LedgerClient, Readiness, build, days_from, plan_changes
from .usage import DAY

__all__ = ("SelfService", "own_document")

log = logging.getLogger("gateway")

_TTL = 60.0
_CACHED = 4096
_READING = 4
_MAX_CHANGES = 20


def own_document(readiness: Readiness, plan: RolloutPlan, tenant: str, client: str) -> dict[str, Any]:
    """One client's view: its behaviours in the window (most urgent first), each with its own changes ahead. The
    operator's name, owner and the internal flag are the operator's, not shown."""
    behaviours = [_own_behaviour(entry, plan, readiness.at) for entry in readiness.clients
                  if entry.tenant == tenant and entry.client == client]
    data = readiness.to_json(top=0)
    return {"client": client, "tenant": tenant, "at": data["at"], "generated": data["generated"],
            "since": data["since"], "quiet_days": readiness.quiet_days, "behaviours": behaviours}


class SelfService:
    """The edge's hook (``edge.serve.OwnView``): the document under ``prefix``, and the ``Link`` on deprecated
    answers."""

    def __init__(self, options: SelfServiceConfig, readiness: ReadinessConfig, ledger: Ledger,
                 plan: Callable[[], RolloutPlan], clock: Clock, names: ClientNames | None = None) -> None:
        self.prefix = options.prefix
        self.document = options.prefix + "deprecations"
        self.link = f'<{self.document}>; rel="deprecation"; type="application/json"'
        self._readiness = readiness
        self._ledger = ledger
        self._plan = plan
        self._clock = clock
        self._names = names or ClientNames(())
        self._cache: TTLCache[tuple[str, str], bytes] = TTLCache(_CACHED, _TTL, timer=time.monotonic)
        self._reading: dict[tuple[str, str], asyncio.Task[bytes]] = {}

    def signal(self, exchange: Exchange, reply: Reply) -> None:
        """A deprecated call's answer (a policy decided, and said ``Deprecation``) to a client with a token: a link
        to its own view."""
        if "Deprecation" in reply.headers and hdrs.AUTHORIZATION in exchange.headers:
            reply.headers.add("Link", self.link)

    async def answer(self, exchange: Exchange) -> Reply:
        try:
            reply = await self._answer(exchange)
        except Exception:
            log.exception("the self-service document failed (request id %s)", exchange.request_id)
            return internal_error(exchange.ensure_request_id())
        if exchange.has_body:
            reply.close_connection = True  # a body nobody reads: the connection cannot carry another request
        return reply

    async def _answer(self, exchange: Exchange) -> Reply:
        rid = exchange.ensure_request_id()
        if exchange.path != self.document:
            return Reply.error(404, "NOT_FOUND", f"the gateway answers {self.document} under {self.prefix}", rid)
        if exchange.method not in ("GET", "HEAD"):
            reply = Reply.error(405, "METHOD_NOT_ALLOWED", f"{self.document} answers GET", rid)
            reply.headers["Allow"] = "GET, HEAD"
            return reply
        client = exchange.client
        if client is None:
            reply = Reply.error(401, "UNAUTHORIZED", "send your own token (the Authorization header you call the API "
                                "with) to see your own usage of deprecated behaviour", rid)
            reply.headers[hdrs.WWW_AUTHENTICATE] = 'Bearer realm="deprecations"'
            return reply
        body = await self._document((exchange.tenant.name, client), rid)
        if isinstance(body, Reply):
            return body
        headers = CIMultiDict({hdrs.CONTENT_TYPE: "application/json", hdrs.CACHE_CONTROL: "private, max-age=60",
                               hdrs.VARY: "Authorization"})
        return Reply(200, headers, body)

    async def _document(self, key: tuple[str, str], rid: str) -> bytes | Reply:
        """The client's document, kept or read; a 503 to retry when the ledger cannot answer now."""
        body = self._cache.get(key)
        if body is not None:
            return body
        try:
            return await self._read(key)
        except LedgerUnavailable as err:
            reply = Reply.error(503, "LEDGER_UNAVAILABLE", str(err), rid)
            reply.headers["Retry-After"] = "30"
        except _Busy:
            reply = Reply.error(503, "BUSY", "too many clients ask for their usage at once: retry in a second", rid)
            reply.headers["Retry-After"] = "1"
        return reply

    async def _read(self, key: tuple[str, str]) -> bytes:
        task = self._reading.get(key)
        if task is None:
            if len(self._reading) >= _READING:
                raise _Busy
            task = self._reading[key] = asyncio.create_task(self._fetch(*key), name="usage-self-service")
            task.add_done_callback(lambda _: self._reading.pop(key, None))
        return await asyncio.shield(task)

    async def _fetch(self, tenant: str, client: str) -> bytes:
        plan, names = self._plan(), self._names
        wall, now = time.time(), self._clock.now().timestamp()
        options = self._readiness
        since = float(int(wall - options.window_days * DAY) // 3600 * 3600)

        def fold(state: list[tuple[Any, ...]], days: list[tuple[Any, ...]]) -> bytes:
            readiness = build(state, days, plan=plan, names=names, wall=wall, now=now,
                              quiet_days=options.quiet_days, window_days=options.window_days)
            return json.dumps(own_document(readiness, plan, tenant, client)).encode()

        body = await self._ledger.readiness(fold, since=since, days_from=days_from(wall), tenant=tenant,
                                            client=client, share=("own", id(plan)))
        self._cache[(tenant, client)] = body
        return body


def _own_behaviour(entry: ClientReadiness, plan: RolloutPlan, at: float) -> dict[str, Any]:
    """One behaviour the client used: its readiness without the operator's fields, and its own changes ahead."""
    shown = entry.to_json()
    for key in ("tenant", "client", "name", "owner", "internal"):
        del shown[key]
    schedule = plan.schedules[entry.tenant][entry.behaviour]
    who = LedgerClient(entry.client, entry.user_agent, entry.first_call)
    _, changes = plan_changes(schedule, who, entry.tenant, at, _MAX_CHANGES)
    shown["changes"] = [change.to_json() for change in changes]
    return shown


class _Busy(Exception):
    pass
