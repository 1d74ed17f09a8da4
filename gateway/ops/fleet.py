"""One usage report from several: the workers of a process, the replicas of a fleet.

A source answers "your report, with at most K clients per policy" (``Source``): this process's tracker, a sibling
worker over its Unix socket (``gateway.ops.workers``), a replica's admin ``/deprecations`` over HTTP. The counts
(requests, by decision, by tenant, untracked) add up exactly. The top-clients lists are merged with the bound each
report gives: a client a report does not list made at most ``unlisted_max`` requests there. So a client's merged
count lies between the sum of what the lists say and that plus the bounds of the reports that do not list it. When
those bounds leave the top N, or a count in it, undecided, the reports that were cut short are asked again for
more (8 times as many each round, up to ``MAX_TOP``), the way threshold algorithms of distributed top-k do: a
client that is top on one replica, or nowhere top but adds up to be, is never lost, and the counts shown are exact.
If a report cannot be deepened (its source failed on a later round, or ``MAX_TOP`` was reached), the merged list
says it is not exact (``top_clients_exact: false``) and gives each row's upper bound (``requests_max``).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .usage import ClientKey, UsageTracker, client_sort_key

__all__ = (
    "MAX_TOP",
    "Collected",
    "Source",
    "SourceError",
    "SourceGone",
    "collect",
    "discover",
    "http_source",
    "local_source",
    "merge",
    "parse_name_port",
    "parse_top",
    "unix_source",
)

# The most clients a source is asked for per policy (and the most /deprecations?top= accepts).
MAX_TOP = 100_000
_GROWTH = 8

Report = Mapping[str, Any]  # policy -> its report (UsageTracker.report's shape)


class SourceError(Exception):
    """A source that could not answer (unreachable, timed out, an error status, not a usage report)."""


class SourceGone(SourceError):
    """A source that no longer exists (a worker that has exited): it holds nothing, so it is left out silently."""


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    fetch: Callable[[int], Awaitable[Any]]  # top -> the report as answered (collect checks it); raises SourceError


@dataclass(slots=True)
class Collected:
    report: dict[str, Any]
    answered: list[str]
    failed: dict[str, str]  # source name -> why
    rounds: int

    @property
    def exact(self) -> bool:
        return all(policy["top_clients_exact"] for policy in self.report.values())


@dataclass(slots=True)
class _Row:
    low: int = 0  # what the lists say
    high: int = 0  # plus what the reports that do not list it may hide
    listed_bound: int = 0  # the bounds of the reports that list it (they hide nothing of it)
    decisions: Counter[str] = field(default_factory=Counter)
    last_seen: float = 0.0


def merge(reports: Sequence[Report], top: int) -> tuple[dict[str, Any], set[int]]:
    """The merged report, and the indexes of the reports whose lists were cut too short to make it exact."""
    out: dict[str, Any] = {}
    deeper: set[int] = set()
    for policy in sorted({p for report in reports for p in report}):
        parts = [(i, report[policy]) for i, report in enumerate(reports) if policy in report]
        merged = _merge_policy([part for _, part in parts], top)
        out[policy] = merged
        if not merged["top_clients_exact"]:
            deeper.update(i for i, part in parts if not part["top_clients_complete"])
    return out, deeper


def _merge_policy(parts: Sequence[Mapping[str, Any]], top: int) -> dict[str, Any]:
    bounds = [0 if part["top_clients_complete"] else int(part["unlisted_max"]) for part in parts]
    unseen = sum(bounds)  # a client no report lists made at most this many requests
    rows: dict[ClientKey, _Row] = {}
    by_decision: Counter[str] = Counter()
    by_tenant: dict[str, Counter[str]] = {}
    for bound, part in zip(bounds, parts, strict=True):
        by_decision.update(part["by_decision"])
        for tenant, counts in part.get("by_tenant", {}).items():
            by_tenant.setdefault(tenant, Counter()).update(counts)
        for listed in part["top_clients"]:
            key = (listed.get("tenant"), listed.get("client"), listed.get("user_agent"))
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row()
            row.low += int(listed["requests"])
            row.high += int(listed.get("requests_max", listed["requests"]))
            row.listed_bound += bound
            row.decisions.update(listed.get("decisions", {}))
            row.last_seen = max(row.last_seen, float(listed.get("last_seen") or 0.0))
    for row in rows.values():
        row.high += unseen - row.listed_bound
    ranked = sorted(rows.items(), key=lambda item: client_sort_key(item[1].low, item[0]))
    chosen, rest = ranked[:top], ranked[top:]
    complete = unseen == 0 and not rest
    outside = 0 if complete else max([unseen, *(row.high for _, row in rest)])
    exact = all(row.low == row.high for _, row in chosen) and (
        complete or (len(chosen) == top and chosen[-1][1].low >= outside)
    )
    clients = len(rows) if all(part["top_clients_complete"] for part in parts) else None
    return {
        "window_seconds": max(part["window_seconds"] for part in parts),
        "requests": sum(int(part["requests"]) for part in parts),
        "by_decision": dict(by_decision),
        "by_tenant": {tenant: dict(counts) for tenant, counts in sorted(by_tenant.items())},
        "untracked_clients_requests": sum(int(part["untracked_clients_requests"]) for part in parts),
        "clients": clients,
        "top_clients": [
            {
                "tenant": key[0],
                "client": key[1],
                "user_agent": key[2],
                "requests": row.low,
                **({"requests_max": row.high} if row.high != row.low else {}),
                "decisions": dict(row.decisions),
                "last_seen": row.last_seen,
            }
            for key, row in chosen
        ],
        "top_clients_complete": complete,
        "unlisted_max": outside,
        "top_clients_exact": exact,
    }


async def collect(sources: Sequence[Source], top: int) -> Collected:
    """Ask every source, merge, and ask again for more the sources whose lists were too short (see the module)."""
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"top must be from 1 to {MAX_TOP}")
    first = top if len(sources) == 1 else min(MAX_TOP, max(2 * top, top + 20))
    asks = [first] * len(sources)
    reports: list[Report | None] = [None] * len(sources)
    failed: dict[str, str] = {}
    gone: set[int] = set()
    pending = list(range(len(sources)))
    rounds = 0
    while True:
        rounds += 1
        results = await asyncio.gather(*(_ask(sources[i], asks[i]) for i in pending), return_exceptions=True)
        for i, result in zip(pending, results, strict=True):
            if isinstance(result, SourceGone):
                gone.add(i)
            elif isinstance(result, SourceError):
                failed[sources[i].name] = str(result)  # a report from an earlier round, if any, is kept
            elif isinstance(result, BaseException):
                raise result
            else:
                reports[i] = result
        present = [(i, report) for i, report in enumerate(reports) if report is not None and i not in gone]
        merged, deeper = merge([report for _, report in present], top)
        grow = [present[j][0] for j in sorted(deeper)]
        grow = [i for i in grow if asks[i] < MAX_TOP and sources[i].name not in failed]
        if not grow:
            return Collected(merged, [sources[i].name for i, _ in present], failed, rounds)
        for i in grow:
            asks[i] = min(MAX_TOP, asks[i] * _GROWTH)
        pending = grow


async def _ask(source: Source, top: int) -> Report:
    """The source's answer, checked and normalised here: an answer that is not a usage report is that source's
    failure (``SourceError``), like no answer."""
    return _normalised(await source.fetch(top), top)


def _normalised(report: Any, asked: int) -> Report:
    """A report as ``merge`` reads it; one from a gateway that predates the merge fields (a rolling upgrade) gets
    the bounds its list implies: complete when it is shorter than asked, else bounded by its last row."""
    if not isinstance(report, dict):
        raise SourceError("the answer is not a usage report")
    out: dict[str, Any] = {}
    for policy, data in report.items():
        if not isinstance(data, dict) or not isinstance(data.get("top_clients"), list):
            raise SourceError(f"the answer is not a usage report (policy {policy!r})")
        if "top_clients_complete" not in data:
            rows = data["top_clients"]
            complete = len(rows) < asked
            data = {
                "untracked_clients_requests": 0, "by_tenant": {}, **data,
                "top_clients_complete": complete,
                "unlisted_max": 0 if complete else min(int(r["requests"]) for r in rows),
                "top_clients_exact": True,
            }
        out[policy] = data
    return out


def local_source(name: str, tracker: UsageTracker) -> Source:
    async def fetch(top: int) -> Report:
        return tracker.report(top)

    return Source(name, fetch)


def http_source(session: aiohttp.ClientSession, base_url: str, timeout: float = 10.0) -> Source:
    """A gateway's admin listener: ``GET {base_url}/deprecations?top=K``."""
    base = base_url.rstrip("/")

    async def fetch(top: int) -> Any:
        return await _get_json(session, f"{base}/deprecations?top={top}", timeout)

    return Source(base, fetch)


