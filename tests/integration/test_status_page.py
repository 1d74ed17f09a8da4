"""The status page in a real browser: headless Chromium (Debian's chromium package, driven by Playwright with the
system browser's path) against a gateway process whose clock is fixed (GATEWAY_NOW).

Each test keeps a screenshot under its temporary directory (tmp_path). scripts/test.sh installs chromium with
apt-get when it is missing and the script runs as root; without a browser these tests are skipped, saying why."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright

from gateway.core.http import token_fingerprint
from tests.gateway_testlib import ADMIN_TOKEN, BASE_CONFIG, RecordingUpstream, guarded_routes
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
        row = page.locator(f'[data-policy="legacy_uploads"] tr[data-client="{fingerprint}"]')
        await row.wait_for(timeout=5000)
        cells = await row.locator("td").all_inner_texts()
        assert cells[:5] == ["3", fingerprint, "acme", XSS, "blocked 3"]
        assert cells[5].startswith("20") and cells[6].startswith("20") and cells[6].endswith("(just now)")
        assert await page.evaluate("window.sameDocument") is True  # refreshed in place, not reloaded
        assert await page.evaluate("window.pwned") is None  # the User-Agent stayed text
        figures = page.locator('[data-tenant="acme"] .figures')
        assert re.fullmatch(r"Requests since 20\S+ \S+ UTC \(30 d\): legacy_uploads: blocked 3",
                            await figures.inner_text())
        # The day's bar on acme's chart, on the same axis as its timeline.
        chart = _behaviour(page, "acme", "legacy_uploads").locator(".chart .bar")
        assert await chart.count() == 1 and await chart.get_attribute("title") == f"{_today()}: 3 requests"
        assert "integrator-token" not in await page.content()
        await page.screenshot(path=tmp_path / "status-clients.png", full_page=True)
    finally:
        await page.close()
    assert problems == []


async def test_the_clients_to_contact_are_listed_most_urgent_first_with_hostile_text_kept_as_text(
        browser: Browser, upstream: RecordingUpstream, tmp_path: Path) -> None:
    """Named and unnamed clients, internal and external: the table of clients to contact (blocked first), each
    company's external clients per state, names and contacts beside fingerprints. A contact and a User-Agent that
    are markup stay text, in the page and in its refresh (the same renderer), which say the same."""
    owner = 'partners@example.com <img src=x onerror="window.pwned=3">'
    config = _config(upstream.url)
    config["usage"] = {"clients": [
        {"name": "partner-app", "owner": owner, "token_fingerprint": token_fingerprint("Bearer partner")},
        {"name": "nightly-sync", "owner": "data platform", "internal": True, "user_agent": {"prefix": "LegacySync/"}}]}
    proc = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": "2026-11-05T12:00:00Z"})
    try:
        async with aiohttp.ClientSession() as client:
            for token, host, agent, status in (("Bearer partner", "127.0.0.1", "PartnerSDK/1.0", 403),
                                               ("Bearer stranger", "old.test", XSS, 200),
                                               ("Bearer sync", "127.0.0.1", "LegacySync/2.1", 403)):
                async with client.put(f"{proc.url}/api/v1/cards/1/files", data=b"file bytes",
                                      headers={"Authorization": token, "User-Agent": agent, "Host": host}) as resp:
                    assert resp.status == status
        page, problems = await _open(browser, proc, viewport={"width": 1280, "height": 900})
        try:
            section = page.locator("#readiness")
            server_text = await section.evaluate(_TEXT_WITHOUT_TIMES)
            rows = section.locator("table.contacts tbody tr")
            cells = [await row.locator("td").all_inner_texts() for row in await rows.all()]
            assert [(c[0], c[2]) for c in cells] == [("blocked", "acme\nlegacy_uploads"),
                                                     ("blocked", "acme\nlegacy_uploads"),
                                                     ("calling", "oldco\nlegacy_uploads")]
            partner = token_fingerprint("Bearer partner")
            assert cells[0][1] == f"partner-app {partner}\nPartnerSDK/1.0\ncontact: {owner}"
            assert cells[1][1].startswith("nightly-sync ") and "(internal)" in cells[1][1]
            assert cells[2][1] == f"{token_fingerprint('Bearer stranger')}\n{XSS}\ncontact: -"
            assert cells[0][3] == "PUT /api/v1/cards/{card_id}/files"
            assert cells[0][4] == "no change scheduled"  # acme forbids legacy uploads by its setting
            assert cells[2][4].startswith("forbidden at 2027-01-15 00:00 UTC, in 70 d 12 h: forbid_legacy_uploads")
            assert "2 external clients still call deprecated behaviour; 1 internal client not counted" in server_text
            counts = await section.locator("table.counts tbody tr").evaluate_all(
                "rows => rows.map(r => [...r.cells].map(c => c.innerText))")
            assert counts == [["acme", "legacy_uploads", "1", "0", "0", "0"],
                              ["oldco", "legacy_uploads", "0", "0", "1", "0"]]
            await page.locator("#refresh").click()
            await page.locator("#status[data-refreshed='1']").wait_for(state="attached")
            assert await page.locator("#readiness").evaluate(_TEXT_WITHOUT_TIMES) == server_text
            assert await page.evaluate("window.pwned") is None
            await page.screenshot(path=tmp_path / "status-readiness.png", full_page=True)
        finally:
            await page.close()
        assert problems == []
    finally:
        proc.stop()


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
    # With it, on a phone: the page refreshed in place (the server's main part, fetched) says the same, and nothing
    # overflows the width.
    phone, phone_problems = await _open(browser, proc, viewport={"width": 390, "height": 844}, is_mobile=True,
                                        has_touch=True, device_scale_factor=2)
    try:
        await phone.locator("#refresh").click()
        # A locator's wait, not wait_for_function: that one polls by evaluating its text inside the page, which the
        # page's Content-Security-Policy (no 'unsafe-eval') refuses whenever the refresh is not done at the first look.
        await phone.locator("#status[data-refreshed='1']").wait_for(state="attached")
        assert await phone.locator("main").evaluate(_TEXT_WITHOUT_TIMES) == server_text
        assert "oldco" in server_text and "sdk/1.0" in server_text and "removed" in server_text
        width = await phone.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page is wider than the phone: {width}"
        await phone.screenshot(path=tmp_path / "status-phone.png", full_page=True)
    finally:
        await phone.close()
    assert problems == [] and phone_problems == []


def _today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")


# --- The demo's own configuration: a timeline from 2026 to 2099, and months of recorded use -----------------------

ROOT = Path(__file__).resolve().parents[2]
_DAY = 86400
CAP, REMOVAL = (dt.datetime(2026, m, 1, tzinfo=dt.UTC).timestamp() for m in (10, 11))


def _demo_config(tmp_path: Path, upstream: str) -> dict[str, Any]:
    """config/gateway.yaml with what scripts/demo.sh adds to it (its own Python, taken from the script and run:
    exemptions until 2099), pointed at the test's upstream."""
    import yaml

    script = (ROOT / "scripts" / "demo.sh").read_text()
    match = re.search(r'"\$work/gateway\.yaml" <<\'PY\'\n(.*?)\nPY\n', script, re.DOTALL)
    assert match, "scripts/demo.sh no longer edits the demo's config with an inline Python script: update this test"
    path = tmp_path / "demo.yaml"
    path.write_text((ROOT / "config" / "gateway.yaml").read_text())
    subprocess.run([sys.executable, "-c", match.group(1), str(path)], check=True, timeout=60)
    config = yaml.safe_load(path.read_text())
    for tenant in config["tenants"]:
        tenant["upstream"] = upstream
    config["access_log"] = {"enabled": False}
    return dict(config)


