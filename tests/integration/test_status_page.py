"""The status page in a real browser: headless Chromium (Debian's chromium package, driven by Playwright with the
system browser's path) against a gateway process whose clock is fixed (GATEWAY_NOW).

Each test keeps a screenshot under its temporary directory (tmp_path). scripts/test.sh installs chromium with
apt-get when it is missing and the script runs as root; without a browser these tests are skipped, saying why."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright

from gateway.core.http import token_fingerprint
from tests.conftest import ADMIN_TOKEN, BASE_CONFIG, RecordingUpstream, guarded_routes
from tests.process_testlib import Proc, start

XSS = '<script>window.pwned=1</script>"><img src=x onerror="window.pwned=2">'


def _chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (Debian package chromium; ./scripts/test.sh installs it as root)")
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = _chromium()
    async with async_playwright() as playwright:
        # --no-sandbox: the tests may run as root (CI), where Chromium's own sandbox refuses to start.
        browser = await playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


def _config(upstream: str) -> dict[str, Any]:
    """Two companies: acme (created after 2026-05-21: uploads forbidden from the start, the default dates) and
    oldco (uploads forbidden from 2027-01-15, cards removed on 2026-12-01, a brownout on 2026-11-10)."""
    tenants = [dict(t, upstream=upstream) for t in BASE_CONFIG["tenants"]]
    tenants[1] = {**tenants[1], "restricted_file_access": True, "forbid_legacy_uploads": False, "rollout": {
        "forbid_legacy_uploads": "2027-01-15", "board_cards_removal": "2026-12-01",
        "brownouts": [{"start": "2026-11-10T10:00:00", "end": "2026-11-10T12:00:00"}]}}
    return {"tenants": tenants, "routes": guarded_routes(), "access_log": {"enabled": False},
            "rollout": {"exemptions": [{"name": "mobile-3x", "until": "2026-12-15", "phase": "full",
                                        "token_fingerprint": "3f9a1c0b2d4e"}]}}


@pytest.fixture
async def gateway_at(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Any]:
    """``await gateway_at(instant)``: a gateway process whose clock is fixed at the instant."""
    running: list[Proc] = []

    async def launch(instant: str) -> Proc:
        proc = await start(_config(upstream.url), tmp_path, env={**os.environ, "GATEWAY_NOW": instant},
                           name=f"gateway-{len(running)}")
        running.append(proc)
        return proc

    yield launch
    for proc in running:
        proc.stop()


async def _open(browser: Browser, proc: Proc, **context: Any) -> tuple[Page, list[str]]:
    """The page, and a list that collects the page's errors and console warnings (a CSP violation is one)."""
    page = await (await browser.new_context(**context)).new_page()
    problems: list[str] = []
    page.on("pageerror", lambda err: problems.append(f"error: {err}"))
    page.on("console", lambda msg: problems.append(f"{msg.type}: {msg.text}") if msg.type in ("error", "warning")
            else None)
    page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
    # The token once in the address: the gateway sets its cookie and redirects to / without it, which redirects to
    # /status; the page's own requests (status.json) carry the cookie.
    await page.goto(f"http://127.0.0.1:{proc.admin}/?token={ADMIN_TOKEN}")
    assert page.url == f"http://127.0.0.1:{proc.admin}/status", page.url
    return page, problems


def _behaviour(page: Page, tenant: str, behaviour: str) -> Any:
    return page.locator(f'[data-tenant="{tenant}"] [data-behaviour="{behaviour}"]')


@pytest.mark.parametrize("instant, acme_board, oldco_board, oldco_dated, oldco_next", [
    ("2026-09-15T12:00:00Z", "full", "full", "full", "Next: capped at 2026-10-01 00:00 UTC, in 15 d 12 h"),
    ("2026-11-05T12:00:00Z", "removed", "capped", "capped", "Next: removed at 2026-11-10 10:00 UTC, in 4 d 22 h"),
    # The brownout puts oldco in the removed phase for two hours; its dates still say capped.
    ("2026-11-10T11:00:00Z", "removed", "removed", "capped", "Next: capped at 2026-11-10 12:00 UTC, in 1 h"),
], ids=["before-the-cap", "capped-and-removed", "during-the-brownout"])
async def test_each_company_is_in_the_right_phase_at_the_right_dates(
        browser: Browser, gateway_at: Any, tmp_path: Path, instant: str, acme_board: str, oldco_board: str,
        oldco_dated: str, oldco_next: str) -> None:
    proc = await gateway_at(instant)
    page, problems = await _open(browser, proc, viewport={"width": 1280, "height": 900})
    try:
        assert page.url.endswith("/status")
        board = _behaviour(page, "acme", "board_cards")
        assert await board.locator(".phase.current").inner_text() == acme_board
        old_board = _behaviour(page, "oldco", "board_cards")
        assert await old_board.locator(".phase.current").inner_text() == oldco_board
        assert await old_board.locator(".next").inner_text() == oldco_next
        assert await _behaviour(page, "acme", "legacy_uploads").locator(".phase.current").inner_text() == "forbidden"
        uploads = _behaviour(page, "oldco", "legacy_uploads")
        assert await uploads.locator(".phase.current").inner_text() == "allowed"
        assert (await uploads.locator(".next").inner_text()).startswith("Next: forbidden at 2027-01-15 00:00 UTC")
        # The brownout window is on oldco's timeline (its own list), not on acme's.
        brownout = old_board.locator(".timeline .bw")
        assert await brownout.count() == 1
        assert await brownout.get_attribute("title") == "brownout removed: 2026-11-10 10:00 UTC to 2026-11-10 12:00 UTC"
        assert await board.locator(".timeline .bw").count() == 0
        # The marker for now lies in the segment of the phase the dates put in force.
        segments = await old_board.locator(".seg").evaluate_all(
            "els => els.map(e => [e.title, e.getBoundingClientRect().left, e.getBoundingClientRect().right])")
        now = await old_board.locator(".now").evaluate("e => e.getBoundingClientRect().left + 1")
        assert [name for name, left, right in segments if left <= now <= right] == [oldco_dated]
        # The events in force are marked so: the date (or the start), and the brownout while it lasts.
        in_force = await old_board.locator("tr.st-now td:nth-child(2)").all_inner_texts()
        expected = ["full (default)"] if oldco_dated == "full" else ["board_cards_cap 2026-10-01 (default): capped"]
        if oldco_board != oldco_dated:
            expected.append("brownout: removed until 2026-11-10 12:00 UTC")
        assert in_force == expected
        await page.screenshot(path=tmp_path / "status.png", full_page=True)
    finally:
        await page.close()
    assert problems == []


