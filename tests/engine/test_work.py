"""The engine's side: work that is not a frame is stoppable, paced and counted.

One conversation's openings, tool results and closes must not make another's frames
late: a tool feed stops within one step when its connection closes, cancels or the
engine shuts down; openings and tool feeds of all conversations together take a
share of engine time, measured, and give way to waiting frames; a close beside
running conversations does not clear the buffer cache; admission counts that work and
is measured before the first client. Judged by counts (model steps taken, frames late),
never by a time bound; the fake model's sleeps only stand for model cost.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import trio

from realtime import client as rc
from realtime.engine.admission import MIN_SAMPLES
from realtime.engine.commands import Close, EngineError, Open, Push, ToolResult
from realtime.engine.facade import Engine
from realtime.engine.fairshare import MAX_SHARE
from realtime.launch.server import engine_for
from realtime.limits import Limits
from realtime.models.base import ModelSession, Opening, ToolInput
from realtime.observe import Observer
from realtime.testing.fake import FakeModel, FakeOptions
from tests.helpers import running_server
from tests.openai.scripted import call_then_say, scripted
from tests.openai.sdk_exchange import voice
from tests.reliability.rawws import RawClient

FRAME = np.zeros(1280, dtype=np.float32)
RATE = 16000
WORDS = ToolInput(" ".join(["word"] * 300), ())
"""A tool output of 301 fake steps (the fake model steps once a word)."""


class Lateness(Observer):
    """Counts frames that finished after their deadline."""

    def __init__(self) -> None:
        self.late = 0
        self.frames = 0
        self._lock = threading.Lock()

    def frame_deadline(self, lateness: float, queued: int) -> None:
        with self._lock:
            self.frames += 1
            self.late += lateness > 0


class Deadlines(Observer):
    """The lateness of every frame."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self._lock = threading.Lock()

    def frame_deadline(self, lateness: float, queued: int) -> None:
        with self._lock:
            self.late.append(lateness)


class CountingOpening:
    """An opening that counts its slices on its model."""

    def __init__(self, inner: Opening, model: SlicedModel) -> None:
        self._inner = inner
        self._model = model

    def advance(self) -> ModelSession | None:
        self._model.slices += 1
        return self._inner.advance()

    def abandon(self) -> None:
        self._inner.abandon()


