"""The container's health check, ``python -I -m gateway.ops.probe``: asks ``/livez`` at the admin address that
``gateway serve`` takes from GATEWAY_ADMIN_LISTEN (the image sets it), so that the check follows the admin listener
wherever it is moved. Exit status 0 when it answers 200, else 1. The standard library only: it runs every 30 s beside
the gateway and imports nothing of it."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping

__all__ = ("ADMIN_LISTEN_ENV", "livez_url", "main")

ADMIN_LISTEN_ENV = "GATEWAY_ADMIN_LISTEN"
_DEFAULT = "127.0.0.1:9090"
# A listener on every address is asked on loopback, of the same family.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def livez_url(environ: Mapping[str, str] = os.environ) -> str:
    """The admin listener's /livez URL, from ``GATEWAY_ADMIN_LISTEN`` (``host:port``, ``[v6]:port``)."""
    value = environ.get(ADMIN_LISTEN_ENV) or _DEFAULT
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{ADMIN_LISTEN_ENV}: expected 'host:port', got {value!r}")
    host = host.removeprefix("[").removesuffix("]")
    host = _LOOPBACK.get(host, host)
    return f"http://[{host}]:{port}/livez" if ":" in host else f"http://{host}:{port}/livez"


def main(environ: Mapping[str, str] = os.environ, timeout: float = 4.0) -> int:
    try:
        url = livez_url(environ)
        # Straight to the listener: a proxy named by the container's environment (http_proxy) is not asked.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=timeout) as resp:
            status = resp.status
    except (OSError, ValueError) as err:  # refused, timed out, a non-200 (HTTPError), a bad address
        print(f"unhealthy: {err}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
