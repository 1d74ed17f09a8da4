"""The docs stand on their own in the repository: every relative link of README.md, sandbox/README.md and docs/
leads to a file that exists (and a `#fragment` to one of its headings), no doc points at a path of some machine, and
docs/service-contract.md says what the code enforces (its dates, defaults, routes and 403)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.core.spec import RESTRICTED_BY_DEFAULT_FROM
from gateway.policies.board_cards.policy import BOARD_CARDS, MESSAGE_KEY
from gateway.policies.legacy_upload_guard.policy import DEFAULT_MESSAGE, DISABLED_CODE

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "sandbox" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CONTRACT = ROOT / "docs" / "service-contract.md"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _links(doc: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", doc.read_text(encoding="utf-8")))


def test_every_relative_link_leads_to_a_file_and_heading_of_the_repository() -> None:
    broken = []
    for doc in DOCS:
        for target in _links(doc):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.is_relative_to(ROOT) or not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file in the repository)")
            elif fragment and file.suffix == ".md" and fragment not in _anchors(file):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_no_doc_points_at_a_path_outside_the_repository() -> None:
    outside = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()}" for doc in DOCS
               for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
               if re.search(r"(?<![\w.])/(work|home|root|Users)/", line)]
    assert outside == []


def test_the_slug_is_githubs() -> None:
    assert _slug("Cards withdrawal on the board route") == "cards-withdrawal-on-the-board-route"
    assert _slug("The `403`") == "the-403"
    assert _slug("`gateway rollout`") == "gateway-rollout"


def test_the_contract_says_what_the_code_enforces() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    cap, removal = (flag.default for flag in BOARD_CARDS.flags)
    for fact in (RESTRICTED_BY_DEFAULT_FROM.isoformat(), str(cap), str(removal), DISABLED_CODE, DEFAULT_MESSAGE,
                 MESSAGE_KEY, "restricted_file_access", "forbid_legacy_uploads", "/api/latest/cards?board_id="):
        assert fact in text, fact
    # Every route of the shipped config is in it: its path, or for the restricted file routes, their base.
    for route in yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())["routes"]:
        for path in route["paths"]:
            base = re.sub(r"/\{file_id\}$", "", path).replace("{board_id}", "{id}")
            assert base in text, (route["name"], path)
    # Linked near the top of the README, where a newcomer reads what the gateway is.
    assert "(docs/service-contract.md)" in (ROOT / "README.md").read_text().split("```")[0]
