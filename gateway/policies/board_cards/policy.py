"""board_cards: withdraw ``cards`` from the board route on the spec's dates ("Limits" 2-3, "Versioning" 5): untouched
before the cap date, at most ``cap`` cards from it, none from the removal date, with ``cards_deprecation_message``
naming the card list request that replaces them. A body it cannot edit safely passes through untouched, counted
(docs/policies/board_cards.md). The policy decides what a board becomes; the HTTP of a rewritten body (content
coding, validators, conditional requests, ``Vary``) is ``core.representation``'s."""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import hashlib
import json
import logging
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from ...core.exchange import BodyTooLarge, BodyUnavailable, Exchange, Next, Pieces, Policy, Reply
from ...core.representation import (
    OFF_LOOP_BYTES,
    REWRITE_DROP,
    Coding,
    Derived,
    NotDecoded,
    accepts_gzip,
    add_vary,
    ask_whole,
    content_etag,
    decode,
    is_json,
    not_modified,
    to_304,
)
from ...core.series import CompanyCounter
from ...core.spec import deprecation_link, deprecation_value, http_date, successor_link
from ...rollout.behaviour import Behaviour, DateFlag
from ...rollout.plan import Schedule
from ..base import BuildContext, PolicySpec
from . import json_splice
from .backfill import REASONS, BackfillFailed, BackfillOptions, CardBackfill, Filled

__all__ = ("BOARD_CARDS", "CAPPED", "FULL", "REMOVED", "Action", "BoardCards", "Families", "NAME", "Options", "Phase",
           "SPEC", "build")

NAME = "board_cards"
log = logging.getLogger("gateway.board_cards")

MESSAGE_KEY = "cards_deprecation_message"
SUCCESSOR = "/api/latest/cards"
MiB = 1 << 20
# Bumped whenever the rewrite's output changes for the same input: part of every ETag the policy derives.
_REWRITE_VERSION = "1"
# Where the backfilled cards go in the board while it is assembled (a NUL cannot occur in JSON text).
_CARDS_HERE = b"\x00cards\x00"


class Phase(enum.IntEnum):
    """The board's phases, in the order of the rollout schedule (its index is the phase's value)."""

    FULL = 0  # every card, the upstream's bytes
    CAPPED = 1  # the first ``cap`` cards
    REMOVED = 2  # none


# The phases as module names too, as re's flags are: an Enum class's attribute is a Python-level lookup in 3.11, and
# these are read on every request.
FULL, CAPPED, REMOVED = Phase


class Action(enum.StrEnum):
    """What the policy did to one board response: the ``action`` label of gateway_board_responses_total and the
    decision's second half in the access log."""

    UNTOUCHED = "untouched"
    CAPPED = "capped"
    REMOVED = "removed"
    PASSED_THROUGH_UNPARSED = "passed_through_unparsed"
    TOO_LARGE = "too_large"
    NOT_OK = "not_ok"
    NOT_MODIFIED = "not_modified"
    BACKFILLED = "backfilled"
    BACKFILL_FAILED = "backfill_failed"
    # In a shadow window: the upstream's board went as it came; the phase decided beside it would have done this.
    WOULD_CAP = "would_cap"
    WOULD_REMOVE = "would_remove"
    # The service's limits on the client's token did not let the backfill finish in time: the board without cards.
    BACKFILL_RATE_LIMITED = "backfill_rate_limited"


_PHASES = tuple(Phase)  # the rollout's index to its Phase, without Enum's call
_PHASE_NAMES = tuple(phase.name.lower() for phase in Phase)  # the phase label of gateway_board_responses_total
# A shadow window's record: what the phase decided beside the one applied would have done to a board it read.
_WOULD = {Action.CAPPED: Action.WOULD_CAP, Action.REMOVED: Action.WOULD_REMOVE}
_READ = frozenset({Action.UNTOUCHED, Action.CAPPED, Action.REMOVED})
_IDENTITY = ("", "identity")
_REWRITING = (CAPPED, REMOVED)

