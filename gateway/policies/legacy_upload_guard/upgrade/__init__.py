"""The upload upgrade bridge: a legacy upload that the guard would refuse with 403 is performed on the restricted access
routes instead, for a client whose company (``bridges.upload_upgrade``) or exemption (``bridge``) says so. ``Upgrade``
(here) is built once per route and hands each request to a ``run.Run``; the modules, the rules it keeps (the
client's own ``Authorization`` only, no file held in memory, nothing left half made) and every answer:
docs/policies/legacy_upload_guard.md ("Upload upgrade bridge")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from cachetools import TTLCache

from ....core.exchange import ClientBody, Exchange, Reply
from ....core.multipart import Ambiguous, Boundary
from ....core.ratelimit import Pace, RateLimits
from ....core.series import CompanyCounter
from ....core.template import PathTemplate
from ....core.spool import SpoolArea
from ..multipart_splitter import MultipartSplitter
from . import card, comment
from .body import form_head
from .options import OUTCOMES, PATH_TEMPLATE_PATTERN, UPGRADE_HEADER, Outcome, UpgradeFamilies, UpgradeOptions
from .outcomes import legacy_file, settle
from .run import CardKey, Run

__all__ = ("OUTCOMES", "PATH_TEMPLATE_PATTERN", "UPGRADE_HEADER", "GuardHooks", "Outcome", "Upgrade", "UpgradeFamilies",
           "UpgradeOptions", "form_head", "legacy_file")


@dataclass(frozen=True, slots=True)
class GuardHooks:
    """What the bridge takes from the guard that owns it."""

    name: str  # the policy's name: its key in the access log's decisions
    # The guard's answer to an ambiguous body (counted in its family and decided, as without the bridge).
    refuse: Callable[[Exchange, Ambiguous], Reply]
    # Counts a request in the guard's family (gateway_legacy_uploads_total) under a decision.
    count: Callable[[Exchange, str], None]
    splitter: Callable[[Boundary], MultipartSplitter]
    linger: tuple[int, float]
    # Marks an answer deprecated as the guard does (Deprecation, Links), with this successor URL when one is known.
    mark: Callable[[Reply, Exchange, str | None], None]


class Upgrade:
    """Built once per route: the options, the id cache, the spool directory, the counters; ``card_file`` and
    ``comment`` serve one request each (their state lives in a ``Run``)."""

    def __init__(self, options: UpgradeOptions, hooks: GuardHooks, counter: CompanyCounter, spool: SpoolArea,
                 limits: RateLimits, *, default_flow: str = "card_file") -> None:
        self.options = options
        self.hooks = hooks
        # The service's limits on each token (the process's, shared with the card backfill), and this bridge's caps.
        self.limits = limits
        self.pace = Pace(options.rate_per_token, options.rate_per_company)
        # How this route's legacy upload is performed (``UpgradeOptions.flow``; unset: the guard's default).
        self.flow = options.flow_or(default_flow)
        self.card_lookup = PathTemplate.of(options.card_lookup)
        self.card_upload = PathTemplate.of(options.card_upload)
        self.comment_upload = PathTemplate.of(options.comment_upload)
        # (tenant, Host, token, card id) -> card uid. Only ids: access is the service's to check, on every upload.
        self.ids: TTLCache[CardKey, str] | None = (
            TTLCache(maxsize=options.id_cache_size, ttl=options.id_cache_ttl) if options.id_cache_size else None
        )
        # (tenant, Host, token, card id) -> ids of the files the bridge made there lately: never taken for a file whose
        # answer was lost (``upload._Upload.find_stored``).
        self.made: TTLCache[CardKey, tuple[str, ...]] = TTLCache(maxsize=max(options.id_cache_size, 1),
                                                                 ttl=options.id_cache_ttl)
        # Swept of the spool files of processes that are gone, now (at start).
        self.spool = spool.directory(options.spool_dir)
        self.counter = counter  # gateway_legacy_upload_upgrades_total: (tenant, outcome)

    def count(self, exchange: Exchange, outcome: Outcome) -> None:
        """Counts a request among the bridge's outcomes (the guard calls it for a request it ended before handing it
        over: refused as without the bridge)."""
        self.counter.inc((exchange.tenant.name, outcome))

    def may_take(self, body: ClientBody) -> bool:
        """Whether the bridge may take over a body the guard peeks at: one no policy before it reads; and for a flow
        that sends one file part alone, also one the edge watches for a late ``_method`` (such a flow refuses any
        other part, so that nothing of a ``_method`` reaches the service)."""
        return not body.filters or (self.flow != "comment" and body.watched_only)

    async def take_over(self, exchange: Exchange, boundary: Boundary) -> Reply:
        """A body the guard peeked at and found a file part in: the bridge's from here (``flow``)."""
        if self.flow == "comment":
            return await self.comment(exchange, boundary, exchange.body.take_over())
        run = Run(self, exchange)
        one = card.card_file if self.flow == "card_file" else comment.comment_file
        return await settle(run, one(run, boundary))

    async def card_file(self, exchange: Exchange, boundary: Boundary | None) -> Reply:
        """``PUT /cards/{card_id}/files``: its one file part uploaded to the card."""
        run = Run(self, exchange)
        return await settle(run, card.card_file(run, boundary))

    async def comment(self, exchange: Exchange, boundary: Boundary, source: AsyncIterator[bytes]) -> Reply:
        """A comment create or update with file parts; ``source``: the client's body, from its first byte."""
        run = Run(self, exchange)
        return await settle(run, comment.comment(run, boundary, source))
