"""Connection timeouts on trio's virtual clock, through an in-memory transport."""

from __future__ import annotations

import base64
import json
import math
import time
from typing import Any

import numpy as np
import trio
import trio.testing

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.native.connection import NativeConnection as Connection
from realtime.session.lifetime import TransportClosed
from realtime.testing.fake import FakeModel


class MemoryTransport:
    def __init__(self) -> None:
        self.inbox_send, self.inbox = trio.open_memory_channel[str | bytes | None](math.inf)
        self.sent: list[dict[str, Any]] = []
        self.sent_at: list[float] = []
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
        self.sent_at.append(trio.current_time())

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_configure_timeout_closes_1008(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    transport = MemoryTransport()
    conn = Connection(transport, engine, Limits(configure_timeout=30))
    start = trio.current_time()
    await conn.run()
    assert transport.sent_at[-1] - start == 30
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
        assert transport.sent_at[-1] - start == 30
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
    # The engine frees the slot once it has run the session's close.
    deadline = time.monotonic() + 2
    while engine.is_reserved() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not engine.is_reserved()


async def test_idle_timeout_waits_until_nothing_is_owed(
    fake_model: FakeModel, autojump_clock: trio.testing.MockClock
) -> None:
    """20 frames sent at once to a slow model, then silence: every frame is delivered
    before the idle clock starts, and it closes exactly idle_timeout after the last."""
    fake_model.options.frame_delay = 0.005  # real time: virtual time races ahead meanwhile
    engine = Engine(lambda: fake_model)
    engine.start()
    try:
        transport = MemoryTransport()
        conn = Connection(transport, engine, Limits(idle_timeout=3))
        audio = base64.b64encode(np.zeros(1280 * 20, "<i2").tobytes()).decode()
        await transport.inbox_send.send('{"type": "session.update"}')
        await transport.inbox_send.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": audio})
        )
        await conn.run()
    finally:
        engine.shutdown()
    types = [e["type"] for e in transport.sent]
    assert types.count("response.audio.delta") == 20
    assert types[-1] == "error" and "no message for 3 s" in transport.sent[-1]["error"]["message"]
    last_audio = max(i for i, t in enumerate(types) if t == "response.audio.delta")
    assert transport.sent_at[-1] - transport.sent_at[last_audio] == 3
    assert conn.close_code == 1008


class GatedTransport(MemoryTransport):
    """Holds every audio delta's write until ``gate`` is set; records which task wrote
    each event and fails if two writes ever overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.writers: list[tuple[str, str]] = []
        self.writing = False

    async def send(self, text: str) -> None:
        assert not self.writing, "two socket writes at once"
        self.writing = True
        try:
            kind = json.loads(text)["type"]
            self.writers.append((kind, trio.lowlevel.current_task().name))
            if kind == "response.audio.delta":
                await self.gate.wait()
            await super().send(text)
        finally:
            self.writing = False


async def test_a_frame_written_by_the_collector_keeps_its_place_before_later_events(
    engine: Engine,
) -> None:
    """The collector writes a frame's events itself when the sender is idle; a pong
    queued while that write is stuck waits for it, and the writes never overlap."""
    transport = GatedTransport()
    conn = Connection(transport, engine, Limits())

    async def sent(kind: str) -> None:
        while kind not in [e["type"] for e in transport.sent]:
            await trio.sleep(0.001)

    frame = base64.b64encode(np.zeros(1280, "<i2").tobytes()).decode()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await transport.inbox_send.send('{"type": "session.update"}')
            await sent("session.updated")
            await transport.inbox_send.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": frame})
            )
            while "response.audio.delta" not in [kind for kind, _ in transport.writers]:
                await trio.sleep(0.001)
            await transport.inbox_send.send('{"type": "session.ping"}')
            await trio.sleep(0.05)
            assert "session.pong" not in [e["type"] for e in transport.sent]
            transport.gate.set()
            await sent("session.pong")
            await transport.inbox_send.aclose()
    types = [e["type"] for e in transport.sent]
    assert types.index("response.audio.delta") < types.index("session.pong")
    writers = dict(transport.writers)
    assert writers["response.audio.delta"] == f"{conn.session_id}:collector"
    # The pong was queued behind the stuck write, so the sender wrote it.
    assert writers["session.pong"] == f"{conn.session_id}:sender"


async def test_the_receiver_never_writes_its_answers_itself(
    engine: Engine,
) -> None:
    """Even with the sender idle the pong goes through the sender: a write by the
    receiver that finds the socket dead would wait inside Hypercorn's full receive
    queue, which only the receiver drains."""
    transport = GatedTransport()
    conn = Connection(transport, engine, Limits())
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await transport.inbox_send.send('{"type": "session.ping"}')
            while "session.pong" not in [kind for kind, _ in transport.writers]:
                await trio.sleep(0.001)
            await transport.inbox_send.aclose()
    assert dict(transport.writers)["session.pong"] == f"{conn.session_id}:sender"