# Spec, "Limits" 2-3: at most 100 cards from 2026-10-01, none from 2026-11-01.
BOARD_CARDS = Behaviour(
    "board_cards",
    tuple(phase.name.lower() for phase in Phase),
    (DateFlag("board_cards_cap", dt.date(2026, 10, 1)), DateFlag("board_cards_removal", dt.date(2026, 11, 1))),
    signals=(DateFlag("board_cards_announcement", label="Deprecation and Link headers",
                      unset="on every board response"),),
    bridge="card_backfill",
    bridge_of=lambda tenant: tenant.card_backfill,
    bridge_phases=("full", "capped"),  # the phases that show cards: the backfill restores what the service withheld
)
# The phases the card backfill bridge acts in, as the behaviour declares them.
_BACKFILL_PHASES = frozenset(_PHASES[BOARD_CARDS.index(phase)] for phase in BOARD_CARDS.bridge_phases)
# The response header that says what the card backfill bridge did (only on bridged requests that needed it).
BACKFILL_HEADER = "X-Gateway-Backfill"


class Families:
    """This policy's metric families, per tenant (tenant names come from the config: the label is bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter(
            "gateway_board_responses", "Board responses, by tenant, phase and action (" + ", ".join(Action) + ").",
            ("tenant", "phase", "action"), registry=registry,
        )
        self.cards_removed = Counter(
            "gateway_board_cards_removed", "Cards withheld from board responses, by tenant.", ("tenant",),
            registry=registry,
        )
        self.backfills = Counter(
            "gateway_board_backfills", "Card backfills (the bridge rebuilding cards from the paginated card list), by "
            "tenant and outcome (done, or why not: " + ", ".join(REASONS) + ").", ("tenant", "outcome"),
            registry=registry,
        )


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # Cards kept from the cap date on (spec: 100).
    cap: int = Field(default=100, ge=1, le=100_000)
    # From the removal date: drop the "cards" key, or send "cards": [].
    removal: Literal["remove_key", "empty_array"] = "remove_key"
    # The limit named in cards_deprecation_message (default: cap).
    page_limit: int | None = Field(default=None, ge=1, le=100_000)
    # Bodies larger than this (after decoding) pass through untouched.
    max_body_bytes: int = Field(default=64 * MiB, ge=1024, le=1024 * MiB)
    # RFC 9745 Deprecation and RFC 8288 Link headers on board responses, from rollout.board_cards_announcement.
    signal: bool = True
    # Documentation of the deprecation, sent as Link rel="deprecation" when set.
    deprecation_link: AnyHttpUrl | None = None
    # Rewritten bodies are gzipped for clients that accept it, from this size on.
    compress_min_bytes: int = Field(default=1024, ge=0)
    compress_level: int = Field(default=6, ge=1, le=9)
    # Scans of identical upstream bodies are reused (checked byte for byte); total size of bodies kept. 0: off.
    memo_bytes: int = Field(default=64 * MiB, ge=0, le=4096 * MiB)
    # The card backfill bridge's bounds (whether it applies: the tenant's bridges.card_backfill, or an exemption's
    # bridge).
    backfill: BackfillOptions = BackfillOptions()


@dataclass(slots=True)
class _MemoEntry:
    body: json_splice.Text
    layout: json_splice.Layout
    # (phase, gzip accepted) -> (body, gzipped): outputs that are new bytes (not the upstream's body as it is).
    rendered: dict[tuple[int, bool], tuple[bytes, bool]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """What the memo is charged for it: the body and every output kept."""
        return len(self.body) + sum(len(out) for out, _ in self.rendered.values())


class _Memo:
    """Scans of recent upstream bodies, reused only for a body equal byte for byte; bounded by the total size of the
    bodies kept and of the outputs rendered from them."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0
        self.entries: OrderedDict[tuple[str, str], _MemoEntry] = OrderedDict()

    def kept(self, key: tuple[str, str]) -> _MemoEntry | None:
        """The entry kept for ``key``: a new body is compared with its body as it arrives (``used`` if equal)."""
        return self.entries.get(key)

    def used(self, key: tuple[str, str]) -> None:
        self.entries.move_to_end(key)

    def put(self, key: tuple[str, str], entry: _MemoEntry) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.size -= old.size
        if entry.size > self.budget:
            return
        self.entries[key] = entry
        self.size += entry.size
        self._evict()

    def render(self, key: tuple[str, str], entry: _MemoEntry, which: tuple[int, bool],
               output: tuple[bytes, bool]) -> None:
        """Keep an output rendered from ``entry``; the memo is charged for it while it keeps the entry."""
        entry.rendered[which] = output
        if self.entries.get(key) is entry:
            self.size += len(output[0])
            self._evict()

    def _evict(self) -> None:
        while self.size > self.budget and self.entries:
            _, evicted = self.entries.popitem(last=False)
            self.size -= evicted.size


