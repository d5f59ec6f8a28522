"""Batched frames: the frames that are due run as one model step of B rows.

The engine thread is held in a frame of a "gate" session (the fake model's
``hold_seeds``) while a test queues the other sessions' commands, so what forms a batch
is decided by the queue alone, never by how fast this machine is; the batches are read
from the fake model's record of its ``step`` calls.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from realtime.engine.commands import Cancel, Close, EngineError, Flush, Open, Push, Step
from realtime.engine.facade import Engine
from realtime.models.base import (
    AudioDelta,
    Cancelled,
    Done,
    Frame,
    InferenceError,
    ModelEvent,
    RowResult,
    open_session,
)
from realtime.observe import Observer
from realtime.testing.fake import FakeModel, FakeOptions

GATE = 99
"""The seed of the session whose frame holds the engine thread."""
RATE = 16000


def frame(level: float = 0.0) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.full(1280, level, dtype=np.float32)


def push(sid: str, level: float = 0.0, rate: int = RATE) -> Push:
    return Push(sid, frame(level), rate)


class Steps(Observer):
    """The model steps and frame deadlines the engine reports."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.deadlines = 0
        self._lock = threading.Lock()

    def model_stepped(self, rows: int, seconds: float) -> None:
        with self._lock:
            self.rows.append(rows)

    def frame_deadline(self, lateness: float, queued: int) -> None:
        with self._lock:
            self.deadlines += 1


@contextmanager
def batching_engine(
    model: FakeModel,
    *,
    capacity: int = 5,
    batch_frames: bool = True,
    admission_margin: float = 0.0,
    observer: Observer | None = None,
) -> Iterator[Engine]:
    model.options.hold_seeds = frozenset({GATE})
    engine = Engine(
        lambda: model,
        capacity=capacity,
        batch_frames=batch_frames,
        admission_margin=admission_margin,
        observer=observer,
    )
    engine.start()
    try:
        yield engine
    finally:
        for _ in range(8):
            model.gate.release()  # nothing stays held if a test failed midway
        engine.shutdown()


def open_all(engine: Engine, *ids: str, seeds: Sequence[int] = (), **kw: Any) -> None:
    for n, sid in enumerate(ids):
        seed = seeds[n] if seeds else n + 1
        assert engine.try_reserve(sid)
        engine.submit(Open(sid, None, seed, kw.get("max_streaming_seconds"))).result(10)


@contextmanager
def held(engine: Engine, model: FakeModel) -> Iterator[None]:
    """The engine thread waits in a frame of session "gate" for the block: whatever
    the block submits is queued together, and runs once the block ends."""
    future = engine.submit(push("gate"))
    assert model.held.acquire(timeout=10)
    try:
        yield
    finally:
        model.gate.release()
    assert isinstance(future.result(10), Step)


def open_gated(engine: Engine, *ids: str) -> None:
    """The "gate" session (seed GATE) and ``ids`` with seeds 1, 2, ... (codes follow them)."""
    open_all(engine, "gate", *ids, seeds=(GATE, *range(1, len(ids) + 1)))


def pushed_together(
    engine: Engine, model: FakeModel, ids: str
) -> list[concurrent.futures.Future[Step | None]]:
    """One frame of each session in ``ids``, queued behind the gate: they run as one step."""
    with held(engine, model):
        return [engine.submit(push(sid)) for sid in ids]


def steps(futures: Sequence[concurrent.futures.Future[Step | None]]) -> list[Step]:
    out = []
    for future in futures:
        step = future.result(10)
        assert isinstance(step, Step)
        out.append(step)
    return out


def test_three_sessions_with_frames_queued_run_as_one_step_of_three_rows() -> None:
    model, observer = FakeModel(), Steps()
    with batching_engine(model, observer=observer) as engine:
        open_gated(engine, "a", "b", "c")
        futures = pushed_together(engine, model, "abc")
        a, b, c = steps(futures)
        engine.shutdown()  # joined: every hook has run
    assert model.batches == [1, 3] and observer.rows == [1, 3]
    assert [s.rows for s in (a, b, c)] == [3, 3, 3]
    assert a.seconds == b.seconds == c.seconds  # one step: its time is each frame's
    assert observer.deadlines == 4  # every row against its own deadline
    codes = [
        next(e for e in s.events if isinstance(e, AudioDelta)).audio_codes[0] for s in (a, b, c)
    ]
    assert codes == [1, 2, 3]  # each row is its own session's frame (codes follow the seed)


def test_a_session_whose_frame_has_not_arrived_is_not_waited_for() -> None:
    model = FakeModel()
    with batching_engine(model) as engine:
        open_gated(engine, "a", "b", "c")
        futures = pushed_together(engine, model, "ab")
        assert [s.rows for s in steps(futures)] == [2, 2]  # c has nothing queued: not waited for
        (late,) = steps([engine.submit(push("c"))])
        assert late.rows == 1
    assert model.batches == [1, 2, 1]


