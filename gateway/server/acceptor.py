"""The listening sockets of both listeners, accepting in batches, and backing off when out of descriptors.

libuv (under uvloop) accepts one connection per loop turn: under load, new connections waited seconds in the kernel's
queue. Here the socket is watched by the loop and each time it is readable up to ``batch`` connections are accepted.
When ``accept()`` fails for want of a descriptor, the connection stays queued and the socket readable: trying again at
once would spin a core. The socket is left unwatched for ``retry_delay`` (a second, as asyncio's own accept loop
does) and the failure logged at most once a minute (docs/reliability.md, "Limits and overload").
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable

__all__ = ("Acceptor", "listening_socket")

log = logging.getLogger("gateway")

# accept() failures that concern the one connection being accepted (it went away, or its network did: accept(2),
# "Error handling"): the next one is accepted at once. Any other failure (EMFILE, ENFILE, ENOBUFS, ENOMEM) backs off.
_ONE_CONNECTION = frozenset(
    getattr(errno, name) for name in ("ECONNABORTED", "EPROTO", "EPERM", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN",
                                      "ENONET", "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH") if hasattr(errno, name)
)
# At most one line about back-offs per this many seconds.
_LOG_EVERY = 60.0


def listening_socket(host: str, port: int, *, backlog: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Acceptor:
    """Accepts connections on ``sock`` for ``protocol_factory`` (aiohttp's server), up to ``batch`` per wake-up.
    ``name`` names the listener in the log; ``backed_off`` is called at each back-off (a metric)."""

    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol], *, batch: int = 128,
                 name: str = "public", backed_off: Callable[[], None] = lambda: None, retry_delay: float = 1.0):
        self._sock = sock
        self._factory = protocol_factory
        self._batch = batch
        self._name = name
        self._backed_off = backed_off
        self._retry_delay = retry_delay
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[object]] = set()
        self._retry: asyncio.TimerHandle | None = None  # set while backing off (the socket is then not watched)
        self._unlogged = 0  # back-offs not yet logged
        self._logged_at = 0.0
        self._loop.add_reader(sock.fileno(), self._accept)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def _accept(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in _ONE_CONNECTION:
                    continue
                self._back_off(err)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._loop.connect_accepted_socket(self._factory, conn))
            self._pending.add(task)
            task.add_done_callback(self._connected)

    def _back_off(self, err: OSError) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._retry = self._loop.call_later(self._retry_delay, self._resume)
        self._backed_off()
        self._unlogged += 1
        now = time.monotonic()
        if self._logged_at and now - self._logged_at < _LOG_EVERY:
            return
        log.warning("%s listener: accepting a connection failed (%s): new connections wait in the kernel's queue, "
                    "accepted again after %gs (%d back-off(s) since the last such line)", self._name,
                    err.strerror or err, self._retry_delay, self._unlogged)
        self._logged_at, self._unlogged = now, 0

    def _resume(self) -> None:
        self._retry = None
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def _connected(self, task: asyncio.Task[object]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a connection could not be set up: %s", task.exception())

    async def close(self) -> None:
        """Stop accepting (connections already accepted go on)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        else:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for task in list(self._pending):
            await asyncio.gather(task, return_exceptions=True)
