"""One request the upload upgrade took on (``Run``): what it has done so far (its file parts, the comment saved, where
the files go) and the steps both flows share: the card's uid (the id cache, the card lookup), the requests of the
bridge's own to the service, and deleting what was made for a client who is told it was not. One file part's upload
is ``upload.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import email.utils
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ....core.exchange import BodyNotRead, Exchange, Reply, UpstreamFailed
from ....core.ratelimit import RateLimited
from ....core.tenants import canonical_host
from ..multipart_splitter import PartHead
from .body import Parts
from .options import RATE_LIMITED_CODE, Outcome, UpgradeOptions, sentence
from .outcomes import CommentRecord, Ending, FileEntry, Files, FileStatus, Partial, Refusal, Stop, log

if TYPE_CHECKING:
    from . import Upgrade

__all__ = ("CARD_ID_RE", "ID_RE", "CardKey", "New", "Run", "Target", "comments_of", "file_ids", "made_since",
           "service_time")

# A uid or file id the service returns: it goes into a path, percent-encoded all the same.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~\-]{0,127}")
CARD_ID_RE = re.compile(r"[0-9]{1,18}")
# (tenant, Host, the SHA-256 of the client's Authorization, card id): an id cache entry.
CardKey = tuple[str, str, bytes, str]
# Clock skew allowed between the service's Date and the created time of an entity it just made.
SKEW = 2.0
# The purpose each stage's requests are counted under (gateway_subrequests_total).
_PURPOSES = {"lookup": "card_lookup", "comment": "comment"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request's files go: the restricted upload route (the card's, or the comment's), and the ids of the
    files its parent had before this request (None: not known, the card's uid came from the id cache)."""

    path: str
    known: frozenset[str] | None


