"""The admin listener (its own address, loopback by default): metrics, liveness, readiness, the effective config,
rollout, the usage report, and the status page. Closed by default (``_guard``): every path but /livez and /readyz
needs the admin token (Bearer, Basic, or the session cookie a ``?token=`` visit sets) and a known ``Host``
(docs/operations.md, "Admin listener")."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar
from urllib.parse import quote, unquote, unquote_plus

from aiohttp import hdrs, web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST

from ..config.ledger import ClientNames
from ..core.tenants import canonical_host
from ..rollout import Clock, RolloutPlan, report
from .gc_pauses import paused, quick_handover
from .ledger import DEFAULT_SINCE, Ledger, LedgerUnavailable, Query, check_name, parse_when, window
from .ledger.readiness import build as build_readiness, days_from
from .metrics import Metrics
from .status import CompanyView, ConfigHistory, config_digest, select_companies, shown_config, status_data
from .status_model import StatusData
from .status_page import CONTENT_SECURITY_POLICY, render_main, render_page
from .usage import DAY, HOUR

if TYPE_CHECKING:
    from ..config import LoadedConfig
    from ..config.schema import ServerConfig
    from ..core.route import Route

__all__ = ("COOKIE", "MAX_TOP", "Served", "known_host", "make_admin_app", "readiness", "session_cookie", "usage_query",
           "valid_session")


class ServedRoutes(Protocol):
    @property
    def routes(self) -> tuple[Route, ...]: ...
    @property
    def catch_all(self) -> Route: ...


class ServedState(Protocol):
    @property
    def config(self) -> LoadedConfig: ...
    @property
    def routes(self) -> ServedRoutes: ...
    @property
    def rollout(self) -> RolloutPlan: ...


class Served(Protocol):
    """What the admin listener reads of the gateway it serves (``gateway.app.Gateway``)."""

    metrics: Metrics
    clock: Clock
    ledger: Ledger | None  # None: usage.ledger.enabled is false
    names: ClientNames  # the clients the operator named (usage.clients)
    ready: bool

    @property
    def state(self) -> ServedState: ...


T = TypeVar("T")

_GATEWAY: web.AppKey[Served] = web.AppKey("gateway")
_HISTORY: web.AppKey[ConfigHistory] = web.AppKey("history")

# The most clients /deprecations?top= lists per behaviour: an answer stays under about 1 MB per behaviour (a row is
# at most about 500 bytes of JSON). Every client of a window: `gateway usage --csv`, which reads the database itself.
MAX_TOP = 1000
# The clients the status page lists per behaviour (most recently seen first).
_PAGE_CLIENTS = 50
# How old the status page's usage may be when another page (or a refresh) asked for the same a moment ago and this
# process has counted nothing since: its refresh interval, so that any number of open pages costs one query per 10 s.
_PAGE_FRESH = 10.0


# --- the guard: Host, then the token ---------------------------------------------------------------------------

_ALWAYS_OPEN = frozenset({"/livez", "/readyz"})
# Paths opened (admin_open) under another path's name: the status page's data, its main part, redirect and icon.
_OPENED_AS = {"/status.json": "/status", "/status.main": "/status", "/": "/status", "/favicon.ico": "/status"}
COOKIE = "gateway_admin"
_REALM = 'realm="gateway admin"'
_SESSION = b"gateway admin session v1"


def session_cookie(token: str, *, now: float, lifetime: float) -> str:
    """A login's cookie value, ``<expiry>.<nonce>.<mac>``: its expiry (Unix seconds), a random nonce (every login a
    new value), and a MAC of both under the admin token. Any worker or replica that has the token can check it
    (nothing is kept in memory); a new token revokes every cookie, and the token never shows in it."""
    expires = int(now + lifetime)
    nonce = secrets.token_urlsafe(16)
    return f"{expires}.{nonce}.{_session_mac(token, expires, nonce)}"


def valid_session(value: str, token: str, *, now: float, lifetime: float) -> bool:
    """Whether ``value`` is a cookie ``session_cookie`` made under ``token``, not yet expired (nor set to expire
    later than ``lifetime`` from now, which a shortened lifetime makes true of older cookies)."""
    expiry, _, rest = value.partition(".")
    nonce, _, mac = rest.partition(".")
    if not _session_parts(expiry, nonce, mac):
        return False
    expires = int(expiry)
    if not now < expires <= now + lifetime:
        return False
    return hmac.compare_digest(mac.encode(), _session_mac(token, expires, nonce).encode())


def _session_mac(token: str, expires: int, nonce: str) -> str:
    return hmac.new(token.encode(), b"%s\n%d\n%s" % (_SESSION, expires, nonce.encode()), hashlib.sha256).hexdigest()


def _session_parts(expiry: str, nonce: str, mac: str) -> bool:
    """Whether a cookie's parts have its shape: an expiry of at most 12 digits, ASCII nonce and MAC."""
    return expiry.isascii() and expiry.isdigit() and len(expiry) <= 12 and nonce.isascii() and mac.isascii()


