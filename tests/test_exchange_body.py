"""A body in hand as pieces (``core.exchange.Pieces``), alone: how it is written (large pieces as they are, small
ones gathered, none lost or reordered), and a reply holding one read again without a copy of the whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.core.exchange import Body, BodyTooLarge, Budget, Pieces, Reply


async def _written(body: Body) -> list[bytes]:
    return [chunk async for chunk in body.chunks()]


async def test_large_pieces_go_as_they_are_small_views_are_gathered_and_oversized_ones_sliced() -> None:
    big = b"B" * 100_000
    page = b"0123456789" * 1000
    views = [memoryview(page)[i : i + 100] for i in range(0, 1000, 100)]
    pieces: list[bytes | memoryview] = [*views, big, b"tail", b"x" * 250_000]
    body = Pieces(pieces, piece=200_000)
    assert body.length == sum(map(len, pieces))
    out = await _written(body)
    assert b"".join(out) == b"".join(pieces)
    assert out[0] == page[:1000]  # ten views, one write
    assert out[1] is big  # not copied
    assert [len(chunk) for chunk in out[2:]] == [4, 200_000, 50_000]
    assert await _written(body) == out  # in memory: written again alike


async def test_a_reply_with_pieces_in_hand_reads_them_without_reading_a_stream() -> None:
    page = b"abcdefghij" * 10
    reply = Reply(200)
    reply.set_body(Pieces([memoryview(page)[:30], memoryview(page)[30:]]))
    assert not reply.streamed and reply.length == 100
    seen: list[bytes | bytearray] = []
    assert await reply.read_pieces(100, seen.append) == [page[:30], page[30:]] == seen
    with pytest.raises(BodyTooLarge):
        await reply.read_pieces(99)
    assert await reply.read(100) == page
    assert not reply.streamed and reply.length == 100


class _Stream(Body):
    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces
        self.length = sum(map(len, pieces))

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


async def test_a_budget_is_taken_once_for_a_body_read_in_pieces_and_once_for_one_set_in_hand() -> None:
    reply = Reply(200)
    reply.set_body(_Stream([b"a" * 40, b"b" * 40]))
    budget = Budget(100)
    assert await reply.read_pieces(1000, budget=budget) == [b"a" * 40, b"b" * 40]
    assert not reply.streamed
    assert await reply.read_pieces(1000, budget=budget) == [b"a" * 40, b"b" * 40]  # read already: taken then
    assert not budget.take(21) and budget.take(20)
    assembled = Reply(200)
    assembled.set_body(Pieces([b"c" * 60]))
    with pytest.raises(BodyTooLarge):
        await assembled.read_pieces(1000, budget=Budget(59))
    assert await assembled.read_pieces(1000, budget=Budget(60)) == [b"c" * 60]
