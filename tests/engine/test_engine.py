"""The engine thread: typed commands, the reservation, failures and thread discipline."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import trio

from realtime.engine.commands import (
    Cancel,
    Close,
    EngineError,
    EngineLoadError,
    Flush,
    Open,
    Push,
    Step,
)
from realtime.engine.facade import Engine, Waker, watch_for_hung_calls
from realtime.models.base import (
    AudioDelta,
    Cancelled,
    Done,
    InferenceError,
    open_session,
    step_one,
)
from realtime.observe import CommandKind, Observer
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import running_engine

FRAME = np.zeros(1280, dtype=np.float32)


def open_(
    session_id: str, system_prompt: str | None = None, max_streaming_seconds: float | None = None
) -> Open:
    return Open(session_id, system_prompt, 0, max_streaming_seconds)


def push(session_id: str, stop: threading.Event | None = None) -> Push:
    return Push(session_id, FRAME, 16000, stop)


async def wait_released(engine: Engine) -> None:
    with trio.fail_after(2):
        while engine.is_reserved():
            await trio.sleep(0.005)


async def test_the_slot_is_freed_by_the_engine_once_it_ran_close(
    engine: Engine, fake_model: FakeModel
) -> None:
    assert engine.try_reserve("sess_a")
    assert not engine.try_reserve("sess_b")
    await engine.run(open_("sess_a"))
    fake_model.options.frame_delay = 0.2
    engine.submit(push("sess_a"))
    future = engine.submit(Close("sess_a"))
    # Close is queued behind a running frame: the engine is not free yet.
    assert engine.is_reserved() and not future.done()
    await Engine.result(future)
    assert not engine.is_reserved()
    # A Close from a session that does not hold the slot frees nothing.
    assert engine.try_reserve("sess_b")
    await engine.run(Close("sess_a"))
    assert engine.is_reserved()


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
    assert len(winners) == 1


async def test_push_on_unopened_session_loses_it(engine: Engine) -> None:
    with pytest.raises(EngineError, match="no open session sess_x") as info:
        await engine.run(push("sess_x"))
    assert info.value.kind == "session_lost" and info.value.during == "push"
    await engine.run(open_("sess_a"))
    with pytest.raises(EngineError, match="its capacity") as info:
        await engine.run(open_("sess_b"))
    assert info.value.kind == "open_failed"
    with pytest.raises(EngineError, match="already open") as info:
        await engine.run(open_("sess_a"))
    assert info.value.kind == "open_failed"


async def test_a_capacity_holds_sessions_by_id() -> None:
    """Sessions are held by id; a slot frees only once the engine ran its Close."""
    with running_engine(FakeModel(), capacity=2) as eng:
        assert eng.try_reserve("sess_a") and eng.try_reserve("sess_b")
        assert eng.reserved == eng.capacity == 2 and not eng.try_reserve("sess_c")
        await eng.run(open_("sess_a"))
        await eng.run(open_("sess_b"))
        step_a = await eng.run(push("sess_a"))
        step_b = await eng.run(push("sess_b"))
        assert step_a is not None and step_b is not None
        closing = eng.submit(Close("sess_a"))
        assert eng.release_pending() in (closing, None)
        await Engine.result(closing)
        assert eng.reserved == 1 < eng.capacity
        with pytest.raises(EngineError, match="no open session sess_a"):
            await eng.run(push("sess_a"))
        assert await eng.run(push("sess_b")) is not None  # the other one goes on
        assert eng.try_reserve("sess_c")


def test_capacity_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Engine(FakeModel, capacity=0)


async def test_push_returns_a_typed_step(engine: Engine) -> None:
    await engine.run(open_("sess_a"))
    step = await engine.run(push("sess_a"))
    assert isinstance(step, Step) and step.seconds >= 0
    assert isinstance(step.events[-1], AudioDelta)


async def test_close_cancels_unflushed_session(engine: Engine, fake_model: FakeModel) -> None:
    await engine.run(open_("sess_a", system_prompt="p"))
    await engine.run(push("sess_a"))
    await engine.run(Close("sess_a"))
    assert fake_model.calls_named("cancel") == [None]
    assert fake_model.cache_clears == 1
    # Closed: a new session may open; closing an unknown id is a no-op.
    await engine.run(Close("sess_a"))
    await engine.run(open_("sess_b"))
    assert [type(e) for e in await engine.run(Flush("sess_b", True))] == [Done]
    await engine.run(Close("sess_b"))
    # A flushed session is not cancelled again on close.
    assert fake_model.calls_named("cancel") == [None]
    assert fake_model.cache_clears == 2


async def test_cancel_returns_cancelled(engine: Engine) -> None:
    await engine.run(open_("sess_a"))
    await engine.run(Push("sess_a", np.zeros(2560, np.float32), 16000))
    assert await engine.run(Cancel("sess_a")) == [Cancelled(2)]
    with pytest.raises(EngineError, match="has ended") as info:
        await engine.run(push("sess_a"))
    assert info.value.kind == "step_failed"


async def test_failing_command_keeps_engine_serving(fake_model: FakeModel) -> None:
    fake_model.options.fail_on_frame = 1
    with running_engine(fake_model) as engine:
        await engine.run(open_("sess_a"))
        await engine.run(push("sess_a"))
        with pytest.raises(EngineError, match=r"RuntimeError: fake model failure") as info:
            await engine.run(push("sess_a"))
        assert info.value.kind == "session_lost" and info.value.session_lost
        # The session was dropped, the engine still serves.
        with pytest.raises(EngineError, match="no open session"):
            await engine.run(push("sess_a"))
        assert engine.alive
        fake_model.options.fail_on_frame = None
        await engine.run(open_("sess_b"))
        assert await engine.run(push("sess_b"))


async def test_context_limit_keeps_the_session(engine: Engine) -> None:
    await engine.run(open_("sess_a", max_streaming_seconds=0.08))
    await engine.run(push("sess_a"))
    with pytest.raises(EngineError, match="context limit") as info:
        await engine.run(push("sess_a"))
    assert info.value.kind == "context_limit" and not info.value.session_lost
    assert isinstance((await engine.run(Flush("sess_a", True)))[-1], Done)


async def test_open_failure_is_open_failed() -> None:
    model = FakeModel(FakeOptions(open_error="max_streaming_seconds must be positive"))
    with running_engine(model) as engine:
        with pytest.raises(EngineError, match="must be positive") as info:
            await engine.run(open_("sess_a"))
        assert info.value.kind == "open_failed" and info.value.during == "open"
        assert engine.alive


class Recorder(Observer):
    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.kinds: list[CommandKind] = []

    def command_started(self, kind: CommandKind) -> None:
        self.threads.add(threading.get_ident())

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        self.kinds.append(kind)


async def test_every_model_call_runs_on_the_engine_thread() -> None:
    models: list[FakeModel] = []

    def loader() -> FakeModel:
        models.append(FakeModel())  # built, like a real model, on the engine thread
        return models[0]

    recorder = Recorder()
    engine = Engine(loader, observer=recorder)
    engine.start()
    fake_model = models[0]
    await engine.run(open_("sess_a"))
    async with trio.open_nursery() as nursery:
        # Concurrent callers from trio still funnel into the one thread, in order.
        for _ in range(4):
            nursery.start_soon(engine.run, push("sess_a"))
    await engine.run(Flush("sess_a", True))
    await engine.run(Close("sess_a"))
    threads = {ident for _, _, ident in fake_model.calls}
    assert threads == recorder.threads == {fake_model.load_thread}
    assert threading.get_ident() not in threads
    names = [n for n, _, _ in fake_model.calls]
    assert names == ["open", "push", "push", "push", "push", "flush", "clear_cache"]
    engine.shutdown()  # joined: every command_finished hook has run
    assert recorder.kinds == ["open", "push", "push", "push", "push", "flush", "close"]


def test_load_failure_is_reported() -> None:
    def broken() -> FakeModel:
        raise FileNotFoundError("config.json not found in /nowhere")

    engine = Engine(broken)
    with pytest.raises(EngineLoadError, match=r"config\.json not found in /nowhere"):
        engine.start()
    assert not engine.alive
    with pytest.raises(EngineError, match="model failed to load") as info:
        engine.submit(open_("sess_a")).result(timeout=1)
    assert info.value.kind == "engine_dead"


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt: raised in the main thread by a signal handler."""


