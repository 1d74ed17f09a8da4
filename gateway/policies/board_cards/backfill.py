"""The card backfill bridge: a board's ``cards`` rebuilt from the paginated card list (spec, "List cards", "Versioning"
5), for a client whose phase still shows cards after the service has stopped returning them. How pages are linked
(``overlap``), when it fails, the service's limits on the client's token (``core.ratelimit``: waited out within the
timeout, else ``rate_limited``), backfills shared by the readers of one board on one token (``_Shared``), and the
bounds that hold by construction (bytes, a page's length, copies, the event loop): docs/policies/board_cards.md
("The card backfill bridge")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...core.exchange import BodyNotRead, BodyTooLarge, Budget, Exchange, Reply, UpstreamFailed
from ...core.ratelimit import Pace, Pacer, RateLimited, RateLimits
from ...core.tenants import canonical_host
from . import json_splice

__all__ = ("REASONS", "BackfillFailed", "BackfillOptions", "CardBackfill", "Filled", "fetch_cards")

LIST_PATH = "/api/latest/cards"
MiB = 1 << 20
# Why a backfill did not happen (bounded: the label of gateway_board_backfills_total and the response header).
REASONS = ("forbidden", "page_error", "upstream_error", "timeout", "too_many_pages", "too_many_cards", "too_large",
           "inconsistent", "not_json", "rate_limited")
# A card's id, as cards are told apart by it (spec: a number; a string is as good). Anything else (null, an object)
# could make two cards look like one, and the list shorter than it is.
_ID_TYPES = (int, str)
# A page smaller than this is read on the event loop (well under a millisecond of work); a larger one on a worker.
_ON_LOOP = 128 << 10
# A card up to this size is parsed whole on the worker thread (a fraction of a millisecond); a larger one is walked.
_PARSED_WHOLE = 64 << 10
# The most bytes one id or board_id may take as written (a number of 4,300 digits would not even parse).
_ID_BYTES = 256
# The walker counts brackets in windows of this size, and checks whether it should stop every so many strings.
_WINDOW = 1 << 20
_CHECK_EVERY = 4096
_ABSENT = object()


class BackfillOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # The limit asked per page (the spec does not give the card list's maximum; the sandbox's is 100).
    page_size: int = Field(default=100, ge=2, le=1000)
    # Cards each page shares with the one before (proof that the list did not shift a card out of sight).
    overlap: int = Field(default=1, ge=1)
    # Pages in flight at once for one board.
    concurrency: int = Field(default=4, ge=1, le=32)
    # Bounds: pages read (retries included), cards assembled, bytes of page bodies, and the whole backfill's time.
    max_pages: int = Field(default=200, ge=1, le=100_000)
    max_cards: int = Field(default=20_000, ge=1, le=10_000_000)
    max_bytes: int = Field(default=64 * MiB, ge=1024, le=4096 * MiB)
    timeout: float = Field(default=10.0, gt=0, le=600)
    # The bridge's own caps on its page requests, per second, per token and per company (0: none); the service's
    # limits, as its answers say them, are kept whatever these say.
    rate_per_token: int = Field(default=0, ge=0, le=1000)
    rate_per_company: int = Field(default=0, ge=0, le=1000)
    # A finished backfill is kept this long for the readers of the same board, company, Host and token (0: not
    # kept; concurrent ones share their page reads all the same), within share_bytes of page bodies kept together.
    share_seconds: float = Field(default=3.0, ge=0, le=60)
    share_bytes: int = Field(default=64 * MiB, ge=0, le=4096 * MiB)

    @model_validator(mode="after")
    def _overlap_below_page(self) -> BackfillOptions:
        if self.overlap >= self.page_size:
            raise ValueError("overlap must be smaller than page_size")
        return self


class BackfillFailed(Exception):
    """``reason``: one of ``REASONS``; ``detail``: for the log (never a token, never a card); ``retry_after``: for
    ``rate_limited``, the seconds until the service takes the token's requests again."""

    def __init__(self, reason: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Filled:
    # Each card's raw JSON, in the list's order: views into the page bodies (never copied; ``fetch_cards``: bytes).
    cards: Sequence[bytes | memoryview]
    pages: int  # page requests made
    size: int = 0  # bytes of the page bodies it holds
    waited: float = 0.0  # seconds waited for the service's limits (or the bridge's caps)
    shared: bool = False  # read for another reader of the same board and token (its pages were not read again)


@dataclass(slots=True)
class _Page:
    offset: int
    ids: list[object]
    raw: Sequence[bytes | memoryview]


class _Stopped(Exception):
    """The backfill was given up while a page was being read on the worker thread."""


class CardBackfill:
    """Built once per route: the options, the worker thread(s) pages are read on (``None``: asyncio's default
    executor), the process's learnt limits of the service (``core.ratelimit``), and the backfills shared by readers
    of one board on one token."""

    def __init__(self, options: BackfillOptions, limits: RateLimits, executor: Executor | None = None) -> None:
        self.options = options
        self.executor = executor
        self.limits = limits
        self.pace = Pace(options.rate_per_token, options.rate_per_company)
        self.shared = _Shared(options.share_seconds, options.share_bytes)

    async def cards(self, exchange: Exchange, board: str, want: int | None) -> Filled:
        """The board's cards in the list's order: all of them (``want`` None) or the first ``want``. A backfill of the
        same board, company, Host and token in progress (or just done) is shared: its page reads are not made again,
        and no other token's ever are."""
        auth = exchange.headers.get("Authorization", "")
        key = (exchange.tenant.name, canonical_host(exchange.headers.get("Host", "")),
               hashlib.sha256(auth.encode("utf-8", "surrogateescape")).digest(), board, want)
        return await self.shared.get(key, lambda: self.read(exchange, board, want))

    async def read(self, exchange: Exchange, board: str, want: int | None) -> Filled:
        """One backfill's page reads, within the timeout and the service's limits."""
        options = self.options
        loop = asyncio.get_running_loop()
        pacer = self.limits.pacer(exchange, self.pace)
        reader = _Reader(exchange, board, options, self.executor, pacer, loop.time() + options.timeout)
        try:
            async with asyncio.timeout(options.timeout):
                cards = await _assemble(reader, want)
        except TimeoutError:
            raise BackfillFailed("timeout", f"not done within {options.timeout} s") from None
        finally:
            reader.stop.set()  # a page still being read on the worker thread stops there
        return Filled(cards, reader.pages, options.max_bytes - reader.budget.left, pacer.waited)


async def fetch_cards(exchange: Exchange, board: str, want: int | None, options: BackfillOptions) -> Filled:
    """``CardBackfill(options, ...).cards(...)``, on asyncio's default executor, each card as bytes of its own."""
    filled = await CardBackfill(options, RateLimits()).cards(exchange, board, want)
    return Filled([bytes(card) for card in filled.cards], filled.pages)


_Key = tuple[str, str, bytes, str, int | None]  # company, Host, the token's SHA-256, board, cards wanted


@dataclass(slots=True)
class _Running:
    task: asyncio.Future[Filled]
    readers: int = 0
    abandoned: bool = False  # every reader left: cancelled (a new reader starts another)


class _Shared:
    """The backfills in progress, and those done in the last ``seconds`` (within ``most`` bytes of page bodies kept
    together), by key: a reader of the same board on the same token waits for the one in progress or takes the one
    kept. The backfill runs in a task of its own: a reader that leaves does not cut it short for the others (the
    last one to leave does)."""

    def __init__(self, seconds: float, most: int) -> None:
        self.seconds = seconds
        self.most = most
        self.running: dict[_Key, _Running] = {}
        self.done: OrderedDict[_Key, tuple[float, Filled]] = OrderedDict()  # by expiry: the first expires first
        self.size = 0

    async def get(self, key: _Key, read: Callable[[], Awaitable[Filled]]) -> Filled:
        loop = asyncio.get_running_loop()
        kept = self.kept(key, loop.time())
        if kept is not None:
            return kept
        running, started = self._joined(key, read, loop)
        running.readers += 1
        try:
            filled = await asyncio.shield(running.task)
        finally:
            _leave(running)
        return filled if started else _as_shared(filled)

    def _joined(self, key: _Key, read: Callable[[], Awaitable[Filled]], loop: asyncio.AbstractEventLoop
                ) -> tuple[_Running, bool]:
        """The read of ``key`` running, and whether it was started now (none ran, or every reader left it)."""
        running = self.running.get(key)
        if running is not None and not running.abandoned:
            return running, False
        started = self.running[key] = _Running(asyncio.ensure_future(read()))
        started.task.add_done_callback(lambda task: self.finished(key, started, loop.time()))
        return started, True

    def kept(self, key: _Key, now: float) -> Filled | None:
        while self.done and next(iter(self.done.values()))[0] <= now:
            self.size -= self.done.popitem(last=False)[1][1].size
        found = self.done.get(key)
        return None if found is None else _as_shared(found[1])

    def finished(self, key: _Key, running: _Running, now: float) -> None:
        if self.running.get(key) is running:
            del self.running[key]
        task = running.task
        if task.cancelled() or task.exception() is not None or not self.seconds:
            return
        filled = task.result()
        if filled.size <= self.most:
            self._keep(key, filled, now + self.seconds)

    def _keep(self, key: _Key, filled: Filled, until: float) -> None:
        """A finished read kept until ``until``; the oldest kept ones let go while they hold more than ``most``."""
        old = self.done.pop(key, None)
        if old is not None:
            self.size -= old[1].size
        self.done[key] = (until, filled)
        self.size += filled.size
        while self.size > self.most:
            self.size -= self.done.popitem(last=False)[1][1].size


def _leave(running: _Running) -> None:
    """A reader leaves the read: the last to leave before it is done abandons it."""
    running.readers -= 1
    if running.readers == 0 and not running.task.done():
        running.abandoned = True  # every reader left
        running.task.cancel()


def _as_shared(filled: Filled) -> Filled:
    return Filled(filled.cards, filled.pages, filled.size, filled.waited, shared=True)


class _Reader:
    def __init__(self, exchange: Exchange, board: str, options: BackfillOptions, executor: Executor | None,
                 pacer: Pacer, deadline: float) -> None:
        self.exchange = exchange
        self.pacer = pacer
        self.deadline = deadline  # the event loop's time the backfill's timeout ends at
        self.board = board
        # One query value, whatever the path segment holds ('&', '=', '+' escaped; its own escapes kept): the board
        # id cannot add a parameter (a second ``limit`` would cut every page short, and the list with it).
        self.board_query = quote(board, safe="%!$'()*,:@")
        self.options = options
        self.executor = executor
        self.pages = 0
        self.budget = Budget(options.max_bytes)
        self.stop = threading.Event()
        auth = exchange.headers.get("Authorization")
        self.headers = {"Accept": "application/json"}
        if auth is not None:
            self.headers["Authorization"] = auth

    async def page(self, offset: int) -> _Page:
        options = self.options
        if self.pages >= options.max_pages:
            raise BackfillFailed("too_many_pages", f"more than max_pages={options.max_pages} pages")
        self.pages += 1
        reply = await self._fetched(offset)
        _check_page_head(reply, offset)
        body = await self._body(reply, offset)
        try:
            ids, raw = await self._parse(body)
        except BackfillFailed as failed:
            raise BackfillFailed(failed.reason, f"page at offset {offset}: {failed.detail}") from None
        return _Page(offset, ids, raw)

    async def _fetched(self, offset: int) -> Reply:
        """The answer to the page at ``offset``; ``BackfillFailed`` when the service or its limits gave none."""
        query = f"board_id={self.board_query}&limit={self.options.page_size}&offset={offset}"
        try:
            return await self.pacer.fetch("GET", LIST_PATH, query=query, headers=self.headers,
                                          purpose="backfill_page", deadline=self.deadline)
        except UpstreamFailed as failed:
            raise BackfillFailed("upstream_error", f"page at offset {offset}: {failed.kind}") from None
        except RateLimited as limited:
            raise BackfillFailed("rate_limited", f"page at offset {offset}: {limited}", limited.seconds) from None

    async def _body(self, reply: Reply, offset: int) -> bytes:
        """A page's body, within what is left of the backfill's bytes."""
        max_bytes = self.options.max_bytes
        too_large = BackfillFailed("too_large", f"pages over max_bytes={max_bytes}")
        declared = reply.length
        if declared is not None and declared > self.budget.left:
            reply.discard()
            raise too_large
        try:
            return await reply.read(max_bytes, budget=self.budget)
        except BodyTooLarge:
            reply.discard()
            raise too_large from None
        except BodyNotRead:
            raise BackfillFailed("upstream_error", f"page at offset {offset}: the body broke off") from None

    async def _parse(self, body: bytes) -> tuple[list[object], Sequence[bytes | memoryview]]:
        page_size = self.options.page_size
        if len(body) < _ON_LOOP:
            # A small page costs less than the trip to a worker thread (a millisecond at most).
            return _read_page(body, page_size, self.board, self.stop)
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, _read_page, body, page_size, self.board, self.stop)


