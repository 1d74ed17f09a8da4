"""Every use the gateway makes of aiohttp's private or undocumented API, why, and a check of each at import.

aiohttp is pinned in requirements.lock. A version that moves one of these pieces stops the gateway at import with a
message naming it, instead of misbehaving at run time. Nothing else in the gateway reaches under aiohttp's public API.

| piece | used in | why |
|---|---|---|
| ``ClientRequest(...)``, ``ClientRequest.send(conn)``, ``ClientResponse.start(conn)`` | ``proxy/upstream.py`` | one road for every proxied request, with and without a body, without ``ClientSession.request``'s per-call machinery (redirects, cookies, traces, proxies, middlewares: more CPU than the rest of a small request) and its header merging, which folds header lines that differ only in case |
| ``ClientRequest.update_headers``, ``update_auto_headers`` (overridden) | ``proxy/upstream.py`` | the upstream is sent the headers as the proxy core built them, with none added |
| ``BaseConnector.connect(req, traces=, timeout=)``, ``ResponseHandler.set_response_params(...)`` | ``proxy/upstream.py`` | a pooled connection and the response parser's limits, as ``ClientSession._request`` sets them |
| ``aiohttp.helpers.TimerNoop`` | ``proxy/upstream.py`` | no total timeout per request: the timeouts are per connect and per read |
| ``web_protocol.RequestHandler`` (subclassed): ``_make_error_handler(err_info)``, ``_manager``; ``web.Server.__call__``, ``_loop``, ``_kwargs`` | ``server/listener.py`` | a request the HTTP parser rejects goes through the gateway's own edge like every other: a JSON answer whose text never quotes the request's bytes, and exactly one access-log record |
| ``web.StreamResponse(_real_headers=)``, ``StreamResponse._send_headers_immediately`` (a class attribute overridden), ``aiohttp.helpers.must_be_empty_body`` | ``server/writer.py`` | the reply's headers handed over without a copy, and a body in hand sent with its head in one write (what ``web.Response`` does, without its per-response handling of text, charsets and compression): part of what keeps small requests as cheap as a minimal aiohttp proxy |
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import aiohttp
from aiohttp import client_proto, connector, helpers, web, web_protocol, web_server

__all__ = ("check",)


def _has_parameters(func: object, *names: str) -> bool:
    try:
        parameters = inspect.signature(func).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


_CHECKS: tuple[tuple[str, Callable[[], bool]], ...] = (
    ("aiohttp.ClientRequest(method, url, headers=, data=, loop=, timer=, session=, version=)",
     lambda: _has_parameters(aiohttp.ClientRequest, "method", "url", "headers", "data", "loop", "timer", "session",
                             "version")),
    ("aiohttp.ClientRequest.send(conn)", lambda: _has_parameters(aiohttp.ClientRequest.send, "conn")),
    ("aiohttp.ClientRequest.update_headers(headers)",
     lambda: _has_parameters(aiohttp.ClientRequest.update_headers, "headers")),
    ("aiohttp.ClientRequest.update_auto_headers(skip_auto_headers)",
     lambda: _has_parameters(aiohttp.ClientRequest.update_auto_headers, "skip_auto_headers")),
    ("aiohttp.ClientResponse.start(connection)", lambda: _has_parameters(aiohttp.ClientResponse.start, "connection")),
    ("aiohttp.connector.BaseConnector.connect(req, traces, timeout)",
     lambda: _has_parameters(connector.BaseConnector.connect, "req", "traces", "timeout")),
    ("aiohttp.client_proto.ResponseHandler.set_response_params(timer=, skip_payload=, read_until_eof=, "
     "auto_decompress=, read_timeout=, read_bufsize=, timeout_ceil_threshold=, max_line_size=, max_field_size=, "
     "max_headers=)",
     lambda: _has_parameters(client_proto.ResponseHandler.set_response_params, "timer", "skip_payload",
                             "read_until_eof", "auto_decompress", "read_timeout", "read_bufsize",
                             "timeout_ceil_threshold", "max_line_size", "max_field_size", "max_headers")),
    ("aiohttp.helpers.TimerNoop", lambda: isinstance(getattr(helpers, "TimerNoop", None), type)),
    ("aiohttp.web_protocol.RequestHandler._make_error_handler(err_info)",
     lambda: _has_parameters(getattr(web_protocol.RequestHandler, "_make_error_handler", None), "err_info")),
    ("aiohttp.web_protocol.RequestHandler._manager", lambda: "_manager" in web_protocol.RequestHandler.__slots__),
    ("aiohttp.web_protocol._ErrInfo(status, exc, message)",
     lambda: {"status", "exc", "message"} <= set(getattr(getattr(web_protocol, "_ErrInfo", None), "__annotations__", ()))),
    ("aiohttp.web.StreamResponse(_real_headers=)",
     lambda: _has_parameters(web.StreamResponse.__init__, "_real_headers")),
    ("aiohttp.web.StreamResponse._send_headers_immediately",
     lambda: isinstance(getattr(web.StreamResponse, "_send_headers_immediately", None), bool)),
    ("aiohttp.helpers.must_be_empty_body(method, code)",
     lambda: _has_parameters(getattr(helpers, "must_be_empty_body", None), "method", "code")),
    ("aiohttp.web.Server._loop, ._kwargs, __call__() -> RequestHandler",
     lambda: "self._kwargs" in inspect.getsource(web_server.Server.__init__)
     and "self._loop" in inspect.getsource(web_server.Server.__init__)
     and callable(getattr(web.Server, "__call__", None))),
)


def check() -> None:
    """Raise RuntimeError naming every piece above that this aiohttp does not have as the gateway uses it."""
    missing = [name for name, present in _CHECKS if not present()]
    if missing:
        raise RuntimeError(
            f"aiohttp {aiohttp.__version__} lacks private API the gateway relies on (see gateway/server/"
            "aiohttp_private.py; install the version pinned in requirements.lock): " + "; ".join(missing)
        )


check()