def test_with_no_batch_frames_every_step_has_one_row() -> None:
    model = FakeModel()
    with batching_engine(model, batch_frames=False) as engine:
        assert engine.max_batch == 1
        open_gated(engine, "a", "b", "c")
        futures = pushed_together(engine, model, "abc")
        assert [s.rows for s in steps(futures)] == [1, 1, 1]
    assert model.batches == [1, 1, 1, 1]


def test_a_batch_is_bounded_by_max_batch() -> None:
    model = FakeModel()
    model.options.hold_seeds = frozenset({GATE})
    engine = Engine(lambda: model, capacity=5, batch_frames=True, max_batch=2)
    engine.start()
    try:
        open_gated(engine, "a", "b", "c", "d")
        futures = pushed_together(engine, model, "abcd")
        assert [s.rows for s in steps(futures)] == [2, 2, 2, 2]
    finally:
        model.gate.release()
        engine.shutdown()
    assert model.batches == [1, 2, 2]


def test_a_failing_row_fails_that_session_only() -> None:
    """In one batch: a model failure (session lost), the context limit and a wrong rate
    (the session goes on), each on its own row; the other rows' frames stand."""
    model = FakeModel(FakeOptions(fail_on_frame=1))
    with batching_engine(model) as engine:
        open_gated(engine, "a", "b")
        open_all(engine, "limited", seeds=(4,), max_streaming_seconds=0.08)  # one frame
        open_all(engine, "rate", seeds=(5,))
        steps([engine.submit(push("a")), engine.submit(push("limited"))])  # frame 0 each
        with held(engine, model):
            futures = [
                engine.submit(push("a")),  # a's frame 1: the model fails
                engine.submit(push("b")),  # b's frame 0: fine
                engine.submit(push("limited")),  # past its one frame
                engine.submit(push("rate", rate=8000)),  # refused, session goes on
            ]
        kinds = []
        for future in futures:
            try:
                future.result(10)
                kinds.append("ok")
            except EngineError as exc:
                kinds.append(exc.kind)
        assert kinds == ["session_lost", "ok", "context_limit", "step_failed"]
        assert model.batches[-1] == 4
        with pytest.raises(EngineError, match="no open session a"):
            engine.submit(push("a")).result(10)  # a was dropped
        (rate,) = steps([engine.submit(push("rate"))])
        assert rate.events  # a refused rate leaves the session as it was


