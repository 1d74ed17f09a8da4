"""The upload upgrade's integration tests share these: the sandbox service and a spool directory (fixtures), the
gateway's config in front of it, multipart parts, and what the sandbox received, stored and counted."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN
from sandbox.state import STORE
from sandbox.store import Card, RestrictedFile, Store
from tests.gateway_testlib import GatewayFactory, RunningGateway, guarded_routes, make_config

TOKEN = f"Bearer {DEFAULT_TOKEN}"
AUTH = {"Authorization": TOKEN}
B = "upgrade-B0undary"
MP = f"multipart/form-data; boundary={B}"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
KiB = 1 << 10
MiB = 1 << 20


def text_part(text: str, name: str = "text") -> tuple[list[str], bytes]:
    return [f'Content-Disposition: form-data; name="{name}"'], text.encode()


def file_part(content: bytes, filename: str = "a.bin", name: str = "files[]",
              media: str = "application/octet-stream") -> tuple[list[str], bytes]:
    return [f'Content-Disposition: form-data; name="{name}"; filename="{filename}"', f"Content-Type: {media}"], content


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    return await aiohttp_server(create_app())


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    directory = tmp_path / "spool"
    directory.mkdir()
    return directory


def store_of(sandbox: Any) -> Store:
    store: Store = sandbox.app[STORE]
    return store


def public_card(sandbox: Any, n: int = 0) -> Card:
    store = store_of(sandbox)
    return [c for c in store.all_cards() if not store.boards[c.board_id].private][n]


def restricted(sandbox: Any) -> list[RestrictedFile]:
    return list(store_of(sandbox).restricted_files.values())


def config(sandbox: Any, spool: Path, *, tenant_bridge: bool = True, exemptions: list[dict[str, Any]] | None = None,
           **upgrade: Any) -> dict[str, Any]:
    data = make_config(f"http://127.0.0.1:{sandbox.port}",
                       routes=guarded_routes(upgrade={"spool_dir": str(spool), **upgrade}))
    data["tenants"][0]["bridges"] = {"upload_upgrade": tenant_bridge}
    if exemptions is not None:
        data["rollout"] = {"exemptions": exemptions}
    return data


async def start(start_gateway: GatewayFactory, sandbox: Any, spool: Path, **kw: Any) -> RunningGateway:
    access_log = kw.pop("access_log", None)
    data = config(sandbox, spool, **kw)
    if access_log is not None:
        data["access_log"] = {"enabled": True}
    return await start_gateway(data, access_log=access_log)


async def send(method: str, url: str, body: bytes | AsyncIterator[bytes] | None, *, content_type: str | None = MP,
               auth: str | None = TOKEN, **headers: str) -> tuple[int, Any, Any]:
    sent = dict(headers)
    if content_type is not None:
        sent["Content-Type"] = content_type
    if auth is not None:
        sent["Authorization"] = auth
    async with aiohttp.ClientSession() as client:
        async with client.request(method, url, data=body, headers=sent) as resp:
            raw = await resp.read()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = raw
            return resp.status, resp.headers, answer


async def download(url: str) -> bytes:
    async with aiohttp.ClientSession() as client:
        async with client.get(url) as resp:
            assert resp.status == 200, (resp.status, await resp.text())
            return await resp.read()


async def journal(sandbox: Any) -> list[dict[str, Any]]:
    """What the sandbox's API received (the tests' own downloads left out)."""
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{sandbox.port}/_sandbox/journal") as resp:
            entries: list[dict[str, Any]] = await resp.json()
            return [e for e in entries if e["path"].startswith("/api/")]


async def add_fault(sandbox: Any, **fault: Any) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/faults", json=fault) as resp:
            assert resp.status == 201, await resp.text()


def upgrades(gw: RunningGateway, outcome: str, tenant: str = "acme") -> float:
    """A company's series appears with its first count (issue 38): none yet is 0."""
    return gw.metrics.registry.get_sample_value("gateway_legacy_upload_upgrades_total",
                                                {"tenant": tenant, "outcome": outcome}) or 0.0


def guard_decisions(gw: RunningGateway, route: str, decision: str) -> float:
    return gw.metrics.registry.get_sample_value("gateway_legacy_uploads_total",
                                                {"tenant": "acme", "route": route, "decision": decision}) or 0.0


async def chunked(*pieces: bytes, size: int = 64 * KiB) -> AsyncIterator[bytes]:
    for piece in pieces:
        for i in range(0, len(piece), size):
            yield piece[i : i + size]
