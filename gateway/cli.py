"""Command line: ``gateway serve``, ``gateway check-config``, ``gateway rollout``, ``gateway usage``,
``gateway outreach``, ``gateway migrate``, ``gateway --version``: the arguments parsed, the config loaded (or its
problems printed, exit status 2), the command run; ``serve``'s process lifecycle is ``gateway.lifecycle``'s."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from . import __version__, lifecycle
from .app import load_config
from .config import ConfigError, ListenAddress, LoadedConfig, RouteConfig, parse_listen
from .core import aiohttp_fast
from .core.tenants import Tenant
from .edge.tenancy import TenantResolver
from .lifecycle import ServeOptions
from .ops.ledger import commands as ledger_commands
from .ops.log_format import setup_logging
from .ops.probe import ADMIN_LISTEN_ENV

if TYPE_CHECKING:
    from .rollout import RolloutPlan

__all__ = ("main",)

DEFAULT_CONFIG = "config/gateway.yaml"


def _listen(value: str) -> ListenAddress:
    try:
        return parse_listen(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="Deprecation gateway: a reverse proxy that enforces API deprecations at the edge."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_help = f"configuration file (default: {DEFAULT_CONFIG})"
    serve = sub.add_parser(
        "serve", help="run the gateway", description="Runs the gateway: the public listener and the admin listener "
        "(/metrics, /livez, /readyz, /status). SIGTERM or SIGINT drains and stops it, SIGHUP reloads the file.")
    serve.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    serve.add_argument("--listen", type=_listen, metavar="HOST:PORT", help="override server.listen")
    serve.add_argument("--admin-listen", type=_listen, metavar="HOST:PORT",
                       help=f"override server.admin_listen and {ADMIN_LISTEN_ENV} (the environment variable the "
                       "container image sets, which its health check reads)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                       help="diagnostic log on stderr, from this level up (default: %(default)s)")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="worker processes sharing the ports, 1 to 64 (default: %(default)s)")
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set by --workers for each worker
    check = sub.add_parser(
        "check-config", help="validate a configuration file and print its tenants, routes and chains",
        description="Validates a configuration file as serve would, without starting anything. Exit status 2 with "
        "every problem listed, each with its path.")
    check.add_argument("--config", dest="config_option", metavar="FILE", help=config_help)
    check.add_argument("config", nargs="?", metavar="FILE", help="the same, given without --config")
    usage = sub.add_parser(
        "usage", help="who still uses deprecated behaviour: read from the usage ledger",
        description="Reads the usage ledger the configuration names (usage.ledger.url: with PostgreSQL, the database "
        "every replica writes to, so the answer is the fleet's). Windows are whole hours, UTC. Exit status 1 when "
        "the ledger cannot be read, 2 for a bad argument or configuration.")
    usage.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    usage.add_argument("--since", default=ledger_commands.DEFAULT_SINCE, metavar="WHEN",
                       help="start: 30d, 12h, 2w ago, or an ISO 8601 date or time (default: %(default)s)")
    usage.add_argument("--until", metavar="WHEN", help="end, the same forms (default: now)")
    usage.add_argument("--tenant", help="only this company (a tenant name from the configuration)")
    usage.add_argument("--behaviour", help="only this dated behaviour (legacy_uploads, board_cards)")
    usage.add_argument("--top", type=int, metavar="N",
                       help="clients per behaviour (default: 20; --csv: every client; 0: every client)")
    usage.add_argument("--order", choices=("requests", "recent"), default="requests",
                       help="clients with the most requests first, or the most recently seen (default: %(default)s)")
    output = usage.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="the report as JSON (/deprecations' shape)")
    output.add_argument("--csv", action="store_true",
                        help="one line per client: the list of clients to contact")
    outreach = sub.add_parser(
        "outreach", help="the clients to contact: who still calls deprecated behaviour, most urgent first",
        description="Reads the usage ledger's per-client state (the fleet's, with PostgreSQL) over "
        "usage.readiness.window_days: each client that still calls (blocked: its calls are refused; overdue: it calls "
        "after its company's date; calling: before it), most urgent first, with its name and contact (usage.clients) "
        "or fingerprint and User-Agent, an example of its call and what changes for it next and when (the rollout at "
        "the gateway's clock). Exit status 1 when the ledger cannot be read, 2 for a bad argument or configuration.")
    outreach.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    outreach.add_argument("--tenant", help="only this company (a tenant name from the configuration)")
    outreach.add_argument("--behaviour", help="only this dated behaviour (legacy_uploads, board_cards)")
    outreach.add_argument("--all", action="store_true", help="the ready clients too (no deprecated call for "
                          "usage.readiness.quiet_days)")
    outreach.add_argument("--top", type=int, metavar="N", help="at most N clients (default: every one)")
    reach = outreach.add_mutually_exclusive_group()
    reach.add_argument("--json", action="store_true", help="as JSON (/deprecations' readiness)")
    reach.add_argument("--csv", action="store_true", help="one line per client and behaviour")
    migrate = sub.add_parser(
        "migrate", help="create or upgrade the usage ledger's schema (gateway serve also does it at start)")
    migrate.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    rollout = sub.add_parser(
        "rollout", help="the phase of each dated behaviour per tenant at an instant, and why",
        description="For each tenant and dated behaviour: the phase in force, why, the next change, brownouts, "
        "shadows, ramps, freezes, exemptions and bridges (docs/rollout.md); with --client (and --user-agent), where "
        "that client stands and why. Exit status 2 on a config error, a bad instant, an unknown host or fingerprint.")
    rollout.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    rollout.add_argument("--at", metavar="INSTANT", help="ISO 8601 date or date-time (default: the gateway's clock)")
    rollout.add_argument("--host", help="only the tenant that serves this Host (needed with --client)")
    rollout.add_argument("--client", metavar="FINGERPRINT",
                         help="one client, by its token fingerprint (12 hex digits, as the access log shows it)")
    rollout.add_argument("--user-agent", metavar="TEXT", help="with --client: the User-Agent it sends")
    return parser


def _describe(config: LoadedConfig) -> str:
    model = config.model
    lines = [f"{config.source}: OK", f"listen {model.server.listen}, admin {model.server.admin_listen}", "tenants:"]
    lines += [_tenant_line(config, tenant) for tenant in config.tenants()]
    lines.append("routes (first match wins; chains run first-listed outermost):")
    lines += [_route_line(config, route) for route in model.routes]
    lines.append(f"  catch_all: everything else\n      chain: {_chain(config, 'catch_all')} -> upstream")
    lines.append(ledger_commands.describe(config))
    return "\n".join(lines)


def _tenant_line(config: LoadedConfig, tenant: Tenant) -> str:
    return (f"  {tenant.name}: hosts {', '.join(tenant.hosts)} -> {config.secrets.redact(str(tenant.upstream))}"
            f" (restricted_file_access={str(tenant.restricted_file_access).lower()},"
            f" forbid_legacy_uploads={str(tenant.forbid_legacy_uploads).lower()})")


def _route_line(config: LoadedConfig, route: RouteConfig) -> str:
    methods = ",".join(route.methods) if route.methods else "*"
    paths = " ".join(p + r for r in route.paths for p in route.prefixes or [""])
    return f"  {route.name}: {methods} {paths}\n      chain: {_chain(config, route.name)} -> upstream"


def _chain(config: LoadedConfig, route: str) -> str:
    return " -> ".join(name for name, _ in config.chains[route]) or "(none)"


class _Refused(Exception):
    """A command cannot run with what it was given: ``str()`` goes to stderr and the exit status is 2."""


def _load(path: str, unneeded: Callable[[Sequence[int | str]], bool] | None = None) -> LoadedConfig:
    """The config of ``path``, or _Refused with every problem."""
    try:
        return load_config(path, unneeded=unneeded)
    except ConfigError as err:
        raise _Refused(str(err)) from None


def _rollout(config_path: str, at: str | None, host: str | None, client: str | None = None,
             user_agent: str | None = None) -> int:
    from .rollout import describe

    config = _load(config_path)
    now = _instant(config, at)
    one_client = client is not None or user_agent is not None
    if one_client:
        _check_client(client, host)
    name = _tenant_of(config, host) if host is not None else None
    print(f"rollout at {now.isoformat()} ({config.source})")
    plan = config.rollout_plan()
    if name is None or not one_client:
        print("\n".join(describe(plan, now, None if name is None else [name])))
        return 0
    print("\n".join(_client_lines(plan, now, name, client, user_agent)))
    return 0


def _client_lines(plan: RolloutPlan, now: dt.datetime, name: str, client: str | None, user_agent: str | None
                  ) -> list[str]:
    """One client of one company, as the rollout treats it: its fingerprint and User-Agent, as given."""
    from .rollout import HeaderClient, describe_client

    headers = {"User-Agent": user_agent} if user_agent is not None else {}
    return describe_client(plan, now, name, HeaderClient(headers, client), _who(client, user_agent))


def _who(client: str | None, user_agent: str | None) -> str:
    """The client ``gateway rollout`` describes: its fingerprint and User-Agent, as given."""
    parts = [f"fingerprint {client}"] if client else []
    if user_agent:
        parts.append(f"User-Agent {user_agent!r}")
    return " ".join(parts)


def _instant(config: LoadedConfig, at: str | None) -> dt.datetime:
    """``--at``, or the gateway's clock (``GATEWAY_NOW``, ``rollout.now``); the problem names where it came from."""
    from .rollout import clock_from_config, parse_instant

    rollout = config.model.rollout
    try:
        return parse_instant(at, rollout.tzinfo) if at is not None else clock_from_config(rollout).now()
    except ValueError as err:
        raise _Refused(f"gateway: --at: {err}" if at is not None else f"gateway: {err}") from None


