"""The frame-latency metric runs on one clock: trio's, from the append to the socket.

On a frozen ``MockClock`` (time moves only when the test jumps it) the metric of a
frame is exactly the time the test let pass while the model ran it; taken on two
clocks (``perf_counter`` minus trio time) it was off by the clocks' offset, which
made ``realtime_frame_latency_seconds_sum`` negative on a real server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.native.connection import NativeConnection as Connection
from realtime.telemetry.metrics import PrometheusObserver
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import append_msg, noise

MODEL_SECONDS = 0.25
"""Virtual time that passes while the model runs the frame."""


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()  # rate 0, no autojump


class Peer:
    """A client that sends ``frames``, then reads everything and waits."""

    def __init__(self, frames: Sequence[str]) -> None:
        self.frames = list(frames)
        self.read: list[str] = []

    async def receive(self) -> str | bytes | None:
        if self.frames:
            return self.frames.pop(0)
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(self, text: str) -> None:
        self.read.append(json.loads(text)["type"])

    async def close(self, code: int, reason: str) -> None:
        pass


def latency(metrics: PrometheusObserver) -> tuple[float, float]:
    """``realtime_frame_latency_seconds``: (count, sum)."""
    found = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            found[s.name] = s.value
    return (
        found["realtime_frame_latency_seconds_count"],
        found["realtime_frame_latency_seconds_sum"],
    )


async def test_frame_latency_is_the_trio_time_from_append_to_socket(
    clock: trio.testing.MockClock,
) -> None:
    reached, go = threading.Event(), threading.Event()

    def audio(index: int, heard: Any) -> Any:
        reached.set()  # the model runs the frame: the test moves time on meanwhile
        go.wait(10)
        return noise(64)

    engine = Engine(lambda: FakeModel(FakeOptions(audio=audio)))
    engine.start()
    metrics = PrometheusObserver(process_metrics=False)
    peer = Peer(
        [
            json.dumps({"type": "session.update", "session": {}}),
            append_msg(noise(1280)),
            json.dumps({"type": "input_audio_buffer.commit"}),
        ]
    )
    conn = Connection(peer, engine, Limits(), observer=metrics)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await trio.to_thread.run_sync(reached.wait, abandon_on_cancel=True)
            clock.jump(MODEL_SECONDS)
            go.set()
    finally:
        go.set()
        engine.shutdown()
    assert peer.read.count("response.audio.delta") == 1 and peer.read[-1] == "response.done"
    count, total = latency(metrics)
    assert count == 1 and total == pytest.approx(MODEL_SECONDS)