def _check_page_head(reply: Reply, offset: int) -> None:
    """A page's answer must be a 200 in no content coding; any other is let go and ends the backfill."""
    if reply.status in (401, 403):
        failed = BackfillFailed("forbidden", f"page at offset {offset}: status {reply.status}")
    elif reply.status != 200:
        failed = BackfillFailed("page_error", f"page at offset {offset}: status {reply.status}")
    elif reply.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        failed = BackfillFailed("not_json", f"page at offset {offset}: content coding")
    else:
        return
    reply.discard()
    raise failed


def _read_page(body: bytes, page_size: int, board: str, stop: threading.Event
               ) -> tuple[list[object], Sequence[bytes | memoryview]]:
    """(On the worker thread for a large page.) The page's cards (views into ``body``; a small page's are copies) and
    their ids; ``BackfillFailed`` for a page that is not a list of cards of this board, or is longer than its
    limit."""
    spans = _spans(body, page_size)
    view = memoryview(body)
    ids: list[object] = []
    # A small page (counted already: at most page_size cards) is parsed whole, in one call; a larger one card by card.
    whole = json.loads(body) if len(body) < _ON_LOOP else None
    for i, (start, end) in enumerate(spans):
        if stop.is_set():
            raise _Stopped()
        ids.append(_card_id(_card_at(whole, i, body, start, end, stop), board))
    if whole is not None:
        return ids, [body[start:end] for start, end in spans]  # small: copies cost less than views
    return ids, [view[start:end] for start, end in spans]