def test_an_interrupt_during_the_load_is_raised_at_once_and_the_thread_ends_later() -> None:
    """Ctrl-C while the model loads must not wait for the load (it cannot be
    cancelled): start() re-raises it at once, the engine reports dead, and its thread
    ends once the load returns instead of waiting for commands forever."""
    loading, finish = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def load() -> FakeModel:
        threads.append(threading.current_thread())
        loading.set()
        if not finish.wait(3):  # bounds the test when start() waits for the load
            raise TimeoutError("nobody ended the load")
        return FakeModel()

    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted

    main = threading.get_ident()

    def interrupt() -> None:
        loading.wait(5)
        time.sleep(0.05)  # the main thread is waiting for the load by now
        signal.pthread_kill(main, signal.SIGUSR1)

    engine = Engine(load)
    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    sender = threading.Thread(target=interrupt)
    started = time.monotonic()
    try:
        sender.start()
        with pytest.raises(Interrupted):
            engine.start()
        waited = time.monotonic() - started
    finally:
        signal.signal(signal.SIGUSR1, previous)
        sender.join()
    assert waited < 1.0
    assert not engine.alive
    assert "interrupted while the model was loading" in (engine.dead_reason or "")
    with pytest.raises(EngineError) as info:
        engine.submit(open_("sess_a")).result(timeout=1)
    assert info.value.kind == "engine_dead"
    finish.set()
    threads[0].join(2)
    assert not threads[0].is_alive()


