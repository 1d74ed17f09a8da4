"""core/aiohttp_fast.py, aiohttp behind one door: each fast path detected by feature (a piece taken away turns its path
off), forced off by GATEWAY_AIOHTTP_FAST_PATHS, described in one line; with a path off, its public fallback is the
one used (tests/integration/test_fast_paths.py: the same bytes on every road)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import client_proto, web
from multidict import CIMultiDict

from gateway.core import aiohttp_fast
from gateway.core.aiohttp_fast import ENV, PATHS, check, decide, describe

ROOT = Path(__file__).resolve().parent.parent
LOCKED = next(line.partition("==")[2] for line in (ROOT / "requirements.lock").read_text().splitlines()
              if line.startswith("aiohttp=="))


def test_every_fast_path_is_on_unless_forced_off() -> None:
    for setting in ({}, {ENV: ""}, {ENV: "on"}):
        fast = decide(setting, {})
        assert fast.off == {} and fast.problem is None
        assert all(getattr(fast, name) for name in PATHS)
    fast = decide({ENV: "off"}, {})
    assert fast.off == dict.fromkeys(PATHS, f"forced off by {ENV}")
    assert not any(getattr(fast, name) for name in PATHS)


def test_a_list_keeps_the_paths_it_names_and_a_path_is_off_when_one_it_needs_is() -> None:
    fast = decide({ENV: " reply_headers , upstream_protocol"}, {})
    assert [name for name in PATHS if getattr(fast, name)] == ["upstream_protocol", "reply_headers"]
    fast = decide({ENV: "upstream_bodyless"}, {})
    assert not fast.upstream_bodyless and fast.off["upstream_bodyless"] == "needs upstream_request"
    fast = decide({ENV: "upstream_body_into"}, {})
    assert fast.off["upstream_body_into"] == "needs upstream_bodyless, upstream_protocol"
    fast = decide({ENV: "upstream_request,upstream_bodyless,upstream_body_into"}, {})
    assert not fast.upstream_body_into and fast.off["upstream_body_into"] == "needs upstream_protocol"


def test_a_missing_piece_turns_its_path_off_whatever_the_setting() -> None:
    fast = decide({ENV: "on"}, {"upstream_request": "ClientRequest.send(conn)"})
    assert fast.off == {"upstream_request": "missing: ClientRequest.send(conn)",
                        "upstream_bodyless": "needs upstream_request",
                        "upstream_body_into": "needs upstream_bodyless"}
    assert fast.upstream_protocol and fast.reply_headers and fast.reply_one_write


def test_the_start_up_line_says_which_are_on_and_why_the_others_are_off() -> None:
    assert describe(decide({}, {})) == (
        f"aiohttp {aiohttp.__version__} fast paths on: upstream_request, upstream_bodyless, upstream_protocol, "
        "upstream_body_into, reply_headers, reply_one_write; off: none")
    line = describe(decide({ENV: "upstream_request"}, {"reply_headers": "StreamResponse(_real_headers=)"}))
    assert line.endswith(
        "fast paths on: upstream_request; off: upstream_bodyless (forced off by GATEWAY_AIOHTTP_FAST_PATHS), "
        "upstream_protocol (forced off by GATEWAY_AIOHTTP_FAST_PATHS), upstream_body_into (forced off by "
        "GATEWAY_AIOHTTP_FAST_PATHS), reply_headers (missing: "
        "StreamResponse(_real_headers=)), reply_one_write (forced off by GATEWAY_AIOHTTP_FAST_PATHS)")
    assert describe(decide({ENV: "off"}, {})).endswith("fast paths on: none; off: " + ", ".join(
        f"{name} (forced off by GATEWAY_AIOHTTP_FAST_PATHS)" for name in PATHS))


def test_an_unknown_path_is_refused_and_meanwhile_every_path_is_off() -> None:
    fast = decide({ENV: "reply_headers,upstream_fast"}, {})
    assert not any(getattr(fast, name) for name in PATHS)
    with pytest.raises(ValueError, match="unknown fast path upstream_fast"):
        check(fast)
    check(decide({ENV: "off"}, {}))


@pytest.mark.skipif(aiohttp.__version__ != LOCKED, reason=f"aiohttp {aiohttp.__version__}, not the locked {LOCKED}")
def test_the_locked_aiohttp_has_every_piece() -> None:
    assert aiohttp_fast._detect() == {}


def _strip_real_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    # An aiohttp whose StreamResponse copies the headers it is handed: the parameter is there, it does nothing.
    init = web.StreamResponse.__init__

    def copying(self: web.StreamResponse, *, status: int = 200, reason: str | None = None,
                headers: CIMultiDict[str] | None = None, _real_headers: CIMultiDict[str] | None = None) -> None:
        init(self, status=status, reason=reason, headers=_real_headers if _real_headers is not None else headers)

    monkeypatch.setattr(web.StreamResponse, "__init__", copying)


def _adds_a_header(monkeypatch: pytest.MonkeyPatch) -> None:
    # An aiohttp whose ClientRequest adds a header of its own to every request.
    def cookies(self: aiohttp.ClientRequest, cookies: object) -> None:
        self.headers["Cookie"] = "x=1"

    monkeypatch.setattr(aiohttp.ClientRequest, "update_cookies", cookies)


TAKEN_AWAY: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    "upstream_request": (_adds_a_header, "ClientRequest sending the headers given, adding none"),
    "upstream_bodyless": (lambda m: m.delattr(aiohttp.BaseConnector, "_release"),
                          "BaseConnector._release(key, protocol, should_close=)"),
    "upstream_protocol": (lambda m: m.delattr(client_proto.ResponseHandler, "_drop_timeout"),
                          "ResponseHandler._reschedule_timeout(), _drop_timeout(), _on_read_timeout()"),
    "upstream_body_into": (lambda m: m.delattr(aiohttp.StreamReader, "_read_nowait_chunk"),
                           "StreamReader._buffer, _read_nowait_chunk(n), total_bytes"),
    "reply_headers": (_strip_real_headers, "StreamResponse(_real_headers=)"),
    "reply_one_write": (lambda m: m.delattr(web.StreamResponse, "_send_headers_immediately"),
                        "StreamResponse._send_headers_immediately"),
}


@pytest.mark.parametrize("path", PATHS)
def test_a_piece_taken_away_is_detected_and_turns_its_path_off(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    take_away, piece = TAKEN_AWAY[path]
    take_away(monkeypatch)
    missing = aiohttp_fast._detect()
    assert missing == {path: piece}
    assert decide({}, missing).off[path] == f"missing: {piece}"


def _only_off(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The door's decision as if GATEWAY_AIOHTTP_FAST_PATHS kept every path but ``names``."""
    kept = ",".join(name for name in PATHS if name not in names)
    monkeypatch.setattr(aiohttp_fast, "FAST", decide({ENV: kept or "off"}, {}))