def _spans(body: bytes, page_size: int) -> list[tuple[int, int]]:
    """Where each card of the page is in ``body``."""
    try:
        return json_splice.array_spans(body, most=page_size)
    except json_splice.TooManyElements:
        raise BackfillFailed("inconsistent", "longer than its limit") from None
    except json_splice.NotJSON:
        raise BackfillFailed("not_json", "not a JSON array of cards with ids") from None


def _card_at(whole: Any, i: int, body: bytes, start: int, end: int, stop: threading.Event) -> tuple[object, object]:
    """The ``id`` and ``board_id`` of card ``i`` (at ``body[start:end]``), from the parsed page when it is ``whole``."""
    try:
        if whole is None:
            return _card_keys(body, start, end, stop)
        card = whole[i]
        if not isinstance(card, dict):
            raise TypeError("not an object")
        return card["id"], card.get("board_id", _ABSENT)
    except (ValueError, TypeError, KeyError, IndexError):
        raise BackfillFailed("not_json", "not a JSON array of cards with ids") from None


def _card_id(keys: tuple[object, object], board: str) -> object:
    """A card's id, which must be a number or a string, the card being of ``board`` if it names one."""
    card_id, board_id = keys
    if type(card_id) not in _ID_TYPES:
        raise BackfillFailed("not_json", "a card id that is not a number or a string")
    if board_id is not _ABSENT and not _same_board(board_id, board):
        raise BackfillFailed("inconsistent", "a card of another board")
    return card_id


