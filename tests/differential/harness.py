"""The differential harness: bodies from real clients and the mutator, what every parser sees in them, the guard's
decision, and the invariants between them (README.md)."""

from __future__ import annotations

import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.differential.clients import Sample, random_form, write_forms
from tests.differential.guard import Decision, Guard
from tests.differential.mutator import mutate
from tests.differential.parsers import PARSERS, NodeParsers, View, python_views

__all__ = ("Outcome", "Results", "client_samples", "evaluate", "generate", "run")


@dataclass(frozen=True, slots=True)
class Outcome:
    sample: Sample
    views: dict[str, View]
    decision: Decision
    finding: str | None  # why the guard's reader takes a part for a file part

    @property
    def seen_by(self) -> tuple[str, ...]:
        """The parsers that see a file part."""
        return tuple(p for p in PARSERS if self.views[p].sees_file)

    @property
    def legitimate(self) -> bool:
        """Every parser accepts the body and none sees a file part."""
        return all(v.accepts for v in self.views.values()) and not self.seen_by

    @property
    def safety_violation(self) -> bool:
        return bool(self.seen_by) and self.decision.forwarded

    @property
    def precision_exception(self) -> bool:
        return self.legitimate and not (self.decision.forwarded and self.decision.exact)

    @property
    def helpfulness_violation(self) -> bool:
        return self.finding is not None and not self.decision.blocked

    @property
    def plain_upload_not_blocked(self) -> bool:
        """Every parser sees a file part, and the answer is not the spec's 403 (not an invariant: a measure)."""
        return len(self.seen_by) == len(PARSERS) and not self.decision.blocked

    @property
    def rule(self) -> str:
        """The guard's reason, in a few words: its refusal rule, or what made a part a file part."""
        if self.decision.blocked:
            return "403 " + re.sub(r" '.*'| [\w.+-]+/[\w.+-]+$", "", self.finding or "file part")
        return self.decision.label

    def motivation(self) -> tuple[str, ...]:
        """The parsers that read this body differently from the others: they reject it where most accept it (or the
        reverse), see a file part where most see none (or the reverse), read other field names, or take a part for a
        file by their own rule (busboy: octet-stream; formidable: any Content-Type)."""
        readings = {p: (v.accepts, v.sees_file, v.names) for p, v in self.views.items()}
        usual = Counter(readings.values()).most_common(1)[0][0]
        return tuple(p for p in PARSERS if self.views[p].native_file or readings[p] != usual)

    def describe(self) -> str:
        views = "\n".join(f"    {p}: {self.views[p].summary()}" for p in PARSERS)
        return (f"[{self.sample.family}] guard: {self.decision.label} (finding: {self.finding})\n"
                f"    Content-Type: {self.sample.ct}\n    body: {self.sample.body[:600]!r}\n{views}")


async def evaluate(samples: Sequence[Sample], guard: Guard, *, timeout: float = 600) -> list[Outcome]:
    """Every parser's view and the guard's decision for each sample (Node parses while Python does)."""
    node = NodeParsers([(s.ct, s.body) for s in samples], timeout)
    partial = []
    for s in samples:
        views = await python_views(s.ct, s.body)
        partial.append((s, views, await guard.decide(s.ct, s.body, s.chunks), guard.finding(s.ct, s.body)))
    return [Outcome(s, {**n, **views}, decision, finding)
            for (s, views, decision, finding), n in zip(partial, node.views(), strict=True)]


async def client_samples(seed: int, forms: int) -> list[Sample]:
    """Every client's body for ``forms`` seeded forms."""
    rng = random.Random(seed)
    return await write_forms([random_form(rng) for _ in range(forms)], seed)


def generate(seed: int, clients: Sequence[Sample], *, bodies: int, batch: int = 2000) -> Iterable[list[Sample]]:
    """``bodies`` samples in batches: the clients' bodies, then seeded mutations of them."""
    rng = random.Random(seed)
    out: list[Sample] = list(clients[:bodies])
    made = len(out)
    while made < bodies:
        sample = mutate(rng, rng.choice(clients))
        if sample is None:
            continue
        out.append(sample)
        made += 1
        if len(out) >= batch:
            yield out
            out = []
    if out:
        yield out


