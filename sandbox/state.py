"""Typed keys for what the application and each request carry."""

from __future__ import annotations

from aiohttp import web

from sandbox.fault_types import FaultTable
from sandbox.journal_types import BodyTap, Journal
from sandbox.ratelimit_types import RateWindows
from sandbox.settings import SandboxSettings
from sandbox.store import Store

__all__ = ["BODY_TAP", "FAULTS", "JOURNAL", "RATE_WINDOWS", "SETTINGS", "STORE", "body_tap"]

SETTINGS = web.AppKey("sandbox_settings", SandboxSettings)
STORE = web.AppKey("sandbox_store", Store)
JOURNAL = web.AppKey("sandbox_journal", Journal)
FAULTS = web.AppKey("sandbox_faults", FaultTable)
RATE_WINDOWS = web.AppKey("sandbox_rate_windows", RateWindows)
BODY_TAP = web.RequestKey("sandbox_body_tap", BodyTap)


def body_tap(request: web.Request) -> BodyTap:
    """The tap the journal middleware installed; a detached one otherwise."""
    tap = request.get(BODY_TAP)
    if tap is None:
        tap = BodyTap()
        request[BODY_TAP] = tap
    return tap
