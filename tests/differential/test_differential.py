"""The short budget of the differential harness (README.md): a few thousand seeded bodies from real clients and the
mutator, read by busboy, formidable, python-multipart, Werkzeug and aiohttp, and decided by the guard; the
invariants must hold on every one. The Node parsers are required: without node and npm this fails, it never
skips."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import pytest_asyncio

from tests.adversarial.parser_disagreements import DISAGREEMENTS, Disagreement
from tests.differential.clients import WRITERS, Sample
from tests.differential.guard import Guard
from tests.differential.harness import Outcome, Results, client_samples, evaluate, generate
from tests.differential.mutator import MUTATIONS
from tests.differential.parsers import PARSERS, node_problem

SEED = 20260521
FORMS = 12
BODIES = 3000
DOC = Path(__file__).parents[2] / "docs" / "policies" / "legacy_upload_guard.md"


@pytest.fixture(scope="module")
def node() -> None:
    problem = node_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(node: None) -> list[Sample]:
    return await client_samples(SEED, FORMS)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(clients: list[Sample]) -> Results:
    results = Results(keep=3)
    guard = Guard()
    for batch in generate(SEED, clients, bodies=BODIES, batch=1500):
        for outcome in await evaluate(batch, guard, timeout=120):
            results.add(outcome)
    return results


def _examples(results: Results, prefix: str) -> str:
    return "\n".join(o.describe() for kind, found in results.examples.items() if kind.startswith(prefix) for o in found)


def test_every_writer_and_mutation_is_exercised(clients: list[Sample], results: Results) -> None:
    assert {s.family for s in clients} == set(WRITERS)
    assert results.total("bodies") == BODIES
    for name in (*MUTATIONS, "truncate"):
        assert results.rows[f"mutated: {name}"].bodies >= 30, name
    # Both sides of each invariant are reached: bodies with a file part and legitimate ones, from clients and mutated.
    for row in ("all clients", "all mutated"):
        assert results.rows[row].with_file >= 20 and results.rows[row].legitimate >= 20


def test_safety_no_body_a_parser_sees_a_file_in_is_forwarded(results: Results) -> None:
    assert results.total("safety") == 0, _examples(results, "safety")


def test_helpfulness_a_file_part_the_guard_sees_gets_the_spec_403(results: Results) -> None:
    assert results.total("helpfulness") == 0, _examples(results, "helpfulness")


def test_precision_client_bodies_without_a_file_are_forwarded_byte_for_byte(results: Results) -> None:
    # One exception, documented: a file attached with an empty name, written with its type and no filename (httpx,
    # undici, form-data, axios), which busboy and formidable take for a file by that type.
    refused = {rule for rule, counter in results.rules.items() if counter[" precision client"]}
    assert refused <= {"403 content type"}, _examples(results, "precision")


def test_precision_every_exception_is_a_documented_rule_with_a_parser_behind_it(results: Results) -> None:
    documented = _documented_rules()
    for rule, counter in results.rules.items():
        if counter[" precision"] == 0:
            continue
        assert rule in documented, f"{rule} refuses legitimate bodies and is not in {DOC.name}'s differential table"
        assert counter[" differ"] > 0, f"{rule}: no parser reads any body it refuses differently from the others"


async def test_an_earlier_id_on_the_restricted_card_route_is_decided_as_a_comment_upload(clients: list[Sample]) -> None:
    """``POST /cards/{card_id}/files`` with the card's number (a legacy upload, config/gateway.yaml's
    legacy_id_card_file_upload) is read by the same rules as the comment routes: on every client body and on mutated
    ones, its guard decides exactly as the comment update's, whose decisions the invariants above check against the
    parsers."""
    comment, card = Guard(), Guard("legacy_id_card_file_upload")
    samples = next(iter(generate(SEED + 1, clients, bodies=len(clients) + 400, batch=10_000)))
    differ = []
    blocked = forwarded = 0
    for s in samples:
        one, other = await comment.decide(s.ct, s.body, s.chunks), await card.decide(s.ct, s.body, s.chunks)
        if (one.label, one.code, one.rule) != (other.label, other.code, other.rule):
            differ.append((s.family, one.label, other.label))
        blocked += other.blocked
        forwarded += other.forwarded
    assert not differ, differ[:5]
    assert blocked >= 100 and forwarded >= 50  # both sides reached


def test_generation_is_reproducible(clients: list[Sample]) -> None:
    again = list(next(iter(generate(SEED, clients, bodies=len(clients) + 300, batch=10_000))))
    once = list(next(iter(generate(SEED, clients, bodies=len(clients) + 300, batch=10_000))))
    assert again == once
    assert len({s.body for s in again}) > len(again) * 0.9


async def test_client_bodies_are_reproducible(clients: list[Sample]) -> None:
    assert await client_samples(SEED, FORMS) == clients


@pytest.mark.parametrize("case", DISAGREEMENTS, ids=[c.id for c in DISAGREEMENTS])
async def test_fixed_disagreements(case: Disagreement, node: None) -> None:
    (outcome,) = await evaluate([Sample("fixed", case.ct, case.body)], Guard(), timeout=60)
    expected = {"passed": "forwarded", "blocked": "403"}.get(case.expect, f"400 {case.rule}")
    assert outcome.decision.label == expected, outcome.describe()
    assert not (outcome.safety_violation or outcome.helpfulness_violation), outcome.describe()
    assert outcome.precision_exception == (case.expect == "refused" and outcome.legitimate)
    assert outcome.motivation() == case.parsers, outcome.describe()


async def test_the_invariants_catch_a_guard_that_forwards_a_file(node: None) -> None:
    """The harness itself: a forwarding decision on a body a parser sees a file in is a safety violation."""
    case = next(c for c in DISAGREEMENTS if c.id == "name-ending-another-parameter")
    (outcome,) = await evaluate([Sample("fixed", case.ct, case.body)], Guard(), timeout=60)
    assert outcome.seen_by == ("formidable",)
    forwarded = Outcome(outcome.sample, outcome.views, outcome.decision.__class__(200, None, None, True, True), None)
    assert forwarded.safety_violation and not forwarded.precision_exception
    assert set(outcome.views) == set(PARSERS)


def _documented_rules() -> set[str]:
    """The answers listed in the doc's table of rules as the parsers motivate them."""
    text = DOC.read_text()
    section = text.partition("## The rules and the parsers behind them")[2].partition("\n## ")[0]
    first_cells = re.findall(r"^\| (`[^|]+)\|", section, re.MULTILINE)
    return {answer for cell in first_cells for answer in re.findall(r"`([^`]+)`", cell)}
