"""Migration readiness through real gateway processes: a ledger written by the code before the per-client rollups
(revision 0001), upgraded at start; calls made with the rollout's clock fixed before and after a company's removal
date (GATEWAY_NOW moves time between two processes); clients in every state, named and unnamed, internal and
external. `gateway outreach`, `/deprecations`, the status page's data and each client's own view agree, and a token
sees only its own rows of the company its Host names."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway import cli
from gateway.core.http import token_fingerprint
from tests.board_fixtures import board_bytes
from tests.gateway_testlib import BASE_CONFIG, RecordingUpstream, guarded_routes
from tests.integration.board_testlib import json_responder
from tests.ledger_testlib import at_revision_0001, write_old_rows
from tests.process_testlib import Proc, start, wait_for

DAY = 86400
BEFORE = "2026-10-15T12:00:00Z"  # both companies' boards capped
AFTER = "2026-11-20T12:00:00Z"  # acme's cards removed (2026-11-01); oldco's still capped (its own date: 2026-12-01)
MOBILE, MOVER, PARTNER, SYNC, RETIRED = (f"Bearer {name}-token" for name in
                                         ("mobile", "mover", "partner", "sync", "retired"))
FP = {token: token_fingerprint(token) or "" for token in (MOBILE, MOVER, PARTNER, SYNC, RETIRED)}  # never ""
OWNER = 'mobile-team@example.com <script>window.pwned=1</script>'


def _config(upstream: str, url: str) -> dict[str, Any]:
    tenants = [dict(t, upstream=upstream) for t in BASE_CONFIG["tenants"]]
    tenants[1] = {**tenants[1], "restricted_file_access": True, "forbid_legacy_uploads": False,
                  "rollout": {"board_cards_removal": "2026-12-01", "forbid_legacy_uploads": "2027-01-15"}}
    routes = guarded_routes()
    for route in routes:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {"cap": 2}}]
    return {
        "tenants": tenants, "routes": routes,
        "rollout": {"exemptions": [{"name": "mobile-3x", "phase": "full", "until": "2026-12-15",
                                    "token_fingerprint": FP[MOBILE]}]},
        "usage": {"ledger": {"url": url, "flush_interval": 0.2},
                  "clients": [{"name": "mobile-app", "owner": OWNER, "token_fingerprint": FP[MOBILE]},
                              {"name": "nightly-sync", "owner": "data platform", "internal": True,
                               "user_agent": {"prefix": "LegacySync/"}}]},
    }


def _history(path: Path) -> None:
    """The ledger as the code before readiness left it: a client that last called 40 days ago."""
    store = at_revision_0001(f"sqlite:///{path}")
    at = time.time() - 40 * DAY
    write_old_rows(store, [(int(at) // 3600 * 3600, "board_cards", "acme", FP[RETIRED], "old-app/1.0",
                            "capped:capped", 12, at - 5 * DAY, at)])
    store.close()


async def _call(client: aiohttp.ClientSession, proc: Proc, method: str, path: str, token: str | None,
                host: str = "127.0.0.1", agent: str = "sdk/1.0") -> aiohttp.ClientResponse:
    headers = {"Host": host, "User-Agent": agent, **({"Authorization": token} if token else {})}
    async with client.request(method, proc.url + path, headers=headers, data=b"file" if method == "PUT" else None) as r:
        await r.read()
        return r


async def _own(client: aiohttp.ClientSession, proc: Proc, token: str | None, host: str = "127.0.0.1"
               ) -> tuple[int, Any]:
    headers = {"Host": host, **({"Authorization": token} if token else {})}
    async with client.get(proc.url + "/_gateway/deprecations", headers=headers) as resp:
        return resp.status, await resp.json()


def _outreach(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["outreach", "--config", str(config), *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


EXPECTED = {
    ("acme", FP[MOVER], "board_cards"): "blocked",  # its cards removed: broken now
    ("acme", FP[PARTNER], "legacy_uploads"): "blocked",  # acme forbids legacy uploads
    ("acme", FP[SYNC], "legacy_uploads"): "blocked",  # internal: not in the totals
    ("acme", FP[MOBILE], "board_cards"): "overdue",  # after acme's removal date, kept working by its exemption
    ("oldco", FP[PARTNER], "board_cards"): "calling",  # oldco's removal (2026-12-01) is ahead
    ("oldco", FP[PARTNER], "legacy_uploads"): "calling",
    ("oldco", "", "legacy_uploads"): "calling",  # requests without a token: one client, "-"
    ("acme", FP[RETIRED], "board_cards"): "ready",  # 40 days quiet (from the ledger before the upgrade)
}


async def test_every_view_of_readiness_agrees_and_a_token_sees_only_its_own(
        upstream: RecordingUpstream, tmp_path: Path) -> None:
    upstream.responder = json_responder(board_bytes(5), etag=None)
    ledger = tmp_path / "usage.sqlite3"
    _history(ledger)
    config = _config(upstream.url, f"sqlite:///{ledger}")
    before = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": BEFORE}, name="before")
    try:
        async with aiohttp.ClientSession() as client:
            assert (await _call(client, before, "GET", "/api/latest/boards/1", MOVER)).status == 200
            status, own = await _own(client, before, MOVER)
        assert status == 200
        [board] = own["behaviours"]
        # Before acme's removal date it still calls; what changes for it next is the removal.
        assert (board["state"], board["phase"], board["next"]["phase"], board["next"]["at"]) == (
            "calling", "capped", "removed", "2026-11-01T00:00:00+00:00")
        assert board["example"] == "GET /api/latest/boards/{board_id}" and board["rule"] == "date"
    finally:
        before.stop()
    after = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": AFTER}, name="after")
    try:
        async with aiohttp.ClientSession() as client:
            assert (await _call(client, after, "GET", "/api/latest/boards/1", MOVER)).status == 200
            board = await _call(client, after, "GET", "/api/latest/boards/1", MOBILE, agent="MobileApp/3.2")
            assert board.status == 200
            assert (await _call(client, after, "GET", "/api/latest/boards/2", PARTNER, host="old.test")).status == 200
            assert (await _call(client, after, "PUT", "/api/v1/cards/7/files?sig=secret", PARTNER, host="old.test")
                    ).status == 200
            refused = await _call(client, after, "PUT", "/api/v1/cards/8/files", PARTNER)
            assert refused.status == 403
            # A deprecated answer links to the client's own view (RFC 9745); a client without a token gets none.
            assert '</_gateway/deprecations>; rel="deprecation"; type="application/json"' in \
                refused.headers.getall("Link")
            assert (await _call(client, after, "PUT", "/api/v1/cards/9/files", SYNC, agent="LegacySync/2.1")
                    ).status == 403
            anonymous = await _call(client, after, "PUT", "/api/v1/cards/9/files", None, host="old.test")
            assert anonymous.status == 200 and not any("_gateway" in v for v in anonymous.headers.getall("Link", []))
            own = {(token, host): await _own(client, after, token, host)
                   for token in (MOBILE, MOVER, PARTNER, SYNC, RETIRED) for host in ("127.0.0.1", "old.test")}
            unauthorized = await _own(client, after, None)
            async with client.post(after.url + "/_gateway/deprecations", headers={"Authorization": PARTNER}) as r:
                assert r.status == 405 and (await r.json())["code"] == "METHOD_NOT_ALLOWED"
            async with client.get(after.url + "/_gateway/other", headers={"Authorization": PARTNER}) as r:
                assert r.status == 404 and (await r.json())["code"] == "NOT_FOUND"
            # Cached per client for a minute: another call does not change the answer yet.
            assert (await _call(client, after, "PUT", "/api/v1/cards/8/files", PARTNER)).status == 403
            again = await _own(client, after, PARTNER)
        deprecations = await after.get_json("/deprecations?since=90d&top=1000")
        page = await after.get_json("/status.json")
    finally:
        after.stop()

    # `gateway outreach`: every client, most urgent first.
    out = _outreach(after.config_path, "--all", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    states = {(c["tenant"], c["client"] or "", c["behaviour"]): c["state"] for c in listed["clients"]}
    assert states == EXPECTED
    assert [c["state"] for c in listed["clients"]] == sorted(
        [c["state"] for c in listed["clients"]], key=("blocked", "overdue", "calling", "ready").index)
    # Internal clients are counted apart: 4 external tokens of a company still call (the partner in two).
    assert (listed["still_calling"], listed["internal_clients"]) == (5, 1)
    assert listed["totals"]["acme"]["legacy_uploads"] == {"blocked": 1, "overdue": 0, "calling": 0, "ready": 0}
    by_key = {(c["tenant"], c["client"] or "", c["behaviour"]): c for c in listed["clients"]}
    mobile = by_key[("acme", FP[MOBILE], "board_cards")]
    assert (mobile["name"], mobile["owner"], mobile["rule"], mobile["user_agent"]) == (
        "mobile-app", OWNER, "exemption:mobile-3x", "MobileApp/3.2")
    assert (mobile["next"]["phase"], mobile["next"]["at"]) == ("removed", "2026-12-15T00:00:00+00:00")
    sync = by_key[("acme", FP[SYNC], "legacy_uploads")]
    assert (sync["name"], sync["internal"]) == ("nightly-sync", True)
    upload = by_key[("oldco", FP[PARTNER], "legacy_uploads")]
    assert upload["example"] == "PUT /api/v1/cards/{card_id}/files" and "4711" not in out.stdout
    assert "sig=" not in out.stdout and "secret" not in out.stdout  # never a query, never a path's ids
    assert (upload["next"]["phase"], upload["next"]["at"]) == ("forbidden", "2027-01-15T00:00:00+00:00")
    assert by_key[("acme", FP[RETIRED], "board_cards")]["requests"] == 12
    # Without --all: the list to act on, as CSV (a spreadsheet) and as a table.
    out = _outreach(after.config_path, "--csv")
    assert out.returncode == 0, out.stderr
    lines = list(csv.DictReader(io.StringIO(out.stdout)))
    assert {(r["tenant"], r["client"], r["behaviour"], r["state"]) for r in lines} == {
        (t, c, b, s) for (t, c, b), s in EXPECTED.items() if s != "ready"}
    assert lines[0]["state"] == "blocked" and lines[-1]["state"] == "calling"
    out = _outreach(after.config_path, "--tenant", "oldco")
    assert out.returncode == 0, out.stderr
    # oldco's: the partner and the requests without a token.
    assert "2 external clients still call deprecated behaviour" in out.stdout
    assert "calling  oldco board_cards" in out.stdout
    assert "acme" not in out.stdout.split("\n", 3)[-1]

    # /deprecations carries the same states, and each client row its name and state.
    ready = deprecations["readiness"]
    assert {(c["tenant"], c["client"] or "", c["behaviour"]): c["state"] for c in ready["clients"]} == EXPECTED
    rows = {(r["tenant"], r["client"] or "", b): r for b, d in deprecations["behaviours"].items()
            for r in d["top_clients"]}
    assert rows[("acme", FP[MOBILE], "board_cards")]["name"] == "mobile-app"
    assert {key: row["state"] for key, row in rows.items()} == EXPECTED
    # The status page: the clients to contact, most urgent first, and each company's external clients per state.
    section = page["readiness"]
    assert [(c["tenant"], c["client"] or "", c["behaviour"]) for c in section["contacts"]] == [
        (c["tenant"], c["client"] or "", c["behaviour"]) for c in listed["clients"] if c["state"] != "ready"]
    assert {(c["tenant"], c["behaviour"]): (c["blocked"], c["overdue"], c["calling"], c["ready"])
            for c in section["companies"]} == {("acme", "board_cards"): (1, 1, 0, 1), ("acme", "legacy_uploads"): (1, 0, 0, 0),
                                               ("oldco", "board_cards"): (0, 0, 1, 0),
                                               ("oldco", "legacy_uploads"): (0, 0, 2, 0)}
    assert section["still_calling"] == 5 and section["internal_clients"] == 1

    # Each client's own view: its own rows of the company its Host names, nothing else.
    assert unauthorized[0] == 401 and unauthorized[1]["code"] == "UNAUTHORIZED"
    for (token, host), (status, document) in own.items():
        assert status == 200, document
        tenant = "oldco" if host == "old.test" else "acme"
        assert (document["client"], document["tenant"]) == (FP[token], tenant)
        mine = {(tenant, FP[token], b["behaviour"]): b["state"] for b in document["behaviours"]}
        assert mine == {key: state for key, state in EXPECTED.items() if key[:2] == (tenant, FP[token])}, (token, host)
        # The operator's name, contact and flag for it are the operator's.
        assert all(not {"name", "owner", "internal"} & set(b) for b in document["behaviours"])
    [exempted] = own[(MOBILE, "127.0.0.1")][1]["behaviours"]
    assert [(c["phase"], c["at"]) for c in exempted["changes"]] == [("removed", "2026-12-15T00:00:00+00:00")]
    assert again == own[(PARTNER, "127.0.0.1")]
    # The access log names the client beside its fingerprint (its board call, and its two looks at its own view).
    assert [(line["path"], line.get("client_name")) for line in after.access_lines()
            if line.get("client") == FP[MOBILE]] == [("/api/latest/boards/1", "mobile-app"),
                                                     ("/_gateway/deprecations", "mobile-app"),
                                                     ("/_gateway/deprecations", "mobile-app")]
    assert all("client_name" not in line for line in after.access_lines() if line.get("client") == FP[PARTNER])


async def test_gateway_usage_shows_the_name_beside_the_fingerprint(upstream: RecordingUpstream,
                                                                   tmp_path: Path) -> None:
    config = _config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3")
    proc = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": AFTER})
    try:
        async with aiohttp.ClientSession() as client:
            assert (await _call(client, proc, "PUT", "/api/v1/cards/9/files", SYNC, agent="LegacySync/2.1")
                    ).status == 403

            async def written() -> bool:
                return bool((await proc.get_json("/deprecations"))["behaviours"])

            await wait_for(written)
    finally:
        proc.stop()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(["usage", "--config", str(proc.config_path)]) == 0
    assert f"{FP[SYNC]}  acme" in out.getvalue() and "LegacySync/2.1 (nightly-sync)" in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["usage", "--config", str(proc.config_path), "--csv"]) == 0
    [row] = csv.DictReader(io.StringIO(out.getvalue()))
    assert (row["client"], row["name"]) == (FP[SYNC], "nightly-sync")


@pytest.mark.parametrize("off", ["self_service", "ledger"])
async def test_the_own_view_has_an_off_switch(upstream: RecordingUpstream, tmp_path: Path, off: str) -> None:
    """Off (or the ledger off): the prefix is the service's like any other path, and deprecated answers carry no
    link to it."""
    config = _config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3")
    del config["usage"]["clients"]
    if off == "ledger":
        config["usage"]["ledger"]["enabled"] = False
    else:
        config["usage"]["self_service"] = {"enabled": False}
    proc = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": AFTER})
    try:
        async with aiohttp.ClientSession() as client:
            refused = await _call(client, proc, "PUT", "/api/v1/cards/8/files", PARTNER)
            assert refused.status == 403 and not any("_gateway" in v for v in refused.headers.getall("Link", []))
            status, body = await _own(client, proc, PARTNER)
    finally:
        proc.stop()
    assert status == 200 and body["path"] == "/_gateway/deprecations"  # the upstream's answer
    assert upstream.received[-1].raw_path == "/_gateway/deprecations"
