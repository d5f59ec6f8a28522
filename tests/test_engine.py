"""The engine thread: reservation, command routing, failures and thread discipline."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import trio

from realtime.engine import Engine, EngineDeadError, EngineError, EngineLoadError
from realtime.models.base import AudioDelta, Cancelled, Done
from tests.fakes import FakeModel, FakeOptions

FRAME = np.zeros(1280, dtype=np.float32)


def test_second_reserve_fails_until_release(engine: Engine) -> None:
    assert not engine.is_reserved()
    assert engine.try_reserve("sess_a")
    assert engine.is_reserved() and engine.reserved_by == "sess_a"
    assert not engine.try_reserve("sess_b")
    engine.release("sess_b")  # another id: a no-op
    assert engine.reserved_by == "sess_a"
    engine.release("sess_a")
    assert not engine.is_reserved()
    assert engine.try_reserve("sess_b")


def test_reserve_is_thread_safe(engine: Engine) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        if engine.try_reserve(f"sess_{i}"):
            winners.append(f"sess_{i}")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and engine.reserved_by == winners[0]


async def test_push_on_unopened_session_errors(engine: Engine) -> None:
    with pytest.raises(EngineError, match="no open session sess_x") as info:
        await engine.push("sess_x", FRAME, 16000)
    assert info.value.code == "inference_error"
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
    with pytest.raises(EngineError, match="no open session sess_x"):
        await engine.push("sess_x", FRAME, 16000)
    with pytest.raises(EngineError, match="still open"):
        await engine.open("sess_b", system_prompt=None, seed=0, max_streaming_seconds=None)


async def test_close_cancels_unflushed_session(engine: Engine, fake_model: FakeModel) -> None:
    await engine.open("sess_a", system_prompt="p", seed=3, max_streaming_seconds=None)
    events = await engine.push("sess_a", FRAME, 16000)
    assert isinstance(events[-1], AudioDelta)
    await engine.close("sess_a")
    assert fake_model.calls_named("cancel") == [None]
    assert fake_model.cache_clears == 1
    # Closed: a new session may open; closing an unknown id is a no-op.
    await engine.close("sess_a")
    await engine.open("sess_b", system_prompt=None, seed=0, max_streaming_seconds=None)
    assert [type(e) for e in await engine.flush("sess_b", True)] == [Done]
    await engine.close("sess_b")
    # A flushed session is not cancelled again on close.
    assert fake_model.calls_named("cancel") == [None]
    assert fake_model.cache_clears == 2


async def test_cancel_returns_cancelled(engine: Engine) -> None:
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
    await engine.push("sess_a", np.zeros(2560, np.float32), 16000)
    events = await engine.cancel("sess_a")
    assert events == [Cancelled(2)]
    with pytest.raises(EngineError, match="has ended"):
        await engine.push("sess_a", FRAME, 16000)


async def test_failing_command_keeps_engine_serving(fake_model: FakeModel) -> None:
    fake_model.options.fail_on_frame = 1
    engine = Engine(lambda: fake_model)
    engine.start()
    try:
        await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
        await engine.push("sess_a", FRAME, 16000)
        with pytest.raises(EngineError, match=r"RuntimeError: fake model failure") as info:
            await engine.push("sess_a", FRAME, 16000)
        assert info.value.code == "inference_error" and info.value.session_dropped
        # The session was dropped, the engine still serves.
        with pytest.raises(EngineError, match="no open session"):
            await engine.push("sess_a", FRAME, 16000)
        assert engine.alive
        fake_model.options.fail_on_frame = None
        await engine.open("sess_b", system_prompt=None, seed=0, max_streaming_seconds=None)
        assert await engine.push("sess_b", FRAME, 16000)
    finally:
        engine.shutdown()


async def test_inference_error_keeps_the_session(engine: Engine) -> None:
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=0.08)
    await engine.push("sess_a", FRAME, 16000)
    with pytest.raises(EngineError, match="context limit") as info:
        await engine.push("sess_a", FRAME, 16000)
    assert not info.value.session_dropped
    assert isinstance((await engine.flush("sess_a", True))[-1], Done)


async def test_open_failure_is_session_initialization_failed() -> None:
    model = FakeModel(FakeOptions(open_error="max_streaming_seconds must be positive"))
    engine = Engine(lambda: model)
    engine.start()
    try:
        with pytest.raises(EngineError, match="must be positive") as info:
            await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
        assert info.value.code == "session_initialization_failed"
        assert engine.alive
    finally:
        engine.shutdown()


async def test_every_model_call_runs_on_the_engine_thread() -> None:
    models: list[FakeModel] = []

    def loader() -> FakeModel:
        models.append(FakeModel())  # built, like a real model, on the engine thread
        return models[0]

    engine = Engine(loader)
    engine.start()
    fake_model = models[0]
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
    async with trio.open_nursery() as nursery:
        # Concurrent callers from trio still funnel into the one thread, in order.
        for _ in range(4):
            nursery.start_soon(engine.push, "sess_a", FRAME, 16000)
    await engine.flush("sess_a", True)
    await engine.close("sess_a")
    threads = {ident for _, _, ident in fake_model.calls}
    assert threads == {engine.thread_ident} == {fake_model.load_thread}
    assert engine.thread_ident != threading.get_ident()
    names = [n for n, _, _ in fake_model.calls]
    assert names == ["open", "push", "push", "push", "push", "flush", "clear_cache"]
    engine.shutdown()


def test_load_failure_is_reported() -> None:
    def broken() -> FakeModel:
        raise FileNotFoundError("config.json not found in /nowhere")

    engine = Engine(broken)
    with pytest.raises(EngineLoadError, match=r"config\.json not found in /nowhere"):
        engine.start()
    assert not engine.alive
    with pytest.raises(EngineDeadError, match="model failed to load"):
        engine.call("open", "sess_a", None, 0, None, timeout=1)


async def test_dead_engine_fails_fast(fake_model: FakeModel) -> None:
    fake_model.options.die_on_frame = 0
    engine = Engine(lambda: fake_model)
    engine.start()
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
    with pytest.raises(EngineDeadError, match="SystemExit"):
        await engine.push("sess_a", FRAME, 16000)
    with trio.fail_after(2):
        while engine.alive:
            await trio.sleep(0.01)
    started = time.perf_counter()
    with pytest.raises(EngineDeadError, match="engine thread died"):
        await engine.push("sess_a", FRAME, 16000)
    assert time.perf_counter() - started < 1.0
    engine.shutdown()


async def test_cancelled_caller_does_not_wedge_the_engine(fake_model: FakeModel) -> None:
    fake_model.options.frame_delay = 0.05
    engine = Engine(lambda: fake_model)
    engine.start()
    try:
        await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
        with trio.move_on_after(0.01):
            await engine.push("sess_a", FRAME, 16000)
        # The abandoned push still completes on the thread; later calls queue behind it.
        await engine.close("sess_a")
        assert [n for n, _, _ in fake_model.calls][-3:] == ["push", "cancel", "clear_cache"]
    finally:
        engine.shutdown()


def test_shutdown_joins_and_cancels_open_session(fake_model: FakeModel) -> None:
    engine = Engine(lambda: fake_model)
    engine.start()
    engine.call("open", "sess_a", None, 0, None, timeout=5)
    engine.shutdown()
    assert not engine.alive
    assert fake_model.calls_named("cancel") == [None]
    assert engine.thread_ident is not None
    assert not any(t.ident == engine.thread_ident for t in threading.enumerate())


def test_run_on_thread_runs_with_the_model_on_the_engine_thread(
    engine: Engine, fake_model: FakeModel
) -> None:
    seen = engine.run_on_thread(lambda model: (model, threading.get_ident()), timeout=5)
    assert seen == (fake_model, engine.thread_ident)


async def test_queued_push_is_skipped_once_its_stop_flag_is_set(
    engine: Engine, fake_model: FakeModel
) -> None:
    stop = threading.Event()
    await engine.open("sess_a", system_prompt=None, seed=0, max_streaming_seconds=None)
    assert await engine.wait(engine.submit("push", "sess_a", FRAME, 16000, stop))
    stop.set()
    assert await engine.wait(engine.submit("push", "sess_a", FRAME, 16000, stop)) is None
    assert fake_model.frames_run == 1
