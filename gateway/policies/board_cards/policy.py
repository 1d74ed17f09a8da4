"""board_cards: withdraw ``cards`` from the board route on the spec's dates ("Limits" 2-3, "Versioning" 5): untouched
before the cap date, at most ``cap`` cards from it, none from the removal date, with ``cards_deprecation_message``
naming the card list request that replaces them. A body it cannot edit safely passes through untouched, counted
(docs/policies/board_cards.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import hashlib
import json
import logging
import re
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from ...core.exchange import BodyTooLarge, BodyUnavailable, Exchange, Next, Pieces, Policy, Reply
from ...core.spec import deprecation_link, deprecation_value, http_date, successor_link
from ...rollout.behaviour import Behaviour, DateFlag
from ...rollout.plan import Schedule
from ..base import BuildContext, PolicySpec
from . import json_splice
from .backfill import REASONS, BackfillFailed, BackfillOptions, CardBackfill

__all__ = ("BOARD_CARDS", "BoardCards", "Families", "NAME", "Options", "SPEC", "build")

NAME = "board_cards"
log = logging.getLogger("gateway.board_cards")

MESSAGE_KEY = "cards_deprecation_message"
SUCCESSOR = "/api/latest/cards"
MiB = 1 << 20
# Bumped whenever the rewrite's output changes for the same input: part of every ETag the policy derives.
_REWRITE_VERSION = "1"
# Where the backfilled cards go in the board while it is assembled (a NUL cannot occur in JSON text).
_CARDS_HERE = b"\x00cards\x00"
# A body at least this large is compressed on a worker thread, off the event loop.
_OFF_LOOP_BYTES = 1 * MiB


# Spec, "Limits" 2-3: at most 100 cards from 2026-10-01, none from 2026-11-01.
BOARD_CARDS = Behaviour(
    "board_cards",
    ("full", "capped", "removed"),
    (DateFlag("board_cards_cap", dt.date(2026, 10, 1)), DateFlag("board_cards_removal", dt.date(2026, 11, 1))),
    signals=(DateFlag("board_cards_announcement", label="Deprecation and Link headers",
                      unset="on every board response"),),
    bridge="card_backfill",
    bridge_of=lambda tenant: tenant.card_backfill,
    bridge_phases=("full", "capped"),  # the phases that show cards: the backfill restores what the service withheld
)
_BACKFILL_PHASES = frozenset(BOARD_CARDS.index(phase) for phase in BOARD_CARDS.bridge_phases)
_ACTIONS = ("untouched", "capped", "removed", "passed_through_unparsed", "too_large", "not_ok", "not_modified",
            "backfilled", "backfill_failed")
_BACKFILL_OUTCOMES = ("done", *REASONS)
# The response header that says what the card backfill bridge did (only on bridged requests that needed it).
BACKFILL_HEADER = "X-Gateway-Backfill"


class Families:
    """This policy's metric families, per tenant (tenant names come from the config: the label is bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter(
            "gateway_board_responses", "Board responses, by tenant, phase and action (" + ", ".join(_ACTIONS) + ").",
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


# Response headers that describe the upstream's bytes and are wrong for a rewritten body.
_REWRITE_DROP = frozenset(
    {"content-length", "content-encoding", "etag", "last-modified", "content-md5", "digest", "content-digest",
     "repr-digest", "accept-ranges", "content-range"}
)
# The same for the upstream's bytes sent again (re-encoded at most): their Last-Modified still dates them.
_REENCODE_DROP = _REWRITE_DROP - {"last-modified"}
# Request headers that would let the upstream answer for a representation the policy then rewrites differently.
_CONDITIONAL_DROP = ("If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range", "If-Match")
_JSON_TYPE = re.compile(r"^\s*application/(?:[\w.+-]+\+)?json\s*(?:;|$)", re.IGNORECASE)
_ETAG = re.compile(r'\s*(?:(W/)?"([^"]*)"|(\*))\s*(?:,|$)')
_GZIP_NAMES = frozenset({"gzip", "x-gzip"})


def _accepts_gzip(header: str | None) -> bool:
    if not header:
        return False
    star = gzip_q = None
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if coding in _GZIP_NAMES:
            gzip_q = quality
        elif coding == "*":
            star = quality
    chosen = gzip_q if gzip_q is not None else star
    return chosen is not None and chosen > 0


