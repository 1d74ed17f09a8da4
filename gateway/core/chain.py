"""Folding a route's policies around the terminal handler (the proxy core), once, when the route is built.

Order rule: the first policy listed is the outermost. It sees the request (and its body) first and the response
(and its body) last.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from .exchange import Exchange, Next, Policy, Reply

__all__ = ("fold",)


def fold(policies: Sequence[Policy], terminal: Next) -> Next:
    handler = terminal
    for policy in reversed(policies):
        handler = _bind(policy, handler)
    return handler


def _bind(policy: Policy, handler: Next) -> Next:
    # A closure rather than functools.partial(policy, next=handler): a keyword partial builds a dict per call.
    def bound(exchange: Exchange) -> Awaitable[Reply]:
        return policy(exchange, handler)

    return bound
