"""One ``gateway serve`` process from start to stop: the gateway started (``app.Gateway``), its public and admin
listeners, the signals (SIGTERM and SIGINT drain and stop it, SIGHUP reloads the file off the event loop), the drain,
and every part closed in order. ``gateway.cli`` parses the arguments, loads the config and calls ``run``."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from aiohttp import web

from . import __version__
from .app import Gateway
from .config import ADMIN_PATHS, ConfigError, ListenAddress, LoadedConfig
from .core import aiohttp_fast
from .ops.admin import make_admin_app
from .ops.gc_pauses import freeze_built, freeze_startup, paused
from .ops.heap import keep_freed_memory
from .ops.log_format import RedactingFormatter
from .ops.status import ConfigHistory
from .ops.workers import Peers, become_supervisor
from .server.acceptor import Acceptor, listening_socket
from .server.listener import Listener, admin_listener, admin_metric_events

__all__ = ("Reloads", "ServeOptions", "run", "serve", "supervise")

log = logging.getLogger("gateway")

# After the drain: how long aiohttp's shutdown gives the requests the deadline cut to unwind (their records).
_CUT_GRACE = 1.0
# The admin listener's backlog (its connections are few: probes, scrapes, an operator's browser).
_ADMIN_BACKLOG = 128


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``gateway serve`` is asked, after its arguments and the environment."""

    config_path: str
    listen: ListenAddress
    admin_listen: ListenAddress
    workers: int = 1  # more than one: ``supervise``
    reuse_port: bool = False  # set by the supervisor for each of its workers
    log_level: str = "info"


def supervise(config: LoadedConfig, options: ServeOptions) -> NoReturn:
    """``--workers``: this process becomes the supervisor of ``options.workers`` processes that each ``run``."""
    server = config.model.server
    worker_argv = ["serve", "--config", options.config_path, "--listen", str(options.listen), "--admin-listen",
                   str(options.admin_listen), "--log-level", options.log_level, "--reuse-port"]
    # A worker's SIGTERM budget: the drain, the requests in flight, then the usage ledger's last write.
    budget = server.drain_delay + server.shutdown_timeout + config.model.usage.ledger.flush_timeout
    become_supervisor(options.workers, worker_argv, budget, options.log_level)


def run(config: LoadedConfig, options: ServeOptions, formatter: RedactingFormatter | None = None) -> None:
    """Serve ``config`` until SIGTERM or SIGINT. OSError: a listener cannot be opened; ValueError: a mistake in the
    environment (GATEWAY_NOW, uvloop asked for but not installed)."""
    with asyncio.Runner(loop_factory=_loop_factory(config.model.server.event_loop)) as runner:
        runner.run(serve(config, options, formatter))


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


async def serve(config: LoadedConfig, options: ServeOptions, formatter: RedactingFormatter | None = None) -> None:
    """The process's life on its event loop: start, serve until told to stop, drain, close."""
    _raise_file_limit(config)
    keep_freed_memory()
    # What the imports and the config left is collected once and frozen; what is built from the config (millions of
    # objects at 10,000 companies) is made without collections and frozen as it is: no collection walks any of it.
    freeze_startup()
    with paused():
        gateway = Gateway(config)
        reloads = Reloads(gateway, options.config_path, ConfigHistory(), formatter)
        peers = Peers.from_environ()  # under --workers: the supervisor's marks
        await gateway.start()
        listeners = _Listeners(gateway, reloads.history)
        await listeners.setup()
        freeze_built()
    try:
        listeners.open(options)
        stop = _stop_signals(peers)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloads.signal)
        # A worker under --workers starts with SIGHUP blocked (gateway.ops.workers): one that came since it read the
        # file is delivered now, to this handler, which reads it again. (Nothing blocked: nothing changes.)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        print(f"gateway {__version__} listening on http://{options.listen} (admin http://{options.admin_listen}"
              f"{_admin_access(config)})", flush=True)
        log.info("%s", aiohttp_fast.describe())  # which of aiohttp's private pieces are used, and why not the others
        await stop.wait()
        await _drain(gateway, listeners, config)
    finally:
        await reloads.cancel()
        await listeners.close()
        await gateway.close()  # the usage ledger's last write, within usage.ledger.flush_timeout
        if peers is not None:
            peers.leave()