def known_host(host: str | None, names: frozenset[str] | list[str]) -> bool:
    """Whether the admin listener answers a request with this ``Host``: an IP address (a rebinding page can only
    send its own host name), ``localhost``, or a configured name (``*.suffix`` wildcards as for tenants)."""
    if not host:
        return False
    name = canonical_host(host)
    if _is_address(name) or name == "localhost" or name in names:
        return True
    return any(pattern.startswith("*.") and name.endswith(pattern[1:]) for pattern in names)


def _is_address(name: str) -> bool:
    """Whether a canonical host is an IP address (IPv6 in its brackets)."""
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def _error(status: int, code: str, message: str, *challenges: str) -> web.Response:
    headers = CIMultiDict({"Cache-Control": "no-store"})
    for challenge in challenges:  # one header each: browsers read one challenge per WWW-Authenticate line
        headers.add(hdrs.WWW_AUTHENTICATE, challenge)
    return web.json_response({"code": code, "message": message}, status=status, headers=headers)


def _same(given: str, token: str) -> bool:
    """Whether a credential as received is the token, in constant time; any bytes (a header's non-UTF-8 bytes reach
    here as surrogates) compare as unequal, never as an error."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())


def _presented(request: web.Request) -> list[str]:
    """Every credential the request carries in ``Authorization``: a bearer token, a Basic password."""
    found = []
    authorization = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        found.append(value.strip())
    elif scheme.lower() == "basic":
        try:  # ValueError: a bad encoding, or characters that are not ASCII
            found.append(base64.b64decode(value.strip(), validate=True).decode().partition(":")[2])
        except ValueError:
            pass
    return found


def _authorized(request: web.Request, server: ServerConfig, token: str) -> bool:
    if any(_same(given, token) for given in _presented(request)):
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and valid_session(cookie, token, now=time.time(), lifetime=server.admin_login_lifetime)


def _query_tokens(request: web.Request) -> list[str] | None:
    """The ``token`` of the query as it may have been meant, or None when there is none: decoded, and decoded with
    ``+`` kept (a token typed as is: in a query a ``+`` reads as a space, and a token has no space), and as sent."""
    for part in request.rel_url.raw_query_string.split("&"):
        name, sep, value = part.partition("=")
        if sep and unquote_plus(name) == "token":
            return [unquote_plus(value), unquote(value), value]
    return None


def _without_token(request: web.Request) -> str:
    """The page asked for, relative to itself (the listener may sit behind a path prefix), without ``token``: its
    last path segment, percent-encoded but for characters that cannot make it read as a scheme or a host (no ``:``,
    ``/`` or ``\\``), so the browser stays on this listener."""
    query = request.rel_url.without_query_params("token").raw_query_string
    page = quote(request.path.rsplit("/", 1)[-1].encode("utf-8", "surrogatepass"), safe="!$&'()*+,;=@-._~") or "./"
    return page + (f"?{query}" if query else "")


def _unauthorized(config: LoadedConfig) -> web.Response:
    server = config.model.server
    given = config.secrets.reference(server.admin_token) if server.admin_token is not None else None
    where = f" (this gateway reads it from {given})" if given else ""
    return _error(401, "UNAUTHORIZED", f"this admin path needs the admin token, server.admin_token{where}: send "
                  "'Authorization: Bearer <token>' or HTTP Basic with the token as password, or open the page once "
                  "with ?token=<token> in a browser", f"Basic {_REALM}", f"Bearer {_REALM}")


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    if request.path in _ALWAYS_OPEN:
        return await handler(request)  # probes: kubelet and load balancers send no token
    config = request.app[_GATEWAY].state.config
    server = config.model.server
    hosts = request.headers.getall(hdrs.HOST, [])
    if len(hosts) != 1 or not known_host(hosts[0], server.admin_hosts):
        return _error(421, "UNKNOWN_HOST", "the admin listener does not answer for this Host: use its IP address, "
                      "localhost, or a name listed in server.admin_hosts")
    if _OPENED_AS.get(request.path, request.path) in server.admin_open_paths():
        return await handler(request)
    return await _closed(request, handler, config)


async def _closed(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  config: LoadedConfig) -> web.StreamResponse:
    """A path behind the admin token: served with it, a login with ``?token=``, else refused."""
    server = config.model.server
    token = server.admin_token
    if token is None:
        return _error(403, "ADMIN_CLOSED", "server.admin_token is not set: this admin path is closed (only /livez and "
                      "/readyz, and the paths in server.admin_open, are served)")
    given = _query_tokens(request)
    if given is not None:
        return _login(request, given, token, server.admin_login_lifetime)
    if _authorized(request, server, token):
        return await handler(request)
    return _unauthorized(config)


def _login(request: web.Request, given: list[str], token: str, lifetime: float) -> web.Response:
    """A page opened with ``?token=``: 401 unless one reading of it is the admin token; else, once, the token leaves
    the address bar (and the browser's history) for a session cookie."""
    if not any(_same(reading, token) for reading in given):
        return _error(401, "UNAUTHORIZED", "the token is not the admin token")
    response = web.Response(status=303, headers={hdrs.LOCATION: _without_token(request), "Cache-Control": "no-store"})
    response.set_cookie(COOKIE, session_cookie(token, now=time.time(), lifetime=lifetime), max_age=int(lifetime),
                        path="/", httponly=True, samesite="Strict")
    return response


async def _metrics(request: web.Request) -> web.Response:
    # Under --workers: every worker's values, read from the shared directory (any worker may answer). In a thread:
    # the first scrape of a config counts its companies per phase (tens of ms at 10,000), and reading the workers'
    # files is disk work.
    body = await asyncio.to_thread(request.app[_GATEWAY].metrics.scrape)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    ready = request.app[_GATEWAY].ready
    return web.json_response({"status": "ready" if ready else "not ready"}, status=200 if ready else 503)


async def _config(request: web.Request) -> web.Response:
    state = request.app[_GATEWAY].state
    routes = [
        {"name": r.name, "methods": sorted(r.methods) if r.methods else None, "paths": list(r.templates),
         "chain": list(r.policies)}
        for r in [*state.routes.routes, state.routes.catch_all]
    ]

    def answer() -> str:  # at 10,000 companies, about a second of work and 2 MB of JSON: not on the event loop
        return json.dumps({"source": state.config.source, "digest": config_digest(state.config),
                           "config": shown_config(state.config), "routes": routes})

    return web.Response(text=await _off_loop(answer), content_type="application/json")


async def _rollout(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    plan, now = gateway.state.rollout, gateway.clock.now()
    return web.Response(text=await _off_loop(lambda: json.dumps(report(plan, now))), content_type="application/json")


def usage_query(params: Mapping[str, str], *, now: float, tz: dt.tzinfo, top: int = 20,
                order: str = "requests") -> Query:
    """A ledger query from ``since``, ``until`` (30d, 12h, 2w, or an ISO date or time, read in ``tz``; the years 1970
    to 9998), ``tenant``, ``behaviour`` (names), ``top`` and ``order`` (requests, recent); ValueError naming the bad
    one (400, never a query the database would refuse)."""
    since = parse_when(params.get("since") or DEFAULT_SINCE, now, tz)
    until = parse_when(params["until"], now, tz) if params.get("until") else now
    if until <= since:
        raise ValueError("until must be after since")
    text = params.get("top")
    top = top if text is None else _top(text)
    checked = _order(params.get("order", order))
    start, end = window(since, until)
    return Query(start, end, tenant=_name(params, "tenant"), behaviour=_name(params, "behaviour"), top=top,
                 order=checked)


def _order(order: str) -> Literal["requests", "recent"]:
    if order not in ("requests", "recent"):
        raise ValueError("order must be requests or recent")
    return "recent" if order == "recent" else "requests"


def _top(text: str) -> int:
    try:
        top = int(text)
    except ValueError:
        top = 0
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"top must be an integer from 1 to {MAX_TOP}")
    return top


def _name(params: Mapping[str, str], key: str) -> str | None:
    """A ``tenant`` or ``behaviour`` parameter: checked, or None when absent or empty."""
    value = params.get(key) or None
    return value and check_name(value, key)


def _problem(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status)


_LEDGER_OFF = "the usage ledger is off (usage.ledger.enabled: false): no usage is recorded"


async def readiness(gateway: Served, *, tenant: str | None = None, behaviour: str | None = None,
                    top: int | None = 20, ready: bool = True, keys: frozenset[tuple[str, str, str]] = frozenset(),
                    fresh: float = 0.0, flush: bool = True) -> tuple[dict[str, Any], dict[tuple[str, str, str], str]]:
    """Readiness over ``usage.readiness.window_days`` (``ledger.readiness``): its JSON (``top`` clients, the ready ones
    too with ``ready``), and the state of each (tenant, client, behaviour) of ``keys``. Built in the reader thread:
    only these come back. LedgerUnavailable when it cannot be read."""
    assert gateway.ledger is not None
    state = gateway.state
    plan, names, options = state.rollout, gateway.names, state.config.model.usage.readiness
    wall, now = time.time(), gateway.clock.now().timestamp()
    since = float(int(wall - options.window_days * DAY) // HOUR * HOUR)

    def fold(rows: list[tuple[Any, ...]], days: list[tuple[Any, ...]]
             ) -> tuple[dict[str, Any], dict[tuple[str, str, str], str]]:
        built = build_readiness(rows, days, plan=plan, names=names, wall=wall, now=now,
                                quiet_days=options.quiet_days, window_days=options.window_days)
        states: dict[tuple[str, str, str], str] = {
            key: e.state for e in built.clients if (key := (e.tenant, e.client, e.behaviour)) in keys}
        return built.to_json(top, ready=ready), states

    return await gateway.ledger.readiness(fold, since=since, days_from=days_from(wall), tenant=tenant,
                                          behaviour=behaviour, share=(id(plan), top, ready, keys), fresh=fresh,
                                          flush=flush)


def _named(report: dict[str, Any], names: ClientNames, states: dict[tuple[str, str, str], str]) -> dict[str, Any]:
    """The report with each client row's name (the operator's, or None) and readiness state: a copy (identical
    reads share the report)."""
    behaviours = {}
    for behaviour, data in report["behaviours"].items():
        rows = []
        for row in data["top_clients"]:
            named = names.find(row["client"], row["user_agent"])
            rows.append({**row, "name": named.name if named is not None else None,
                         "state": states.get((row["tenant"], row["client"] or "", behaviour))})
        behaviours[behaviour] = {**data, "top_clients": rows}
    return {**report, "behaviours": behaviours}


async def _deprecations(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    try:
        query = usage_query(request.query, now=time.time(), tz=gateway.state.config.model.rollout.tzinfo)
    except ValueError as err:
        return _problem(400, "BAD_QUERY", str(err))
    if gateway.ledger is None:
        return _problem(404, "LEDGER_OFF", _LEDGER_OFF)
    try:
        report = await gateway.ledger.report(query)
        # (The report's read wrote this process's counts: one answer, one snapshot of them.)
        ready, states = await readiness(gateway, tenant=query.tenant, behaviour=query.behaviour, top=query.top,
                                        keys=_listed_keys(report), flush=False)
    except LedgerUnavailable as err:
        return _problem(503, "LEDGER_UNAVAILABLE", str(err))
    return web.json_response({**_named(report, gateway.names, states), "readiness": ready})


def _listed_keys(report: Mapping[str, Any]) -> frozenset[tuple[str, str, str]]:
    """(tenant, client, behaviour) of each client the report lists."""
    return frozenset((row["tenant"], row["client"] or "", behaviour)
                     for behaviour, data in report["behaviours"].items() for row in data["top_clients"])


def _page_query(request: web.Request, wall: float) -> tuple[CompanyView, Query]:
    """The page's companies and window, from its query; ValueError naming a bad parameter (400)."""
    tz = request.app[_GATEWAY].state.config.model.rollout.tzinfo
    return CompanyView.of(request.query), usage_query(request.query, now=wall, tz=tz, top=_PAGE_CLIENTS,
                                                      order="recent")


async def _status_data(request: web.Request, view: CompanyView, query: Query, wall: float) -> StatusData:
    """The page's data: the ledger read first (its reads run in their own thread), then the companies chosen and
    the page built in a thread: at 10,000 companies neither holds the event loop."""
    gateway = request.app[_GATEWAY]
    state = gateway.state
    ledger = gateway.ledger
    usage, ready, problem = await _page_usage(gateway, query)
    plan = state.rollout
    selection = await _off_loop(functools.partial(select_companies, plan, gateway.clock.now().timestamp(), usage,
                                                  view))
    daily: list[tuple[str, str, int, int]] = []
    if ledger is not None and usage is not None:
        daily, problem = await _page_daily(ledger, wall, selection.names, problem)
    return await _off_loop(functools.partial(
        status_data, config=state.config, plan=plan, clock=gateway.clock, history=request.app[_HISTORY],
        usage=usage, daily=daily, ledger=ledger.status() if ledger is not None else None, usage_problem=problem,
        wall=wall, selection=selection, readiness=ready))


async def _page_usage(gateway: Served, query: Query
                      ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
    """The page's usage report and clients to contact, each None with the problem when the ledger is off or down."""
    ledger = gateway.ledger
    if ledger is None:
        return None, None, _LEDGER_OFF
    usage: dict[str, Any] | None = None
    try:
        usage = _named(await ledger.report(query, fresh=_PAGE_FRESH), gateway.names, {})
        # The clients to contact: the most urgent of those that still call.
        ready, _ = await readiness(gateway, top=_PAGE_CLIENTS, ready=False, fresh=_PAGE_FRESH, flush=False)
    except LedgerUnavailable as err:
        return usage, None, str(err)
    return usage, ready, None


async def _page_daily(ledger: Ledger, wall: float, names: list[str], problem: str | None
                      ) -> tuple[list[tuple[str, str, int, int]], str | None]:
    """Requests per day for the charts of the companies shown (everything retention keeps); the page's problem,
    this read's when it fails."""
    try:
        return await ledger.daily(*window(wall - ledger.options.retention_days * 86400, wall),
                                  tenants=frozenset(names), fresh=_PAGE_FRESH), problem
    except LedgerUnavailable as err:
        return [], str(err)


async def _off_loop(work: Callable[[], T]) -> T:
    """``work`` on a thread that gives the GIL up within a millisecond when the event loop asks, with no collection
    inside (which would walk every object of 10,000 companies holding the GIL)."""
    return await asyncio.to_thread(_quietly, work)


def _quietly(work: Callable[[], T]) -> T:
    with paused(), quick_handover():
        return work()


_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


async def _status(request: web.Request) -> web.Response:
    return await _rendered(request, render_page)


async def _status_main(request: web.Request) -> web.Response:
    """The page's main part, as the page's script puts it in place at each refresh (the same renderer)."""
    return await _rendered(request, render_main)


async def _rendered(request: web.Request, render: Callable[[StatusData], str]) -> web.Response:
    """The status page's data for the request's query, rendered off the event loop as HTML."""
    wall = time.time()
    try:
        view, query = _page_query(request, wall)
    except ValueError as err:
        return _problem(400, "BAD_QUERY", str(err))
    text = await _off_loop(functools.partial(render, await _status_data(request, view, query, wall)))
    return web.Response(text=text, content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)


async def _status_json(request: web.Request) -> web.Response:
    wall = time.time()
    try:
        view, query = _page_query(request, wall)
    except ValueError as err:
        return _problem(400, "BAD_QUERY", str(err))
    text = await _off_loop(functools.partial(_dumps, await _status_data(request, view, query, wall)))
    return web.Response(text=text, content_type="application/json", headers={"Cache-Control": "no-store",
                                                                              "X-Content-Type-Options": "nosniff"})


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


async def _root(request: web.Request) -> web.Response:
    raise web.HTTPFound("status")  # relative: the page also works behind a path prefix (kubectl proxy)


async def _favicon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # browsers ask for one; the page has none (and logs no error for it)


def make_admin_app(gateway: Served, *, history: ConfigHistory | None = None) -> web.Application:
    """``history``: the config's load and reload times (``gateway serve`` keeps it; by default, loaded now)."""
    app = web.Application(middlewares=[_guard])
    app[_GATEWAY] = gateway
    app[_HISTORY] = history if history is not None else ConfigHistory()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/config", _config)
    app.router.add_get("/deprecations", _deprecations)
    app.router.add_get("/rollout", _rollout)
    app.router.add_get("/status", _status)
    app.router.add_get("/status.json", _status_json)
    app.router.add_get("/status.main", _status_main)
    app.router.add_get("/", _root)
    app.router.add_get("/favicon.ico", _favicon)
    return app
