"""What ``gateway usage``, ``gateway outreach`` and ``gateway migrate`` do and print (``gateway.cli`` parses their
arguments and loads the config), and the ledger's line in ``gateway check-config``.

They open the ledger's database directly (``store.Store``): any replica, or an operator's machine with the config
and access to the database, reads the fleet's whole history. Exit status: 0, 1 when the ledger cannot be read or
written, 2 for a bad argument.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ...config.ledger import ClientNames
from .query import DEFAULT_SINCE, Query, check_name, parse_when, window

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...config import LoadedConfig
    from .store import Store

__all__ = ("DEFAULT_SINCE", "describe", "migrate", "outreach", "usage")

_T = TypeVar("_T")


def describe(config: LoadedConfig) -> str:
    """The ledger's line in ``check-config``: its database (secrets masked) and how it writes and keeps."""
    options = config.model.usage.ledger
    if not options.enabled:
        return "usage ledger: off (usage.ledger.enabled: false)"
    return (f"usage ledger: {config.secrets.redact(options.url)} (written every {options.flush_interval:g}s, "
            f"kept {options.retention_days} days)")


def _open(config: LoadedConfig, *, create: bool) -> Store | str:
    """The store, or the problem (already fit to print) when there is none to open."""
    options = config.model.usage.ledger
    if not options.enabled:
        return f"the usage ledger is off in {config.source} (usage.ledger.enabled: false)"
    from .store import Store, sqlite_path

    path = sqlite_path(options.url)
    if not create and path not in (None, ":memory:") and not Path(str(path)).exists():
        # Opening it would create an empty file: say where it was looked for instead.
        return (f"no usage ledger at {Path(str(path)).resolve()} (a relative sqlite path is read from the working "
                "directory; the gateway creates the file on its first write)")
    return Store(options.url, timeout=options.flush_timeout)


def _failed(config: LoadedConfig, what: str, err: Exception) -> int:
    from .store import describe_error

    shown = config.secrets.redact(config.model.usage.ledger.url)
    print(f"gateway: cannot {what} the usage ledger {shown}: {config.secrets.redact(describe_error(err))}",
          file=sys.stderr)
    return 1


def migrate(config: LoadedConfig) -> int:
    store = _open(config, create=True)
    if isinstance(store, str):
        print(f"gateway: {store}", file=sys.stderr)
        return 2
    try:
        found, head = store.migrate()
    except Exception as err:  # noqa: BLE001 - any driver error: said in one line, exit 1
        return _failed(config, "migrate", err)
    finally:
        store.close()
    shown = config.secrets.redact(config.model.usage.ledger.url)
    print(f"usage ledger {shown}: schema {head}" + (" (already)" if found == head else f" (was {found or 'empty'})"))
    return 0


def usage(config: LoadedConfig, *, since: str, until: str | None, tenant: str | None, behaviour: str | None,
          top: int | None, order: str, output: Literal["text", "json", "csv"]) -> int:
    now = time.time()
    try:
        query = _usage_query(config, now, since, until, tenant, behaviour, top, order, output)
    except ValueError as err:
        return _say(str(err), 2)
    report = _read(config, lambda store: _report(store, query))
    if isinstance(report, int):
        return report
    _name_clients(report, ClientNames(config.model.usage.clients))
    shown = config.secrets.redact(config.model.usage.ledger.url)
    _emit(output, report, _csv, lambda: _text(report, shown, now))
    return 0


def _say(problem: str, status: int) -> int:
    print(f"gateway: {problem}", file=sys.stderr)
    return status


def _names(tenant: str | None, behaviour: str | None) -> tuple[str | None, str | None]:
    """``--tenant`` and ``--behaviour`` checked (``ValueError`` naming the bad one)."""
    return tenant and check_name(tenant, "--tenant"), behaviour and check_name(behaviour, "--behaviour")


def _usage_query(config: LoadedConfig, now: float, since: str, until: str | None,
                 tenant: str | None, behaviour: str | None, top: int | None, order: str, output: str) -> Query:
    """The report's query from the command line (``ValueError`` with the problem, fit to print)."""
    tz = config.model.rollout.tzinfo
    try:
        start = parse_when(since, now, tz)
        end = parse_when(until, now, tz) if until else now
    except ValueError as err:
        raise ValueError(f"--since/--until: {err}") from err
    tenant, behaviour = _names(tenant, behaviour)
    if end <= start:
        raise ValueError("--until must be after --since")
    if top is not None and top < 0:
        raise ValueError("--top must be 0 (every client) or more")
    return Query(*window(start, end), tenant=tenant, behaviour=behaviour, top=_limit(top, output),
                 order="recent" if order == "recent" else "requests")


def _limit(top: int | None, output: str) -> int | None:
    """How many clients a report lists: ``--top 0`` every one, CSV every one unless told, else 20 unless told."""
    if top == 0 or (top is None and output == "csv"):
        return None
    return top or 20


def _report(store: Store, query: Query) -> dict[str, Any]:
    from .store import fold_report

    # A database no gateway has written to yet (no schema): an empty report, and nothing created.
    return store.report(query) if store.revision() is not None else fold_report(query)


