"""The service's limits on a token's requests, in one place for both bridges: a ``Pacer`` (one per client request,
over the process's ``RateLimits``) sends a bridge's requests when the limits learnt from the service's answers
(``429``/``503`` with ``Retry-After``; ``X-RateLimit-Remaining``/``-Reset``/``-Limit``) and the bridge's own caps
take them, waits out a limit answer and repeats the request, when the wait ends before the request's deadline;
otherwise ``RateLimited`` says how long until the service would take it, and the bridge answers ``rate_limited``
(docs/policies/board_cards.md, docs/policies/legacy_upload_guard.md: "Within the service's limits")."""

from __future__ import annotations

import asyncio
import bisect
import email.utils
import hashlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .exchange import Exchange, Reply
from .tenants import canonical_host

__all__ = ("LIMIT_STATUSES", "Pace", "Pacer", "RateLimited", "RateLimits", "limit_wait")

# The answers that say a token's requests are over the service's limit (503 only with Retry-After).
LIMIT_STATUSES = (429, 503)
# A 429 that says neither Retry-After nor when the window resets: waited out as this many seconds.
_DEFAULT_WAIT = 1.0
# The longest wait an answer can impose, and the longest window learnt (a wrong header must not block for a day).
_MOST_WAIT = 3600.0
# An X-RateLimit-Reset above this is an epoch time (GitHub's), below it a number of seconds.
_EPOCH = 1e9
# Keys (company, Host, token) whose limits are kept, least recently used first out: the memory is bounded.
_KEYS = 4096
# Answers kept per key to guess a limit no header states (the accepted requests of the last window).
_ACCEPTED = 64
_K = TypeVar("_K")
_V = TypeVar("_V")


class RateLimited(Exception):
    """A bridge's request cannot go, or be repeated, within its deadline: the service would take it in
    ``retry_after`` seconds. ``status``: the service's limit answer (429, 503), or None when the learnt limit or the
    bridge's own cap held it back before it was sent."""

    def __init__(self, retry_after: float, status: int | None) -> None:
        super().__init__(f"over the service's limit for this token: {retry_after:.1f} s to wait"
                         + (f" (answered {status})" if status is not None else ""))
        self.retry_after = retry_after
        self.status = status

    @property
    def seconds(self) -> int:
        """``retry_after`` as a ``Retry-After`` value: whole seconds, at least one."""
        return max(1, math.ceil(self.retry_after))


@dataclass(frozen=True, slots=True)
class Pace:
    """A bridge's own caps on its requests: per second per token and per company (0: none)."""

    per_token: int = 0
    per_company: int = 0


def limit_wait(headers: Mapping[str, str], status: int, now: float | None = None) -> float | None:
    """How long an answer says to wait before the next request (seconds): a limit answer's ``Retry-After`` (else its
    ``X-RateLimit-Reset``, else a second for a 429); None when it is no limit answer (a 503 without Retry-After)."""
    if status not in LIMIT_STATUSES:
        return None
    wait = _retry_after(headers.get("Retry-After"), now)
    if wait is None and status == 429:
        wait = _reset_in(headers.get("X-RateLimit-Reset"), now)
        wait = _DEFAULT_WAIT if wait is None else wait
    return wait