class _PassThrough(Exception):
    """The upstream's bytes go as they came (fail open): ``action`` is counted, ``reason`` logged."""

    def __init__(self, action: Action, reason: str) -> None:
        super().__init__(reason)
        self.action = action
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Signals:
    """One tenant's signal headers, worked out once."""

    start: float | None  # rollout.board_cards_announcement (None: always)
    deprecation: str | None  # the Deprecation header: the cap date
    sunset: tuple[float, str] | None  # RFC 8594: the removal date, and its Sunset header, sent while it lies ahead

    @classmethod
    def of(cls, schedule: Schedule) -> _Signals:
        cap_at = schedule.flag_instant("board_cards_cap")
        removal_at = schedule.flag_instant("board_cards_removal")
        return cls(schedule.signals["board_cards_announcement"],
                   None if cap_at is None else deprecation_value(cap_at),
                   None if removal_at is None else (removal_at, http_date(removal_at)))

    def dates(self, headers: CIMultiDict[str], now: float) -> bool:
        """``Deprecation`` and ``Sunset`` (while the removal lies ahead), once announced: False before."""
        if self.start is not None and now < self.start:
            return False
        if self.deprecation is not None:
            headers["Deprecation"] = self.deprecation
        if self.sunset is not None and now < self.sunset[0]:
            headers["Sunset"] = self.sunset[1]
        return True


class _Call:
    """One request's view of the policy: its tenant, phase and label (the request's rollout decision, turned into
    this policy's terms here and nowhere else), whether the bridge applies, a shadow window's phase, and how its
    outcome is recorded."""

    __slots__ = ("policy", "exchange", "tenant", "phase", "label", "bridged", "shadow", "would", "vary", "board", "now")

    def __init__(self, policy: BoardCards, exchange: Exchange) -> None:
        decision = exchange.decide(BOARD_CARDS.name)
        phase = _PHASES[decision.index]
        self.policy = policy
        self.exchange = exchange
        self.tenant = exchange.tenant.name
        self.phase = phase
        self.label = decision.label
        # The card backfill bridge: for a client whose phase shows cards (all, or up to the cap), when the tenant or
        # an exemption says so.
        self.bridged = phase in _BACKFILL_PHASES and decision.bridge
        self.shadow = None if decision.shadow is None or self.bridged else _PHASES[decision.shadow]
        self.would: Action | None = None  # what the shadow's phase would have done to the board read
        self.vary = decision.vary
        self.board = exchange.params.get("board_id", "")
        assert exchange.rollout is not None
        self.now = exchange.rollout.now

    @property
    def if_none_match(self) -> str | None:
        return self.exchange.headers.get("If-None-Match")

    @property
    def key(self) -> tuple[str, str]:
        """The memo's key for this board."""
        return (self.tenant, self.exchange.path)

    @property
    def gzip_ok(self) -> bool:
        return accepts_gzip(self.exchange.headers.get("Accept-Encoding"))

    def saw(self, layout: json_splice.Layout, cap: int) -> None:
        """The board read, in a shadow window: what its phase would have done to it, if other than the phase's."""
        if self.shadow is not None:
            self.would = _WOULD.get(_action_of(layout, self.shadow, cap)[0])

    def finish(self, action: Action, reply: Reply) -> Reply:
        if self.would is not None and action in _READ:
            action = self.would  # recorded as what the shadow's phase would have done; the answer is as it is
        self.policy.responses.inc((self.tenant, _PHASE_NAMES[self.phase], action))
        self.exchange.decisions[NAME] = self.label + ":" + action
        return reply

    def signal(self, headers: CIMultiDict[str]) -> None:
        self.policy.signal_headers(headers, self.tenant, self.board, self.now)

    def vary_rewritten(self, headers: CIMultiDict[str]) -> None:
        """A rewritten (or re-encoded) answer varies on the encoding, and on what the decision read."""
        add_vary(headers, ("Accept-Encoding", *self.vary))

    def passed_through(self, reply: Reply, skip: _PassThrough) -> Reply:
        """The upstream's bytes, as read: counted, logged, signalled."""
        log.warning(
            "board_cards: response passed through untouched (%s: %s); tenant %s, route %s, request id %s",
            skip.action, skip.reason, self.tenant, self.exchange.route.name, self.exchange.request_id,
        )
        self.signal(reply.headers)
        return self.finish(skip.action, reply)


