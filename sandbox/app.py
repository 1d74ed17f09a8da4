"""Application factory of the sandbox service."""

from __future__ import annotations

from aiohttp import web

from sandbox.auth import auth_middleware
from sandbox.boards import board_routes
from sandbox.cards import card_routes
from sandbox.comments import comment_routes
from sandbox.controls import control_routes
from sandbox.downloads import download_routes
from sandbox.errors import error_middleware
from sandbox.fault_types import FaultTable
from sandbox.faults import fault_middleware
from sandbox.files import file_routes
from sandbox.journal import journal_middleware, journal_routes
from sandbox.journal_types import Journal
from sandbox.legacy_files import legacy_file_routes
from sandbox.ratelimit import rate_limit_middleware
from sandbox.ratelimit_types import RateWindows
from sandbox.seed import build_store
from sandbox.settings import SandboxSettings
from sandbox.state import FAULTS, JOURNAL, RATE_WINDOWS, SETTINGS, STORE

__all__ = ["API_PREFIXES", "SandboxSettings", "create_app"]

API_PREFIXES = ("/api/v1", "/api/latest")


def create_app(settings: SandboxSettings | None = None) -> web.Application:
    """A fresh sandbox: its own seeded data, an empty journal, no faults."""
    settings = settings or SandboxSettings()
    # Outermost first: the journal sees every answer, including errors,
    # injected faults, 429s of the rate limit and 401s produced further in.
    app = web.Application(middlewares=[journal_middleware, error_middleware, rate_limit_middleware, fault_middleware,
                                       auth_middleware])
    app[SETTINGS] = settings
    app[STORE] = build_store(settings.seed, settings.extra_boards)
    app[JOURNAL] = Journal(settings.journal_size)
    app[FAULTS] = FaultTable()
    app[RATE_WINDOWS] = RateWindows()
    for prefix in API_PREFIXES:
        app.add_routes(board_routes(prefix))
        app.add_routes(card_routes(prefix))
        app.add_routes(comment_routes(prefix))
        app.add_routes(legacy_file_routes(prefix))
        app.add_routes(file_routes(prefix))
    app.add_routes(download_routes())
    app.add_routes(journal_routes())
    app.add_routes(control_routes())
    return app