def unix_source(path: str, name: str, timeout: float = 5.0) -> Source:
    """A sibling worker's private listener (``gateway.ops.workers``): ``GET /usage?top=K`` on its Unix socket."""

    async def fetch(top: int) -> Any:
        # One short-lived session per question: siblings come and go (restarts), and the admin endpoints that ask
        # them are rare; nothing on the request path uses this.
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
            return await _get_json(session, f"http://worker/usage?top={top}", timeout, gone=name)

    return Source(name, fetch)


async def _get_json(session: aiohttp.ClientSession, url: str, timeout: float, *, gone: str | None = None) -> Any:
    """The JSON body of ``GET url``; ``SourceError`` for anything else. ``gone``: the name of a source that has left
    when nothing listens at the address any more (a worker that has exited leaves its socket file behind):
    ``SourceGone``."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                raise SourceError(f"{resp.status} {resp.reason}: {_message(await resp.read())}")
            return await resp.json(content_type=None)
    except aiohttp.ClientConnectorError as err:
        if gone is not None and isinstance(err.os_error, (ConnectionRefusedError, FileNotFoundError)):
            raise SourceGone(gone) from None
        raise SourceError(_describe(err)) from None
    except (aiohttp.ClientError, OSError) as err:
        raise SourceError(_describe(err)) from None
    except TimeoutError:
        raise SourceError(f"no answer within {timeout:g}s") from None
    except ValueError:
        raise SourceError("the answer is not JSON") from None


def parse_top(text: str) -> int:
    """The ``top`` of ``/deprecations?top=K`` (and of a worker's ``/usage``): an integer from 1 to ``MAX_TOP``."""
    try:
        top = int(text)
    except ValueError:
        top = 0
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"top must be an integer from 1 to {MAX_TOP}")
    return top


