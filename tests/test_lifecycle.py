"""Connection timeouts on trio's virtual clock, through an in-memory transport."""

from __future__ import annotations

import json
import math
from typing import Any

import trio
import trio.testing

from realtime.connection import Connection, TransportClosed
from realtime.engine import Engine
from realtime.limits import Limits


class MemoryTransport:
    def __init__(self) -> None:
        self.inbox_send, self.inbox = trio.open_memory_channel[str | bytes | None](math.inf)
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None

    async def receive(self) -> str | bytes | None:
        try:
            return await self.inbox.receive()
        except trio.EndOfChannel:
            raise TransportClosed from None

    async def send(self, text: str) -> None:
        if self.closed:
            raise TransportClosed
        self.sent.append(json.loads(text))

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_configure_timeout_closes_1008(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    transport = MemoryTransport()
    conn = Connection(transport, engine, Limits(configure_timeout=30))
    start = trio.current_time()
    await conn.run()
    assert trio.current_time() - start == 30
    assert [e["type"] for e in transport.sent] == ["session.created", "error"]
    assert transport.sent[1]["error"] == {
        "code": "invalid_request",
        "message": "no session.update within 30 s; closing",
    }
    assert transport.closed is not None and transport.closed[0] == 1008
    assert conn.close_code == 1008
    assert not engine.is_reserved()


async def test_configure_timeout_counts_from_accept_not_last_message(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    transport = MemoryTransport()
    conn = Connection(transport, engine, Limits(configure_timeout=30, idle_timeout=120))

    async def chatter() -> None:
        for _ in range(10):
            await trio.sleep(5)
            await transport.inbox_send.send('{"type": "session.ping"}')

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chatter)
        await conn.run()
        assert trio.current_time() - start == 30
        nursery.cancel_scope.cancel()
    assert transport.closed is not None and transport.closed[0] == 1008
    assert [e["type"] for e in transport.sent].count("session.pong") == 5


async def test_disconnect_releases(engine: Engine) -> None:
    transport = MemoryTransport()
    conn = Connection(transport, engine, Limits())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await trio.testing.wait_all_tasks_blocked()
        assert engine.is_reserved()
        await transport.inbox_send.aclose()
    assert not engine.is_reserved()