def _same_board(board_id: object, board: str) -> bool:
    if type(board_id) is int:
        return board.isdigit() and int(board) == board_id
    return isinstance(board_id, str) and board_id == board


def _card_keys(body: bytes, start: int, end: int, stop: threading.Event) -> tuple[object, object]:
    """The ``id`` and ``board_id`` (``_ABSENT`` when it has none) of the card at ``body[start:end]``; KeyError without
    an id, TypeError when it is not an object. ``body`` is an array the scanner checked by the JSON grammar."""
    if end - start <= _PARSED_WHOLE:
        parsed = json.loads(body[start:end])
        if not isinstance(parsed, dict):
            raise TypeError("not an object")
        return parsed["id"], parsed.get("board_id", _ABSENT)
    values = _top_level(body, start, end, ("id", "board_id"), stop)
    board_id = values.get("board_id")
    return (json.loads(values["id"]), _ABSENT if board_id is None else json.loads(board_id))


_WS = frozenset(b" \t\r\n")
_SCALAR = re.compile(rb'-?[0-9][0-9.eE+\-]*|true|false|null')
_OPEN = (b"{", b"[")
_CLOSE = (b"}", b"]")


def _top_level(card: bytes, pos: int, n: int, names: tuple[str, ...], stop: threading.Event) -> dict[str, bytes]:
    """The raw values (a string or a scalar, at most ``_ID_BYTES``) of the top-level members ``names`` of the large
    JSON object at ``card[pos:n]``, without parsing it: each string is skipped with ``bytes.find``, and brackets are
    counted between strings, so Python runs once per string and once per megabyte (the GIL changes hands
    meanwhile). The last of a repeated name wins, as for ``json.loads``."""
    pos = _object_start(card, pos, n)
    found: dict[str, bytes] = {}
    depth = 0
    strings = 0
    while True:
        quote_at = _find_quote(card, pos, n)
        depth += _depth_change(card, pos, n if quote_at < 0 else quote_at)
        if quote_at < 0:
            return found
        pos = _string_end(card, quote_at, n)
        strings += 1
        if strings % _CHECK_EVERY == 0 and stop.is_set():
            raise _Stopped()
        if depth == 1 and _before(card, quote_at) in (0x7B, 0x2C):
            name = _key_name(card[quote_at:pos])
            if name in names:
                start, pos = _member_value(card, pos, n, name)
                found[name] = card[start:pos]


