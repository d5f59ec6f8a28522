"""A client that reads nothing while its close waits is dropped within ``send_timeout``.

The plumbing over an in-memory transport whose peer stops reading: its writes and
its close block, shielded as Hypercorn shields socket writes, until the connection
is aborted. Virtual time (``MockClock``) makes every bound exact; the socket-level
attack is in test_socket.py, the rule itself in test_conversation.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence

import pytest
import trio
import trio.testing

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.native.connection import NativeConnection as Connection
from realtime.testing.fake import FakeModel

SEND_TIMEOUT = 10.0
GIVE_UP = 1000.0
"""When a stuck write ends by itself (as a TCP stack would, eventually): a test of code
that never aborts fails instead of hanging."""


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that jumps once trio has been idle for 10 ms of real time: the
    engine thread answers in far less, so waiting for it does not race the clock
    ahead (a threshold of 0 jumps hundreds of timer polls while a thread replies).
    Each bound checked here spans no engine call, so it is exact either way."""
    return trio.testing.MockClock(autojump_threshold=0.01)


@pytest.fixture
def idle_engine() -> Iterator[Engine]:
    engine = Engine(FakeModel)
    engine.start()
    yield engine
    engine.shutdown()


class StuckPeer:
    """A peer that reads its first ``reads`` events and nothing after; its close is
    stuck too when ``close_stuck``. A stuck write ends when ``abort()`` is called."""

    def __init__(
        self, engine: Engine, frames: Sequence[str], *, reads: float, close_stuck: bool
    ) -> None:
        self.engine = engine
        self.frames = list(frames)
        self.reads = reads
        self.close_stuck = close_stuck
        self.read: list[str] = []
        self.stuck_since: float | None = None
        self.close_at: float | None = None
        self.released_before_close = False
        self.aborted_at: float | None = None
        self._aborted = trio.Event()

    async def receive(self) -> str | bytes | None:
        if self.frames:
            return self.frames.pop(0)
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def _stuck(self) -> None:
        if self.stuck_since is None:
            self.stuck_since = trio.current_time()
        with trio.CancelScope(shield=True), trio.move_on_after(GIVE_UP):
            await self._aborted.wait()

    async def send(self, text: str) -> None:
        if len(self.read) >= self.reads:
            await self._stuck()
        elif not self._aborted.is_set():
            self.read.append(json.loads(text)["type"])

    async def close(self, code: int, reason: str) -> None:
        self.close_at = trio.current_time()
        self.released_before_close = (
            self.engine.release_pending() is not None or not self.engine.is_reserved()
        )
        if self.close_stuck:
            await self._stuck()

    def abort(self) -> bool:
        self.aborted_at = trio.current_time()
        self._aborted.set()
        return True


def _frames(*messages: dict[str, object]) -> list[str]:
    return [json.dumps(m) for m in messages]


async def test_a_close_the_client_does_not_read_is_aborted_after_send_timeout(
    clock: trio.testing.MockClock, idle_engine: Engine
) -> None:
    """Every event went out, then the client stopped reading: the graceful close
    (after response.done) releases the slot first and must not wait longer than
    send_timeout for the close frame to go out."""
    peer = StuckPeer(
        idle_engine,
        _frames({"type": "session.update", "session": {}}, {"type": "input_audio_buffer.commit"}),
        reads=math.inf,
        close_stuck=True,
    )
    conn = Connection(peer, idle_engine, Limits(send_timeout=SEND_TIMEOUT))
    with trio.fail_after(10 * GIVE_UP):
        await conn.run()
    assert peer.read[-1] == "response.done"
    assert peer.released_before_close
    assert peer.close_at is not None and peer.aborted_at == peer.close_at + SEND_TIMEOUT
    assert conn.close_code == 1000 and conn.ending()[0] == "done"


async def test_a_stalled_reader_whose_close_is_stuck_too_is_aborted(
    clock: trio.testing.MockClock, idle_engine: Engine
) -> None:
    """The client reads nothing after session.created: send_timeout after the write
    started the slot is released and the close begins; the close is the stuck write
    itself (not only queued behind one), and send_timeout later the connection is
    aborted."""
    peer = StuckPeer(
        idle_engine, _frames({"type": "session.update", "session": {}}), reads=1, close_stuck=True
    )
    conn = Connection(peer, idle_engine, Limits(send_timeout=SEND_TIMEOUT))
    with trio.fail_after(10 * GIVE_UP):
        await conn.run()
    assert peer.read == ["session.created"]
    assert peer.stuck_since is not None
    assert peer.close_at == peer.stuck_since + SEND_TIMEOUT
    assert peer.released_before_close
    assert peer.aborted_at == peer.close_at + SEND_TIMEOUT
    assert conn.close_code == 1008 and conn.ending()[0] == "stalled_client"