def _read(config: LoadedConfig, reader: Callable[[Store], _T]) -> _T | int:
    """What ``reader`` reads from the ledger, or the exit status once the problem is printed."""
    store = _open(config, create=False)
    if isinstance(store, str):
        return _say(store, 1 if config.model.usage.ledger.enabled else 2)
    try:
        return reader(store)
    except Exception as err:  # noqa: BLE001 - any driver error: said in one line, exit 1
        return _failed(config, "read", err)
    finally:
        store.close()


def _name_clients(report: dict[str, Any], names: ClientNames) -> None:
    for data in report["behaviours"].values():
        for row in data["top_clients"]:
            named = names.find(row["client"], row["user_agent"])
            row["name"] = named.name if named is not None else None


def _emit(output: str, data: dict[str, Any], as_csv: Callable[[dict[str, Any]], None],
          as_text: Callable[[], None]) -> None:
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "csv":
        as_csv(data)
    else:
        as_text()


def outreach(config: LoadedConfig, *, tenant: str | None, behaviour: str | None, everyone: bool, top: int | None,
             output: Literal["text", "json", "csv"]) -> int:
    """The clients to contact, most urgent first: blocked, overdue, then calling (the soonest change first), each
    with its name and contact (or fingerprint and User-Agent), state, example call and what changes for it next;
    ``everyone``: the ready ones too."""
    from .readiness import build

    try:
        tenant, behaviour, now = _outreach_args(config, tenant, behaviour, top)
    except ValueError as err:
        return _say(str(err), 2)
    options = config.model.usage.readiness
    wall = time.time()
    rows = _read(config, lambda store: _readiness_rows(store, wall, options.window_days, tenant, behaviour))
    if isinstance(rows, int):
        return rows
    ready = build(*rows, plan=config.rollout_plan(), names=ClientNames(config.model.usage.clients), wall=wall,
                  now=now, quiet_days=options.quiet_days, window_days=options.window_days)
    data = ready.to_json(top, ready=everyone)
    shown = config.secrets.redact(config.model.usage.ledger.url)
    _emit(output, data, _outreach_csv, lambda: _outreach_text(data, shown, wall, everyone))
    return 0


def _outreach_args(config: LoadedConfig, tenant: str | None, behaviour: str | None, top: int | None
                   ) -> tuple[str | None, str | None, float]:
    """The names checked, and the rollout's clock; ``ValueError`` with the problem, fit to print."""
    from ...rollout import clock_from_config

    tenant, behaviour = _names(tenant, behaviour)
    now = clock_from_config(config.model.rollout).now().timestamp()
    if top is not None and top < 1:
        raise ValueError("--top must be 1 or more")
    return tenant, behaviour, now


def _readiness_rows(store: Store, wall: float, window_days: int, tenant: str | None,
                    behaviour: str | None) -> tuple[list[Any], list[Any]]:
    from .readiness import days_from

    if store.revision() is None:
        return [], []
    return store.readiness(wall - window_days * 86400, days_from(wall), tenant, behaviour)


_OUTREACH_COLUMNS = ("state", "tenant", "behaviour", "client", "name", "owner", "internal", "user_agent", "example",
                     "rule", "last_decision", "phase", "next_phase", "next_at", "next_why", "first_call", "last_call",
                     "requests", "last_7_days", "previous_7_days", "trend", "refused_7_days", "last_refused",
                     "previewing")