async def test_dead_engine_fails_fast_and_frees_the_slot(fake_model: FakeModel) -> None:
    fake_model.options.die_on_frame = 0
    with running_engine(fake_model) as engine:
        assert engine.try_reserve("sess_a")
        await engine.run(open_("sess_a"))
        with pytest.raises(EngineError, match="SystemExit") as info:
            await engine.run(push("sess_a"))
        assert info.value.kind == "engine_dead"
        with trio.fail_after(2):
            while engine.alive:
                await trio.sleep(0.01)
        assert not engine.is_reserved()
        started = time.perf_counter()
        with pytest.raises(EngineError, match="engine thread died"):
            await engine.run(push("sess_a"))
        assert time.perf_counter() - started < 1.0


async def test_cancelled_caller_does_not_wedge_the_engine(fake_model: FakeModel) -> None:
    fake_model.options.frame_delay = 0.05
    with running_engine(fake_model) as engine:
        await engine.run(open_("sess_a"))
        with trio.move_on_after(0.01):
            await engine.run(push("sess_a"))
        # The abandoned push still completes on the thread; later calls queue behind it.
        await engine.run(Close("sess_a"))
        assert [n for n, _, _ in fake_model.calls][-3:] == ["push", "cancel", "clear_cache"]


def test_shutdown_joins_and_cancels_open_session(fake_model: FakeModel) -> None:
    engine = Engine(lambda: fake_model)
    engine.start()
    engine.submit(open_("sess_a")).result(timeout=5)
    (ident,) = {ident for _, _, ident in fake_model.calls}
    thread = next(t for t in threading.enumerate() if t.ident == ident)
    engine.shutdown()
    assert not engine.alive
    assert fake_model.calls_named("cancel") == [None]
    assert not thread.is_alive()


async def test_queued_work_is_skipped_once_its_stop_flag_is_set(
    engine: Engine, fake_model: FakeModel
) -> None:
    stop = threading.Event()
    await engine.run(open_("sess_a"))
    assert await engine.run(push("sess_a", stop))
    stop.set()
    assert await engine.run(push("sess_a", stop)) is None
    assert fake_model.frames_run == 1
    await engine.run(Close("sess_a"))
    with pytest.raises(EngineError, match="connection is gone"):
        await engine.run(Open("sess_b", None, 0, None, stop))
    assert fake_model.calls_named("open") == [(None, 0, None)]