async def test_a_client_that_made_legacy_uploads_appears_without_a_reload(
        browser: Browser, gateway_at: Any, tmp_path: Path) -> None:
    proc = await gateway_at("2026-11-05T12:00:00Z")
    page, problems = await _open(browser, proc, viewport={"width": 1280, "height": 900})
    try:
        assert "No request used deprecated behaviour in the window." in await page.locator("#usage").inner_text()
        await page.evaluate("window.sameDocument = true")
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.put(f"{proc.url}/api/v1/cards/1/files", data=b"file bytes",
                                      headers={"Authorization": "Bearer integrator-token", "User-Agent": XSS}) as resp:
                    assert resp.status == 403
        await page.locator("#refresh").click()
        fingerprint = token_fingerprint("Bearer integrator-token")
        row = page.locator(f'[data-policy="legacy_upload_guard"] tr[data-client="{fingerprint}"]')
        await row.wait_for(timeout=5000)
        cells = await row.locator("td").all_inner_texts()
        assert cells[:5] == ["3", fingerprint, "acme", XSS, "blocked 3"]
        assert cells[5].startswith("20") and cells[5].endswith("(just now)")
        assert await page.evaluate("window.sameDocument") is True  # refreshed in place, not reloaded
        assert await page.evaluate("window.pwned") is None  # the User-Agent stayed text
        figures = page.locator('[data-tenant="acme"] .figures')
        assert await figures.inner_text() == "Last 1 h: legacy_upload_guard: blocked 3"
        assert "integrator-token" not in await page.content()
        await page.screenshot(path=tmp_path / "status-clients.png", full_page=True)
    finally:
        await page.close()
    assert problems == []


_TEXT_WITHOUT_TIMES = """main => {
  const copy = main.cloneNode(true);
  copy.querySelectorAll(".vol").forEach(e => e.remove());
  return copy.innerText;
}"""


async def test_the_page_reads_the_same_without_javascript_and_on_a_phone(
        browser: Browser, gateway_at: Any, tmp_path: Path) -> None:
    proc = await gateway_at("2026-11-10T11:00:00Z")
    async with aiohttp.ClientSession() as client:
        async with client.put(f"{proc.url}/api/v1/cards/1/files", data=b"x",
                              headers={"Authorization": "Bearer t", "User-Agent": "sdk/1.0"}) as resp:
            assert resp.status == 403
    # Without JavaScript: the server's HTML.
    plain, problems = await _open(browser, proc, java_script_enabled=False, viewport={"width": 1280, "height": 900})
    server_text = await plain.locator("main").evaluate(_TEXT_WITHOUT_TIMES)
    assert await plain.locator("#refresh").is_hidden()
    await plain.screenshot(path=tmp_path / "status-no-js.png", full_page=True)
    await plain.close()
    # With it, on a phone: the script's rendering of status.json says the same, and nothing overflows the width.
    phone, phone_problems = await _open(browser, proc, viewport={"width": 390, "height": 844}, is_mobile=True,
                                        has_touch=True, device_scale_factor=2)
    try:
        await phone.locator("#refresh").click()
        await phone.wait_for_function("document.getElementById('status').dataset.refreshed === '1'")
        assert await phone.locator("main").evaluate(_TEXT_WITHOUT_TIMES) == server_text
        assert "oldco" in server_text and "sdk/1.0" in server_text and "removed" in server_text
        width = await phone.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page is wider than the phone: {width}"
        await phone.screenshot(path=tmp_path / "status-phone.png", full_page=True)
    finally:
        await phone.close()
    assert problems == [] and phone_problems == []
