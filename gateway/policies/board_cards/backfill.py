"""The card backfill bridge: a board's ``cards`` rebuilt from the paginated card list (spec, "List cards",
"Versioning" 5), for a client whose phase still shows cards after the service itself has stopped returning them.

Pages are fetched with the client's own ``Authorization`` (never another credential), ``concurrency`` at a time.
Consecutive pages overlap by ``overlap`` cards: page k+1 must contain the last card of page k, which proves that no
card was skipped between them even if the list shifted while it was read; cards seen twice (a card inserted in
front moves the next page's window) are dropped by id. A link that does not hold is read once more; if it still
does not hold, the backfill fails as ``inconsistent``. Every bound (pages, cards, bytes, time) fails it likewise:
the caller then serves the upstream's board as it came, never a partial array presented as whole.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...core.exchange import BodyNotRead, BodyTooLarge, Exchange, UpstreamFailed
from . import json_splice

__all__ = ("REASONS", "BackfillFailed", "BackfillOptions", "Filled", "fetch_cards")

LIST_PATH = "/api/latest/cards"
MiB = 1 << 20
# Why a backfill did not happen (bounded: the label of gateway_board_backfills_total and the response header).
REASONS = ("forbidden", "page_error", "upstream_error", "timeout", "too_many_pages", "too_many_cards", "too_large",
           "inconsistent", "not_json")
# A card's id, as cards are told apart by it (spec: a number; a string is as good). Anything else (null, an object)
# could make two cards look like one, and the list shorter than it is.
_ID_TYPES = (int, str)


class BackfillOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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

    @model_validator(mode="after")
    def _overlap_below_page(self) -> BackfillOptions:
        if self.overlap >= self.page_size:
            raise ValueError("overlap must be smaller than page_size")
        return self


class BackfillFailed(Exception):
    """``reason``: one of ``REASONS``; ``detail``: for the log (never a token, never a card)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Filled:
    cards: list[bytes]  # each card's raw JSON, in the list's order
    pages: int  # page requests made


@dataclass(slots=True)
class _Page:
    offset: int
    ids: list[object]
    raw: list[bytes]


class _Reader:
    def __init__(self, exchange: Exchange, board: str, options: BackfillOptions) -> None:
        self.exchange = exchange
        # One query value, whatever the path segment holds ('&', '=', '+' escaped; its own escapes kept): the board
        # id cannot add a parameter (a second ``limit`` would cut every page short, and the list with it).
        self.board = quote(board, safe="%!$'()*,:@")
        self.options = options
        self.pages = 0
        self.bytes_left = options.max_bytes
        auth = exchange.headers.get("Authorization")
        self.headers = {"Accept": "application/json"}
        if auth is not None:
            self.headers["Authorization"] = auth

    async def page(self, offset: int) -> _Page:
        options = self.options
        if self.pages >= options.max_pages:
            raise BackfillFailed("too_many_pages", f"more than max_pages={options.max_pages} pages")
        self.pages += 1
        query = f"board_id={self.board}&limit={options.page_size}&offset={offset}"
        try:
            reply = await self.exchange.fetch("GET", LIST_PATH, query=query, headers=self.headers)
        except UpstreamFailed as failed:
            raise BackfillFailed("upstream_error", f"page at offset {offset}: {failed.kind}") from None
        if reply.status in (401, 403):
            reply.discard()
            raise BackfillFailed("forbidden", f"page at offset {offset}: status {reply.status}")
        if reply.status != 200:
            reply.discard()
            raise BackfillFailed("page_error", f"page at offset {offset}: status {reply.status}")
        if reply.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
            reply.discard()
            raise BackfillFailed("not_json", f"page at offset {offset}: content coding")
        try:
            body = await reply.read(self.bytes_left)
        except BodyTooLarge:
            reply.discard()
            raise BackfillFailed("too_large", f"pages over max_bytes={options.max_bytes}") from None
        except BodyNotRead:
            raise BackfillFailed("upstream_error", f"page at offset {offset}: the body broke off") from None
        self.bytes_left -= len(body)
        try:
            raw = json_splice.array_elements(body)
            parsed = json.loads(body)
            ids = [card["id"] for card in parsed]
            if not all(type(card_id) in _ID_TYPES for card_id in ids):
                raise TypeError("an id that is not a number or a string")
        except (json_splice.NotJSON, ValueError, TypeError, KeyError):
            raise BackfillFailed("not_json", f"page at offset {offset} is not a JSON array of cards with ids") from None
        if len(raw) > options.page_size:
            raise BackfillFailed("inconsistent", f"page at offset {offset} is longer than its limit")
        return _Page(offset, ids, raw)


async def fetch_cards(exchange: Exchange, board: str, want: int | None, options: BackfillOptions) -> Filled:
    """The board's cards in the list's order: all of them (``want`` None) or the first ``want``."""
    reader = _Reader(exchange, board, options)
    try:
        async with asyncio.timeout(options.timeout):
            cards = await _assemble(reader, want)
    except TimeoutError:
        raise BackfillFailed("timeout", f"not done within {options.timeout} s") from None
    return Filled(cards, reader.pages)


async def _assemble(reader: _Reader, want: int | None) -> list[bytes]:
    options = reader.options
    size = options.page_size
    step = size - options.overlap
    cards: list[bytes] = []
    seen: set[object] = set()
    last_id: object = None
    next_offset = 0
    retried = False
    while True:
        # The first page alone (most boards fit in it), then ``concurrency`` pages at a time.
        count = 1 if next_offset == 0 else options.concurrency
        if want is not None:
            # No more pages in flight than the wanted cards need: the first page brings ``size``, each next ``step``.
            missing = want - len(cards)
            needed = 1 + -(-max(missing - size, 0) // step) if next_offset == 0 else -(-missing // step)
            count = max(1, min(count, needed))
        wave = await _gather(reader, [next_offset + i * step for i in range(count)])
        restart = False
        for page in wave:
            start = 0
            if page.offset > 0:
                # The link: this page must hold the last card of the one before.
                if last_id not in page.ids:
                    if not page.ids:
                        return cards  # the list ended with the previous page, which was full
                    if retried:
                        raise BackfillFailed("inconsistent", "the card list shifted by more than the overlap "
                                             f"between pages (at offset {page.offset}), twice")
                    retried = restart = True
                    break
                start = page.ids.index(last_id) + 1
            for card_id, raw in zip(page.ids[start:], page.raw[start:], strict=True):
                if card_id in seen:
                    continue  # read twice: an insert in front moved the next page's window
                seen.add(card_id)
                cards.append(raw)
                if len(cards) > options.max_cards:
                    raise BackfillFailed("too_many_cards", f"more than max_cards={options.max_cards}")
            if page.ids:
                last_id = page.ids[-1]
            if len(page.ids) < size:
                return cards if want is None else cards[:want]
            if want is not None and len(cards) >= want:
                return cards[:want]
            next_offset = page.offset + step
        if restart:
            # Read again from the start, once: the cards kept so far may be the very ones that moved.
            cards, seen, last_id, next_offset = [], set(), None, 0


async def _gather(reader: _Reader, offsets: list[int]) -> list[_Page]:
    tasks = [asyncio.ensure_future(reader.page(offset)) for offset in offsets]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