def parse_name_port(value: str) -> tuple[str, int]:
    """``NAME:PORT`` (``[v6 address]:PORT`` too)."""
    host, sep, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"expected NAME:PORT, got {value!r}")
    return host, int(port_text)


async def discover(name: str, port: int) -> list[str]:
    """The admin base URL of every address (A and AAAA) the name resolves to: a Kubernetes headless Service resolves
    to one address per pod."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise SourceError(f"cannot resolve {name}: {getattr(err, 'strerror', None) or err}") from None
    addresses = sorted({(info[0], str(info[4][0])) for info in infos}, key=lambda a: (a[0] != socket.AF_INET, a[1]))
    urls = []
    for family, address in addresses:
        host = f"[{address.replace('%', '%25')}]" if family == socket.AF_INET6 else address
        urls.append(f"http://{host}:{port}")
    if not urls:
        raise SourceError(f"{name} resolves to no address")
    return urls


def _message(body: bytes) -> str:
    text = body[:300].decode("utf-8", "replace")
    try:
        data = json.loads(body)
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return str(data["message"])
    except ValueError:
        pass
    return text.strip() or "(no body)"


def _describe(err: BaseException) -> str:
    os_error = getattr(err, "os_error", None)
    if isinstance(os_error, OSError) and os_error.strerror:
        return os_error.strerror
    return str(err) or type(err).__name__