def _parse_etags(value: str) -> list[tuple[bool, str]] | None:
    """``If-None-Match`` as (weak, opaque) pairs; ``("*", ...)`` for a star; None when malformed."""
    tags: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(value):
        m = _ETAG.match(value, pos)
        if m is None or m.end() == pos:
            return None
        tags.append((True, "*") if m.group(3) else (bool(m.group(1)), m.group(2)))
        pos = m.end()
    return tags


@dataclass(slots=True)
class _MemoEntry:
    body: json_splice.Text
    layout: json_splice.Layout
    # (phase index, gzip accepted) -> (body, gzipped): outputs that are new bytes (not the upstream's body as it is).
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

    def render(self, key: tuple[str, str], entry: _MemoEntry, which: tuple[int, bool], output: tuple[bytes, bool]) -> None:
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

    def __init__(self, action: str, reason: str) -> None:
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


class _Call:
    """One request's view of the policy: its tenant, phase and label, and how its outcome is recorded."""

    __slots__ = ("policy", "exchange", "tenant", "index", "phase", "label", "board", "now")

    def __init__(self, policy: BoardCards, exchange: Exchange, index: int, kind: str, now: float) -> None:
        self.policy = policy
        self.exchange = exchange
        self.tenant = exchange.tenant.name
        self.index = index
        self.phase = BOARD_CARDS.phases[index]
        self.label = self.phase if kind not in ("brownout", "exemption") else f"{self.phase}({kind})"
        self.board = exchange.params.get("board_id", "")
        self.now = now

    def finish(self, action: str) -> None:
        self.policy.counters[(self.tenant, self.phase, action)].inc()
        self.exchange.decisions[NAME] = f"{self.label}:{action}"

    def signal(self, headers: CIMultiDict[str]) -> None:
        self.policy.signal_headers(headers, self.tenant, self.board, self.now)

    def passed_through(self, reply: Reply, skip: _PassThrough) -> Reply:
        """The upstream's bytes, as read: counted, logged, signalled."""
        self.finish(skip.action)
        log.warning(
            "board_cards: response passed through untouched (%s: %s); tenant %s, route %s, request id %s",
            skip.action, skip.reason, self.tenant, self.exchange.route.name, self.exchange.request_id,
        )
        self.signal(reply.headers)
        return reply


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
        self.schedules: dict[str, Schedule] = {tenant: per[BOARD_CARDS.name]
                                               for tenant, per in ctx.rollout.schedules.items()}
        self.clock = ctx.clock
        families = ctx.families(Families)
        phases = BOARD_CARDS.phases
        self.cap = options.cap
        self.page_limit = options.page_limit or options.cap
        self.empty_array = options.removal == "empty_array"
        self.max_body = options.max_body_bytes
        self.memo = _Memo(options.memo_bytes) if options.memo_bytes else None
        self.doc_link = deprecation_link(str(options.deprecation_link)) if options.deprecation_link else None
        # One ETag suffix per rewriting phase: it changes whenever what the phase does to a body changes.
        fingerprint = hashlib.sha256((options.model_dump_json() + _REWRITE_VERSION).encode()).hexdigest()[:8]
        self.suffixes = {i: f".cards-{phases[i]}-{fingerprint}" for i in (1, 2)}
        # Every series of every configured tenant exists from the start (at 0), so that increase() sees the first one.
        self.counters = {
            (tenant, phase, action): families.responses.labels(tenant, phase, action)
            for tenant in self.schedules for phase in phases for action in _ACTIONS
        }
        self.removed_counters = {tenant: families.cards_removed.labels(tenant) for tenant in self.schedules}
        self.backfill_counters = {(tenant, outcome): families.backfills.labels(tenant, outcome)
                                  for tenant in self.schedules for outcome in _BACKFILL_OUTCOMES}
        # Per tenant, once: the signal headers, and what a rewritten response varies on.
        self.signals = {tenant: _Signals.of(s) for tenant, s in self.schedules.items()} if options.signal else {}
        self.rewritten_vary = {tenant: ("Accept-Encoding", *s.vary) for tenant, s in self.schedules.items()}
        # Work on whole bodies that could hold the event loop for long (a backfill's pages and its answer, gzip of a
        # large body) runs on these threads; they end with the policy (a reload builds a new one).
        self.workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="board_cards")
        weakref.finalize(self, self.workers.shutdown, wait=False)
        self.backfill = CardBackfill(options.backfill, self.workers)

    # --- headers ------------------------------------------------------------------------------------------------

    def signal_headers(self, headers: CIMultiDict[str], tenant: str, board: str, now: float) -> None:
        own = self.signals.get(tenant)
        if own is None or (own.start is not None and now < own.start):
            return
        if own.deprecation is not None:
            headers["Deprecation"] = own.deprecation
        if own.sunset is not None and now < own.sunset[0]:
            headers["Sunset"] = own.sunset[1]
        headers.add("Link", successor_link(f"{SUCCESSOR}?board_id={board}"))
        if self.doc_link is not None:
            headers.add("Link", self.doc_link)

    @staticmethod
    def vary(headers: CIMultiDict[str], names: tuple[str, ...]) -> None:
        present = {v.strip().lower() for value in headers.getall("Vary", ()) for v in value.split(",")}
        if "*" in present:
            return
        extra = [n for n in names if n.lower() not in present]
        if extra:
            headers.add("Vary", ", ".join(extra))

    def weak_etag(self, upstream_etag: str | None, index: int) -> str | None:
        if not upstream_etag:
            return None
        tags = _parse_etags(upstream_etag)
        if not tags or len(tags) != 1 or tags[0][1] == "*":
            return None
        return f'W/"{tags[0][1]}{self.suffixes[index]}"'

    def translate_if_none_match(self, value: str, index: int) -> str | None:
        """Keep only tags this phase issued, as the upstream's own; a tag from another phase can never match."""
        tags = _parse_etags(value)
        if tags is None:
            return None
        suffix = self.suffixes[index]
        kept = []
        for weak, opaque in tags:
            if opaque == "*" and weak:
                kept.append("*")
            elif opaque.endswith(suffix):
                kept.append(f'"{opaque[: -len(suffix)]}"')
        return ", ".join(kept) or None

    # --- bodies -------------------------------------------------------------------------------------------------

    def message(self, board: str, index: int, count: int | None) -> bytes:
        """``cards_deprecation_message``; in the capped phase, ``count`` None: the total is not known."""
        if index == 1:
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

    def rewrite(self, body: json_splice.Text, layout: json_splice.Layout, index: int, board: str) -> bytes:
        """The body for a phase that withholds cards from it (``_action_of`` says it does)."""
        extra = (MESSAGE_KEY, self.message(board, index, layout.count))
        if index == 1 or self.empty_array:
            return json_splice.truncate(body, layout, self.cap if index == 1 else 0, extra)
        return json_splice.drop(body, layout, extra)

    def encode(self, out: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
        """The body the client gets, and whether it is gzipped."""
        options = self.options
        if gzip_ok and len(out) >= options.compress_min_bytes:
            return gzip.compress(out, compresslevel=options.compress_level, mtime=0), True
        return out, False

    async def encoded(self, out: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
        """``encode``, on a worker thread for a large body (zlib lets the event loop run meanwhile)."""
        if len(out) < _OFF_LOOP_BYTES or not gzip_ok:
            return self.encode(out, gzip_ok)
        return await asyncio.get_running_loop().run_in_executor(self.workers, self.encode, out, gzip_ok)

    def decode(self, raw: bytes, coding: str) -> bytes:
        if coding in ("", "identity"):
            return raw
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise _PassThrough("passed_through_unparsed", f"content coding {coding!r}")
        max_body = self.max_body
        inflater = zlib.decompressobj(47)  # gzip or zlib, by the header
        try:
            out = inflater.decompress(raw, max_body + 1)
        except zlib.error:
            raise _PassThrough("passed_through_unparsed", "the compressed body is corrupt") from None
        if len(out) > max_body:
            raise _PassThrough("too_large", "larger than max_body_bytes once decoded")
        if not inflater.eof or inflater.unused_data:
            raise _PassThrough("passed_through_unparsed", "the compressed body is truncated or has trailing data")
        return out

    async def read_board(self, reply: Reply, key: tuple[str, str]) -> tuple[json_splice.Text, _MemoEntry]:
        """The upstream's 200 body, decoded, and its scan; ``_PassThrough`` for one this policy does not read (the
        reply then still sends all of it: what was read, then the rest as it streams).

        The body is scanned while it arrives, a piece at a time between the event loop's other work, and kept as
        those pieces, never joined. A body equal byte for byte to the one the memo keeps for this board is only
        compared with it, not scanned: the memo's scan is used (a compressed body is decoded whole, then read)."""
        headers = reply.headers
        max_body = self.max_body
        memo = self.memo
        if not _JSON_TYPE.match(headers.get("Content-Type", "")):
            raise _PassThrough("passed_through_unparsed", "not a JSON content type")
        coding = headers.get("Content-Encoding", "").strip().lower()
        identity = coding in ("", "identity")
        length = reply.length
        if length is not None and length > max_body and identity:
            raise _PassThrough("too_large", f"Content-Length {length} is over max_body_bytes")
        kept = memo.kept(key) if memo is not None else None
        reader = json_splice.Reader("cards", keep=self.cap, extra_key=MESSAGE_KEY,
                                    same_as=kept.body if kept else None)
        try:
            raw = await reply.read_pieces(max_body, reader.feed if identity else None)
        except BodyTooLarge:
            raise _PassThrough("too_large", "the body is over max_body_bytes") from None
        if not identity:
            reader.feed(self.decode(b"".join(raw), coding))
        if memo is not None and kept is not None and reader.same:
            memo.used(key)
            return kept.body, kept
        try:
            layout = reader.layout()
        except json_splice.NotJSON as err:
            raise _PassThrough("passed_through_unparsed", str(err)) from None
        entry = _MemoEntry(reader.body, layout)
        if memo is not None:
            memo.put(key, entry)
        return entry.body, entry

    async def rendered(self, key: tuple[str, str], entry: _MemoEntry, body: json_splice.Text, index: int,
                       board: str, action: str, gzip_ok: bool) -> tuple[bytes, bool]:
        """The client's body for this phase and encoding; the same scan, phase and encoding give the same output,
        so a new one is kept with the scan."""
        output = entry.rendered.get((index, gzip_ok))
        if output is None:
            plain = action == "untouched"
            out = bytes(body) if plain else self.rewrite(body, entry.layout, index, board)  # (pieces joined once)
            output = await self.encoded(out, gzip_ok)
            if self.memo is not None and not (plain and output[0] is out):
                self.memo.render(key, entry, (index, gzip_ok), output)
        return output

    # --- the policy ---------------------------------------------------------------------------------------------

    async def __call__(self, exchange: Exchange, next: Next) -> Reply:
        tenant = exchange.tenant.name
        schedule = self.schedules[tenant]
        now = self.clock.now().timestamp()
        index, kind = schedule.phase_and_kind(now, exchange.headers)
        call = _Call(self, exchange, index, kind, now)
        cap = self.cap

        # The card backfill bridge: for a client whose phase shows cards (all, or up to the cap), when the tenant or
        # an exemption says so.
        bridged = index in _BACKFILL_PHASES and schedule.bridge(now, exchange.headers)
        if index == 0 and not bridged:
            reply = await next(exchange)
            if reply.status in (200, 304):
                call.signal(reply.headers)
                self.vary(reply.headers, schedule.vary)
                call.finish("untouched")
            else:
                call.finish("not_ok")
            return reply

        # A rewriting phase: ask for bytes the policy can read and for validators it can translate.
        upstream_headers = exchange.upstream_headers
        upstream_headers["Accept-Encoding"] = "identity"
        for name in _CONDITIONAL_DROP:
            upstream_headers[name] = None
        if_none_match = exchange.headers.get("If-None-Match")
        if bridged:
            # The answer may be assembled from pages: its validator is the gateway's, so the gateway judges the
            # condition itself, on a full answer from the upstream.
            upstream_headers["If-None-Match"] = None
        elif if_none_match is not None:
            upstream_headers["If-None-Match"] = self.translate_if_none_match(if_none_match, index)
        # HEAD answers with GET's headers: the upstream is asked for the body GET would rewrite (the core sends the
        # client the head only).
        exchange.answer_from_body()
        reply = await next(exchange)
        headers = reply.headers
        if reply.status == 304:
            # (Bridged in phase 0 the upstream was asked unconditionally: a 304 anyway is passed on as phase 0 would.)
            if index > 0:
                etag = self.weak_etag(headers.get("ETag"), index)
                headers.popall("ETag", None)
                headers.popall("Last-Modified", None)
                if etag is not None:
                    headers["ETag"] = etag
            self.vary(headers, self.rewritten_vary[tenant])
            call.signal(headers)
            call.finish("not_modified")
            return reply
        if reply.status != 200:
            call.finish("not_ok")
            return reply

        key = (tenant, exchange.path)
        try:
            body, entry = await self.read_board(reply, key)
        except _PassThrough as skip:
            return call.passed_through(reply, skip)
        except BodyUnavailable:
            call.finish("not_ok")  # the upstream broke off part way: the reply is now the proxy core's error answer
            return reply
        layout = entry.layout
        if bridged:
            if _lacks_cards(layout, index, cap):
                return await self.backfilled(call, reply, body, layout, if_none_match)
            if index == 0:
                # The upstream's board is whole: it goes as it came (the condition judged here, see above).
                call.signal(headers)
                self.vary(headers, self.rewritten_vary[tenant])
                if _not_modified(if_none_match, headers.get("ETag")):
                    _to_304(reply)
                    call.finish("not_modified")
                else:
                    call.finish("untouched")
                return reply
        if layout.target is not None and not layout.is_array:
            return call.passed_through(reply, _PassThrough("passed_through_unparsed", "cards is not an array"))

        action, withheld = _action_of(layout, index, cap)
        gzip_ok = _accepts_gzip(exchange.headers.get("Accept-Encoding"))
        out, gzipped = await self.rendered(key, entry, body, index, call.board, action, gzip_ok)
        upstream_etag = headers.get("ETag")
        for name in _REWRITE_DROP if action != "untouched" else _REENCODE_DROP:
            headers.popall(name, None)
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        etag = self.weak_etag(upstream_etag, index)
        if etag is not None:
            headers["ETag"] = etag
        self.vary(headers, self.rewritten_vary[tenant])
        call.signal(headers)
        if withheld:
            self.removed_counters[tenant].inc(withheld)
        if bridged and _not_modified(if_none_match, headers.get("ETag")):
            _to_304(reply)
            call.finish("not_modified")
            return reply
        call.finish(action)
        reply.set_body(out)
        return reply

    async def backfilled(self, call: _Call, reply: Reply, body: json_splice.Text, layout: json_splice.Layout,
                         if_none_match: str | None) -> Reply:
        """The board with its cards rebuilt from the card list; on any failure, the upstream's board as it came."""
        exchange, tenant, board, index = call.exchange, call.tenant, call.board, call.index
        headers = reply.headers
        self.vary(headers, self.rewritten_vary[tenant])
        call.signal(headers)
        cap = self.cap
        try:
            # All of them, or the cap and one more: enough to know whether the phase withholds any.
            filled = await self.backfill.cards(exchange, board, None if index == 0 else cap + 1)
        except BackfillFailed as failed:
            self.backfill_counters[(tenant, failed.reason)].inc()
            exchange.notes["board_cards.backfill"] = failed.reason
            headers[BACKFILL_HEADER] = f"failed; reason={failed.reason}"
            log.warning("board_cards: card backfill not done (%s); tenant %s, board %s, request id %s",
                        failed.detail, tenant, board, exchange.request_id)
            call.finish("backfill_failed")
            return reply  # the bytes read: never a partial array presented as whole
        cards = filled.cards
        count = min(len(cards), cap) if index == 1 else len(cards)
        truncated = index == 1 and len(cards) > cap
        message = self.message(board, 1, None) if truncated else None
        gzip_ok = _accepts_gzip(exchange.headers.get("Accept-Encoding"))
        # Hashed (and compressed) on a worker thread when large: the answer can be as large as max_bytes. It is never
        # copied whole: the cards go out as views into the pages they came in.
        if sum(len(card) for card in cards) < _OFF_LOOP_BYTES:
            pieces, etag, gzipped = self.assemble(body, layout, cards, count, message, gzip_ok)
        else:
            pieces, etag, gzipped = await asyncio.get_running_loop().run_in_executor(
                self.workers, self.assemble, body, layout, cards, count, message, gzip_ok)
        for name in _REWRITE_DROP:
            headers.popall(name, None)
        # The gateway's own validator: the answer is assembled from several upstream responses.
        headers["ETag"] = etag
        headers[BACKFILL_HEADER] = f"done; cards={count}; pages={filled.pages}"
        self.backfill_counters[(tenant, "done")].inc()
        exchange.notes["board_cards.backfill"] = f"done cards={count} pages={filled.pages}"
        if _not_modified(if_none_match, etag):
            _to_304(reply)
            call.finish("not_modified")
            return reply
        if gzipped is not None:
            headers["Content-Encoding"] = "gzip"
        call.finish("backfilled")
        if gzipped is not None:
            reply.set_body(gzipped)
        elif sum(len(piece) for piece in pieces) < _OFF_LOOP_BYTES:
            reply.set_body(b"".join(pieces))  # small: it leaves with its head in one write
        else:
            reply.set_body(Pieces(pieces))
        return reply

    def assemble(self, body: json_splice.Text, layout: json_splice.Layout, cards: Sequence[bytes | memoryview], count: int,
                 message: bytes | None, gzip_ok: bool) -> tuple[list[bytes | memoryview], str, bytes | None]:
        """(On a worker thread.) The board with its first ``count`` cards in place, as pieces (the cards are views
        into their pages), its ETag, and its gzip coding when the client takes one. With ``message`` (more cards than
        the phase shows), the message naming the rest's request is set in the upstream's board, which holds fewer
        cards, before the cards go in."""
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
        length = sum(len(p) for p in pieces)
        if length < _OFF_LOOP_BYTES:
            # Small: in one piece (hashed and compressed in one call each).
            out = b"".join(pieces)
            out_etag = f'W/"bf-{hashlib.sha256(out).hexdigest()[:20]}"'
            small, gzipped = self.encode(out, gzip_ok)
            return [out], out_etag, small if gzipped else None
        digest = hashlib.sha256()
        for piece in pieces:
            digest.update(piece)
        etag = f'W/"bf-{digest.hexdigest()[:20]}"'
        options = self.options
        if not gzip_ok or length < options.compress_min_bytes:
            return pieces, etag, None
        compressor = zlib.compressobj(options.compress_level, zlib.DEFLATED, 31)  # gzip, as gzip.compress writes
        runs = [compressor.compress(b"".join(batch)) for batch in _batches(pieces, 1 << 20)]
        runs.append(compressor.flush())
        return [], etag, b"".join(runs)


def build(options: Options, ctx: BuildContext) -> Policy:
    return BoardCards(options, ctx)


def _batches(pieces: Sequence[bytes | memoryview], size: int) -> list[list[bytes | memoryview]]:
    """Consecutive pieces gathered into runs of about ``size`` bytes (a large piece is a run of its own)."""
    runs: list[list[bytes | memoryview]] = [[]]
    held = 0
    for piece in pieces:
        if held >= size:
            runs.append([])
            held = 0
        runs[-1].append(piece)
        held += len(piece)
    return runs


def _lacks_cards(layout: json_splice.Layout, index: int, cap: int) -> bool:
    """For a bridged request: whether the upstream's board lacks cards the phase shows (no ``cards``, or the
    service's message that it withheld some, with fewer than the phase shows)."""
    if layout.target is not None and not layout.is_array:
        return False  # not a board this policy can edit: passed through
    withheld = layout.target is None or layout.extra is not None
    return withheld and not (index == 1 and layout.count >= cap)


def _not_modified(if_none_match: str | None, etag: str | None) -> bool:
    """RFC 9110 13.1.2: weak comparison of ``If-None-Match`` with the answer's ETag."""
    if not if_none_match or not etag:
        return False
    tags = _parse_etags(if_none_match)
    mine = _parse_etags(etag)
    if not tags or not mine or len(mine) != 1:
        return False
    return any(opaque == "*" or opaque == mine[0][1] for _, opaque in tags)


def _to_304(reply: Reply) -> None:
    reply.status = 304
    reply.reason = None
    reply.set_body(b"")
    reply.headers.popall("Content-Encoding", None)


def _action_of(layout: json_splice.Layout, index: int, cap: int) -> tuple[str, int]:
    """What a rewriting phase does to a board (an array of cards, or none), and how many cards it withholds."""
    if layout.target is None:
        return "untouched", 0
    if index == 1:
        return ("capped", layout.count - cap) if layout.count > cap else ("untouched", 0)
    return "removed", layout.count


SPEC = PolicySpec(NAME, Options, build, behaviours=(BOARD_CARDS,))
