"""Credentials written in a URL (``scheme://user:password@host``), found by the URL parser, never by a pattern of
what a password may hold.

``without_userinfo`` masks the userinfo of every URL in a text: where a URL starts is the only thing searched for;
its authority and userinfo are then what ``urllib.parse.urlsplit`` reads, so quotes, spaces, ``@``, percent-escapes
and non-ASCII characters in a password are masked whole. ``without_query_values`` masks the value of every query
parameter of every URL (a vendor's key, a database password). ``url_credentials`` gives, for a URL the config holds,
every spelling of its credentials some text could carry (as written, as yarl encodes them, decoded).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from yarl import URL

__all__ = ("MASK", "url_credentials", "without_query_values", "without_userinfo")

MASK = "<redacted>"
# Where a URL may begin: its scheme and "://". What follows is left to the URL parser.
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# A URL up to its query, then the query: both end at a space, a quote or an angle bracket (a URL in a sentence).
_URL_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s?#'\"<>]*\?)([^\s#'\"<>]*)")


def _authority_end(text: str, start: int) -> int:
    """Where the authority beginning at ``start`` ends, as urlsplit delimits it (the first '/', '?' or '#')."""
    ends = [i for i in (text.find(c, start) for c in "/?#") if i >= 0]
    return min(ends) if ends else len(text)


def _masked_line(line: str) -> str:
    out: list[str] = []
    pos = 0
    while (found := _URL_START.search(line, pos)) is not None:
        start = found.end()
        end = _authority_end(line, start)
        candidate = line[found.start():end]
        try:
            netloc = urlsplit(candidate).netloc
        except ValueError:  # an unbalanced '[' (IPv6): urlsplit refuses the authority; its rule is still the same
            netloc = line[start:end]
        if netloc != line[start:end]:
            netloc = line[start:end]  # urlsplit dropped a tab or a control character: the text's own span counts
        userinfo, at, _ = netloc.rpartition("@")
        if at:
            out.append(line[pos:start] + MASK)
            pos = start + len(userinfo)
        else:
            out.append(line[pos:start])
            pos = start
    out.append(line[pos:])
    return "".join(out)


def without_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``<redacted>`` (a URL never spans lines)."""
    if "://" not in text:
        return text
    return "\n".join(_masked_line(line) if "://" in line else line for line in text.split("\n"))


def without_query_values(text: str) -> str:
    """``text`` with the value of every query parameter of every URL in it replaced by ``<redacted>``, the names
    kept (``?api_key=<redacted>&region=<redacted>``); a parameter without ``=`` is masked whole."""
    if "://" not in text or "?" not in text:
        return text
    return _URL_QUERY.sub(lambda found: found.group(1) + _masked_query(found.group(2)), text)


def _masked_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, sep, value = part.partition("=")
        parts.append(f"{name}={MASK}" if sep and value else part if sep or not part else MASK)
    return "&".join(parts)


def url_credentials(value: str) -> set[str]:
    """Every spelling of the credentials in a URL worth masking in any text: the userinfo as written, as yarl
    encodes it, decoded, and the password alone when it is long enough not to be an ordinary word."""
    netloc = value[value.find("://") + 3:] if "://" in value else ""
    written, at, _ = netloc[:_authority_end(netloc, 0)].rpartition("@")
    found = {written} if at else set()
    try:
        url = URL(value)
        found |= _parsed_credentials(url.user, url.password, url.raw_user, url.raw_password)
    except (ValueError, TypeError):
        pass
    return {f for f in found if len(f) >= 4}


def _parsed_credentials(user: str | None, password: str | None, raw_user: str | None, raw_password: str | None
                        ) -> set[str]:
    """The userinfo as yarl reads it, decoded and encoded; the password alone when it is long enough not to be an
    ordinary word."""
    if password is None:
        return {user, raw_user or user} if user else set()
    found = {f"{user or ''}:{password}", f"{raw_user or ''}:{raw_password}"}
    if len(password) >= 8:
        found.update({password, raw_password or password})
    return found
