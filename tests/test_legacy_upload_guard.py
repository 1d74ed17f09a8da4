"""The legacy upload guard alone: the multipart sniffer byte by byte, the options, and the middleware with a mocked
request and a recording next handler (no sockets)."""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

import pytest

from gateway.app import ConfigError, parse_config
from gateway.core.exchange import Exchange
from gateway.core.multipart import Ambiguous, Boundary, MalformedValue, form_data_boundary, parse_media_type
from gateway.ops.metrics import Metrics
from gateway.policies import POLICIES
from gateway.policies.legacy_upload_guard import DISABLED_CODE, NAME, Options
from gateway.policies.legacy_upload_guard.multipart_sniffer import MultipartSniffer, Verdict
from tests.gateway_testlib import make_config, multipart_body
from tests.multipart_testlib import FILE, SNIFF_CASES, TEXT, B, part, sniff
from tests.policy_testlib import Terminal, build_policy, config_of, exchange_for, mocked_request


@pytest.mark.parametrize(("name", "body", "verdict", "detail"), SNIFF_CASES, ids=[c[0] for c in SNIFF_CASES])
def test_sniffer_same_answer_however_the_body_is_split(name: str, body: bytes, verdict: Verdict, detail: str) -> None:
    rng = random.Random(name)
    splits = [None, [1] * len(body), [rng.randint(1, 17) for _ in range(len(body))], [len(body) // 2 or 1]]
    for chunks in splits:
        assert sniff(body, chunks=chunks, max_header_bytes=1024) == (verdict, detail), chunks


def test_sniffer_answers_file_as_soon_as_the_part_headers_end() -> None:
    body = multipart_body([TEXT, FILE], B)
    headers_end = body.index(b"\r\n\r\n", body.index(b"files[]")) + 4
    sniffer = MultipartSniffer(Boundary(B.encode(), False))
    assert sniffer.feed(body[: headers_end - 1]) is Verdict.NEED_MORE
    assert sniffer.feed(body[headers_end - 1 : headers_end]) is Verdict.FILE
    assert sniffer.finding is not None and sniffer.finding.index == 1


def test_sniffer_memory_stays_bounded_over_a_long_part() -> None:
    sniffer = MultipartSniffer(Boundary(B.encode(), False))
    sniffer.feed(f"--{B}\r\nContent-Disposition: form-data; name=a\r\n\r\n".encode())
    for _ in range(1000):
        assert sniffer.feed(b"y" * 10_000) is Verdict.NEED_MORE
        assert len(sniffer._buf) <= len(B) + 4
    assert sniffer.feed(f"\r\n--{B}--".encode()) is Verdict.NEED_MORE
    assert sniffer.feed_eof() is Verdict.NO_FILE


def test_quoted_boundary_refuses_the_delimiter_with_quotes() -> None:
    body = multipart_body([TEXT], B).replace(b"hello", f'\r\n--"{B}"'.encode())
    assert sniff(body, quoted=True) == (Verdict.NEED_MORE, "alternate_delimiter")
    assert sniff(body, chunks=[1] * len(body), quoted=True) == (Verdict.NEED_MORE, "alternate_delimiter")
    assert sniff(body, quoted=False) == (Verdict.NO_FILE, "")


@pytest.mark.parametrize(
    ("value", "boundary", "rule"),
    [
        ("multipart/form-data; boundary=abc", b"abc", None),
        (' Multipart/Form-Data ;Boundary="a.b+c-d_e" ; charset=utf-8 ', b"a.b+c-d_e", None),
        ("multipart/form-data; boundary=abc;", b"abc", None),
        ("multipart/mixed; boundary=abc", None, "multipart_subtype"),
        ("multipart/form-data", None, "missing_boundary"),
        ("multipart/form-data; boundary=a; BOUNDARY=a", None, "duplicate_boundary"),
        ("multipart/form-data; boundary=a; x=1; x=2", None, "duplicate_parameter"),
        ("multipart/form-data; boundary*=a", None, "boundary_parameter"),
        # RFC 2046's bchars, quoted: the parsers of tests/differential read them all alike.
        ("multipart/form-data; boundary=\"a b\"", b"a b", None),
        ("multipart/form-data; boundary=\"===============1234567890123456789==\"", b"===============1234567890123456789==", None),
        ("multipart/form-data; boundary=\"'()+_,-./:=?\"", b"'()+_,-./:=?", None),
        ("multipart/form-data; boundary=\"\"", None, "boundary_characters"),
        ("multipart/form-data; boundary=\"ab \"", None, "boundary_characters"),
        ("multipart/form-data; boundary=\"a;b\"", None, "boundary_characters"),
        ("multipart/form-data; boundary=\"a\tb\"", None, "boundary_characters"),
        (f"multipart/form-data; boundary={'b' * 71}", None, "boundary_characters"),
    ],
)
def test_form_data_boundary(value: str, boundary: bytes | None, rule: str | None) -> None:
    try:
        found = form_data_boundary(parse_media_type(value))
    except Ambiguous as err:
        assert err.rule == rule
    else:
        assert rule is None and found.value == boundary


@pytest.mark.parametrize(
    "value", ["", "multipart", "a/b c", "a/b; x", "a/b; x=", 'a/b; x="\\""', "a/b, c/d", "a/b; x = 1", "(c) a/b"]
)
def test_media_type_parser_is_strict(value: str) -> None:
    with pytest.raises(MalformedValue):
        parse_media_type(value)


# --- options ----------------------------------------------------------------------------------------------------


def _config_with(options: dict[str, Any]) -> dict[str, Any]:
    routes = [{"name": "legacy_card_file_upload", "methods": ["PUT"], "paths": ["/cards/{card_id}/files"],
               "chain": [{"legacy_upload_guard": options}]}]  # fmt: skip
    return make_config("http://127.0.0.1:1", routes=routes)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"successor": "/x"}, "routes[0].chain[0].legacy_upload_guard.detect: Field required"),
        ({"detect": "route"}, "routes[0].chain[0].legacy_upload_guard.successor: Field required"),
        ({"detect": "body", "successor": "/x"}, "routes[0].chain[0].legacy_upload_guard.detect: Input should be"),
        ({"detect": "route", "successor": "x y"}, "routes[0].chain[0].legacy_upload_guard.successor: String should match"),
        ({"detect": "route", "successor": "/x", "look_ahead_bytes": 10},
         "routes[0].chain[0].legacy_upload_guard.look_ahead_bytes: Input should be greater than or equal to 65536"),
        ({"detect": "route", "successor": "/x", "look_ahead_bytes": 65536, "max_part_header_bytes": 70000},
         "routes[0].chain[0].legacy_upload_guard: max_part_header_bytes must not exceed look_ahead_bytes"),
        ({"detect": "route", "successor": "/x", "file_fields": ["a b"]},
         "routes[0].chain[0].legacy_upload_guard.file_fields: invalid field names"),
        ({"detect": "route", "successor": "/x", "deprecated_since": "soon"},
         "routes[0].chain[0].legacy_upload_guard.deprecated_since"),
        ({"detect": "route", "successor": "/x", "linger_seconds": -1},
         "routes[0].chain[0].legacy_upload_guard.linger_seconds: Input should be greater than or equal to 0"),
        ({"detect": "route", "successor": "/x", "surprise": 1},
         "routes[0].chain[0].legacy_upload_guard.surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_options_stop_start_up_with_their_path(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config_with(options), "test")
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_good_options_and_defaults() -> None:
    loaded = parse_config(_config_with({"detect": "route", "successor": "/api/v1/cards/{card_id}/files"}), "test")
    ((_, request_id), (name, options)) = loaded.chains["legacy_card_file_upload"]
    assert name == NAME and isinstance(options, Options)
    assert options.look_ahead_bytes == 1 << 20
    assert options.deprecated_since == dt.date(2026, 5, 21)
    assert POLICIES[NAME].options is Options


# --- the policy alone ------------------------------------------------------------------------------------------


def _guard(metrics: Metrics, route: str = "legacy_comment_update", **options: Any) -> Any:
    options = {"detect": "file_parts", "successor": "/api/v1/cards/{card_id}/comments/{comment_id}/files", **options}
    config = config_of(make_config("http://127.0.0.1:1", routes=[
        {"name": route, "methods": ["PATCH", "PUT"], "paths": ["/cards/{card_id}/comments/{comment_id}"],
         "chain": [{"legacy_upload_guard": options}]}]))  # fmt: skip
    return build_policy(config, route, NAME, "2026-07-01T00:00:00+00:00", metrics), config


def _exchange(config: Any, body: bytes | None, headers: list[tuple[str, str]], *, forbid: bool = True,
              method: str = "PATCH", eof: bool = True) -> Exchange:
    # acme (created 2026-06-01) has the forbid setting on from the start; oldco (2025) has it off: the rollout plan's
    # production decision, not a stand-in.
    request = mocked_request(method, "/api/v1/cards/7/comments/9", headers, body, eof=eof)
    return exchange_for(config, request, "legacy_comment_update", {"card_id": "7", "comment_id": "9"},
                        tenant="acme" if forbid else "oldco", request_id="rid-1")


def _uploads(metrics: Metrics, decision: str) -> float:
    tenant = "oldco" if decision == "allowed" else "acme"  # the forbidding company, or the one that allows
    labels = {"tenant": tenant, "route": "legacy_comment_update", "decision": decision}
    return metrics.registry.get_sample_value("gateway_legacy_uploads_total", labels) or 0.0


MP = [("Content-Type", f"multipart/form-data; boundary={B}")]


async def test_file_part_is_blocked_and_never_forwarded() -> None:
    metrics = Metrics()
    (guard, config), core = _guard(metrics), Terminal()
    exchange = _exchange(config, multipart_body([TEXT, FILE], B), MP)
    reply = await guard(exchange, core)
    assert core.forwarded == 0
    assert reply.status == 403
    assert reply.headers["Content-Type"].startswith("application/json")
    assert json.loads(await reply.read(1 << 20)) == {
        "code": DISABLED_CODE,
        "message": "Uploading files outside restricted file access is disabled for the public API by company settings.",
        "request_id": "rid-1",
        "replacement": "POST /api/v1/cards/7/comments/9/files",
    }
    assert reply.headers["Deprecation"] == "@1779321600"
    assert reply.headers["Link"] == '</api/v1/cards/7/comments/9/files>; rel="successor-version"'
    assert exchange.decisions == {NAME: "blocked"}
    assert _uploads(metrics, "blocked") == 1


async def test_text_only_body_is_forwarded_exactly() -> None:
    (guard, config), core = _guard(Metrics()), Terminal()
    body = multipart_body([TEXT, TEXT], B)
    exchange = _exchange(config, body, MP)
    reply = await guard(exchange, core)
    assert reply.status == 200 and core.forwarded == 1
    assert core.body == body
    assert exchange.decisions == {NAME: "passed"}
    assert "Deprecation" not in reply.headers


@pytest.mark.parametrize(
    "headers",
    [[("Content-Type", "application/json")], [], [("Content-Type", "application/json"), ("Content-Encoding", "gzip")]],
)
async def test_non_multipart_bodies_are_not_read(headers: list[tuple[str, str]]) -> None:
    (guard, config), core = _guard(Metrics()), Terminal()
    exchange = _exchange(config, b'{"text": "x"}', headers)
    await guard(exchange, core)
    assert core.forwarded == 1 and exchange.body.filters == [] and core.body == b'{"text": "x"}'


async def test_ambiguous_body_is_refused() -> None:
    metrics = Metrics()
    (guard, config), core = _guard(metrics), Terminal()
    exchange = _exchange(config, multipart_body([TEXT], B).replace(b"\r\n", b"\n"), MP)
    reply = await guard(exchange, core)
    assert core.forwarded == 0 and reply.status == 400
    assert exchange.decisions == {NAME: "refused"}
    assert exchange.notes[f"{NAME}.rule"] == "line_endings"
    assert _uploads(metrics, "refused") == 1


async def test_look_ahead_bound_is_enforced() -> None:
    (guard, config), core = _guard(Metrics(), look_ahead_bytes=65536, max_part_header_bytes=1024), Terminal()
    body = multipart_body([(TEXT[0], b"t" * 100_000), FILE], B)
    exchange = _exchange(config, body, MP)
    reply = await guard(exchange, core)
    assert core.forwarded == 0 and reply.status == 413


async def test_expect_continue_is_sent_before_reading_part_headers() -> None:
    (guard, config), core = _guard(Metrics()), Terminal()
    exchange = _exchange(config, multipart_body([TEXT], B), [*MP, ("Expect", "100-continue")])
    await guard(exchange, core)
    exchange.request.writer.write.assert_awaited_once_with(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[attr-defined]


async def test_route_detection_never_sends_continue_nor_reads() -> None:
    (guard, config), core = _guard(Metrics(), detect="route"), Terminal()
    exchange = _exchange(config, b"x" * 1000, [*MP, ("Expect", "100-continue")], method="PUT", eof=False)
    reply = await guard(exchange, core)
    assert reply.status == 403 and core.calls == 0
    exchange.request.writer.write.assert_not_awaited()  # type: ignore[attr-defined]
    assert exchange.request.content.read_nowait() == b"x" * 1000  # not a byte was read
    assert reply.linger is not None  # the body is still coming: the core lingers, then closes the connection


async def test_route_detection_passes_a_bodyless_request() -> None:
    (guard, config), core = _guard(Metrics(), detect="route"), Terminal()
    exchange = _exchange(config, None, [], method="PUT")
    reply = await guard(exchange, core)
    assert reply.status == 200 and exchange.decisions == {NAME: "passed"}


async def test_forbid_off_passes_uploads_and_marks_them_deprecated() -> None:
    metrics = Metrics()
    (guard, config), core = _guard(metrics, deprecated_since="2027-01-01T12:00:00+01:00"), Terminal()
    body = multipart_body([TEXT, FILE], B)
    exchange = _exchange(config, body, MP, forbid=False)
    reply = await guard(exchange, core)
    assert reply.status == 200 and core.body == body
    assert reply.headers["Deprecation"] == f"@{int(dt.datetime(2027, 1, 1, 11, tzinfo=dt.UTC).timestamp())}"
    assert exchange.decisions == {NAME: "allowed"}
    assert _uploads(metrics, "allowed") == 1


async def test_forbid_off_text_comment_is_not_counted() -> None:
    metrics = Metrics()
    (guard, config), core = _guard(metrics), Terminal()
    exchange = _exchange(config, multipart_body([TEXT], B), MP, forbid=False)
    reply = await guard(exchange, core)
    assert "Deprecation" not in reply.headers
    assert exchange.decisions == {NAME: "passed"}
    assert _uploads(metrics, "allowed") == 0


async def test_a_stalled_body_is_refused_after_the_read_timeout() -> None:
    (guard, config), core = _guard(Metrics(), body_read_timeout=0.05), Terminal()
    exchange = _exchange(config, multipart_body([TEXT], B)[:20], MP, eof=False)
    reply = await guard(exchange, core)
    assert core.forwarded == 0 and reply.status == 408
    assert exchange.notes[f"{NAME}.rule"] == "body_timeout"


async def test_a_file_part_after_an_ambiguous_part_gets_the_spec_403() -> None:
    (guard, config), core = _guard(Metrics()), Terminal()
    body = multipart_body([part("Content-Disposition: formdata; name=a"), FILE], B)
    exchange = _exchange(config, body, MP)
    reply = await guard(exchange, core)
    assert core.forwarded == 0 and reply.status == 403
    assert json.loads(await reply.read(1 << 20))["code"] == DISABLED_CODE
    assert exchange.decisions == {NAME: "blocked"}


async def test_an_ambiguous_body_past_the_look_ahead_is_refused_for_its_rule() -> None:
    (guard, config), core = _guard(Metrics(), look_ahead_bytes=65536, max_part_header_bytes=1024), Terminal()
    body = multipart_body([part("Content-Disposition: formdata; name=a", content=b"t" * 100_000), FILE], B)
    exchange = _exchange(config, body, MP)
    reply = await guard(exchange, core)
    assert core.forwarded == 0 and reply.status == 400
    assert exchange.notes[f"{NAME}.rule"] == "disposition_type"