def test_reply_headers_off_gives_aiohttp_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    headers = CIMultiDict([("X-A", "1"), ("x-a", "2")])
    _only_off(monkeypatch)
    assert aiohttp_fast.reply_response(200, None, headers, whole=False).headers is headers
    _only_off(monkeypatch, "reply_headers")
    for whole in (False, True):
        response = aiohttp_fast.reply_response(201, "Made", headers, whole=whole)
        assert response.headers is not headers and list(response.headers.items()) == list(headers.items())
        assert (response.status, response.reason) == (201, "Made")


def test_reply_one_write_off_is_aiohttp_s_plain_response(monkeypatch: pytest.MonkeyPatch) -> None:
    _only_off(monkeypatch)
    whole = aiohttp_fast.reply_response(200, None, CIMultiDict(), whole=True)
    assert type(whole) is not web.StreamResponse and not whole._send_headers_immediately
    assert type(aiohttp_fast.reply_response(200, None, CIMultiDict(), whole=False)) is web.StreamResponse
    _only_off(monkeypatch, "reply_one_write")
    assert type(aiohttp_fast.reply_response(200, None, CIMultiDict(), whole=True)) is web.StreamResponse


@pytest.mark.parametrize(("off", "protocol"), [((), aiohttp_fast._Connection),
                                                (("upstream_protocol",), client_proto.ResponseHandler)])
async def test_upstream_protocol_off_leaves_aiohttp_s_own(off: tuple[str, ...], protocol: type,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _only_off(monkeypatch, *off)
    pool = aiohttp.TCPConnector()
    try:
        aiohttp_fast.install_protocol(pool)
        assert type(pool._factory()) is protocol
    finally:
        await pool.close()