def _derived(options: Options) -> dict[Phase, Derived]:
    """What each rewriting phase derives: its ETag suffix changes whenever what the phase does to a body changes."""
    fingerprint = hashlib.sha256((options.model_dump_json() + _REWRITE_VERSION).encode()).hexdigest()[:8]
    return {phase: Derived(f".cards-{BOARD_CARDS.phases[phase]}-{fingerprint}") for phase in _REWRITING}


class BoardCards:
    """The policy, built once per route (and again on reload): everything derived from the options and the rollout
    plan; each request's state lives in a ``_Call``."""

    def __init__(self, options: Options, ctx: BuildContext) -> None:
        if not json_splice.NATIVE:
            log.warning(
                "board_cards: the C JSON scanner (gateway.policies.board_cards._jsonscan) is not built (no C compiler "
                "at install); large boards are read by the Python path, about 35 times more slowly; reinstall with "
                "gcc to build it"
            )
        self.options = options
        self.cap = options.cap
        self.page_limit = options.page_limit or options.cap
        self.empty_array = options.removal == "empty_array"
        self.max_body = options.max_body_bytes
        self.memo = _Memo(options.memo_bytes) if options.memo_bytes else None
        self.doc_link = deprecation_link(str(options.deprecation_link)) if options.deprecation_link else None
        self.derived = _derived(options)
        self._per_tenant(options, ctx)
        # Work on whole bodies that could hold the event loop for long (a backfill's pages and its answer, gzip of a
        # large body) runs on these threads; they end with the policy (a reload builds a new one).
        self.workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="board_cards")
        weakref.finalize(self, self.workers.shutdown, wait=False)
        self.coding = Coding(options.compress_min_bytes, options.compress_level, self.workers)
        self.backfill = CardBackfill(options.backfill, ctx.limits, self.workers)

    def _per_tenant(self, options: Options, ctx: BuildContext) -> None:
        """Per tenant, when first needed: its signal headers (shared by tenants whose schedule is shared) and its
        series (a company's appear with its first board response: core.series)."""
        self.plan = ctx.rollout
        self.signals: dict[Schedule, _Signals] = {}
        families = ctx.families(Families)
        self.responses = CompanyCounter(families.responses, ctx.companies)
        self.removed = CompanyCounter(families.cards_removed, ctx.companies)
        self.backfills = CompanyCounter(families.backfills, ctx.companies)

    # --- headers ------------------------------------------------------------------------------------------------

    def signal_headers(self, headers: CIMultiDict[str], tenant: str, board: str, now: float) -> None:
        if not self.options.signal:
            return
        schedule = self.plan.schedule(tenant, BOARD_CARDS.name)
        own = self.signals.get(schedule)
        if own is None:
            own = self.signals[schedule] = _Signals.of(schedule)
        if not own.dates(headers, now):
            return
        headers.add("Link", successor_link(f"{SUCCESSOR}?board_id={board}"))
        if self.doc_link is not None:
            headers.add("Link", self.doc_link)

    # --- bodies -------------------------------------------------------------------------------------------------

    def message(self, board: str, phase: Phase, count: int | None) -> bytes:
        """``cards_deprecation_message``; in the capped phase, ``count`` None: the total is not known."""
        if phase is CAPPED:
            of = "" if count is None else f" of {count}"
            text = (
                f"Cards on the board route are deprecated: this response holds the first {self.cap}{of} cards. "
                f"Read the rest with GET {SUCCESSOR}?board_id={board}&limit={self.page_limit}&offset={self.cap}."
            )
        else:
            text = (
                "Cards are no longer returned on the board route. "
                f"Read them with GET {SUCCESSOR}?board_id={board}&limit={self.page_limit}&offset=0."
            )
        return json.dumps(text, ensure_ascii=False).encode()

    def rewrite(self, body: json_splice.Text, layout: json_splice.Layout, phase: Phase, board: str) -> bytes:
        """The body for a phase that withholds cards from it (``_action_of`` says it does)."""
        extra = (MESSAGE_KEY, self.message(board, phase, layout.count))
        capped = phase is CAPPED
        if capped or self.empty_array:
            return json_splice.truncate(body, layout, self.cap if capped else 0, extra)
        return json_splice.drop(body, layout, extra)

    async def read_board(self, reply: Reply, key: tuple[str, str]) -> tuple[json_splice.Text, _MemoEntry]:
        """The upstream's 200 body, decoded, and its scan; ``_PassThrough`` for one this policy does not read (the
        reply then still sends all of it: what was read, then the rest as it streams).

        The body is scanned while it arrives, a piece at a time between the event loop's other work, and kept as
        those pieces, never joined. A body equal byte for byte to the one the memo keeps for this board is only
        compared with it, not scanned: the memo's scan is used (a compressed body is decoded whole, then read)."""
        coding = self.readable(reply)
        memo = self.memo
        kept = memo.kept(key) if memo is not None else None
        reader = json_splice.Reader("cards", keep=self.cap, extra_key=MESSAGE_KEY,
                                    same_as=kept.body if kept else None)
        identity = coding in _IDENTITY
        try:
            raw = await reply.read_pieces(self.max_body, reader.feed if identity else None)
        except BodyTooLarge:
            raise _PassThrough(Action.TOO_LARGE, "the body is over max_body_bytes") from None
        if not identity:
            reader.feed(self.decoded(b"".join(raw), coding))
        return self.scanned(key, kept, reader)

    def scanned(self, key: tuple[str, str], kept: _MemoEntry | None, reader: json_splice.Reader
                ) -> tuple[json_splice.Text, _MemoEntry]:
        """The body read: the memo's entry when it is the same, else its new scan (kept in the memo)."""
        memo = self.memo
        if memo is not None and kept is not None and reader.same:
            memo.used(key)
            return kept.body, kept
        try:
            layout = reader.layout()
        except json_splice.NotJSON as err:
            raise _PassThrough(Action.PASSED_THROUGH_UNPARSED, str(err)) from None
        entry = _MemoEntry(reader.body, layout)
        if memo is not None:
            memo.put(key, entry)
        return entry.body, entry

    def readable(self, reply: Reply) -> str:
        """The body's content coding (lower case), for a body the policy reads: JSON, and not declared too long."""
        headers = reply.headers
        if not is_json(headers.get("Content-Type", "")):
            raise _PassThrough(Action.PASSED_THROUGH_UNPARSED, "not a JSON content type")
        coding = headers.get("Content-Encoding", "").strip().lower()
        length = reply.length
        if length is not None and length > self.max_body and coding in _IDENTITY:
            raise _PassThrough(Action.TOO_LARGE, f"Content-Length {length} is over max_body_bytes")
        return coding

    def decoded(self, raw: bytes, coding: str) -> bytes:
        """A content-coded body, decoded whole once it is in (within max_body_bytes)."""
        try:
            return decode(raw, coding, self.max_body)
        except NotDecoded as err:
            raise _PassThrough(Action.TOO_LARGE if err.too_large else Action.PASSED_THROUGH_UNPARSED,
                               err.reason) from None

    async def rendered(self, call: _Call, entry: _MemoEntry, body: json_splice.Text, action: Action
                       ) -> tuple[bytes, bool]:
        """The client's body for this phase and encoding; the same scan, phase and encoding give the same output,
        so a new one is kept with the scan."""
        gzip_ok = call.gzip_ok
        which = (call.phase, gzip_ok)
        output = entry.rendered.get(which)
        if output is None:
            plain = action is Action.UNTOUCHED
            # (The pieces are joined once.)
            out = bytes(body) if plain else self.rewrite(body, entry.layout, call.phase, call.board)
            output = await self.coding.encoded(out, gzip_ok)
            if self.memo is not None and not (plain and output[0] is out):
                self.memo.render(call.key, entry, which, output)
        return output

    # --- the policy ---------------------------------------------------------------------------------------------

    async def __call__(self, exchange: Exchange, next: Next) -> Reply:
        call = _Call(self, exchange)
        if call.phase is FULL and not call.bridged:
            reply = await next(exchange)
            return self.untouched(call, reply) if call.shadow is None else await self.shadowed(call, reply)
        self.ask_upstream(call)
        reply = await next(exchange)
        if reply.status == 304:
            return self.revalidated(call, reply)
        if reply.status != 200:
            return call.finish(Action.NOT_OK, reply)
        return await self.board(call, reply)

    def untouched(self, call: _Call, reply: Reply) -> Reply:
        """The full phase: the upstream's answer as it is, signalled."""
        if reply.status not in (200, 304):
            return call.finish(Action.NOT_OK, reply)
        call.signal(reply.headers)
        add_vary(reply.headers, call.vary)
        return call.finish(Action.UNTOUCHED, reply)

    async def shadowed(self, call: _Call, reply: Reply) -> Reply:
        """The full phase in a shadow window: the request went upstream as it came and its answer goes back as it
        came; the board is read on the way to record what the phase decided beside it would have done to it."""
        if reply.status != 200:
            return self.untouched(call, reply)
        try:
            _, entry = await self.read_board(reply, call.key)
        except _PassThrough as skip:
            return call.passed_through(reply, skip)
        except BodyUnavailable:
            return call.finish(Action.NOT_OK, reply)
        call.saw(entry.layout, self.cap)
        return self.untouched(call, reply)

    def ask_upstream(self, call: _Call) -> None:
        """A rewriting phase, or the bridge: the upstream is asked for bytes the policy can read and for validators
        it can translate."""
        exchange = call.exchange
        if call.bridged:
            # The answer may be assembled from pages: its validator is the gateway's, so the gateway judges the
            # condition itself, on a full answer from the upstream.
            ask_whole(exchange.upstream_headers)
        else:
            self.derived[call.phase].ask(exchange.upstream_headers, call.if_none_match)
        # HEAD answers with GET's headers: the upstream is asked for the body GET would rewrite (the core sends the
        # client the head only).
        exchange.answer_from_body()

    def revalidated(self, call: _Call, reply: Reply) -> Reply:
        """The upstream's 304 to a translated condition, labelled as the phase's."""
        # (Bridged in the full phase the upstream was asked unconditionally: a 304 anyway is passed on as the full
        # phase would.)
        if call.phase is not FULL:
            self.derived[call.phase].revalidated(reply.headers)
        call.vary_rewritten(reply.headers)
        call.signal(reply.headers)
        return call.finish(Action.NOT_MODIFIED, reply)

    async def board(self, call: _Call, reply: Reply) -> Reply:
        """The upstream's 200: read, then bridged, rewritten or passed on."""
        try:
            body, entry = await self.read_board(reply, call.key)
        except _PassThrough as skip:
            return call.passed_through(reply, skip)
        except BodyUnavailable:
            return call.finish(Action.NOT_OK, reply)  # the upstream broke off part way: the core's error answer
        if call.bridged:
            return await self.bridge(call, reply, body, entry)
        call.saw(entry.layout, self.cap)
        return await self.rewritten(call, reply, body, entry)

    async def bridge(self, call: _Call, reply: Reply, body: json_splice.Text, entry: _MemoEntry) -> Reply:
        """A bridged request: the board backfilled when it lacks cards the phase shows, else as the phase has it."""
        if _lacks_cards(entry.layout, call.phase, self.cap):
            return await self.backfilled(call, reply, body, entry.layout)
        if call.phase is FULL:
            return self.whole(call, reply)
        return await self.rewritten(call, reply, body, entry)

    def whole(self, call: _Call, reply: Reply) -> Reply:
        """Bridged in the full phase, the upstream's board is whole: it goes as it came (the condition judged here,
        see ``ask_upstream``)."""
        headers = reply.headers
        call.signal(headers)
        call.vary_rewritten(headers)
        if not_modified(call.if_none_match, headers.get("ETag")):
            to_304(reply)
            return call.finish(Action.NOT_MODIFIED, reply)
        return call.finish(Action.UNTOUCHED, reply)

    async def rewritten(self, call: _Call, reply: Reply, body: json_splice.Text, entry: _MemoEntry) -> Reply:
        """The phase's board: cards withheld (or the upstream's bytes, when there are none to withhold), labelled as
        the phase's representation."""
        layout = entry.layout
        if layout.target is not None and not layout.is_array:
            return call.passed_through(reply, _PassThrough(Action.PASSED_THROUGH_UNPARSED, "cards is not an array"))
        action, withheld = _action_of(layout, call.phase, self.cap)
        out, gzipped = await self.rendered(call, entry, body, action)
        headers = reply.headers
        self.derived[call.phase].label(headers, rewritten=action is not Action.UNTOUCHED, gzipped=gzipped)
        call.vary_rewritten(headers)
        call.signal(headers)
        if withheld:
            self.removed.inc((call.tenant,), withheld)
        if call.bridged and not_modified(call.if_none_match, headers.get("ETag")):
            to_304(reply)
            return call.finish(Action.NOT_MODIFIED, reply)
        reply.set_body(out)
        return call.finish(action, reply)

    # --- the card backfill bridge -------------------------------------------------------------------------------

    async def backfilled(self, call: _Call, reply: Reply, body: json_splice.Text, layout: json_splice.Layout
                         ) -> Reply:
        """The board with its cards rebuilt from the card list; on any failure, the upstream's board as it came."""
        headers = reply.headers
        call.vary_rewritten(headers)
        call.signal(headers)
        try:
            # All of them, or the cap and one more: enough to know whether the phase withholds any.
            filled = await self.backfill.cards(call.exchange, call.board,
                                               None if call.phase is FULL else self.cap + 1)
        except BackfillFailed as failed:
            return self.backfill_failed(call, reply, failed)
        count, message = self.shown(call, filled)
        pieces, etag, gzipped = await self.assembled(body, layout, filled.cards, count, message, call.gzip_ok)
        self.backfill_done(call, headers, etag, count, filled)
        if not_modified(call.if_none_match, etag):
            to_304(reply)
            return call.finish(Action.NOT_MODIFIED, reply)
        if gzipped is not None:
            headers["Content-Encoding"] = "gzip"
        reply.set_body(_board_body(pieces, gzipped))
        return call.finish(Action.BACKFILLED, reply)

    def backfill_done(self, call: _Call, headers: CIMultiDict[str], etag: str, count: int, filled: Filled) -> None:
        """The backfilled board's headers (its own validator: it is assembled from several upstream responses), its
        count and note."""
        for name in REWRITE_DROP:
            headers.popall(name, None)
        headers["ETag"] = etag
        headers[BACKFILL_HEADER] = f"done; cards={count}; pages={filled.pages}" + ("; shared" if filled.shared else "")
        self.backfills.inc((call.tenant, "done"))
        call.exchange.notes["board_cards.backfill"] = _done_note(count, filled)

    def backfill_failed(self, call: _Call, reply: Reply, failed: BackfillFailed) -> Reply:
        """The bytes read: never a partial array presented as whole. Over the service's limits, the outcome is named
        ``rate_limited``, with the seconds until the service takes the token's requests again."""
        self.backfills.inc((call.tenant, failed.reason))
        call.exchange.notes["board_cards.backfill"] = failed.reason
        log.warning("board_cards: card backfill not done (%s); tenant %s, board %s, request id %s",
                    failed.detail, call.tenant, call.board, call.exchange.request_id)
        if failed.retry_after is not None:
            reply.headers[BACKFILL_HEADER] = f"rate_limited; retry_after={failed.retry_after}"
            return call.finish(Action.BACKFILL_RATE_LIMITED, reply)
        reply.headers[BACKFILL_HEADER] = f"failed; reason={failed.reason}"
        return call.finish(Action.BACKFILL_FAILED, reply)

    def shown(self, call: _Call, filled: Filled) -> tuple[int, bytes | None]:
        """How many of the backfilled cards the phase shows, and the message naming the rest's request when it
        withholds some."""
        total = len(filled.cards)
        if call.phase is CAPPED and total > self.cap:
            return self.cap, self.message(call.board, CAPPED, None)
        return total, None

    async def assembled(self, body: json_splice.Text, layout: json_splice.Layout, cards: Sequence[bytes | memoryview],
                        count: int, message: bytes | None, gzip_ok: bool
                        ) -> tuple[list[bytes | memoryview], str, bytes | None]:
        """``assemble``: hashed (and compressed) on a worker thread when large (the answer can be as large as
        max_bytes). It is never copied whole: the cards go out as views into the pages they came in."""
        if sum(len(card) for card in cards) < OFF_LOOP_BYTES:
            return self.assemble(body, layout, cards, count, message, gzip_ok)
        return await asyncio.get_running_loop().run_in_executor(
            self.workers, self.assemble, body, layout, cards, count, message, gzip_ok)

    def assemble(self, body: json_splice.Text, layout: json_splice.Layout, cards: Sequence[bytes | memoryview],
                 count: int, message: bytes | None,
                 gzip_ok: bool) -> tuple[list[bytes | memoryview], str, bytes | None]:
        """(On a worker thread.) The board with its first ``count`` cards in place, as pieces (the cards are views
        into their pages), its ETag, and its gzip coding when the client takes one. With ``message`` (more cards than
        the phase shows), the message naming the rest's request is set in the upstream's board, which holds fewer
        cards, before the cards go in."""
        pieces = _board_pieces(body, layout, cards, count, message)
        length = sum(len(p) for p in pieces)
        if length < OFF_LOOP_BYTES:
            # Small: in one piece (hashed and compressed in one call each).
            out = b"".join(pieces)
            small, gzipped = self.coding.encode(out, gzip_ok)
            return [out], content_etag((out,), "bf"), small if gzipped else None
        gzipped_pieces = self.coding.encode_pieces(pieces, length, gzip_ok)
        return ([] if gzipped_pieces is not None else pieces), content_etag(pieces, "bf"), gzipped_pieces