def _retry_after(value: str | None, now: float | None) -> float | None:
    """RFC 9110 10.2.3: delay-seconds or an HTTP-date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), _MOST_WAIT)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when - (time.time() if now is None else now)), _MOST_WAIT)


def _reset_in(value: str | None, now: float | None) -> float | None:
    """``X-RateLimit-Reset``: seconds until the window resets, or (GitHub's) the epoch second it resets at."""
    try:
        reset = float(value) if value else None
    except ValueError:
        return None
    if reset is None or not math.isfinite(reset) or reset < 0:
        return None
    if reset > _EPOCH:
        reset -= time.time() if now is None else now
    return min(max(0.0, reset), _MOST_WAIT)


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


class _Stamps:
    """When the last requests of a key went, in time order: a cap of ``n`` a second waits for the ``n``-th latest to
    be a second old."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=1000)

    def wait(self, now: float, cap: int, span: float = 1.0) -> float:
        """Until ``cap`` requests were sent in the last ``span`` seconds no more (any ``span`` long: a window of the
        service's, wherever it begins, gets no more either)."""
        times = self.times
        if not cap or len(times) < cap:
            return 0.0
        return max(0.0, times[-cap] + span - now)

    def add(self, now: float) -> None:
        self.times.append(now)  # (the latest: an answer's time, ``settle``, is never later than a sending after it)

    def settle(self, sent: float, answered: float) -> None:
        """The request added at ``sent`` was answered (or failed) at ``answered``: it counts from then on, the latest
        the service can have received it. Counted from its sending alone, a cap of n a second let the service receive
        two requests closer than a second apart when the earlier one took longer to reach it (a new connection to
        open, a busy machine). Requests in flight together are answered in any order: the answer takes its place
        among the times, which stay in order."""
        times = self.times
        for at in range(len(times) - 1, -1, -1):
            if times[at] == sent:
                del times[at]
                bisect.insort(times, answered)
                return


class _Window:
    """One key's limits as learnt: blocked until a time (a limit answer), and how many more requests the current
    window takes (``left``, as of the answer to send number ``seq``, with the sends after it counted against it)
    until it resets (``reset_at``); the window's size and length once known, to pace the next ones."""

    __slots__ = ("sent", "in_flight", "blocked_until", "seq", "left", "reset_at", "limit", "period", "accepted",
                 "stamps")

    def __init__(self) -> None:
        self.sent = 0  # sends so far (each has its number)
        self.in_flight = 0
        self.blocked_until = 0.0
        self.seq = -1
        self.left: int | None = None  # None: not known (no header said, or the window it was said of has passed)
        self.reset_at: float | None = None
        self.limit: int | None = None  # requests a window takes (X-RateLimit-Limit, or learnt from a 429)
        self.period: float | None = None  # a window's length (the longest reset seen)
        self.accepted: deque[float] = deque(maxlen=_ACCEPTED)  # when answers that were no limit answer came
        self.stamps = _Stamps()

    def wait(self, now: float, cap: int) -> float:
        """How long before the next request may go (0: now)."""
        self.renew(now)
        wait = max(self.blocked_until - now, self.stamps.wait(now, cap))
        if self.limit is not None and self.period is not None:
            wait = max(wait, self.stamps.wait(now, self.limit, self.period))
        if self.left is not None and self.left - (self.sent - 1 - self.seq) <= 0:
            wait = max(wait, self._until_reset(now))
        return wait

    def _until_reset(self, now: float) -> float:
        """The window is spent: the time until it resets (when no header said, a window's length from now)."""
        if self.reset_at is None:
            self.reset_at = now + (self.period or _DEFAULT_WAIT)
        return self.reset_at - now

    def renew(self, now: float) -> None:
        """The window of what was learnt has passed: the next one takes ``limit`` (the requests in flight counted)."""
        if self.reset_at is None or now < self.reset_at:
            return
        self.seq = self.sent - 1
        self.left = None if self.limit is None else self.limit - self.in_flight
        self.reset_at = None if self.period is None or self.limit is None else now + self.period

    def send(self, now: float) -> int:
        self.stamps.add(now)
        self.in_flight += 1
        self.sent += 1
        return self.sent - 1

    def learn(self, seq: int, headers: Mapping[str, str], status: int, now: float) -> float | None:
        """What the answer to send ``seq`` says: the wait it imposes when it is a limit answer (None otherwise)."""
        self.in_flight -= 1
        wait = limit_wait(headers, status, time.time())
        if wait is not None:
            self.blocked(seq, wait, now)
            return wait
        self.accepted.append(now)
        self.limit = _number(headers.get("X-RateLimit-Limit")) or self.limit
        left = _number(headers.get("X-RateLimit-Remaining"))
        if left is not None and seq >= self.seq:
            self._remaining(seq, left, _reset_in(headers.get("X-RateLimit-Reset"), time.time()), now)
        return None

    def _remaining(self, seq: int, left: int, reset: float | None, now: float) -> None:
        """The window as the answer to send ``seq`` (the latest one to say) states it: ``left`` requests, reset in
        ``reset`` seconds (None: not said)."""
        self.seq, self.left = seq, left
        self.reset_at = None if reset is None else now + reset
        self.period = max(self.period or 0.0, reset or 0.0) or None

    def blocked(self, seq: int, wait: float, now: float) -> None:
        """A limit answer: nothing goes before ``wait`` is over; a window of the size just seen, paced after it."""
        self.blocked_until = max(self.blocked_until, now + wait)
        # The requests the service took in the window that ended in this answer (guessed: those answered in the last
        # window's length, which may reach into the one before), or one fewer than was paced to: what it takes.
        took = max(1, sum(1 for at in self.accepted if at > now - max(wait, _DEFAULT_WAIT)))
        self.limit = took if self.limit is None else max(1, min(self.limit - 1, took))
        self.period = max(self.period or 0.0, wait, 0.1)
        self.seq, self.left, self.reset_at = max(self.seq, seq), 0, now + wait


class RateLimits:
    """The process's learnt limits, per company, Host and token (the service limits a token: both bridges of a
    client share what either learnt), and the companies' request times for their caps. Bounded: the least recently
    used keys go first."""

    def __init__(self, keys: int = _KEYS) -> None:
        self._keys = keys
        self._windows: OrderedDict[tuple[str, str, bytes], _Window] = OrderedDict()
        self._companies: OrderedDict[str, _Stamps] = OrderedDict()

    def window(self, exchange: Exchange) -> tuple[_Window, _Stamps]:
        """The limits of the exchange's company, Host and token, and its company's request times."""
        auth = exchange.headers.get("Authorization", "")
        key = (exchange.tenant.name, canonical_host(exchange.headers.get("Host", "")),
               hashlib.sha256(auth.encode("utf-8", "surrogateescape")).digest())
        return _lru(self._windows, key, _Window, self._keys), _lru(self._companies, key[0], _Stamps, self._keys)

    def pacer(self, exchange: Exchange, pace: Pace) -> Pacer:
        return Pacer(self, exchange, pace)


def _lru(store: OrderedDict[_K, _V], key: _K, make: Callable[[], _V], most: int) -> _V:
    found = store.get(key)
    if found is None:
        found = store[key] = make()
        if len(store) > most:
            store.popitem(last=False)
    else:
        store.move_to_end(key)
    return found


class Pacer:
    """One client request's requests of a bridge, within the service's limits and the bridge's caps: ``fetch`` is
    ``exchange.fetch`` that waits its turn and waits out a limit answer, within a deadline. ``waited``: the seconds
    it waited; ``limited``: the limit answers it got."""

    __slots__ = ("_exchange", "_pace", "_window", "_company", "waited", "limited")

    def __init__(self, limits: RateLimits, exchange: Exchange, pace: Pace) -> None:
        self._exchange = exchange
        self._pace = pace
        self._window, self._company = limits.window(exchange)
        self.waited = 0.0
        self.limited = 0

    async def fetch(self, method: str, path: str, *, deadline: float, query: str = "",
                    headers: Mapping[str, str] | None = None, body: bytes | AsyncIterator[bytes] | None = None,
                    purpose: str = "policy") -> Reply:
        """``exchange.fetch``, sent when the limits take it and repeated after a limit answer (a request without a
        streamed body), all before ``deadline`` (the event loop's time); ``RateLimited`` when that cannot be (a
        limit answer is let go first). A streamed body is never sent twice: its limit answer raises at once."""
        loop = asyncio.get_running_loop()
        while True:
            await self._turn(loop, deadline)
            window = self._window
            sent = loop.time()
            seq = window.send(sent)
            self._company.add(sent)
            try:
                reply = await self._exchange.fetch(method, path, query=query, headers=headers, body=body,
                                                   purpose=purpose)
            except BaseException:
                window.in_flight -= 1
                raise
            finally:
                answered = loop.time()
                window.stamps.settle(sent, answered)
                self._company.settle(sent, answered)
            wait = window.learn(seq, reply.headers, reply.status, answered)
            if wait is None:
                return reply
            reply.discard()
            self.limited += 1
            if not (body is None or isinstance(body, bytes)) or loop.time() + wait > deadline:
                raise RateLimited(wait, reply.status)

    async def _turn(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Waits until the limits take one more request; ``RateLimited`` when that is after ``deadline``."""
        pace = self._pace
        while True:
            now = loop.time()
            wait = max(self._window.wait(now, pace.per_token), self._company.wait(now, pace.per_company))
            if wait <= 0:
                return
            if now + wait > deadline:
                raise RateLimited(wait, None)
            self.waited += wait
            await asyncio.sleep(wait)
