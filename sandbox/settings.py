"""Configuration of one sandbox instance."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

__all__ = ["DEFAULT_TOKEN", "READONLY_TOKEN", "SandboxSettings"]

DEFAULT_TOKEN = "sandbox-token"
READONLY_TOKEN = "sandbox-readonly"

# One secret per process, so every app built in this process signs alike
# unless a test pins its own.
_PROCESS_SECRET = secrets.token_bytes(32)

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """Everything that makes one sandbox differ from another.

    ``tokens`` are full-access API tokens; ``readonly_tokens`` are also valid
    but every non-GET request made with them answers 403.
    """

    tokens: frozenset[str] = frozenset({DEFAULT_TOKEN})
    readonly_tokens: frozenset[str] = frozenset({READONLY_TOKEN})
    signing_secret: bytes = field(default=_PROCESS_SECRET, repr=False)
    signed_link_ttl: int = 300
    seed: int = 20260521
    public_base_url: str | None = None
    gzip_boards: bool = False
    max_retained_file_bytes: int = 64 * MiB
    max_json_body_bytes: int = 1 * MiB
    journal_size: int = 1000
    journal_body_cap: int = 1 * MiB

    def is_valid_token(self, token: str) -> bool:
        return token in self.tokens or token in self.readonly_tokens

    def is_readonly_token(self, token: str) -> bool:
        return token in self.readonly_tokens and token not in self.tokens
