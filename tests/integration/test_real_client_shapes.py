"""The request shapes real clients of the service send (SDKs, CLIs, MCP servers, read for how they call it), each
with its expected decision under the forbid setting on and off, the upload upgrade bridge on and off: through a
real gateway with the shipped route table (config/gateway.yaml) in front of the sandbox playing the service.

The shapes: the deprecated ``PUT .../files`` (multipart ``file``); ``POST .../files`` multipart ``file`` with the
card's number where its uid belongs (an MCP server: the service takes it as a legacy upload, an earlier file); ``POST
.../files`` JSON with a URL (an external link, not an upload); a comment created with ``files[]``; a comment patched
with its text only. What the sandbox stored says what each decision did: an earlier file (public link, ``type`` 1),
a restricted one (``type`` 11), or nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN
from sandbox.state import STORE
from sandbox.store import Store
from tests.gateway_testlib import GatewayFactory, LineCollector, RunningGateway, make_config, multipart_body

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
B = "real-client-B0undary"
MP = f"multipart/form-data; boundary={B}"
CARD = 1  # the sandbox's card 1 (board 1)
FILE = multipart_body([(['Content-Disposition: form-data; name="file"; filename="report.pdf"',
                         "Content-Type: application/pdf"], b"%PDF-1.4 report")], B)
COMMENT = multipart_body([(['Content-Disposition: form-data; name="text"'], b"see attached"),
                          (['Content-Disposition: form-data; name="files[]"; filename="notes.txt"',
                            "Content-Type: text/plain"], b"notes")], B)
LINK = json.dumps({"url": "https://files.example.test/spec.pdf", "name": "spec.pdf"}).encode()


@dataclass(frozen=True)
class Shape:
    id: str
    method: str
    path: str
    content_type: str
    body: bytes
    route: str  # the shipped route it lands on


SHAPES = {
    "put_multipart_file": Shape("put_multipart_file", "PUT", f"/api/v1/cards/{CARD}/files", MP, FILE,
                                "legacy_card_file_upload"),
    "post_multipart_file_numeric_id": Shape("post_multipart_file_numeric_id", "POST", f"/api/v1/cards/{CARD}/files",
                                            MP, FILE, "legacy_id_card_file_upload"),
    "post_json_url": Shape("post_json_url", "POST", f"/api/v1/cards/{CARD}/files", "application/json", LINK,
                           "legacy_id_card_file_upload"),
    "comment_created_with_files": Shape("comment_created_with_files", "POST", f"/api/v1/cards/{CARD}/comments", MP,
                                        COMMENT, "legacy_comment_create"),
    "comment_patched_text_only": Shape("comment_patched_text_only", "PATCH", f"/api/v1/cards/{CARD}/comments/1",
                                       "application/json", b'{"text": "edited"}', "legacy_comment_update"),
}

# Per mode (the forbid setting, the bridge): each shape's status, the guard's decision in the access log, and what
# the sandbox gained: (earlier files, restricted files, comments).
ON, ON_BRIDGED, OFF, OFF_BRIDGED = "forbid_on", "forbid_on_bridge_on", "forbid_off", "forbid_off_bridge_on"
ALLOWED = {
    "put_multipart_file": (200, "allowed", (1, 0, 0)),
    "post_multipart_file_numeric_id": (200, "allowed", (1, 0, 0)),
    "post_json_url": (200, "passed", (1, 0, 0)),
    "comment_created_with_files": (200, "allowed", (1, 0, 1)),
    "comment_patched_text_only": (200, "passed", (0, 0, 0)),
}
EXPECTED: dict[str, dict[str, tuple[int, str, tuple[int, int, int]]]] = {
    ON: {
        "put_multipart_file": (403, "blocked", (0, 0, 0)),
        "post_multipart_file_numeric_id": (403, "blocked", (0, 0, 0)),
        "post_json_url": (200, "passed", (1, 0, 0)),
        "comment_created_with_files": (403, "blocked", (0, 0, 0)),
        "comment_patched_text_only": (200, "passed", (0, 0, 0)),
    },
    ON_BRIDGED: {
        "put_multipart_file": (200, "upgraded", (0, 1, 0)),
        "post_multipart_file_numeric_id": (200, "upgraded", (0, 1, 0)),
        "post_json_url": (200, "passed", (1, 0, 0)),
        "comment_created_with_files": (200, "upgraded", (0, 1, 1)),
        "comment_patched_text_only": (200, "passed", (0, 0, 0)),
    },
    OFF: ALLOWED,
    OFF_BRIDGED: ALLOWED,  # the bridge acts only where the answer would be 403
}
HOSTS = {ON: "on.test", ON_BRIDGED: "bridged.test", OFF: "off.test", OFF_BRIDGED: "off-bridged.test"}


def _shipped_routes() -> list[dict[str, Any]]:
    """The route table as shipped: what an operator runs."""
    routes: list[dict[str, Any]] = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())["routes"]
    return routes


def _config(sandbox_url: str, spool: Path) -> dict[str, Any]:
    routes = _shipped_routes()
    for route in routes:
        for entry in route.get("chain", []):
            if "legacy_upload_guard" in entry:
                guard = entry["legacy_upload_guard"]
                guard["upgrade"] = {**guard.get("upgrade", {}), "spool_dir": str(spool)}
    data = make_config(sandbox_url, routes=routes, access_log={"enabled": True})

    def tenant(mode: str, forbid: bool, bridge: bool) -> dict[str, Any]:
        return {"name": mode.replace("_", "-"), "hosts": [HOSTS[mode]], "upstream": sandbox_url,
                "created": "2026-06-01", "forbid_legacy_uploads": forbid, "bridges": {"upload_upgrade": bridge}}

    data["tenants"] = [tenant(ON, True, False), tenant(ON_BRIDGED, True, True), tenant(OFF, False, False),
                       tenant(OFF_BRIDGED, False, True)]
    return data


def _counts(store: Store) -> tuple[int, int, int]:
    card = store.cards[CARD]
    comments = sum(1 for c in store.comments.values() if c.card_id == card.id)
    return len(store.legacy_files), len(store.restricted_files), comments


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    return await aiohttp_server(create_app())


@pytest.fixture
async def gateway(sandbox: Any, start_gateway: GatewayFactory, tmp_path: Path) -> tuple[RunningGateway, LineCollector]:
    lines = LineCollector()
    return await start_gateway(_config(f"http://127.0.0.1:{sandbox.port}", tmp_path), access_log=lines), lines


@pytest.mark.parametrize("mode", list(EXPECTED))
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_real_clients_request_gets_its_decision(sandbox: Any, gateway: tuple[RunningGateway, LineCollector],
                                                        shape: str, mode: str) -> None:
    gw, lines = gateway
    store: Store = sandbox.app[STORE]
    request = SHAPES[shape]
    status, decision, gained = EXPECTED[mode][shape]
    before = _counts(store)
    headers = {**AUTH, "Host": HOSTS[mode], "Content-Type": request.content_type}
    async with aiohttp.ClientSession() as client:
        async with client.request(request.method, gw.url + request.path, data=request.body, headers=headers) as resp:
            answer = await resp.read()
            assert resp.status == status, answer[:500]
            deprecated = "Deprecation" in resp.headers
    after = _counts(store)
    assert tuple(a - b for a, b in zip(after, before)) == gained
    (line,) = [json.loads(text) for text in lines.lines]
    assert line["route"] == request.route
    assert line["decisions"]["legacy_upload_guard"] == decision
    # Counted as a legacy upload in the guard's family (and so in the usage ledger), by its route, when it is one.
    tenant = mode.replace("_", "-")
    value = gw.metrics.registry.get_sample_value("gateway_legacy_uploads_total", {
        "tenant": tenant, "route": request.route, "decision": "bridged" if decision == "upgraded" else decision})
    assert (value or 0) == (0 if decision == "passed" else 1)
    assert deprecated == (decision != "passed")
    if status == 403:
        assert json.loads(answer)["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
    if decision == "upgraded" and request.route.endswith("card_file_upload"):
        record = json.loads(answer)  # the legacy record's shape, of the restricted file the bridge uploaded
        assert record["type"] == 11 and record["card_id"] == CARD and record["name"] == "report.pdf"


async def test_a_restricted_upload_by_uid_passes_in_every_mode(sandbox: Any,
                                                               gateway: tuple[RunningGateway, LineCollector]) -> None:
    """The migrated client, for contrast: the card's uid in the path is the restricted upload, never guarded."""
    gw, lines = gateway
    store: Store = sandbox.app[STORE]
    uid = store.cards[CARD].uid
    for mode in EXPECTED:
        before = _counts(store)
        headers = {**AUTH, "Host": HOSTS[mode], "Content-Type": MP}
        async with aiohttp.ClientSession() as client:
            async with client.post(f"{gw.url}/api/v1/cards/{uid}/files", data=FILE, headers=headers) as resp:
                assert resp.status == 200 and "Deprecation" not in resp.headers
        assert tuple(a - b for a, b in zip(_counts(store), before)) == (0, 1, 0)
    assert {json.loads(text)["route"] for text in lines.lines} == {"card_file_upload"}
    assert not any("decisions" in json.loads(text) for text in lines.lines)
