"""The gateway's diagnostic log (stderr): one formatter that keeps secrets out of every line it writes.

The access log never carries a token or a query string by construction (``access_log``). The diagnostic log
quotes exceptions, and an exception's text is not the gateway's to choose: an aiohttp error can name the URL it was
asked for, signed query and all, and a traceback can show a header value. So the formatter redacts, in the whole
formatted record (message and traceback), the query string of any URL and the credentials after an
``Authorization`` scheme (``Bearer``, ``Basic``, ...), and the userinfo (``user:password@``) of any URL, as the URL
parser reads it (``core.redaction``). Given the loaded config's secrets (``use_secrets``: its ``${NAME}`` values,
its admin token, every spelling of its upstreams' credentials), it masks those wherever they appear too.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable

from ..core.redaction import without_userinfo

__all__ = ("RedactingFormatter", "redact", "setup_logging")

_URL_QUERY_RE = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"<>]*)\?[^\s#'\"<>]*")
_CREDENTIALS_RE = re.compile(r"\b(Bearer|Basic|Digest|Token|Negotiate)\s+[A-Za-z0-9._~+/=:-]+", re.IGNORECASE)


def redact(text: str) -> str:
    text = without_userinfo(_URL_QUERY_RE.sub(r"\1?<redacted>", text))
    return _CREDENTIALS_RE.sub(r"\1 <redacted>", text)


class RedactingFormatter(logging.Formatter):
    _secrets: Callable[[str], str] | None = None

    def use_secrets(self, redact_secrets: Callable[[str], str]) -> None:
        """The loaded config's own redaction (``Secrets.redact``), applied first; replaced on every reload."""
        self._secrets = redact_secrets

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self._secrets is not None:
            text = self._secrets(text)
        return redact(text)


def setup_logging(level: str) -> RedactingFormatter:
    """The diagnostic log on stderr, every line through the redacting formatter (of the gateway, and of the
    ``--workers`` supervisor, which imports this module and not the gateway)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler])
    return formatter
