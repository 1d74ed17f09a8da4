"""Fixtures of the adversarial corpora: the guarded gateway in front of an upstream that counts connections."""

from __future__ import annotations

import pytest

from tests.gateway_testlib import CountingUpstream, GatewayFactory, RunningGateway, guarded_routes, make_config


@pytest.fixture
async def guarded_gw(counting_upstream: CountingUpstream, start_gateway: GatewayFactory) -> RunningGateway:
    """Tenant ``acme`` (Host 127.0.0.1) has the forbid setting on; ``oldco`` (Host old.test) has it off."""
    return await start_gateway(make_config(counting_upstream.url, routes=guarded_routes()))