def build(options: Options, ctx: BuildContext) -> Policy:
    return BoardCards(options, ctx)


def _done_note(count: int, filled: Filled) -> str:
    """The access log's note of a backfill done: its cards and pages, whether another reader's was shared, and how
    long the service's limits made it wait."""
    note = f"done cards={count} pages={filled.pages}"
    if filled.shared:
        note += " shared"
    if filled.waited:
        note += f" waited={filled.waited:.1f}"
    return note


def _board_pieces(body: json_splice.Text, layout: json_splice.Layout, cards: Sequence[bytes | memoryview],
                  count: int, message: bytes | None) -> list[bytes | memoryview]:
    """The board with ``cards[:count]`` as its cards, as pieces (the cards are the pieces between the frame's)."""
    if message is not None:
        body = json_splice.set_member(body, layout, MESSAGE_KEY, message)
        layout = json_splice.scan(body, "cards", extra_key=MESSAGE_KEY)
    # The board with a placeholder where the cards go (a NUL cannot occur in JSON text).
    frame = json_splice.set_member(body, layout, "cards", _CARDS_HERE, before=MESSAGE_KEY,
                                   remove=() if message is not None else (MESSAGE_KEY,))
    head, _, tail = frame.partition(_CARDS_HERE)
    pieces: list[bytes | memoryview] = [head + b"["]
    for card in cards[:count]:
        pieces += (card, b",")
    if count:
        pieces.pop()
    pieces.append(b"]" + tail)
    return pieces


