"""§8 faults: the model raises, kills the engine thread, or hangs.

Each time the client gets the documented error, and the server either keeps
serving (a raise) or reports 503 on /health and refuses new clients at once (a
dead or hung engine; ``realtime serve`` then exits for its supervisor to restart it).
"""

from __future__ import annotations

import time

import trio

from realtime.engine import Engine, watch_for_hung_calls
from realtime.models.fake import FakeModel, FakeOptions
from tests.helpers import ahttp, append_msg, connect, noise, running_server


def started(model: FakeModel) -> Engine:
    engine = Engine(lambda: model)
    engine.start()
    return engine


async def wait_free(engine: Engine) -> None:
    with trio.fail_after(5):
        while engine.is_reserved():
            await trio.sleep(0.01)


async def test_a_raising_model_is_an_error_and_the_server_keeps_serving() -> None:
    model = FakeModel(FakeOptions(fail_on_frame=1))
    engine = started(model)
    try:
        async with running_server(engine) as server:
            async with connect(server.url) as client:
                await client.configure()
                await client.send(append_msg(noise(1280 * 3)))
                events = await client.recv_until("error")
                assert events[-1]["error"]["code"] == "inference_error"
                # An unexpected model failure ends the session (the engine drops it).
                assert await client.closed_code() == 1011
            await wait_free(engine)
            status, body = await ahttp("GET", server.http + "/health")
            assert (status, body["status"]) == (200, "ok")
            model.options.fail_on_frame = None
            async with connect(server.url) as client:  # the next client is served
                await client.configure()
                await client.send(append_msg(noise(1280)))
                assert (await client.recv_until("response.audio.delta"))[-1]["frame_index"] == 0
    finally:
        engine.shutdown()


async def test_a_killed_engine_thread_is_503_and_refuses_at_once() -> None:
    engine = started(FakeModel(FakeOptions(die_on_frame=0)))
    try:
        async with running_server(engine) as server:
            async with connect(server.url) as client:
                await client.configure()
                await client.send(append_msg(noise(1280)))
                events = await client.recv_until("error")
                assert events[-1]["error"]["code"] == "inference_error"
                assert await client.closed_code() == 1011
            status, body = await ahttp("GET", server.http + "/health")
            assert (status, body["status"], body["engine_alive"]) == (503, "unavailable", False)
            assert body["reason"]
            for _ in range(3):
                async with connect(server.url) as client:
                    event = await client.recv(timeout=2)
                    assert event["error"]["code"] == "inference_error"
                    assert await client.closed_code(timeout=2) == 1011
    finally:
        engine.shutdown()


async def test_a_hung_model_call_is_declared_503_and_fails_the_client() -> None:
    model = FakeModel(FakeOptions(hang_on_frame=1))
    engine = started(model)
    reasons: list[str] = []

    async def on_hung(reason: str) -> None:
        reasons.append(reason)

    try:
        async with running_server(engine) as server, trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_hung_calls, engine, 0.5, on_hung)
            async with connect(server.url) as client:
                await client.configure()
                await client.send(append_msg(noise(1280 * 3)))
                started_at = time.monotonic()
                events = await client.recv_until("error", timeout=15)
                assert events[-1]["error"]["code"] == "inference_error"
                assert time.monotonic() - started_at < 10  # failure guard, not a timing test
            assert reasons and "max-step-seconds" in reasons[0]
            status, body = await ahttp("GET", server.http + "/health")
            assert (status, body["engine_alive"]) == (503, False)
            assert "hung" in body["reason"]
            async with connect(server.url) as client:  # waiting in silence is the bug
                event = await client.recv(timeout=2)
                assert event["error"]["code"] == "inference_error"
    finally:
        model.unhang.set()  # let the abandoned thread end, so the test leaves nothing behind
        engine.shutdown()
