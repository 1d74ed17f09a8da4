"""Command line: ``gateway serve``, ``gateway check-config``, ``gateway rollout``, ``gateway usage``,
``gateway migrate``, ``gateway --version``. Parsing and wiring only."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import resource
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Literal

from aiohttp import web

from . import __version__
from .app import Gateway, load_config
from .config import ADMIN_PATHS, ConfigError, ListenAddress, LoadedConfig, parse_listen
from .core import aiohttp_fast
from .edge.tenancy import TenantResolver
from .ops.admin import make_admin_app
from .ops.gc_pauses import freeze_startup
from .ops.heap import keep_freed_memory
from .ops.ledger import commands as ledger_commands
from .ops.log_format import RedactingFormatter, setup_logging
from .ops.probe import ADMIN_LISTEN_ENV
from .ops.status import ConfigHistory
from .ops.workers import Peers, become_supervisor
from .server.acceptor import Acceptor, listening_socket
from .server.listener import admin_listener, admin_metric_events

__all__ = ("main",)

DEFAULT_CONFIG = "config/gateway.yaml"
log = logging.getLogger("gateway")


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
    for tenant in config.tenants():
        lines.append(
            f"  {tenant.name}: hosts {', '.join(tenant.hosts)} -> {config.secrets.redact(str(tenant.upstream))}"
            f" (restricted_file_access={str(tenant.restricted_file_access).lower()},"
            f" forbid_legacy_uploads={str(tenant.forbid_legacy_uploads).lower()})"
        )
    lines.append("routes (first match wins; chains run first-listed outermost):")
    for route in model.routes:
        methods = ",".join(route.methods) if route.methods else "*"
        paths = " ".join(p + r for r in route.paths for p in route.prefixes or [""])
        chain = " -> ".join(name for name, _ in config.chains[route.name]) or "(none)"
        lines.append(f"  {route.name}: {methods} {paths}\n      chain: {chain} -> upstream")
    chain = " -> ".join(name for name, _ in config.chains["catch_all"]) or "(none)"
    lines.append(f"  catch_all: everything else\n      chain: {chain} -> upstream")
    lines.append(ledger_commands.describe(config))
    return "\n".join(lines)


def _raise_file_limit(config: LoadedConfig) -> None:
    """Raise the soft limit on open files to the hard one: each client connection holds a descriptor, and so does each
    upstream connection (at most upstream.pool_size). Warn when even the hard limit is below that need."""
    model = config.model
    need = model.server.max_connections + model.upstream.pool_size + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if model.server.max_connections and soft < need:
        log.warning("open-file limit %d is below what server.max_connections (%d) and upstream.pool_size (%d) may "
                    "need (%d): raise the hard limit (ulimit -Hn, the container runtime's nofile) or lower them",
                    soft, model.server.max_connections, model.upstream.pool_size, need)


async def _serve(config_path: str, config: LoadedConfig, listen: ListenAddress, admin_listen: ListenAddress,
                 *, reuse_port: bool = False, formatter: RedactingFormatter | None = None) -> None:
    _raise_file_limit(config)
    keep_freed_memory()
    gateway = Gateway(config)
    history = ConfigHistory()
    peers = Peers.from_environ()  # under --workers: the supervisor's marks
    await gateway.start()
    server = config.model.server
    # aiohttp's own shutdown closes connections and drops the rest of a body still arriving: it runs only after the
    # gateway's drain (below), when nothing is left in flight but what the deadline cuts.
    runner = web.ServerRunner(gateway.make_server(), shutdown_timeout=_CUT_GRACE)
    admin_runner = web.AppRunner(make_admin_app(gateway, history=history), access_log=None)
    await runner.setup()
    await admin_runner.setup()
    assert admin_runner.server is not None
    admin = admin_listener(admin_runner.server, server, admin_metric_events(gateway.metrics))
    freeze_startup()  # before the first request: no full collection walks start-up's objects again
    acceptor: Acceptor | None = None
    admin_acceptor: Acceptor | None = None
    backoffs = gateway.metrics.accept_backoffs
    try:
        sock = _listening(listen, server.backlog, reuse_port)
        assert runner.server is not None
        acceptor = Acceptor(sock, runner.server, backed_off=backoffs.labels("public").inc)
        admin_sock = _listening(admin_listen, _ADMIN_BACKLOG, reuse_port)
        admin_acceptor = Acceptor(admin_sock, admin, name="admin", backed_off=backoffs.labels("admin").inc)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if peers is not None and (peers.orphaned() or peers.stopping()):
            stop.set()  # the supervisor died or was stopped while this worker started (its SIGTERM came too early)
        loop.add_signal_handler(signal.SIGHUP, _reload, gateway, config_path, history, formatter)
        # A worker under --workers starts with SIGHUP blocked (gateway.ops.workers): one that came since it read the
        # file is delivered now, to this handler, which reads it again. (Nothing blocked: nothing changes.)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        print(f"gateway {__version__} listening on http://{listen} (admin http://{admin_listen}"
              f"{_admin_access(config)})", flush=True)
        log.info("%s", aiohttp_fast.describe())  # which of aiohttp's private pieces are used, and why not the others
        await stop.wait()
        # Readiness turns 503 first, so load balancers stop sending before the listener closes.
        gateway.ready = False
        log.info("stopping: draining for %ss, then finishing in-flight requests (up to %ss)",
                 server.drain_delay, server.shutdown_timeout)
        await asyncio.sleep(server.drain_delay)
        # No new connections; every exchange in flight finishes (uploads still being sent, downloads still being
        # received), each answered with Connection: close.
        await acceptor.close()
        acceptor = None
        left = await gateway.drain(server.shutdown_timeout)
        if left:
            log.warning("shutdown_timeout (%ss) reached: cutting %d request(s) still in flight",
                        server.shutdown_timeout, left)
    finally:
        if acceptor is not None:
            await acceptor.close()
        if admin_acceptor is not None:
            await admin_acceptor.close()
        await runner.cleanup()
        await admin.shutdown(_CUT_GRACE)
        await admin_runner.cleanup()
        await gateway.close()  # the usage ledger's last write, within usage.ledger.flush_timeout
        if peers is not None:
            peers.leave()


# After the drain: how long aiohttp's shutdown gives the requests the deadline cut to unwind (their records).
_CUT_GRACE = 1.0
# The admin listener's backlog (its connections are few: probes, scrapes, an operator's browser).
_ADMIN_BACKLOG = 128


def _listening(address: ListenAddress, backlog: int, reuse_port: bool) -> socket.socket:
    try:
        return listening_socket(address.host, address.port, backlog=backlog, reuse_port=reuse_port)
    except OSError as err:
        raise OSError(err.errno, f"{address}: {err.strerror or err}") from None


def _admin_access(config: LoadedConfig) -> str:
    server = config.model.server
    if server.admin_token is None and len(server.admin_open_paths()) < len(ADMIN_PATHS):
        return ": /livez and /readyz only until server.admin_token is set"
    return ""


def _reload(gateway: Gateway, config_path: str, history: ConfigHistory | None = None,
            formatter: RedactingFormatter | None = None) -> None:
    """SIGHUP: validate the file again and swap it in whole; a bad file leaves the running config in place (and so
    does anything that fails while the new config is built: the swap is one assignment, after everything is built).
    Either way the refusal is counted and logged, never raised into the event loop."""
    try:
        config = load_config(config_path)
        changed = gateway.reload(config)
    except ConfigError as err:
        _refused(gateway, history, len(err.problems))
        log.error("reload refused, the running configuration stays: %s", err)
        return
    except Exception as err:  # noqa: BLE001 - a bug building a valid config must not end or bypass the refusal
        _refused(gateway, history, 1)
        log.error("reload refused, the running configuration stays: building it failed: %s", err, exc_info=True)
        return
    if formatter is not None:
        formatter.use_secrets(config.secrets.redact)
    gateway.metrics.config_reloads.labels("success").inc()
    gateway.metrics.config_last_reload.set_to_current_time()
    if history is not None:
        history.reloaded()
    log.info("configuration reloaded from %s", config_path)
    if changed:
        log.warning("reload does not apply %s: restart the gateway for them", ", ".join(changed))


def _refused(gateway: Gateway, history: ConfigHistory | None, problems: int) -> None:
    gateway.metrics.config_reloads.labels("failure").inc()
    if history is not None:
        history.refused(problems)


def _rollout(config_path: str, at: str | None, host: str | None, client: str | None = None,
             user_agent: str | None = None) -> int:
    from .rollout import HeaderClient, clock_from_config, describe, describe_client, parse_instant

    try:
        config = load_config(config_path)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    rollout = config.model.rollout
    try:
        # The problem names where the instant came from: --at, or GATEWAY_NOW (clock_from_config says so).
        now = parse_instant(at, rollout.tzinfo) if at is not None else clock_from_config(rollout).now()
    except ValueError as err:
        print(f"gateway: --at: {err}" if at is not None else f"gateway: {err}", file=sys.stderr)
        return 2
    if (client is not None or user_agent is not None) and host is None:
        print("gateway: --client and --user-agent need --host (a client belongs to one company)", file=sys.stderr)
        return 2
    if client is not None and not re.fullmatch(r"[0-9a-f]{12}", client):
        print(f"gateway: --client: {client[:40]!r} is not a token fingerprint (12 lowercase hex digits)",
              file=sys.stderr)
        return 2
    names = None
    if host is not None:
        tenant = TenantResolver.of(config).resolve(host)
        if tenant is None:
            print(f"gateway: no tenant serves the host {host!r}", file=sys.stderr)
            return 2
        names = [tenant.name]
    print(f"rollout at {now.isoformat()} ({config.source})")
    plan = config.rollout_plan()
    if names is not None and (client is not None or user_agent is not None):
        headers = {"User-Agent": user_agent} if user_agent is not None else {}
        who = " ".join(part for part in (client and f"fingerprint {client}", user_agent and f"User-Agent {user_agent!r}")
                       if part)
        print("\n".join(describe_client(plan, now, names[0], HeaderClient(headers, client), who)))
        return 0
    print("\n".join(describe(plan, now, names)))
    return 0


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``auto``: uvloop when it is installed (it is, from requirements.lock), else asyncio's own loop."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError("server.event_loop is uvloop but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `gateway rollout | head`: the reader left; stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _outside_the_ledger(path: Sequence[int | str]) -> bool:
    """``usage`` and ``migrate`` open the ledger's database only: a variable they need is one under usage.ledger.
    Elsewhere (the admin token, an upstream's password) an unset one stays its reference, so that an operator's
    shell needs only the ledger's variables to read the fleet's usage."""
    return list(path[:2]) != ["usage", "ledger"]


def _admin_listen_from_env() -> ListenAddress | None:
    """GATEWAY_ADMIN_LISTEN, between --admin-listen and the file: the container image sets it, and its health check
    (``gateway.ops.probe``) reads it too, so that both follow the admin listener wherever it is moved."""
    value = os.environ.get(ADMIN_LISTEN_ENV)
    return parse_listen(value) if value else None


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "rollout":
        return _rollout(args.config, args.at, args.host, args.client, args.user_agent)
    if args.command in ("usage", "migrate"):
        try:
            config = load_config(args.config, unneeded=_outside_the_ledger)
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
        if args.command == "migrate":
            return ledger_commands.migrate(config)
        output: Literal["text", "json", "csv"] = "json" if args.json else "csv" if args.csv else "text"
        return ledger_commands.usage(config, since=args.since, until=args.until, tenant=args.tenant,
                                     behaviour=args.behaviour, top=args.top, order=args.order, output=output)
    if args.command == "check-config":
        if args.config and args.config_option and args.config != args.config_option:
            print("gateway check-config: give the configuration file once (--config FILE or FILE)", file=sys.stderr)
            return 2
        try:
            config = load_config(args.config_option or args.config or DEFAULT_CONFIG)
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
        print(_describe(config))
        return 0
    formatter = setup_logging(args.log_level)
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    formatter.use_secrets(config.secrets.redact)
    try:
        aiohttp_fast.check()
    except ValueError as err:  # a wrong GATEWAY_AIOHTTP_FAST_PATHS
        print(f"gateway: {err}", file=sys.stderr)
        return 2
    server = config.model.server
    listen = args.listen or server.listen
    try:
        admin_listen = args.admin_listen or _admin_listen_from_env() or server.admin_listen
    except ValueError as err:
        print(f"gateway: {ADMIN_LISTEN_ENV}: {err}", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= 64:
        print("gateway: --workers must be between 1 and 64", file=sys.stderr)
        return 2
    if args.workers > 1:
        worker_argv = ["serve", "--config", args.config, "--listen", str(listen), "--admin-listen", str(admin_listen),
                       "--log-level", args.log_level, "--reuse-port"]
        # A worker's SIGTERM budget: the drain, the requests in flight, then the usage ledger's last write.
        budget = server.drain_delay + server.shutdown_timeout + config.model.usage.ledger.flush_timeout
        become_supervisor(args.workers, worker_argv, budget, args.log_level)  # exec: does not return
    try:
        with asyncio.Runner(loop_factory=_loop_factory(server.event_loop)) as runner:
            runner.run(_serve(args.config, config, listen, admin_listen, reuse_port=args.reuse_port,
                              formatter=formatter))
    except OSError as err:
        print(f"gateway: cannot listen: {err.strerror or err}", file=sys.stderr)
        return 1
    except ValueError as err:  # GATEWAY_NOW and similar environment mistakes
        print(f"gateway: {err}", file=sys.stderr)
        return 2
    return 0
