"""The public listening socket, accepting in batches.

libuv (under uvloop) accepts one connection per turn of the event loop. A gateway busy with a thousand connections
takes tens of milliseconds per turn, so under load new connections wait seconds in the kernel's queue before they are
even accepted: before they can be served, or told 503 over ``server.max_connections``. Here the socket is watched by
the loop, and each time it is readable up to ``batch`` connections are accepted at once and handed to the server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

__all__ = ("Acceptor", "listening_socket")

log = logging.getLogger("gateway")


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
    """Accepts connections on ``sock`` for ``protocol_factory`` (aiohttp's server), up to ``batch`` per wake-up."""

    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol], *, batch: int = 128):
        self._sock = sock
        self._factory = protocol_factory
        self._batch = batch
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[object]] = set()
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
            except OSError as err:  # EMFILE and the like: the next wake-up tries again
                log.warning("accepting a connection failed: %s", err.strerror or err)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._loop.connect_accepted_socket(self._factory, conn))
            self._pending.add(task)
            task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[object]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a connection could not be set up: %s", task.exception())

    async def close(self) -> None:
        """Stop accepting (connections already accepted go on)."""
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for task in list(self._pending):
            await asyncio.gather(task, return_exceptions=True)