def _object_start(card: bytes, pos: int, n: int) -> int:
    """Where the object at ``card[pos:n]`` opens (after whitespace); TypeError when it is no object."""
    while pos < n and card[pos] in _WS:
        pos += 1
    if pos >= n or card[pos] != 0x7B:
        raise TypeError("not an object")
    return pos


def _depth_change(card: bytes, pos: int, end: int) -> int:
    """Brackets opened less those closed in ``card[pos:end]``, which holds no string."""
    change = 0
    for window in range(pos, end, _WINDOW):
        stop_at = min(end, window + _WINDOW)
        change += sum(card.count(c, window, stop_at) for c in _OPEN)
        change -= sum(card.count(c, window, stop_at) for c in _CLOSE)
    return change


def _key_name(key: bytes) -> str:
    """A member's name from its quoted key."""
    name: str = key[1:-1].decode("utf-8", "replace") if b"\\" not in key else json.loads(key)
    return name


def _member_value(card: bytes, after: int, n: int, name: str) -> tuple[int, int]:
    """Where the value of the member whose key ends at ``after`` starts and ends: a string or a scalar of at most
    ``_ID_BYTES``, else TypeError."""
    colon = after
    while card[colon] in _WS:
        colon += 1
    start = colon + 1
    while card[start] in _WS:
        start += 1
    stop_at = _value_end(card, start, n)
    if stop_at == start or stop_at - start > _ID_BYTES:
        raise TypeError(f"{name} is not a short string or a number")
    return start, stop_at


def _value_end(card: bytes, start: int, n: int) -> int:
    """Just after the string or scalar at ``start`` (``start`` itself when there is neither)."""
    if card[start] == 0x22:
        return _string_end(card, start, n)
    m = _SCALAR.match(card, start, min(n, start + _ID_BYTES + 1))
    return m.end() if m is not None else start


def _find_quote(data: bytes, start: int, n: int) -> int:
    """The next '"' in ``data[start:n]`` (-1: none), looked for a window at a time (each search holds the GIL)."""
    while start < n:
        at = data.find(b'"', start, min(n, start + _WINDOW))
        if at >= 0:
            return at
        start += _WINDOW
    return -1


