"""Chains fold once, first listed outermost; policies see the request first and the response last."""

from __future__ import annotations

from gateway.core.chain import fold
from gateway.core.exchange import Exchange, Next, Policy, Reply
from tests.gateway_testlib import make_config
from tests.policy_testlib import config_of, exchange_for, mocked_request


def _exchange(method: str) -> Exchange:
    return exchange_for(config_of(make_config("http://127.0.0.1:1")), mocked_request(method, "/"), "catch_all", {})


async def test_first_listed_is_outermost() -> None:
    events: list[str] = []

    def policy(name: str) -> Policy:
        async def middleware(exchange: Exchange, handler: Next) -> Reply:
            events.append(f"{name} in")
            response = await handler(exchange)
            events.append(f"{name} out")
            response.headers.add("X-Order", name)
            return response

        return middleware

    async def terminal(exchange: Exchange) -> Reply:
        events.append("terminal")
        return Reply(200, body=b"ok")

    handler = fold([policy("a"), policy("b"), policy("c")], terminal)
    response = await handler(_exchange("GET"))
    assert events == ["a in", "b in", "c in", "terminal", "c out", "b out", "a out"]
    assert response.headers.getall("X-Order") == ["c", "b", "a"]


async def test_a_policy_can_answer_without_calling_the_terminal() -> None:
    calls: list[str] = []

    async def block(exchange: Exchange, handler: Next) -> Reply:
        return Reply(403)

    async def terminal(exchange: Exchange) -> Reply:
        calls.append("terminal")
        return Reply(200)

    response = await fold([block], terminal)(_exchange("PUT"))
    assert response.status == 403
    assert calls == []