async def test_a_hung_call_is_declared_and_everything_waiting_fails(
    fake_model: FakeModel,
) -> None:
    fake_model.options.hang_on_frame = 0
    engine = Engine(lambda: fake_model)
    engine.start()
    try:
        assert engine.try_reserve("sess_a")
        await engine.run(open_("sess_a"))
        running = engine.submit(push("sess_a"))
        queued = engine.submit(push("sess_a"))
        reasons: list[str] = []

        async def on_hung(reason: str) -> None:
            reasons.append(reason)

        with trio.fail_after(10):
            await watch_for_hung_calls(engine, 0.2, on_hung)
        assert len(reasons) == 1 and "made no progress" in reasons[0]
        assert engine.hung and not engine.alive and not engine.is_reserved()
        assert engine.dead_reason == reasons[0]
        for future in (running, queued, engine.submit(open_("sess_b"))):
            with pytest.raises(EngineError) as info:
                future.result(timeout=1)
            assert info.value.kind == "engine_dead"
    finally:
        fake_model.unhang.set()
        engine.shutdown(timeout=5)


async def test_a_long_prefill_that_makes_progress_is_not_hung(fake_model: FakeModel) -> None:
    fake_model.options.open_delay = 1.0  # 100 steps of 10 ms, each a heartbeat
    with running_engine(fake_model) as engine:

        async def on_hung(reason: str) -> None:
            raise AssertionError(reason)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_hung_calls, engine, 0.3, on_hung)
            await engine.run(open_("sess_a"))
            nursery.cancel_scope.cancel()
        assert engine.alive


@contextmanager
def engine_with_waker(model: FakeModel) -> Iterator[tuple[Engine, Waker]]:
    with running_engine(model) as engine:
        waker = Waker()
        try:
            yield engine, waker
        finally:
            waker.close()


async def test_a_waker_wakes_its_task_for_each_result_from_the_engine_thread(
    fake_model: FakeModel,
) -> None:
    with engine_with_waker(fake_model) as (engine, waker):
        await engine.run(open_("sess_a"))
        for _ in range(3):
            step = await waker.result(engine.submit(push("sess_a")))
            assert isinstance(step, Step)
        done = engine.submit(push("sess_a"))
        done.result(timeout=5)
        again = await waker.result(done)  # already finished
        assert isinstance(again, Step)
        with pytest.raises(EngineError):
            await waker.result(engine.submit(push("sess_gone")))


async def test_a_waker_abandoned_mid_wait_then_closed_ignores_late_results(
    fake_model: FakeModel,
) -> None:
    """A cancelled wait leaves a callback behind; once closed, it writes nowhere."""
    fake_model.options.frame_delay = 0.05
    with engine_with_waker(fake_model) as (engine, waker):
        await engine.run(open_("sess_a"))
        late = engine.submit(push("sess_a"))
        with trio.move_on_after(0.01):
            await waker.result(late)
        waker.close()
        assert isinstance(late.result(timeout=5), Step)  # its callback ran after close


def test_the_model_seam_steps_frames_of_several_sessions() -> None:
    """``RealtimeModel.step``: one call, each session's events in order, and a row that
    fails is that row's result alone (the engine batches the frames that are due)."""
    model = FakeModel()
    a = open_session(model, system_prompt=None, seed=1, max_streaming_seconds=None)
    b = open_session(model, system_prompt=None, seed=2, max_streaming_seconds=None)
    frame = np.zeros(model.figures.frame_samples, np.float32)
    rate = model.figures.input_sample_rate
    first, second, third = model.step([(a, frame, rate), (b, frame[:640], rate), (a, frame, 8000)])
    assert isinstance(first, list) and any(isinstance(e, AudioDelta) for e in first)
    assert second == []  # half a frame: nothing yet for that session
    assert isinstance(third, InferenceError)  # a bad rate fails its row only
    assert model.calls_named("push") == [1280, 640, 1280]
    assert step_one(model, (b, frame[:640], rate))  # the second half: b's first frame
    with pytest.raises(InferenceError):
        step_one(model, (b, frame, 8000))
