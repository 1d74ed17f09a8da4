"""The server: accepting connections, aiohttp's HTTP/1.1 parser, the time limits of a client, and writing each reply.
The private aiohttp pieces it uses for speed (and the upstream client's) are behind ``core.aiohttp_fast``."""