class Run:
    """One request the bridge took on: what it has done so far, so that every ending can say so."""

    __slots__ = ("up", "exchange", "pacer", "auth", "card_id", "files", "card", "target", "saved", "changed",
                 "comment_unknown", "parts", "body_usable")

    def __init__(self, up: Upgrade, exchange: Exchange) -> None:
        self.up = up
        self.exchange = exchange
        # Every request of the bridge's own goes through it: within the service's limits on the client's token.
        self.pacer = up.limits.pacer(exchange, up.pace)
        auth = exchange.headers.get("Authorization")
        # The only header of the client's that the bridge's requests carry.
        self.auth: Mapping[str, str] = {} if auth is None else {"Authorization": auth}
        card_id = exchange.params.get("card_id", "")
        self.card_id = str(int(card_id)) if CARD_ID_RE.fullmatch(card_id) else ""  # "": not a number
        self.files = Files()
        self.card: dict[str, Any] | None = None  # the card lookup's answer, when one was made for this request
        self.target: Target | None = None
        self.saved: CommentRecord | None = None  # the comment the files go to
        self.changed = False  # the bridge saved a comment or uploaded a file for this request
        self.comment_unknown = False  # a comment's answer was lost: it may have been saved
        self.parts: Parts | None = None  # the client's body, once the run reads it
        self.body_usable = True  # no upload broken off half way may still be reading the client's body

    @property
    def options(self) -> UpgradeOptions:
        return self.up.options

    # --- the card -----------------------------------------------------------------------------------------------

    def need_card_id(self) -> None:
        if not self.card_id:
            raise Refusal("card_id", "the card id in the path is not a number: the card cannot be looked up")

    def card_key(self) -> CardKey:
        """The id cache's key: a mapping serves only the company, the Host and the credentials whose lookup made it
        (another token's use of a card is nothing this client can learn from the gateway)."""
        exchange = self.exchange
        auth = exchange.headers.get("Authorization", "")
        token = hashlib.sha256(auth.encode("utf-8", "surrogateescape")).digest()
        return (exchange.tenant.name, canonical_host(exchange.headers.get("Host", "")), token, self.card_id)

    def card_path(self) -> str:
        return self.up.card_lookup.render({"card_id": self.card_id}, encode=True)

    async def resolve_card(self) -> str:
        """The card's uid: from the id cache, else from the card lookup (with the client's token)."""
        ids = self.up.ids
        key = self.card_key()
        cached = ids.get(key) if ids is not None else None
        if cached is not None:
            return cached
        card = await self.lookup()
        uid = card.get("uid")
        if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
            raise self.bad_answer("lookup", "the card lookup's answer has no usable uid")
        if ids is not None:
            ids[key] = uid
        return uid

    async def lookup(self) -> dict[str, Any]:
        reply, data = await self.call("GET", self.card_path(), stage="lookup", timeout=self.options.lookup_timeout)
        if data is None:
            raise Stop(self.passed_on(reply, "lookup", reply.status))
        self.card = data
        return data

    async def search_card(self, purpose: str) -> tuple[Reply, dict[str, Any]] | None:
        """The card lookup made to find what a lost answer left behind (a file, a comment): the answer and the card,
        or None when it gave none (the run goes on either way)."""
        try:
            reply, data = await self.call("GET", self.card_path(), stage="lookup", timeout=self.options.lookup_timeout,
                                          purpose=purpose)
        except (Stop, Partial):
            return None
        if data is None:
            reply.discard()
            return None
        return reply, data

    def add_file(self, head: PartHead) -> FileEntry:
        return self.files.add(head, self.options.max_files)

    def remember(self, file_id: str) -> None:
        """A file this bridge made lately on the card: never taken for a file whose answer was lost."""
        made = self.up.made
        key = self.card_key()
        made[key] = (*made.get(key, ())[-15:], file_id)

    # --- undoing ------------------------------------------------------------------------------------------------

    async def delete(self, entry: FileEntry) -> None:
        """One file the bridge made, deleted (with the client's token); ``entry.status`` says whether it went (a
        deletion that got no answer did not: the file is named, never a 500)."""
        assert entry.path is not None and entry.id is not None
        entry.status = FileStatus.ROLLBACK_FAILED
        try:
            reply = await self.pacer.fetch("DELETE", f"{entry.path}/{quote(entry.id, safe='')}", headers=self.auth,
                                           purpose="delete", deadline=self.deadline(self.options.request_timeout))
        except (UpstreamFailed, RateLimited):
            return
        reply.discard()
        if 200 <= reply.status < 300 or reply.status == 404:
            entry.status = FileStatus.ROLLED_BACK

    async def rollback(self) -> None:
        """Delete the files this request uploaded (its client went away before it could be told)."""
        made = self.files.with_status(FileStatus.UPLOADED)
        if not made:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.options.request_timeout):
                for entry in made:
                    await self.delete(entry)
        left = [str(f.id) for f in made if f.status is not FileStatus.ROLLED_BACK]
        if left:
            log.warning("legacy_upload_guard: upload upgrade could not delete %d file(s) of a client that went away "
                        "(%s); tenant %s, card %s, request id %s", len(left), ", ".join(left),
                        self.exchange.tenant.name, self.card_id, self.exchange.request_id)

    # --- requests of the bridge's own ---------------------------------------------------------------------------

    async def call(self, method: str, path: str, *, stage: str, timeout: float, query: str = "",
                   body: bytes | None = None, headers: Mapping[str, str] | None = None, purpose: str | None = None
                   ) -> tuple[Reply, dict[str, Any] | None]:
        """A small request with the client's token; its answer, and its JSON object when the status is 2xx (None
        otherwise: the answer's body is then left to stream on). ``Stop`` when no answer came in ``timeout``."""
        sent = {**self.auth, "Accept": "application/json", **(headers or {})}
        try:
            async with asyncio.timeout(timeout):
                reply = await self.pacer.fetch(method, path, query=query, headers=sent, body=body,
                                               purpose=purpose or _PURPOSES.get(stage, stage),
                                               deadline=self.deadline(timeout))
                if not 200 <= reply.status < 300:
                    return reply, None
                data = await self.read_json(reply, stage)
        except (UpstreamFailed, RateLimited, TimeoutError) as err:
            raise self._unanswered(stage, timeout, err) from None
        if data is None:
            raise self.bad_answer(stage, f"the service's answer to the {stage} request is not a JSON object")
        return reply, data

    async def read_json(self, reply: Reply, stage: str) -> dict[str, Any] | None:
        try:
            raw = await reply.read(self.options.max_answer_bytes)
        except BodyNotRead:
            reply.discard()
            raise self.bad_answer(stage, f"the service's answer to the {stage} request is over "
                                  f"{self.options.max_answer_bytes} bytes or broke off") from None
        return json_object(raw)

    @staticmethod
    def deadline(timeout: float) -> float:
        """The event loop's time ``timeout`` seconds from now: how long a request of the bridge's may wait for the
        service's limits (a wait that would end later is not begun)."""
        return asyncio.get_running_loop().time() + timeout

    # --- answers ------------------------------------------------------------------------------------------------

    def _unanswered(self, stage: str, timeout: float, err: UpstreamFailed | RateLimited | TimeoutError
                    ) -> Stop | Partial:
        """How a request of the bridge's that got no answer ends the run: the service failed, its limits held it
        back, or ``timeout`` ran out."""
        if isinstance(err, UpstreamFailed):
            return Stop(Ending(Outcome.FAILED, err.reply, f"{stage}_{err.kind}"))
        if isinstance(err, RateLimited):
            return self.rate_limited(stage, err)
        return Stop(Ending(Outcome.FAILED, self.error(504, "LEGACY_UPLOAD_UPGRADE_TIMEOUT", f"the service did not "
                                                      f"answer the {stage} request within {timeout:g} s"),
                           f"{stage}_timeout"))

    def rate_limited(self, stage: str, limited: RateLimited) -> Stop | Partial:
        """The service's limits on the client's token keep a request of the bridge's from going in time: nothing
        made, ``429`` with ``Retry-After``; after something was, the partial answer, with it too."""
        if self.changed:
            return Partial(429, "rate_limited", f"the service's limits on this client's requests kept the {stage} "
                           "request from going in time", retry_after=limited.seconds)
        reply = self.error(429, RATE_LIMITED_CODE, f"the service's limits on this client's requests kept the bridge's "
                           f"{stage} request from going in time; send the upload again in {limited.seconds} s")
        reply.headers["Retry-After"] = str(limited.seconds)
        return Stop(Ending(Outcome.RATE_LIMITED, reply, f"{stage}_rate_limited"))

    def error(self, status: int, code: str, message: str) -> Reply:
        return Reply.error(status, code, sentence(message), self.exchange.ensure_request_id())

    def bad_answer(self, stage: str, message: str) -> Stop | Partial:
        """An answer of the service that is not what the route gives: the run ends, partly done or not."""
        if self.changed:
            return Partial(502, f"{stage}_answer", message)
        return Stop(Ending(Outcome.FAILED, self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", message), f"{stage}_answer"))

    def passed_on(self, reply: Reply, stage: str, status: int | None) -> Ending:
        """The answer to pass on when nothing was created: the service's (its ``status``), or the proxy core's when
        the service gave none (``status`` None)."""
        if status is None:
            return Ending(Outcome.FAILED, reply, f"{stage}_error")
        return Ending(Outcome.DENIED if status in (401, 403, 404) else Outcome.FAILED, reply,
                      f"{stage}_status_{status}")


# --- reading the service's answers ------------------------------------------------------------------------------


def json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` as a JSON object (None: not JSON, or not an object)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def file_ids(files: Any) -> frozenset[str] | None:
    """The ids in a ``files`` array of the service's (None when it is not an array)."""
    if not isinstance(files, list):
        return None
    return frozenset(f["id"] for f in files if isinstance(f, dict) and isinstance(f.get("id"), str))


def comments_of(card: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A card's ``comments`` (the objects among them; None when it is not an array)."""
    comments = card.get("comments")
    if not isinstance(comments, list):
        return None
    return [c for c in comments if isinstance(c, dict)]


@dataclass(frozen=True, slots=True)
class New:
    """Whether an entity the service lists was made by this request (a file or comment whose answer was lost): not
    among the ids ``known`` before it, when they are, else created in the last ``window`` seconds by the service's
    own clock (``now``: the ``Date`` of the answer that listed it)."""

    known: Collection[str] | None
    now: float | None
    window: float

    def __call__(self, entity_id: str, entity: Mapping[str, Any]) -> bool:
        if self.known is not None:
            return entity_id not in self.known
        return made_since(entity, self.now, self.window)


def made_since(entity: Mapping[str, Any], now: float | None, window: float) -> bool:
    """Whether the service created ``entity`` within the last ``window`` seconds, by its own clock (``now``: the
    ``Date`` of the answer that listed it), allowing ``SKEW``."""
    created = iso_time(entity.get("created"))
    return now is not None and created is not None and created >= now - window - SKEW


def service_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def iso_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()