class Broken(FakeModel):
    """A model whose whole batched step raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.broken = False

    def step(self, frames: Sequence[Frame]) -> list[RowResult]:
        if self.broken:
            self.batches.append(len(frames))
            raise self.error
        return super().step(frames)


@pytest.mark.parametrize(
    ("error", "kind", "dropped"),
    [
        (RuntimeError("the batch broke"), "session_lost", True),
        (InferenceError("a condition every row survives"), "step_failed", False),
    ],
)
def test_a_step_that_raises_fails_every_row_as_one_frame_would(
    error: Exception, kind: str, dropped: bool
) -> None:
    model = Broken(error)
    with batching_engine(model) as engine:
        open_gated(engine, "a", "b")
        with held(engine, model):
            model.broken = True  # the gate's own frame is already past its step call
            futures = [engine.submit(push(sid)) for sid in "ab"]
        for future in futures:
            with pytest.raises(EngineError) as info:
                future.result(10)
            assert info.value.kind == kind
        model.broken = False
        for sid in "ab":
            if dropped:
                with pytest.raises(EngineError, match=f"no open session {sid}"):
                    engine.submit(push(sid)).result(10)
            else:
                assert steps([engine.submit(push(sid))])[0].events
        assert engine.alive


def test_flush_cancel_and_close_of_one_session_run_alone_while_the_others_batch() -> None:
    model = FakeModel()
    with batching_engine(model) as engine:
        open_gated(engine, "a", "b", "c")
        with held(engine, model):
            frames = [engine.submit(push(sid)) for sid in "abc"]
            second = engine.submit(push("a"))
            flush = engine.submit(Flush("b"))
            cancel = engine.submit(Cancel("c"))
            close = engine.submit(Close("c"))
            stopped = threading.Event()
            stopped.set()
            skipped = engine.submit(Push("a", frame(), RATE, stopped))  # a cancelled frame
        assert [s.rows for s in steps(frames)] == [3, 3, 3]
        assert any(isinstance(e, Done) for e in flush.result(10))
        assert any(isinstance(e, Cancelled) for e in cancel.result(10))
        assert close.result(10) is None
        (after,) = steps([second])
        assert after.rows == 1  # b's head is its flush and c's its cancel: a runs alone
        assert skipped.result(10) is None
        with pytest.raises(EngineError, match="has ended"):
            engine.submit(push("b")).result(10)  # flushed: a frame after it is refused
    assert model.batches == [1, 3, 1]


def test_a_hung_batch_fails_every_row() -> None:
    """The watchdog's ``declare_hung`` fails the futures of every row of the model call
    that never returns, not only the first."""
    model = FakeModel()
    with batching_engine(model) as engine:
        model.options.hold_seeds = frozenset({GATE, 1})  # a's frame holds too
        open_gated(engine, "a", "b")
        futures = pushed_together(engine, model, "ab")
        assert model.held.acquire(timeout=10)  # the batch of a and b is running, held
        engine.declare_hung("stuck")
        for future in futures:
            with pytest.raises(EngineError) as info:
                future.result(10)
            assert info.value.kind == "engine_dead"
        model.gate.release()


def describe(events: Sequence[ModelEvent]) -> list[object]:
    """Events compared by value (an audio frame's samples by their bytes)."""
    out: list[object] = []
    for e in events:
        if isinstance(e, AudioDelta):
            out.append((e.frame_index, e.samples.tobytes(), e.audio_codes, e.end_of_turn))
        else:
            out.append(e)
    return out


@pytest.mark.parametrize("row_delay", [None, 0.0])
def test_each_row_of_a_batch_equals_its_session_run_alone(row_delay: float | None) -> None:
    """Three sessions, distinct seeds and audio, five frames each queued at once (five
    batches of three), against each session alone on a fresh model."""
    levels = {"a": 0.1, "b": 0.2, "c": 0.3}
    seeds = {"a": 1, "b": 2, "c": 3}
    model = FakeModel(FakeOptions(batch_row_delay=row_delay))
    with batching_engine(model) as engine:
        open_all(engine, "gate", *levels, seeds=(GATE, *seeds.values()))
        with held(engine, model):
            futures = {
                sid: [engine.submit(push(sid, lv)) for _ in range(5)] for sid, lv in levels.items()
            }
        batched = {sid: [describe(s.events) for s in steps(fs)] for sid, fs in futures.items()}
    assert model.batches == [1, 3, 3, 3, 3, 3]
    for sid, level in levels.items():
        alone = FakeModel()
        session = open_session(
            alone, system_prompt=None, seed=seeds[sid], max_streaming_seconds=None
        )
        solo = [describe(session.push_audio(frame(level), RATE)) for _ in range(5)]
        assert batched[sid] == solo


def test_the_fake_batched_step_costs_the_first_row_and_a_little_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``batch_row_delay``: one sleep per step, ``frame_delay + row_delay x (B - 1)``."""
    model = FakeModel(FakeOptions(frame_delay=0.02, batch_row_delay=0.001))
    sessions = [
        open_session(model, system_prompt=None, seed=k, max_streaming_seconds=None)
        for k in range(4)
    ]
    slept: list[float] = []
    monkeypatch.setattr("realtime.testing.fake.time.sleep", slept.append)
    results = model.step([(s, frame(), RATE) for s in sessions])
    monkeypatch.undo()
    assert slept == [pytest.approx(0.023)]
    assert all(isinstance(r, list) and r for r in results)


# --- admission by the batched step's cost ----------------------------------------------


def test_admission_reads_the_step_time_of_each_batch_size() -> None:
    """21 ms a step whatever its rows: two conversations, batched, cost one 21 ms step a
    frame, and a third (predicted 1.5 x the two-row step) fits in 0.75 x 80 ms; time
    sliced, three need 3 x 21 = 63 ms and the third is refused. The sleeps can only
    make steps longer, which only helps the refusal; the admission holds up to ~40 ms."""
    for batch_frames, refusal in ((True, None), (False, "overloaded")):
        model = FakeModel(FakeOptions(frame_delay=0.021, batch_row_delay=0.0))
        with batching_engine(
            model, capacity=4, batch_frames=batch_frames, admission_margin=0.75
        ) as engine:
            open_all(engine, "a", "b")
            futures = [engine.submit(push(sid)) for sid in "ab" for _ in range(20)]
            rows = {s.rows for s in steps(futures)}
            assert rows <= ({1, 2} if batch_frames else {1})
            assert engine.step_costs.keys() == ({2} if batch_frames else {1})
            assert engine.refusal() == refusal
            cost = engine.admission_cost()
            assert cost is not None and (cost <= 0.06) == batch_frames
            assert engine.try_reserve("c") == (refusal is None)


def test_streams_out_of_phase_are_gathered_into_one_batch() -> None:
    """Two conversations streaming in real time, their frames half a frame apart: the
    engine waits for the second's frame (it is due before the first's deadline) and
    steps them together, instead of one step each per frame."""
    import time

    model = FakeModel()
    with batching_engine(model, capacity=2) as engine:
        model.options.hold_seeds = frozenset()
        open_all(engine, "a", "b")
        futures = []
        origin = time.monotonic()
        for n in range(6):
            for sid, offset in (("a", 0.0), ("b", 0.03)):
                delay = origin + n * 0.08 + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(engine.submit(push(sid)))
        rows = [s.rows for s in steps(futures)]
    assert max(rows) == 2, rows
    assert model.batches.count(2) >= 2, model.batches