def _check_client(client: str | None, host: str | None) -> None:
    if host is None:
        raise _Refused("gateway: --client and --user-agent need --host (a client belongs to one company)")
    if client is not None and not re.fullmatch(r"[0-9a-f]{12}", client):
        raise _Refused(f"gateway: --client: {client[:40]!r} is not a token fingerprint (12 lowercase hex digits)")


def _tenant_of(config: LoadedConfig, host: str) -> str:
    tenant = TenantResolver.of(config).resolve(host)
    if tenant is None:
        raise _Refused(f"gateway: no tenant serves the host {host!r}")
    return tenant.name


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except _Refused as err:
        print(err, file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `gateway rollout | head`: the reader left; stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _outside_the_ledger(path: Sequence[int | str]) -> bool:
    """``usage`` and ``migrate`` open the ledger's database only: a variable they need is one under usage.ledger.
    Elsewhere (the admin token, an upstream's password) an unset one stays its reference, so that an operator's
    shell needs only the ledger's variables to read the fleet's usage."""
    return list(path[:2]) != ["usage", "ledger"]


def _outside_the_ledger_and_rollout(path: Sequence[int | str]) -> bool:
    """``outreach`` also works out each client's next change: the rollout's variables (its ramps' key) are needed."""
    return _outside_the_ledger(path) and not (path[:1] == ["rollout"] or (path[:1] == ["tenants"] and
                                                                             path[2:3] == ["rollout"]))


def _admin_listen_from_env() -> ListenAddress | None:
    """GATEWAY_ADMIN_LISTEN, between --admin-listen and the file: the container image sets it, and its health check
    (``gateway.ops.probe``) reads it too, so that both follow the admin listener wherever it is moved."""
    value = os.environ.get(ADMIN_LISTEN_ENV)
    try:
        return parse_listen(value) if value else None
    except ValueError as err:
        raise _Refused(f"gateway: {ADMIN_LISTEN_ENV}: {err}") from None


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    return _COMMANDS.get(args.command, _serve)(args)


def _rollout_command(args: argparse.Namespace) -> int:
    return _rollout(args.config, args.at, args.host, args.client, args.user_agent)


def _migrate(args: argparse.Namespace) -> int:
    return ledger_commands.migrate(_load(args.config, _outside_the_ledger))


def _check_config(args: argparse.Namespace) -> int:
    if args.config and args.config_option and args.config != args.config_option:
        raise _Refused("gateway check-config: give the configuration file once (--config FILE or FILE)")
    print(_describe(_load(args.config_option or args.config or DEFAULT_CONFIG)))
    return 0


def _usage(args: argparse.Namespace) -> int:
    config = _load(args.config, _outside_the_ledger)
    output: Literal["text", "json", "csv"] = "json" if args.json else "csv" if args.csv else "text"
    return ledger_commands.usage(config, since=args.since, until=args.until, tenant=args.tenant,
                                 behaviour=args.behaviour, top=args.top, order=args.order, output=output)


def _outreach(args: argparse.Namespace) -> int:
    config = _load(args.config, _outside_the_ledger_and_rollout)
    output: Literal["text", "json", "csv"] = "json" if args.json else "csv" if args.csv else "text"
    return ledger_commands.outreach(config, tenant=args.tenant, behaviour=args.behaviour, everyone=args.all,
                                    top=args.top, output=output)


def _serve(args: argparse.Namespace) -> int:
    formatter = setup_logging(args.log_level)
    config = _load(args.config)
    formatter.use_secrets(config.secrets.redact)
    options = _serve_options(args, config)
    if options.workers > 1:
        lifecycle.supervise(config, options)  # exec: does not return
    try:
        lifecycle.run(config, options, formatter)
    except OSError as err:
        print(f"gateway: cannot listen: {err.strerror or err}", file=sys.stderr)
        return 1
    except ValueError as err:  # GATEWAY_NOW and similar environment mistakes
        raise _Refused(f"gateway: {err}") from None
    return 0


def _check_fast_paths() -> None:
    try:
        aiohttp_fast.check()
    except ValueError as err:  # a wrong GATEWAY_AIOHTTP_FAST_PATHS
        raise _Refused(f"gateway: {err}") from None


def _serve_options(args: argparse.Namespace, config: LoadedConfig) -> ServeOptions:
    """What ``gateway serve`` was told: the command line over the environment over the file."""
    _check_fast_paths()
    server = config.model.server
    admin_listen = args.admin_listen or _admin_listen_from_env() or server.admin_listen
    if not 1 <= args.workers <= 64:
        raise _Refused("gateway: --workers must be between 1 and 64")
    return ServeOptions(args.config, args.listen or server.listen, admin_listen, workers=args.workers,
                        reuse_port=args.reuse_port, log_level=args.log_level)


_COMMANDS: dict[str | None, Callable[[argparse.Namespace], int]] = {
    "rollout": _rollout_command, "migrate": _migrate, "usage": _usage, "outreach": _outreach,
    "check-config": _check_config,
}