def _seed(url: str) -> None:
    """Months of board_cards use by the sandbox company's clients, falling at the cap and again at the removal, and
    a few legacy uploads by legacy-co: written the way the gateway writes them."""
    from gateway.ops.ledger.store import Store
    from gateway.ops.usage import UsageCounter

    now = [0.0]
    counter = UsageCounter(behaviours={"board_cards": "board_cards", "legacy_upload_guard": "legacy_uploads"},
                           clock=lambda: now[0])
    store = Store(url)
    store.migrate()
    start = dt.datetime(2026, 9, 1, tzinfo=dt.UTC).timestamp()
    for day in range(85):
        base = start + day * _DAY
        daily, phase = (40, "full") if base < CAP else (25, "capped") if base < REMOVAL else (8, "removed")
        for i in range(daily + day % 5):
            now[0] = base + i * 600
            counter.record({"board_cards": phase}, f"{i % 7:012x}", "legacy-board-client/1.0", "sandbox")
            if i % 8 == 0:
                counter.record({"legacy_upload_guard": "allowed"}, "00000000000a", "legacy-uploader/2.1", "legacy-co")
        batch = counter.take()
        assert batch is not None
        store.write(batch, now[0])
        counter.written(batch)
    store.close()


_OVERLAPS = """timeline => {
  const box = timeline.getBoundingClientRect();
  const labels = [...timeline.querySelectorAll(".ticks .tick")].filter(e => getComputedStyle(e).display !== "none")
    .map(e => e.getBoundingClientRect());
  const problems = [];
  labels.forEach((r, i) => {
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5) problems.push(`label ${i} leaves the axis`);
    if (i && r.left < labels[i - 1].right + 2) problems.push(`labels ${i - 1} and ${i} overlap`);
  });
  return {problems, count: labels.length};
}"""