def _board_body(pieces: list[bytes | memoryview], gzipped: bytes | None) -> bytes | Pieces:
    if gzipped is not None:
        return gzipped
    if sum(len(piece) for piece in pieces) < OFF_LOOP_BYTES:
        return b"".join(pieces)  # small: it leaves with its head in one write
    return Pieces(pieces)


def _lacks_cards(layout: json_splice.Layout, phase: Phase, cap: int) -> bool:
    """For a bridged request: whether the upstream's board lacks cards the phase shows (no ``cards``, or the
    service's message that it withheld some, with fewer than the phase shows)."""
    if layout.target is not None and not layout.is_array:
        return False  # not a board this policy can edit: passed through
    withheld = layout.target is None or layout.extra is not None
    return withheld and not (phase is CAPPED and layout.count >= cap)


def _action_of(layout: json_splice.Layout, phase: Phase, cap: int) -> tuple[Action, int]:
    """What a rewriting phase does to a board (an array of cards, or none), and how many cards it withholds."""
    if layout.target is None:
        return Action.UNTOUCHED, 0
    if phase is CAPPED:
        return (Action.CAPPED, layout.count - cap) if layout.count > cap else (Action.UNTOUCHED, 0)
    return Action.REMOVED, layout.count


SPEC = PolicySpec(NAME, Options, build, behaviours=(BOARD_CARDS,))