class SlicedModel(FakeModel):
    """The fake model, counting the slices its openings run."""

    slices = 0

    def begin_session(  # type: ignore[override]
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> Opening:
        inner = super().begin_session(
            system_prompt=system_prompt,
            seed=seed,
            max_streaming_seconds=max_streaming_seconds,
            prompt_scope=prompt_scope,
        )
        return CountingOpening(inner, self)


@contextmanager
def engine_of(model: FakeModel, capacity: int = 2, **kwargs: Any) -> Iterator[Engine]:
    engine = Engine(lambda: model, capacity=capacity, **kwargs)
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


def open_now(engine: Engine, sid: str, prompt: str | None = None) -> None:
    assert engine.try_reserve(sid)
    engine.submit(Open(sid, prompt, 0, None)).result(10)


def tool_steps(model: FakeModel) -> int:
    return len(model.calls_named("tool_step"))


def wait_for(check: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.005)


def stream(engine: Engine, sid: str, frames: int) -> None:
    """Hand the engine one frame of ``sid`` every frame time, as a live client does."""
    futures = []
    start = time.monotonic()
    for i in range(frames):
        time.sleep(max(0.0, start + i * 0.08 - time.monotonic()))
        futures.append(engine.submit(Push(sid, FRAME, RATE)))
    for future in futures:
        assert future.result(10) is not None


# --- finding 1: a tool feed stops when its connection closes, cancels or the engine stops


@pytest.mark.parametrize("signal", ["close", "stop"])
def test_a_tool_feed_stops_within_one_step_when_its_connection_goes(signal: str) -> None:
    """A Close queued behind a feed (its connection left) or the connection's stop
    signal (a cancel) ends the feed before its next step, so the Close, due at once,
    promotes no model work of the departed session."""
    model = FakeModel(FakeOptions(frame_delay=0.01))
    with engine_of(model) as engine:
        open_now(engine, "a")
        stop = threading.Event()
        feed = engine.submit(ToolResult("a", WORDS, stop if signal == "stop" else None))
        wait_for(lambda: tool_steps(model) >= 3)
        if signal == "stop":
            stop.set()
        else:
            engine.submit(Close("a"))
        ran = tool_steps(model)
        with pytest.raises(EngineError, match="stopped"):
            feed.result(10)
        assert tool_steps(model) <= ran + 1  # the step running when it was stopped
        if signal == "close":
            wait_for(lambda: engine.reserved == 0)


def test_a_departed_tool_feed_takes_no_steps_from_a_live_stream() -> None:
    """The red team's finding 1 on the engine: a client leaves 0.2 s into a 301-step
    feed; the victim beside it streams in real time and every frame keeps its deadline
    (before: the departed feed won every pick until all its steps had run)."""
    late = Lateness()
    model = FakeModel(FakeOptions(frame_delay=0.03))
    with engine_of(model, observer=late) as engine:
        open_now(engine, "victim")
        open_now(engine, "gone")
        engine.submit(ToolResult("gone", WORDS))
        victim = threading.Thread(target=stream, args=(engine, "victim", 15))
        victim.start()
        time.sleep(0.2)
        ran = tool_steps(model)
        engine.submit(Close("gone"))
        victim.join()
        assert tool_steps(model) <= ran + 1
        assert late.frames == 15
        assert late.late <= 2, late.late  # at most the frames that met a step under way


def test_a_conversation_s_own_frames_never_hold_its_tool_feed_back() -> None:
    """The share bounds work beside *other* conversations' streams: a conversation
    alone whose audio keeps coming while its tool output goes in (its frames wait behind
    the feed in its own order) has the feed run back to back, not at the share."""
    model = FakeModel(FakeOptions(frame_delay=0.01))
    with engine_of(model) as engine:
        open_now(engine, "a")
        feed = engine.submit(ToolResult("a", WORDS))
        frames = threading.Thread(target=stream, args=(engine, "a", 12))
        frames.start()
        time.sleep(0.6)
        ran = tool_steps(model)
        frames.join()
        feed.result(10)
        # Back to back: ~60 steps of 10 ms in 0.6 s; at the most share, at most 18.
        assert ran >= 30, ran


def test_shutdown_stops_a_tool_feed() -> None:
    """Finding 10: the engine stops a feed at shutdown (before: every queued step ran,
    ``engine thread still busy after 10.0 s``)."""
    model = FakeModel(FakeOptions(frame_delay=0.02))
    engine = Engine(lambda: model)
    engine.start()
    open_now(engine, "a")
    feed = engine.submit(ToolResult("a", WORDS))
    wait_for(lambda: tool_steps(model) >= 3)
    engine.shutdown(timeout=10)
    assert not engine.alive
    with pytest.raises(EngineError):
        feed.result(0)
    assert tool_steps(model) < 20  # of 301


# --- findings 7 and 8: openings share one step every two frames; closes keep the cache


def test_simultaneous_openings_take_one_step_every_two_frames_from_a_stream() -> None:
    """Finding 7: four long-prompt openings beside one live stream. Before, with every
    opening guaranteed a slice every two frames, the stream fell behind; now the
    openings together take at most their share of engine time (a share of
    wall time, :mod:`realtime.engine.fairshare`) and never a waiting frame's turn."""
    late = Lateness()
    model = SlicedModel(FakeOptions(frame_delay=0.015, prefill_token_delay=0.04))
    with engine_of(model, capacity=5, observer=late) as engine:
        open_now(engine, "victim")
        openings = []
        for sid in "abcd":
            assert engine.try_reserve(sid)
            openings.append(engine.submit(Open(sid, "p" * 60, 0, None)))
        before = model.slices
        stream(engine, "victim", 25)
        ran = model.slices - before
        assert late.frames == 25
        assert late.late <= 3, late.late
        # 2 s of stream: at most the most share of it in 40 ms slices, plus the
        # bucket's one and the slice under way.
        assert 0.04 * ran <= MAX_SHARE * 2.1 + 0.04 * 2, ran
        assert ran >= 5, ran  # the openings ran in the time the stream left
        assert not any(f.done() for f in openings)  # still opening: they were in its way


def test_openings_dearer_than_a_frame_keep_a_stream_in_real_time() -> None:
    """Three openings whose slices cost 1.5 frame times each (the
    demo checkpoint's cold prefill slice) beside one live stream. Before, the rule
    counted slices, not time: a slice every two frame times was 120 ms of every 160,
    and the stream's frames ended up to 0.2 s late; now the openings take their share
    of engine time, each slice just after the stream's frame."""
    late = Deadlines()
    model = SlicedModel(FakeOptions(frame_delay=0.015, prefill_token_delay=0.12))
    with engine_of(model, capacity=5, observer=late) as engine:
        open_now(engine, "victim")
        for sid in "abc":
            assert engine.try_reserve(sid)
            engine.submit(Open(sid, "p" * 60, sid.encode()[0], None))
        before = model.slices
        stream(engine, "victim", 30)
        assert len(late.late) == 30
        # Frames more than a frame period late (over two frame times from arrival):
        # the first may meet a slice under way, then at most one in twenty.
        assert sum(x > 0.08 for x in late.late) <= 2, [round(x, 3) for x in late.late]
        assert model.slices - before >= 3  # the openings still progress


def test_an_opening_s_slices_are_cut_to_the_gap_between_a_stream_s_frames() -> None:
    """An opening whose slice is four prefill steps of 40 ms (160 ms, two frame periods:
    a cold slice on a loaded machine) beside one live stream. A slice that long fits no
    gap, so whenever it ran the next frame was late (before: 6 of 30 by 25-64 ms); now the engine
    asks for as many steps as fit before the stream's next frame (three here), and for
    all four once the stream has ended."""
    late = Deadlines()
    model = FakeModel(
        FakeOptions(frame_delay=0.015, prefill_token_delay=0.04, prefill_steps_per_slice=4)
    )
    with engine_of(model, capacity=2, observer=late) as engine:
        open_now(engine, "victim")
        assert engine.try_reserve("b")
        opening = engine.submit(Open("b", "p" * 48, 0, None))
        stream(engine, "victim", 30)
        streamed = len(model.openings[-1].asked)
        opening.result(10)
        asked = model.openings[-1].asked
        assert len(late.late) == 30
        # Frames late by more than a quarter frame (before: 6 of 30, 25-64 ms); the
        # first frames meet the whole slice that began before the stream did.
        assert sum(x > 0.02 for x in late.late[2:]) <= 1, [round(x, 3) for x in late.late]
        assert 0 < min(asked[1:streamed]) < 4, asked  # cut while the stream ran
        assert asked[-1] == 4, asked  # alone: whole slices


def test_an_opening_progresses_beside_a_stream_that_is_always_late() -> None:
    """On an engine whose frames never keep their deadlines (100 ms against 80), an
    opening beside the stream still progresses: its slices wait for the frames to catch
    up only so long (``PATIENCE_FRAMES``), then take their share."""
    model = SlicedModel(FakeOptions(frame_delay=0.1, prefill_token_delay=0.1))
    with engine_of(model, capacity=2) as engine:
        open_now(engine, "victim")
        victim = threading.Thread(target=stream, args=(engine, "victim", 60))
        victim.start()
        time.sleep(0.3)
        assert engine.try_reserve("b")
        opening = engine.submit(Open("b", "pppp", 0, None))  # slices that fit no gap
        opening.result(30)
        still_streaming = victim.is_alive()
        victim.join()
        assert still_streaming  # it opened beside the stream, not after it


def test_a_close_beside_running_sessions_keeps_the_buffer_cache() -> None:
    """Finding 8: clearing MLX's buffer cache waits for the device and makes every other
    session's next step allocate again; it runs once the last session has closed."""
    model = FakeModel()
    with engine_of(model, capacity=3) as engine:
        for sid in "abc":
            open_now(engine, sid)
        for sid in "ab":
            engine.submit(Close(sid)).result(10)
        assert model.cache_clears == 0
        engine.submit(Close("c")).result(10)
        assert model.cache_clears == 1


def test_openings_count_in_admission() -> None:
    """Findings 7 and 8: the engine time of openings counts in admission's prediction."""
    model = FakeModel(FakeOptions(frame_delay=0.005, prefill_token_delay=0.01))
    with engine_of(model, capacity=4, admission_margin=0.75) as engine:
        open_now(engine, "a")
        for _ in range(MIN_SAMPLES):
            engine.submit(Push("a", FRAME, RATE)).result(10)
        assert engine.try_reserve("b")
        before = engine.admission_cost()
        assert before is not None
        engine.submit(Open("b", "p" * 20, 0, None)).result(10)  # 20 slices of 10 ms
        after = engine.admission_cost()
        assert after is not None and after > before + 0.005


# --- finding 9: admission from the first client


def test_the_step_is_measured_before_the_engine_is_ready() -> None:
    """Finding 9: with admission on, the engine steps silence at batch sizes 1 and its
    capacity before it reports ready, so the first clients are admitted by measurement
    (before: all eight were admitted and every frame was late)."""
    model = FakeModel(FakeOptions(frame_delay=0.02, batch_row_delay=0.025))
    limits = Limits(max_sessions=4, admission_margin=0.75)
    engine = engine_for(lambda: model, limits, batch_frames=True)
    assert engine.warm_up
    engine.start()
    try:
        assert set(engine.step_costs) == {1, 4}
        admitted = 0
        while engine.try_reserve(f"s{admitted}"):
            admitted += 1
        assert admitted == 2  # 0.02 + 0.025 x (2 - 1) <= 0.75 x 0.08 < 0.02 + 0.025 x 2
        assert engine.refusal() == "overloaded"
        assert model.cache_clears == 1  # the warm-up's sessions are gone
    finally:
        engine.shutdown()


def test_one_conversation_needs_no_warm_up() -> None:
    """The default (``--max-sessions 1``) starts exactly as before: nothing to admit by
    load, so no warm-up."""
    model = FakeModel()
    engine = engine_for(lambda: model, Limits())
    assert not engine.warm_up
    engine.start()
    try:
        assert engine.step_costs == {} and model.frames_run == 0
    finally:
        engine.shutdown()


async def test_an_openai_client_that_leaves_during_a_tool_feed_frees_its_slot_at_once() -> None:
    """Finding 1 through the socket: a ``function_call_output`` of 301 steps, then the
    client resets its TCP connection. The feed stops within a step or two and the slot
    is free (before: all 301 steps ran first, the slot held the whole time)."""
    model = scripted(call_then_say("Sunny."))
    engine = Engine(lambda: model)
    engine.start()
    try:
        async with running_server(engine) as server:
            host, port = server.http.removeprefix("http://").split(":")
            client = await RawClient.connect(host, int(port), path="/openai/v1/realtime?model=x")
            await client.recv_until("session.created")
            tool = {"type": "function", "name": "get_weather", "description": "Weather."}
            update = {"type": "realtime", "tools": [tool]}
            await client.send_json({"type": "session.update", "session": update})
            await client.recv_until("session.updated")
            pcm = voice(0.6)
            for i in range(0, len(pcm), 9600):
                audio = base64.b64encode(pcm[i : i + 9600]).decode()
                await client.send_json({"type": "input_audio_buffer.append", "audio": audio})
            args = (await client.recv_until("response.function_call_arguments.done"))[-1]
            model.options.frame_delay = 0.02
            item = {
                "type": "function_call_output",
                "call_id": args["call_id"],
                "output": WORDS.text,
            }
            await client.send_json({"type": "conversation.item.create", "item": item})
            with trio.fail_after(10):
                while tool_steps(model) < 3:
                    await trio.sleep(0.005)
            ran = tool_steps(model)
            client.reset()
            with trio.fail_after(10):
                while engine.is_reserved():
                    await trio.sleep(0.005)
            assert tool_steps(model) <= ran + 2
    finally:
        engine.shutdown()


async def test_a_fresh_server_admits_its_first_clients_by_measurement() -> None:
    """Finding 9 through the socket: on a server just started with ``--max-sessions 4``
    whose step is too slow for two, the second client is refused at once (before: every
    client was admitted until 16 real steps had run, and every frame was late)."""
    model = FakeModel(FakeOptions(frame_delay=0.05, batch_row_delay=0.05))
    limits = Limits(max_sessions=4, admission_margin=0.75)
    engine = engine_for(lambda: model, limits, batch_frames=True)
    engine.start()
    try:
        async with running_server(engine, limits=limits) as server:
            async with rc.connect(server.url) as one:
                await one.configure()
                with pytest.raises(rc.ServerBusy):
                    async with rc.connect(server.url) as two:
                        await two.configure()
                assert engine.refusal() == "overloaded"
    finally:
        engine.shutdown()