async def test_the_demo_config_reads_well_on_a_laptop_and_on_a_phone(
        browser: Browser, upstream: RecordingUpstream, tmp_path: Path) -> None:
    """The demo's exemptions end in 2099: the axis still shows the rollout (2026's cap and removal wide enough to
    see), draws the far events at its edge with their date, and no label overlaps or wraps into a column; the usage
    chart shares the axis, and shows use falling at the cap and at the removal."""
    url = f"sqlite:///{tmp_path}/usage.sqlite3"
    _seed(url)
    config = _demo_config(tmp_path, upstream.url)
    config["usage"] = {"ledger": {"url": url, "retention_days": 36500}}  # the seeded months, whatever today is
    proc = await start(config, tmp_path, env={**os.environ, "GATEWAY_NOW": "2026-11-25T12:00:00Z",
                                              "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN})  # the demo's admin_token names it
    try:
        for name, viewport in (("laptop", {"width": 1280, "height": 900}), ("phone", {"width": 390, "height": 844})):
            page, problems = await _open(browser, proc, viewport=viewport, is_mobile=name == "phone")
            try:
                board = _behaviour(page, "sandbox", "board_cards")
                for timeline in await page.locator(".timeline").all():
                    found = await timeline.evaluate(_OVERLAPS)
                    assert found["problems"] == [] and found["count"] >= 3, (name, found)
                # The rollout is readable: a month of the capped phase is a good part of the axis.
                width = await board.locator(".track").evaluate("e => e.getBoundingClientRect().width")
                capped = await board.locator(".seg[title=capped]").evaluate("e => e.getBoundingClientRect().width")
                assert capped >= width / 6, (name, capped, width)
                # The exemptions end in 2099: at the axis' edge, with their date, each label a line of text.
                label = board.locator(".exlabel")
                assert await label.inner_text() == "exemption demo-legacy-client until 2099-01-01 00:00 UTC ▶"
                line = await label.evaluate("e => [e.getBoundingClientRect().height, e.getBoundingClientRect().width,"
                                            " parseFloat(getComputedStyle(e).lineHeight)]")
                assert line[0] <= 2.2 * line[2] and line[1] >= width * 0.6, (name, line)
                assert await board.locator(".exbar.far").evaluate(
                    "e => Math.abs(e.getBoundingClientRect().right - e.parentElement.getBoundingClientRect().right)"
                ) < 1
                # Requests per day on the same axis: the dashed lines are the cap and the removal, and use falls at
                # each.
                heights = await board.locator(".chart").evaluate("""chart => {
                  const marks = [...chart.querySelectorAll(".cmark")].map(e => e.getBoundingClientRect().left);
                  const bars = [...chart.querySelectorAll(".bar")].map(e => {
                    const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.height]; });
                  const mean = (a) => a.reduce((s, v) => s + v, 0) / a.length;
                  return [marks.length, mean(bars.filter(b => b[0] < marks[0]).map(b => b[1])),
                          mean(bars.filter(b => b[0] > marks[0] && b[0] < marks[1]).map(b => b[1])),
                          mean(bars.filter(b => b[0] > marks[1]).map(b => b[1]))];
                }""")
                assert heights[0] == 2 and heights[1] > heights[2] > heights[3] > 0, (name, heights)
                note = await board.locator(".chartnote").inner_text()
                assert note.startswith("Requests per day (UTC) from the usage ledger") and "2026-09-01" in note
                overflow = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
                assert overflow[0] <= overflow[1], (name, overflow)
                await page.screenshot(path=tmp_path / f"status-demo-{name}.png", full_page=True)
                target = os.environ.get("STATUS_PAGE_SCREENSHOT")  # docs/status-page.png is made this way
                if target and name == "laptop":
                    await page.locator("#companies").screenshot(path=target)
            finally:
                await page.close()
            assert problems == [], (name, problems)
    finally:
        proc.stop()
