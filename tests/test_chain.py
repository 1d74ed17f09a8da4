"""Chains fold once, first listed outermost; policies see the request first and the response last."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.core.chain import fold


async def test_first_listed_is_outermost() -> None:
    events: list[str] = []

    def policy(name: str):
        async def middleware(request, handler):
            events.append(f"{name} in")
            response = await handler(request)
            events.append(f"{name} out")
            response.headers.add("X-Order", name)
            return response

        return middleware

    async def terminal(request):
        events.append("terminal")
        return web.Response(text="ok")

    handler = fold([policy("a"), policy("b"), policy("c")], terminal)
    response = await handler(make_mocked_request("GET", "/"))
    assert events == ["a in", "b in", "c in", "terminal", "c out", "b out", "a out"]
    assert response.headers.getall("X-Order") == ["c", "b", "a"]


async def test_a_policy_can_answer_without_calling_the_terminal() -> None:
    calls: list[str] = []

    async def block(request, handler):
        return web.Response(status=403)

    async def terminal(request):
        calls.append("terminal")
        return web.Response()

    response = await fold([block], terminal)(make_mocked_request("PUT", "/"))
    assert response.status == 403
    assert calls == []
