"""The server: accepting connections, aiohttp's HTTP/1.1 parser, the time limits of a client, and writing each reply.
Every private aiohttp piece the gateway relies on (here and in the upstream client) is listed and checked in
``aiohttp_private`` when this package loads."""

from . import aiohttp_private  # noqa: F401 - the check, at import
