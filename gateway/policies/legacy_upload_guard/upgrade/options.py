"""The upload upgrade's options, its metric family and the words of its answers (outcomes, the header, codes)."""

from __future__ import annotations

import enum
import os
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ....core.template import PARAM, PathTemplate

__all__ = ("OUTCOMES", "PARTIAL_CODE", "PATH_TEMPLATE_PATTERN", "RATE_LIMITED_CODE", "UPGRADE_HEADER", "Outcome",
           "UpgradeFamilies", "UpgradeOptions")


class Outcome(enum.StrEnum):
    """What became of a request the bridge took on (bounded: the label of gateway_legacy_upload_upgrades_total, the
    ``X-Gateway-Upload-Upgrade`` header's first word, and the access log's decision)."""

    UPGRADED = "upgraded"
    PARTIAL = "partial"
    FAILED = "failed"
    # The client is told the upload failed, and the file the service stored all the same was deleted.
    ROLLED_BACK = "rolled_back"
    # The client is told it failed, and the service stored (or may have stored) a file that was not deleted (the
    # answer names it, with its id when known).
    LEFT_STORED = "left_stored"
    DENIED = "denied"
    ABORTED = "aborted"
    REFUSED = "refused"
    # The service's limits on the client's token did not let the bridge's requests go in time: nothing was created,
    # the client is told when to send again (429 with Retry-After).
    RATE_LIMITED = "rate_limited"


OUTCOMES = tuple(outcome.value for outcome in Outcome)
# The response header that says what the bridge did.
UPGRADE_HEADER = "X-Gateway-Upload-Upgrade"
PARTIAL_CODE = "LEGACY_UPLOAD_UPGRADE_PARTIAL"
RATE_LIMITED_CODE = "LEGACY_UPLOAD_UPGRADE_RATE_LIMITED"
MiB = 1 << 20

# A path template of the options (and the guard's successor): percent-encoded characters and {placeholders}.
PATH_TEMPLATE_PATTERN = rf"^/(?:[A-Za-z0-9\-._~!$&'()*+,=:@/]|%[0-9A-Fa-f]{{2}}|{PARAM})*$"
_FIELD_PATTERN = r"^[A-Za-z0-9_.\-\[\]]{1,64}$"


class UpgradeOptions(BaseModel):
    """The bridge's bounds and the service's routes it uses (whether it applies is the tenant's and the exemptions')."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # What the route's legacy upload is, and so how the bridge performs it: "card_file", one file part to the card
    # (PUT .../files, or a POST naming the card by its number); "comment", a comment's text and its files; "comment_file",
    # one file part to an existing comment; "none": the bridge does not apply on this route. Unset: "card_file" for
    # detect: route, "comment" for detect: file_parts.
    flow: Literal["card_file", "comment", "comment_file", "none"] | None = None
    # The service's routes: the card lookup (GET, JSON with "uid", "files", and "comments" with their uids and files)
    # and the restricted access uploads.
    card_lookup: str = Field(default="/api/v1/cards/{card_id}", pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    card_upload: str = Field(default="/api/v1/cards/{card_uid}/files", pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    comment_upload: str = Field(default="/api/v1/cards/{card_uid}/comments/{comment_uid}/files",
                                pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    # The restricted upload's form field (spec: "file"), the legacy card upload's (the service reads the file of a
    # PUT .../files from a part of this name only), and the comment's text field.
    upload_field: str = Field(default="file", pattern=_FIELD_PATTERN)
    legacy_field: str = Field(default="file", pattern=_FIELD_PATTERN)
    text_field: str = Field(default="text", pattern=_FIELD_PATTERN)
    # card id -> card uid mappings kept, and for how long (seconds). Kept per company, Host and token: a mapping is
    # only ever used for the very credentials (and company) whose lookup made it.
    id_cache_size: int = Field(default=10_000, ge=0, le=1_000_000)
    id_cache_ttl: float = Field(default=300.0, gt=0, le=86_400)
    # The card lookup, and each other request of the bridge's own (a comment, a rollback, the answer to an upload
    # whose client left once its whole file was sent, the search for a file whose answer was lost).
    lookup_timeout: float = Field(default=10.0, gt=0, le=600)
    request_timeout: float = Field(default=30.0, gt=0, le=600)
    # File parts per comment; bytes of a comment's text parts together; bytes of the file parts spooled before a
    # comment's text together, per request (0: a file part before the text is refused; the process's budget is
    # spool.max_bytes); where they are spooled (default: spool.dir).
    max_files: int = Field(default=20, ge=1, le=1000)
    max_field_bytes: int = Field(default=1 * MiB, ge=1024, le=64 * MiB)
    spool_bytes: int = Field(default=64 * MiB, ge=0, le=64 << 30)
    spool_dir: str | None = Field(default=None, max_length=4096)
    # The most read of one answer of the service (the card lookup's, a comment's, an upload's).
    max_answer_bytes: int = Field(default=8 * MiB, ge=64 << 10, le=256 * MiB)
    # The bridge's own caps on its requests, per second, per token and per company (0: none); the service's limits,
    # as its answers say them, are kept whatever these say.
    rate_per_token: int = Field(default=0, ge=0, le=1000)
    rate_per_company: int = Field(default=0, ge=0, le=1000)
    # After a comment's upload failed: how much more of the body is read (and dropped) to list the file parts that
    # were not sent (0: only those already read are listed). At most max_files + 1 are listed; the rest are counted.
    rest_bytes: int = Field(default=64 * MiB, ge=0, le=64 << 30)

    def flow_or(self, default: str) -> str:
        """``flow``, or ``default`` when it is unset."""
        return self.flow or default

    @field_validator("spool_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError("spool_dir must be an absolute path")
        return value

    @model_validator(mode="after")
    def _placeholders(self) -> UpgradeOptions:
        wanted = {"card_lookup": {"card_id"}, "card_upload": {"card_uid"},
                  "comment_upload": {"card_uid", "comment_uid"}}
        for key, names in wanted.items():
            found = set(PathTemplate.of(getattr(self, key)).params)
            if found != names:
                raise ValueError(f"{key} must have the placeholders {sorted(names)}, not {sorted(found)}")
        return self


class UpgradeFamilies:
    """The bridge's metric family (per tenant: tenant names come from the config, the label is bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.upgrades = Counter(
            "gateway_legacy_upload_upgrades", "Legacy uploads the upload upgrade bridge took on, by tenant and "
            "outcome (" + ", ".join(OUTCOMES) + ").", ("tenant", "outcome"), registry=registry,
        )


def sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + "."


def short(text: Any, limit: int = 255) -> Any:
    """A client's name as an answer lists it: at most ``limit`` characters (a part header may hold 16 KiB)."""
    return text[:limit] if isinstance(text, str) else text
