"""Fixtures for the sandbox tests: a fresh app per test, a client over a real socket."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from sandbox.app import create_app
from sandbox.settings import SandboxSettings

from .sandbox_testlib import SECRET, ClientFactory


@pytest.fixture
def settings() -> SandboxSettings:
    return SandboxSettings(signing_secret=SECRET)


@pytest.fixture
async def make_client(aiohttp_client: AiohttpClient) -> ClientFactory:
    async def build(settings: SandboxSettings | None = None) -> TestClient[Any, Any]:
        return await aiohttp_client(create_app(settings or SandboxSettings(signing_secret=SECRET)))

    return build


@pytest.fixture
async def client(make_client: ClientFactory, settings: SandboxSettings) -> TestClient[Any, Any]:
    return await make_client(settings)