def _string_end(data: bytes, start: int, n: int) -> int:
    """Just after the closing quote of the string whose opening quote is at ``start``."""
    at = start
    while True:
        at = _find_quote(data, at + 1, n)
        if at < 0:
            raise ValueError("an unterminated string")
        back = at - 1
        while data[back] == 0x5C:
            back -= 1
        if (at - 1 - back) % 2 == 0:
            return at + 1


def _before(data: bytes, at: int) -> int:
    """The last byte before ``at`` that is not whitespace."""
    at -= 1
    while at >= 0 and data[at] in _WS:
        at -= 1
    return data[at] if at >= 0 else -1


async def _assemble(reader: _Reader, want: int | None) -> list[bytes | memoryview]:
    assembly = _Assembly(reader.options, want)
    while True:
        cards = assembly.take(await _gather(reader, assembly.offsets()))
        if cards is not None:
            return cards


class _Assembly:
    """The board's cards read so far, in list order, each once; where the next pages start; whether the list was
    read again from its start already (it shifted under the backfill)."""

    def __init__(self, options: BackfillOptions, want: int | None) -> None:
        self.options = options
        self.want = want
        self.size = options.page_size
        self.step = options.page_size - options.overlap
        self.retried = False
        self.cards: list[bytes | memoryview] = []
        self.seen: set[object] = set()
        self.last_id: object = None
        self.next_offset = 0

    def offsets(self) -> list[int]:
        """The next wave's pages: the first page alone (most boards fit in it), then ``concurrency`` at a time."""
        count = 1 if self.next_offset == 0 else self.options.concurrency
        if self.want is not None:
            count = max(1, min(count, self._needed(self.want)))
        return [self.next_offset + i * self.step for i in range(count)]

    def _needed(self, want: int) -> int:
        # No more pages in flight than the wanted cards need: the first page brings ``size``, each next ``step``.
        missing = want - len(self.cards)
        if self.next_offset == 0:
            return 1 + -(-max(missing - self.size, 0) // self.step)
        return -(-missing // self.step)

    def take(self, wave: list[_Page]) -> list[bytes | memoryview] | None:
        """A wave's pages, in order: the cards once the list (or as much of it as wanted) is read, else None."""
        for page in wave:
            if page.offset > 0 and not page.ids:
                return self.cards  # the list ended with the previous page, which was full
            start = self._linked(page)
            if start is None:
                self._restart()
                return None
            cards = self._add(page, start)
            if cards is not None:
                return cards
        return None

    def _restart(self) -> None:
        """Read again from the start, once: the cards kept so far may be the very ones that moved."""
        self.cards, self.seen, self.last_id, self.next_offset = [], set(), None, 0

    def _linked(self, page: _Page) -> int | None:
        """Where the page's new cards start: after the last card of the page before, which it must hold (None when
        it does not: the list shifted by more than the overlap)."""
        if page.offset <= 0:
            return 0
        if self.last_id in page.ids:
            return page.ids.index(self.last_id) + 1
        if self.retried:
            raise BackfillFailed("inconsistent", "the card list shifted by more than the overlap "
                                 f"between pages (at offset {page.offset}), twice")
        self.retried = True
        return None

    def _add(self, page: _Page, start: int) -> list[bytes | memoryview] | None:
        """The page's cards from ``start``, those not read before: the cards when this page ends what is read."""
        cards, seen, most = self.cards, self.seen, self.options.max_cards
        for card_id, raw in zip(page.ids[start:], page.raw[start:], strict=True):
            if card_id in seen:
                continue  # read twice: an insert in front moved the next page's window
            seen.add(card_id)
            cards.append(raw)
            if len(cards) > most:
                raise BackfillFailed("too_many_cards", f"more than max_cards={most}")
        if page.ids:
            self.last_id = page.ids[-1]
        return self._ended(page)

    def _ended(self, page: _Page) -> list[bytes | memoryview] | None:
        cards, want = self.cards, self.want
        if len(page.ids) < self.size:
            return cards if want is None else cards[:want]
        if want is not None and len(cards) >= want:
            return cards[:want]
        self.next_offset = page.offset + self.step
        return None


async def _gather(reader: _Reader, offsets: list[int]) -> list[_Page]:
    tasks = [asyncio.ensure_future(reader.page(offset)) for offset in offsets]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
