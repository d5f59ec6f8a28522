"""§8 faults: the model raises, kills the engine thread, or hangs.

Each time the client gets the documented error, and the server either keeps
serving (a raise) or reports 503 on /health and refuses new clients at once (a
dead or hung engine; ``realtime serve`` then exits for its supervisor to restart it).
"""

from __future__ import annotations

import trio

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import FakeModel, FakeOptions
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


async def test_a_hung_model_call_is_declared_503_and_the_server_stops() -> None:
    """The server's own watcher (--max-step-seconds): waiting and new clients get
    inference_error at once and /health says why, then the server stops serving
    (``realtime serve`` exits 3)."""
    fake_model = FakeModel(FakeOptions(hang_on_frame=1))
    engine = started(fake_model)
    limits = Limits(max_step_seconds=0.3, shutdown_timeout=1.0)
    try:
        async with running_server(engine, limits=limits) as server:
            async with connect(server.url) as client:
                await client.configure()
                await client.send(append_msg(noise(1280 * 3)))
                events = await client.recv_until("error", timeout=10)
                assert events[-1]["error"]["code"] == "inference_error"
                assert "no progress" in events[-1]["error"]["message"]
                assert await client.closed_code() == 1011
            status, health = await ahttp("GET", server.http + "/health")
            assert status == 503 and "hung" in health["reason"]
            async with connect(server.url) as client:
                err = await client.recv()
                assert err["error"]["code"] == "inference_error"
    finally:
        fake_model.unhang.set()
        engine.shutdown()
