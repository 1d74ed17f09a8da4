"""The gateway's diagnostic log (stderr): one formatter that keeps secrets out of every line it writes.

The access log never carries a token or a query string by construction (``access_log``). The diagnostic log
quotes exceptions, and an exception's text is not the gateway's to choose: an aiohttp error can name the URL it was
asked for, signed query and all, and a traceback can show a header value. So the formatter redacts, in the whole
formatted record (message and traceback), the query string of any URL and the credentials after an
``Authorization`` scheme (``Bearer``, ``Basic``, ...), and the ``user:password@`` of a URL.
"""

from __future__ import annotations

import logging
import re

__all__ = ("RedactingFormatter", "redact")

_URL_QUERY_RE = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"<>]*)\?[^\s#'\"<>]*")
_URL_USERINFO_RE = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@'\"<>]+@")
_CREDENTIALS_RE = re.compile(r"\b(Bearer|Basic|Digest|Token|Negotiate)\s+[A-Za-z0-9._~+/=:-]+", re.IGNORECASE)


def redact(text: str) -> str:
    text = _URL_QUERY_RE.sub(r"\1?<redacted>", text)
    text = _URL_USERINFO_RE.sub(r"\1<redacted>@", text)
    return _CREDENTIALS_RE.sub(r"\1 <redacted>", text)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
