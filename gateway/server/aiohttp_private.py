"""Every use the gateway makes of aiohttp's private or undocumented API, checked at import: a version that moves one
of these pieces stops the gateway at start with a message naming it, instead of misbehaving at run time. The list,
where each piece is used and why: docs/architecture.md ("aiohttp's private pieces")."""

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
    ("aiohttp.connector.BaseConnector._factory (makes each connection's ResponseHandler)",
     lambda: "self._factory = functools.partial(ResponseHandler, loop=loop)" in inspect.getsource(
         connector.BaseConnector.__init__)),
    ("aiohttp.client_proto.ResponseHandler._reschedule_timeout(), _drop_timeout(), _on_read_timeout(), "
     "._read_timeout",
     lambda: all(callable(getattr(client_proto.ResponseHandler, name, None))
                 for name in ("_reschedule_timeout", "_drop_timeout", "_on_read_timeout"))
     and "self._read_timeout" in inspect.getsource(client_proto.ResponseHandler.__init__)),
    ("aiohttp.connector.BaseConnector._conns, ._acquired, ._acquired_per_host, ._limit_per_host, "
     "._keepalive_timeout (its pool of kept-alive connections and what is acquired)",
     lambda: all(f"self.{name} =" in inspect.getsource(connector.BaseConnector.__init__) or
                 f"self.{name}:" in inspect.getsource(connector.BaseConnector.__init__)
                 for name in ("_conns", "_acquired", "_acquired_per_host", "_limit_per_host", "_keepalive_timeout"))),
    ("aiohttp.connector.BaseConnector._release(key, protocol, should_close=)",
     lambda: _has_parameters(getattr(connector.BaseConnector, "_release", None), "key", "protocol", "should_close")),
    ("aiohttp.connector.Connection._protocol",
     lambda: "self._protocol" in inspect.getsource(connector.Connection.__init__)),
    ("aiohttp.ClientRequest.connection_key", lambda: isinstance(getattr(aiohttp.ClientRequest, "connection_key", None),
                                                                property)),
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
    ("aiohttp.web.AppRunner._make_server() -> web.Server, and its .request_handler, .request_factory",
     lambda: inspect.iscoroutinefunction(getattr(web.AppRunner, "_make_server", None))
     and "self.request_handler =" in inspect.getsource(web_server.Server.__init__)
     and "self.request_factory =" in inspect.getsource(web_server.Server.__init__)),
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