def _stop_signals(peers: Peers | None) -> asyncio.Event:
    """Set by SIGINT or SIGTERM; at once when the supervisor died or was stopped while this worker started (its
    SIGTERM came too early)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if peers is not None and (peers.orphaned() or peers.stopping()):
        stop.set()
    return stop


async def _drain(gateway: Gateway, listeners: _Listeners, config: LoadedConfig) -> None:
    # Readiness turns 503 first, so load balancers stop sending before the listener closes.
    server = config.model.server
    gateway.ready = False
    log.info("stopping: draining for %ss, then finishing in-flight requests (up to %ss)",
             server.drain_delay, server.shutdown_timeout)
    await asyncio.sleep(server.drain_delay)
    # No new connections; every exchange in flight finishes (uploads still being sent, downloads still being
    # received), each answered with Connection: close.
    await listeners.stop_accepting()
    left = await gateway.drain(server.shutdown_timeout)
    if left:
        log.warning("shutdown_timeout (%ss) reached: cutting %d request(s) still in flight",
                    server.shutdown_timeout, left)


class _Listeners:
    """The public and the admin listener: aiohttp's server of each, then an acceptor on each socket."""

    def __init__(self, gateway: Gateway, history: ConfigHistory) -> None:
        server = gateway.state.config.model.server
        self._backoffs = gateway.metrics.accept_backoffs
        self._backlog = server.backlog
        # aiohttp's own shutdown closes connections and drops the rest of a body still arriving: it runs only after
        # the gateway's drain, when nothing is left in flight but what the deadline cuts.
        self._runner = web.ServerRunner(gateway.make_server(), shutdown_timeout=_CUT_GRACE)
        self._admin_runner = web.AppRunner(make_admin_app(gateway, history=history), access_log=None)
        self._admin_events = admin_metric_events(gateway.metrics)
        self._server = server
        self._admin_listener: Listener | None = None
        self._public: Acceptor | None = None
        self._admin: Acceptor | None = None

    async def setup(self) -> None:
        await self._runner.setup()
        await self._admin_runner.setup()
        assert self._admin_runner.server is not None
        # The admin application's own handler and requests, served within the admin listener's bounds.
        self._admin_listener = admin_listener(self._admin_runner.server, self._server, self._admin_events)

    def open(self, options: ServeOptions) -> None:
        """Both sockets bound and accepting; OSError names the address that cannot be."""
        assert self._runner.server is not None and self._admin_listener is not None
        sock = _listening(options.listen, self._backlog, options.reuse_port)
        self._public = Acceptor(sock, self._runner.server, backed_off=self._backoffs.labels("public").inc)
        admin_sock = _listening(options.admin_listen, _ADMIN_BACKLOG, options.reuse_port)
        self._admin = Acceptor(admin_sock, self._admin_listener, name="admin",
                               backed_off=self._backoffs.labels("admin").inc)

    async def stop_accepting(self) -> None:
        """The public listener closed: no new connection; the admin listener keeps answering probes."""
        if self._public is not None:
            await self._public.close()
            self._public = None

    async def close(self) -> None:
        await self.stop_accepting()
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
        await self._runner.cleanup()
        if self._admin_listener is not None:
            await self._admin_listener.shutdown(_CUT_GRACE)
        await self._admin_runner.cleanup()


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


def _raised_soft_limit(need: int) -> int:
    """The soft limit on open files, raised to the hard one where it is lower (an unlimited hard one: to ``need``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= soft:
        return soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def _raise_file_limit(config: LoadedConfig) -> None:
    """Raise the soft limit on open files to the hard one: each client connection holds a descriptor, and so does each
    upstream connection (at most upstream.pool_size). Warn when even the hard limit is below that need."""
    model = config.model
    need = model.server.max_connections + model.upstream.pool_size + 64
    soft = _raised_soft_limit(need)
    if model.server.max_connections and soft < need:
        log.warning("open-file limit %d is below what server.max_connections (%d) and upstream.pool_size (%d) may "
                    "need (%d): raise the hard limit (ulimit -Hn, the container runtime's nofile) or lower them",
                    soft, model.server.max_connections, model.upstream.pool_size, need)


class Reloads:
    """SIGHUP: the file read, validated and built again away from the event loop (``Gateway.reload_file``), then
    swapped in at once; a bad file, or anything that fails while the new config is built, leaves the running config in
    place. Either way the outcome is counted, kept in ``history`` (the status page) and logged, never raised into the
    event loop. One reload at a time: a SIGHUP during one is answered by another once it is done (the file may have
    changed after it was read)."""

    def __init__(self, gateway: Gateway, path: str, history: ConfigHistory | None = None,
                 formatter: RedactingFormatter | None = None) -> None:
        self.gateway = gateway
        self.path = path
        self.history = history if history is not None else ConfigHistory()
        self._formatter = formatter
        self._running: asyncio.Task[None] | None = None
        self._again = False

    def signal(self) -> None:
        """The SIGHUP handler."""
        if self._running is not None:
            self._again = True
            return
        self._running = asyncio.get_running_loop().create_task(self._until_read())

    async def _until_read(self) -> None:
        try:
            self._again = True
            while self._again:
                self._again = False
                await self.reload()
        finally:
            self._running = None

    async def cancel(self) -> None:
        """At shutdown: a reload still being built is dropped (never swapped in)."""
        task = self._running
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def reload(self) -> bool:
        """One reload of the file; whether it was swapped in."""
        try:
            config, changed = await self.gateway.reload_file(self.path)
        except ConfigError as err:
            self._refused(len(err.problems))
            log.error("reload refused, the running configuration stays: %s", err)
            return False
        except Exception as err:  # noqa: BLE001 - a bug building a valid config must not end or bypass the refusal
            self._refused(1)
            log.error("reload refused, the running configuration stays: building it failed: %s", err, exc_info=True)
            return False
        self._applied(config, changed)
        return True

    def _applied(self, config: LoadedConfig, changed: list[str]) -> None:
        """A reload swapped in: the log's secrets, the metrics and the history follow it."""
        if self._formatter is not None:
            self._formatter.use_secrets(config.secrets.redact)
        metrics = self.gateway.metrics
        metrics.config_reloads.labels("success").inc()
        metrics.config_last_reload.set_to_current_time()
        self.history.reloaded()
        log.info("configuration reloaded from %s", self.path)
        if changed:
            log.warning("reload does not apply %s: restart the gateway for them", ", ".join(changed))

    def _refused(self, problems: int) -> None:
        self.gateway.metrics.config_reloads.labels("failure").inc()
        self.history.refused(problems)
