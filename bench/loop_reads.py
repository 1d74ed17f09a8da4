"""How many reads of one body an event loop makes in one turn: a socket sends a body at once, a
``BufferedProtocol`` spends ``--cost`` ms on each full buffer of ``--piece`` bytes (as a scan would), and a callback
re-armed with ``call_soon`` counts the loop's turns. Under uvloop, libuv reads on while each read fills its buffer (up
to 32 reads in one callback); asyncio's selector loop reads once per readiness event. ``--pace``: the protocol pauses
the transport's reading after each full buffer and resumes it on the next turn (as ``core/aiohttp_fast._BodyInto``).

    .venv/bin/python bench/loop_reads.py [--loop uvloop|asyncio] [--pace] [--size 11000000] [--cost 0.15]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time


class _Reader(asyncio.BufferedProtocol):
    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
        self.args, self.loop, self.done = args, loop, done
        self.buffer = bytearray(args.piece)
        self.at = self.got = self.turn = 0
        self.reads_per_turn: dict[int, int] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's transports are not asyncio.Transport's)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)[self.at :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        self.at += nbytes
        self.reads_per_turn[self.turn] = self.reads_per_turn.get(self.turn, 0) + 1
        if self.at == len(self.buffer):
            self.at = 0
            end = time.perf_counter() + self.args.cost / 1000
            while time.perf_counter() < end:
                pass
            if self.args.pace and self.got < self.args.size and self.transport is not None:
                self.transport.pause_reading()
                self.loop.call_soon(self.transport.resume_reading)
        if self.got >= self.args.size and not self.done.done():
            self.done.set_result(None)


async def measure(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))

    def send() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1)
            conn.sendall(b"x" * args.size)
            conn.recv(1)

    threading.Thread(target=send, daemon=True).start()
    done: asyncio.Future[None] = loop.create_future()
    reader = _Reader(args, loop, done)

    def tick() -> None:
        reader.turn += 1
        if not done.done():
            loop.call_soon(tick)

    transport, _ = await loop.create_connection(lambda: reader, *listener.getsockname())
    transport.write(b"g")
    loop.call_soon(tick)
    await done
    transport.close()
    listener.close()
    counts = reader.reads_per_turn.values()
    print(f"{args.loop}{', paced' if args.pace else ''}: {sum(counts)} reads in {len(counts)} turns, "
          f"at most {max(counts)} in one turn ({args.size:,} bytes, {args.piece:,}-byte buffers, "
          f"{args.cost} ms a buffer)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--pace", action="store_true")
    parser.add_argument("--size", type=int, default=11_000_000)
    parser.add_argument("--piece", type=int, default=256 * 1024)
    parser.add_argument("--cost", type=float, default=0.15, help="ms spent on each full buffer")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(measure(args))
    else:
        asyncio.run(measure(args))


if __name__ == "__main__":
    main()
