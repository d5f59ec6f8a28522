"""Several sessions on one engine: turns by deadline, sliced opens, capacity, admission.

Orders are read from the engine itself (a future's done-callback runs on the engine
thread the moment the command ends), never from wall-clock thresholds: the fake model
sleeps at least as long as it is told, which only ever helps the assertions here.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import numpy as np
import pytest

from realtime.engine.admission import MIN_SAMPLES
from realtime.engine.commands import Cancel, Close, EngineError, Flush, Open, Push
from realtime.engine.facade import Engine
from realtime.observe import Observer
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import running_engine

FRAME = np.zeros(1280, dtype=np.float32)


def push(session_id: str, stop: threading.Event | None = None) -> Push:
    return Push(session_id, FRAME, 16000, stop)


class Order:
    """Names of commands in the order the engine finished them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._lock = threading.Lock()

    def track(self, name: str, future: concurrent.futures.Future[Any]) -> None:
        def done(_: object) -> None:
            with self._lock:
                self.names.append(name)

        future.add_done_callback(done)


def open_all(engine: Engine, *ids: str, prompt: str | None = None) -> None:
    for sid in ids:
        assert engine.try_reserve(sid)
        engine.submit(Open(sid, prompt, 0, None)).result(10)


def test_sessions_streaming_at_once_take_turns_frame_by_frame() -> None:
    model = FakeModel(FakeOptions(frame_delay=0.002))
    with running_engine(model, capacity=2) as engine:
        open_all(engine, "a", "b")
        order = Order()
        futures = []
        for sid in ("a", "b"):  # each hands over a burst of six frames at once
            for i in range(6):
                future = engine.submit(push(sid))
                order.track(f"{sid}{i}", future)
                futures.append(future)
        concurrent.futures.wait(futures, 10)
        assert [n[0] for n in order.names] == ["a", "b"] * 6
        assert order.names[::2] == [f"a{i}" for i in range(6)]


def test_flush_cancel_and_close_wait_behind_another_session_for_one_step_at_most() -> None:
    model = FakeModel(FakeOptions(frame_delay=0.02))
    with running_engine(model, capacity=3) as engine:
        open_all(engine, "a", "b", "c")
        order = Order()
        for i in range(5):
            order.track(f"b{i}", engine.submit(push("b")))
        order.track("a-flush", engine.submit(Flush("a")))
        order.track("c-cancel", engine.submit(Cancel("c")))
        last = engine.submit(Close("b"))
        order.track("b-close", last)
        last.result(10)
        # At most one of b's frames (the one running) ran before a's flush and c's cancel.
        assert order.names.index("a-flush") <= 1
        assert order.names.index("c-cancel") <= 2
        assert order.names[-1] == "b-close"  # b's own order is kept


def test_an_open_with_a_long_prompt_runs_in_slices_between_the_others_frames() -> None:
    """60 prefill slices of at least 5 ms each: a frame due 80 ms after it reached the
    engine runs between two slices, long before the opening ends (an open in one call
    would hold the thread for all 60)."""
    model = FakeModel(FakeOptions(prefill_token_delay=0.005))
    with running_engine(model, capacity=2) as engine:
        open_all(engine, "a")
        order = Order()
        assert engine.try_reserve("b")
        opening = engine.submit(Open("b", "x" * 60, 0, None))
        order.track("b-open", opening)
        for i in range(3):
            order.track(f"a{i}", engine.submit(push("a")))
        opening.result(10)
        assert order.names[-1] == "b-open", order.names
        assert model.calls_named("push") == [1280, 1280, 1280]


def test_a_stopped_open_ends_within_a_slice_and_frees_its_place() -> None:
    model = FakeModel(FakeOptions(prefill_token_delay=0.01))
    with running_engine(model, capacity=1) as engine:
        assert engine.try_reserve("a")
        stop = threading.Event()
        opening = engine.submit(Open("a", "x" * 500, 0, None, stop))  # 5 s in one go
        stop.set()
        with pytest.raises(EngineError) as info:
            opening.result(2)
        assert info.value.kind == "open_failed"
        engine.submit(Close("a")).result(2)
        assert engine.try_reserve("b")
        engine.submit(Open("b", None, 0, None)).result(2)  # the opening's place is free


def test_capacity_counts_sessions_and_refuses_the_next_as_busy() -> None:
    with running_engine(FakeModel(), capacity=3) as engine:
        for sid in "abc":
            assert engine.refusal() is None
            assert engine.try_reserve(sid)
        assert engine.reserved == engine.capacity == 3
        assert engine.refusal() == "busy" and not engine.try_reserve("d")
        engine.submit(Close("b")).result(2)
        assert engine.try_reserve("d")


def test_admission_by_load_refuses_once_the_measured_step_time_says_so() -> None:
    """50 ms steps: two conversations need 100 ms of every 80 ms frame; one is all the
    0.75 margin admits. Before enough frames are measured, the cap alone applies."""
    model = FakeModel(FakeOptions(frame_delay=0.05))
    with running_engine(model, capacity=4, admission_margin=0.75) as engine:
        open_all(engine, "a")
        assert engine.refusal() is None  # nothing measured yet
        for _ in range(MIN_SAMPLES):
            engine.submit(push("a")).result(5)
        assert engine.step_p90 is not None and engine.step_p90 >= 0.05
        assert engine.refusal() == "overloaded"
        assert not engine.try_reserve("b")
        assert engine.queue_depth == 0
        engine.submit(Close("a")).result(5)
        assert engine.try_reserve("b")  # alone, a conversation is always admitted
    with running_engine(model, capacity=4, admission_margin=0.0) as engine:
        open_all(engine, "a")
        for _ in range(MIN_SAMPLES):
            engine.submit(push("a")).result(5)
        assert engine.try_reserve("b")  # margin 0: the cap alone


def test_late_frames_are_counted_against_their_deadline() -> None:
    """Four sessions at 50 ms a step: a round of their frames takes 200 ms, so frames
    due 80 ms after they arrived finish late."""
    model = FakeModel(FakeOptions(frame_delay=0.05))
    deadlines = _Deadlines()
    with running_engine(model, capacity=4, observer=deadlines) as engine:
        open_all(engine, "a", "b", "c", "d")
        futures = [engine.submit(push(sid)) for sid in "abcd"]
        concurrent.futures.wait(futures, 10)
    assert len(deadlines.lateness) == 4
    assert sum(1 for late in deadlines.lateness if late > 0) >= 2


class _Deadlines(Observer):
    """Each frame's lateness against its deadline, as the engine reports it (the
    ``realtime_engine_frames_late`` metric counts the positive ones)."""

    def __init__(self) -> None:
        self.lateness: list[float] = []

    def frame_deadline(self, lateness: float, queued: int) -> None:
        self.lateness.append(lateness)


def test_a_model_failure_drops_that_session_only() -> None:
    model = FakeModel(FakeOptions(fail_on_frame=2))
    with running_engine(model, capacity=2) as engine:
        open_all(engine, "a", "b")
        engine.submit(push("b")).result(5)
        for _ in range(2):
            engine.submit(push("a")).result(5)
        with pytest.raises(EngineError) as info:
            engine.submit(push("a")).result(5)  # a's third frame fails
        assert info.value.kind == "session_lost"
        step = engine.submit(push("b")).result(5)  # b goes on (its second frame)
        assert step is not None and step.events
        with pytest.raises(EngineError):
            engine.submit(push("a")).result(5)