def _outreach_csv(data: dict[str, Any]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(_OUTREACH_COLUMNS)
    writer.writerows(_outreach_row(row) for row in data["clients"])


def _outreach_row(row: dict[str, Any]) -> list[Any]:
    """A client's row: its next change in three columns."""
    upcoming = row["next"] or {}
    values = {**row, "next_phase": upcoming.get("phase"), "next_at": upcoming.get("at"),
              "next_why": upcoming.get("why")}
    return [_csv_value(values[key]) for key in _OUTREACH_COLUMNS]


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return _cell(value) if isinstance(value, str) else value


def _outreach_text(data: dict[str, Any], shown: str, wall: float, everyone: bool) -> None:
    _outreach_header(data, shown)
    clients = data["clients"]
    if not clients:
        print("no client to contact")
        return
    for row in clients:
        _outreach_client(row, wall)
    more = (data["clients_in_window"] if everyone else data["to_contact"]) - len(clients)
    if more > 0:
        print(f"... {more} more: --top to list more")


def _outreach_header(data: dict[str, Any], shown: str) -> None:
    n, m = data["still_calling"], data["internal_clients"]
    print(f"usage ledger {shown}: readiness at {data['at']} over the last {data['window_days']} days (ready: no "
          f"deprecated call for {data['quiet_days']} days)")
    print(f"{n} external client{_s(n)} still {'calls' if n == 1 else 'call'} deprecated behaviour"
          + (f" ({m} internal client{_s(m)} not counted)" if m else ""))
    for tenant, per in data["totals"].items():
        for behaviour, counts in per.items():
            print(f"  {tenant} {behaviour}: " + ", ".join(f"{state} {count}" for state, count in counts.items()))


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _outreach_client(row: dict[str, Any], wall: float) -> None:
    contact = row["owner"] or _agent(row["user_agent"])
    print(f"{row['state']:<8} {row['tenant']} {row['behaviour']}: {_who(row)}, {contact}")
    last = dt.datetime.fromisoformat(row["last_call"]).timestamp()
    print(f"         calls {row['example'] or '(no example yet)'}; last {_when(last)} ({_ago(wall - last)}), "
          f"{row['last_7_days']} in the last 7 days, {row['previous_7_days']} the 7 before ({row['trend']})"
          + (f"; rule {row['rule']}" if row["rule"] else ""))
    upcoming = row["next"]
    if upcoming is None:
        print(f"         now {row['phase']}; no change scheduled")
    else:
        print(f"         now {row['phase']}; next {upcoming['phase']} at {upcoming['at']}: {upcoming['why']}")


def _who(row: dict[str, Any]) -> str:
    who = row["name"] or row["client"] or "(no token)"
    if row["name"]:
        who += f" ({row['client'] or 'no token'})"
    return who + (" [internal]" if row["internal"] else "")


def _agent(user_agent: str | None) -> str:
    return _printable(user_agent) if user_agent else "-"


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _printable(text: str) -> str:
    """A User-Agent (a client's own text) for a terminal: control characters (escape sequences) as \\xNN."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _text(report: dict[str, Any], shown: str, now: float) -> None:
    since = dt.datetime.fromisoformat(report["since"]).timestamp()
    until = dt.datetime.fromisoformat(report["until"]).timestamp()
    print(f"usage ledger {shown}: {_when(since)} to {_when(until)} UTC")
    behaviours = report["behaviours"]
    if not behaviours:
        print("no deprecated behaviour used in the window")
    for name, data in behaviours.items():
        _behaviour_text(name, data, now)


def _behaviour_text(name: str, data: dict[str, Any], now: float) -> None:
    decisions = ", ".join(f"{k} {v}" for k, v in data["by_decision"].items())
    print(f"{name}: {data['requests']} requests ({decisions}), {_clients(data['clients'], data['variants'])}")
    _behaviour_notes(data)
    rows = data["top_clients"]
    if rows:
        print(f"  {'requests':>10}  {'client':<12}  {'tenant':<12}  {'first seen':<16}  {'last seen':<16}  "
              f"{'':<10}  user agent")
    for row in rows:
        _client_line(row, now)
    if len(rows) < data["variants"]:
        print(f"  ... {data['variants'] - len(rows)} more: --top 0 lists every one")


def _behaviour_notes(data: dict[str, Any]) -> None:
    """A behaviour's requests per company, and those of clients over usage.max_clients, when there are any."""
    tenants = ", ".join(f"{t} {sum(d.values())}" for t, d in data["by_tenant"].items())
    if tenants:
        print(f"  by tenant: {tenants}")
    if data["untracked_clients_requests"]:
        print(f"  {data['untracked_clients_requests']} requests from clients over usage.max_clients (not listed)")


def _client_line(row: dict[str, Any], now: float) -> None:
    named = f" ({row['name']})" if row.get("name") else ""
    print(f"  {row['requests']:>10}  {row['client'] or '-':<12}  {row['tenant'] or '-':<12}  "
          f"{_when(row['first_seen']):<16}  {_when(row['last_seen']):<16}  {_ago(now - row['last_seen']):<10}  "
          f"{_agent(row['user_agent'])}{named}")


def _clients(clients: int, variants: int) -> str:
    """``3 clients``, or ``1 client, 2 User-Agent variants``: a client is a token (its fingerprint), a variant one
    client with one User-Agent in one company (a row of the list)."""
    text = f"{clients} client{'s' if clients != 1 else ''}"
    if variants != clients:
        text += f", {variants} User-Agent variant{'s' if variants != 1 else ''}"
    return text


def _csv(report: dict[str, Any]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["behaviour", "tenant", "client", "user_agent", "requests", "decisions", "first_seen",
                     "last_seen", "name"])
    writer.writerows(_csv_row(name, row) for name, data in report["behaviours"].items() for row in data["top_clients"])


def _csv_row(name: str, row: dict[str, Any]) -> list[Any]:
    """One client's row of the report: its decisions as ``decision=requests;...``, its times in UTC."""
    return [
        name, row["tenant"], row["client"] or "", _cell(row["user_agent"] or ""), row["requests"],
        ";".join(f"{d}={n}" for d, n in row["decisions"].items()),
        dt.datetime.fromtimestamp(row["first_seen"], dt.UTC).isoformat(timespec="seconds"),
        dt.datetime.fromtimestamp(row["last_seen"], dt.UTC).isoformat(timespec="seconds"),
        row.get("name") or "",
    ]


def _cell(text: str) -> str:
    """A client's own text as a CSV cell a spreadsheet will not run as a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