@dataclass
class Row:
    bodies: int = 0
    with_file: int = 0  # a parser sees a file part
    legitimate: int = 0
    safety: int = 0
    precision: int = 0
    helpfulness: int = 0
    plain_upload_not_403: int = 0


@dataclass
class Results:
    """The invariant counts per generator family, and the first examples of each kind of finding."""

    rows: dict[str, Row] = field(default_factory=lambda: defaultdict(Row))
    # the guard's answer (its rule) -> bodies so answered, precision exceptions among them, and how often each
    # parser read one of those bodies differently from the others
    rules: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    not_403_rules: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Outcome]] = field(default_factory=lambda: defaultdict(list))
    seconds: float = 0.0
    keep: int = 5

    def add(self, outcome: Outcome) -> None:
        family = outcome.sample.family
        keys = ["client: " + family] if "+" not in family else ["mutated: " + m for m in family.split("+")[1:]]
        for key in [*keys, "all clients" if "+" not in family else "all mutated"]:
            row = self.rows[key]
            row.bodies += 1
            row.with_file += bool(outcome.seen_by)
            row.legitimate += outcome.legitimate
            row.safety += outcome.safety_violation
            row.precision += outcome.precision_exception
            row.helpfulness += outcome.helpfulness_violation
            row.plain_upload_not_403 += outcome.plain_upload_not_blocked
        kind = "client" if "+" not in family else "mutated"
        if not outcome.decision.forwarded:
            counter = self.rules[outcome.rule]
            counter[" bodies"] += 1
            counter[" precision"] += outcome.precision_exception
            counter[f" precision {kind}"] += outcome.precision_exception
            motivation = outcome.motivation()
            counter[" differ"] += bool(motivation)
            for parser in motivation:
                counter[parser] += 1
        if outcome.plain_upload_not_blocked:
            self.not_403_rules[f"{kind}: {outcome.rule}"] += 1
        for name, hit in (("safety", outcome.safety_violation), ("helpfulness", outcome.helpfulness_violation),
                          ("precision " + outcome.rule, outcome.precision_exception),
                          ("not 403 " + outcome.rule, outcome.plain_upload_not_blocked)):
            if hit and len(self.examples[name]) < self.keep:
                self.examples[name].append(outcome)

    def table(self) -> str:
        lines = ["| generator family | bodies | a parser sees a file part | legitimate (all accept, no file) | "
                 "safety violations | precision exceptions | helpfulness violations | every parser sees a file, "
                 "answer not 403 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        order = sorted(self.rows, key=lambda k: (not k.startswith("all"), not k.startswith("client"), k))
        for key in order:
            r = self.rows[key]
            lines.append(f"| {key} | {r.bodies} | {r.with_file} | {r.legitimate} | {r.safety} | {r.precision} | "
                         f"{r.helpfulness} | {r.plain_upload_not_403} |")
        lines += ["", "| the guard's answer (not forwarded) | bodies | precision exceptions (client, mutated) | "
                  "bodies the parsers read differently | by parser |", "|---|---:|---:|---:|---|"]
        for rule, c in sorted(self.rules.items(), key=lambda kv: (-kv[1][" precision"], -kv[1][" bodies"])):
            parsers = ", ".join(f"{p} {n}" for p, n in c.most_common() if not p.startswith(" "))
            lines.append(f"| {rule} | {c[' bodies']} | {c[' precision']} ({c[' precision client']}, "
                         f"{c[' precision mutated']}) | {c[' differ']} | {parsers} |")
        lines += ["", "| every parser sees a file part, the answer is not 403 | bodies |", "|---|---:|"]
        lines += [f"| {rule} | {n} |" for rule, n in self.not_403_rules.most_common()]
        return "\n".join(lines)

    def total(self, name: str) -> int:
        return sum(getattr(self.rows[k], name) for k in ("all clients", "all mutated") if k in self.rows)


async def run(seed: int, *, forms: int, bodies: int, batch: int = 2000, keep: int = 5) -> Results:
    results = Results(keep=keep)
    guard = Guard()
    start = time.monotonic()
    clients = await client_samples(seed, forms)
    for samples in generate(seed, clients, bodies=bodies, batch=batch):
        for outcome in await evaluate(samples, guard):
            results.add(outcome)
    results.seconds = time.monotonic() - start
    return results

