"""The edge's classification alone (gateway/edge/classify.py), with mocked requests: each refusal before routing, its
status and code, and what an accepted request is classified as. The same refusals through a socket are in
tests/adversarial/test_protocol_edges.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import http_exceptions
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core.exchange import Exchange
from gateway.edge.classify import EdgeRefusal, classify, parser_error_text
from gateway.edge.route_table import RouteTable
from gateway.edge.tenancy import TenantResolver
from gateway.policies import POLICIES
from tests.gateway_testlib import guarded_routes, make_config
from tests.policy_testlib import config_of, mocked_request

CONFIG = config_of(make_config("http://127.0.0.1:1", routes=guarded_routes()))
TENANTS = TenantResolver.of(CONFIG)
ROUTES = RouteTable.of(CONFIG, POLICIES)


@dataclass(frozen=True)
class _State:
    tenants: TenantResolver = TENANTS
    routes: RouteTable = ROUTES
    body_timeout: float = 60.0
    look_ahead: int = 1 << 20


def _classify(method: str, target: str, headers: list[tuple[str, str]]) -> Exchange | EdgeRefusal:
    return _exchange(classify(mocked_request(method, target, headers), 0.0, _State(), services=object()))  # type: ignore[arg-type]


def _exchange(found: tuple[Exchange, Any] | EdgeRefusal) -> Exchange | EdgeRefusal:
    return found if isinstance(found, EdgeRefusal) else found[0]


async def _refusal(method: str, target: str, headers: list[tuple[str, str]]) -> tuple[int, str]:
    found = _classify(method, target, headers)
    assert isinstance(found, EdgeRefusal), found
    assert found.reply.close_connection
    body = json.loads(await found.reply.read(1 << 16))
    assert body["code"] == found.code and body["request_id"] == found.request_id
    return found.reply.status, found.code


@pytest.mark.parametrize(("method", "target", "headers", "status", "code"), [
    ("GET", "/api/v1/boards/1", [("Host", "127.0.0.1"), ("Host", "old.test")], 400, "BAD_HOST"),
    ("POST", "/api/v1/cards/1/comments", [("Host", "127.0.0.1"), ("Transfer-Encoding", "gzip, chunked")], 400,
     "BAD_TRANSFER_ENCODING"),
    ("GET", "http://other.test/api/v1/boards/1", [("Host", "127.0.0.1")], 400, "BAD_REQUEST_TARGET"),
    ("GET", "/api/v1/boards/1", [("Host", "nobody.test")], 421, "UNKNOWN_HOST"),
    ("POST", "/api/v1/cards/1/files", [("Host", "127.0.0.1"), ("X-HTTP-Method-Override", "PUT"),
                                       ("X-HTTP-Method", "PATCH")], 400, "AMBIGUOUS_METHOD"),
])
async def test_a_request_that_cannot_be_classified_safely_is_refused_before_routing(
    method: str, target: str, headers: list[tuple[str, str]], status: int, code: str
) -> None:
    assert await _refusal(method, target, headers) == (status, code)


def test_a_request_is_classified_by_tenant_canonical_path_effective_method_and_route() -> None:
    found = _classify("POST", "/api/v1/./cards/7/files?x=1", [("Host", "OLD.test:80"), ("X-HTTP-Method-Override", "PUT")])
    assert isinstance(found, Exchange)
    assert (found.tenant.name, found.path, found.query, found.method) == ("oldco", "/api/v1/cards/7/files", "x=1", "PUT")
    assert (found.route.name, found.params) == ("legacy_card_file_upload", {"card_id": "7"})
    assert found.route.guarded and "legacy_upload_guard" in found.route.policies


async def test_a_header_value_that_is_not_utf8_is_refused_not_altered() -> None:
    """aiohttp reads obs-text into a string it can only write back changed: such a request is refused. (Its value as
    aiohttp's parser decodes it: UTF-8 with surrogate escapes, so a value is ASCII exactly when its bytes are.)"""
    request = mocked_request("GET", "/api/v1/boards/1", [("Host", "127.0.0.1"), ("X-Name", "cafe")])
    message = request._message
    request._message = message._replace(raw_headers=((b"Host", b"127.0.0.1"), (b"X-Name", b"caf\xe9")))
    request._headers = CIMultiDictProxy(CIMultiDict([("Host", "127.0.0.1"), ("X-Name", "caf\udce9")]))
    found = _exchange(classify(request, 0.0, _State(), services=object()))  # type: ignore[arg-type]
    assert isinstance(found, EdgeRefusal) and (found.reply.status, found.code) == (400, "BAD_HEADER")


def test_a_request_no_route_names_goes_to_the_catch_all() -> None:
    found = _classify("DELETE", "/api/v1/boards/1", [("Host", "acme.test")])
    assert isinstance(found, Exchange) and found.route is ROUTES.catch_all and found.params == {}
    assert not found.route.guarded


@pytest.mark.parametrize(("error", "text"), [
    (http_exceptions.LineTooLong("Authorization: Bearer secret-token", "8190"), "a request line or header is too long"),
    (http_exceptions.BadHttpMethod("G\x01T /?sig=secret"), "the request method is not valid"),
    (http_exceptions.InvalidHeader("X: secret-token"), "a header is not valid"),
    (ValueError("secret-token"), "the request is not valid HTTP/1.1"),
    (None, "the request is not valid HTTP/1.1"),
])
async def test_a_parser_error_is_named_by_its_kind_never_by_its_text(error: Any, text: str) -> None:
    assert parser_error_text(error) == text
    refusal = EdgeRefusal.unparsed(400, error)
    assert (refusal.reply.status, refusal.code) == (400, "MALFORMED_REQUEST")
    body = json.loads(await refusal.reply.read(1 << 16))
    assert body["code"] == "MALFORMED_REQUEST" and body["message"] == text


@pytest.mark.parametrize(("status", "code"), [(413, "REQUEST_TOO_LARGE"), (431, "HEADERS_TOO_LARGE"),
                                              (405, "BAD_REQUEST"), (500, "INTERNAL_ERROR")])
def test_a_parser_status_keeps_its_status_and_gets_its_code(status: int, code: str) -> None:
    refusal = EdgeRefusal.unparsed(status, None)
    assert (refusal.reply.status, refusal.code) == (status, code)
