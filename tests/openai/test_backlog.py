"""The OpenAI dialect's input backlog bound, on the pure state machine
with the time passed in: while the model opens (a long prompt's prefill can take a
minute) the newest audio is kept up to the bound and nobody is told per append (Pipecat
takes every ``error`` but two as fatal); once it runs, only a client that sends faster
than real time gets ``input_audio_buffer_full``, at most once in ``FULL_ERROR_SECONDS``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from realtime.limits import Limits
from realtime.openai.dialect import FULL_ERROR_SECONDS, Dialect, Output
from realtime.session.work import DroppedAudio, OpenModel, RunAudio
from tests.openai.test_dialect import append, events, pcm24

CHUNK = 480
"""20 ms at 24 kHz: what a microphone client sends each time."""


def bounded(seconds: float = 1.0) -> Dialect:
    """A dialect whose backlog bound is ``seconds`` (1 s: 12 frames of 80 ms)."""
    return Dialect("sess_test", "scripted", Limits(max_pending_audio_seconds=seconds), now=0.0)


def stream(
    d: Dialect, pcm: np.ndarray[Any, Any], start: float, *, pace: float = 1.0
) -> list[Output]:
    """``pcm`` in 20 ms appends, the clock at ``pace`` times real time from ``start``
    (0: all at ``start``)."""
    out: list[Output] = []
    for n, i in enumerate(range(0, pcm.shape[0], CHUNK)):
        now = start + n * 0.02 / pace if pace else start
        out += d.receive(json.dumps(append(pcm[i : i + CHUNK])), now)
    return out


def frames(outputs: list[Output]) -> list[RunAudio]:
    return [o for o in outputs if isinstance(o, RunAudio)]


def drops(outputs: list[Output]) -> list[DroppedAudio]:
    return [o for o in outputs if isinstance(o, DroppedAudio)]


def errors(outputs: list[Output]) -> list[dict[str, Any]]:
    return [e for e in events(outputs) if e["type"] == "error"]


def test_while_the_model_opens_the_newest_audio_is_kept_and_nobody_is_told() -> None:
    pcm = pcm24(5.0) * np.linspace(0.1, 1.0, 5 * 24000)  # every frame differs
    pcm = pcm.astype("<i2")
    opening = bounded()
    out = stream(opening, pcm, 0.0)
    assert OpenModel(None) in out
    assert errors(out) == [] and frames(out) == []
    dropped = drops(out)
    # The frames an open model would have been given, for comparison.
    reference = bounded(60.0)
    reference.opened(None, now=0.0)
    every = frames(stream(reference, pcm, 0.0))
    assert len(every) > 12
    assert sum(d.seconds for d in dropped) == pytest.approx((len(every) - 12) * 0.08)
    assert {d.reason for d in dropped} == {"opening"}
    assert [bool(d.note) for d in dropped] == [True] + [False] * (len(dropped) - 1)
    assert "max_pending_audio_seconds" in dropped[0].note
    released = frames(opening.opened(None, now=5.0))
    assert len(released) == 12
    for got, want in zip(released, every[-12:], strict=True):
        assert np.array_equal(got.samples, want.samples)
    # Opened, and once the engine has run them, the audio goes on at once again.
    for _ in released:
        opening.frame_dropped()
    assert len(frames(stream(opening, pcm24(0.5), 5.0))) >= 5


def test_a_response_or_a_tool_output_takes_the_held_audio_along_first() -> None:
    d = bounded()
    stream(d, pcm24(0.5), 0.0)
    out = d.receive(json.dumps({"type": "response.create"}), 0.5)
    held = frames(out)
    assert len(held) == 6
    assert out.index(held[-1]) < out.index(events(out)[0])  # before response.created
    # What was handed on counts against the bound: the rest of it is held.
    stream(d, pcm24(2.0), 0.5)
    assert len(frames(d.opened(None, now=3.0))) == 12 - 6
    d2 = bounded()
    stream(d2, pcm24(0.5), 0.0)
    item = {"type": "function_call_output", "call_id": "c", "output": "21"}
    out = d2.receive(json.dumps({"type": "conversation.item.create", "item": item}), 0.5)
    assert len(frames(out)) == 6


def test_a_failed_open_drops_what_was_held_and_the_next_audio_opens_again() -> None:
    d = bounded()
    stream(d, pcm24(0.5), 0.0)
    out = d.opened("no memory", now=1.0)
    assert frames(out) == [] and errors(out)[0]["error"]["code"] == "session_initialization_failed"
    out = stream(d, pcm24(0.2), 1.0)
    assert OpenModel(None) in out and frames(out) == []
    assert len(frames(d.opened(None, now=2.0))) == 2


def test_an_engine_behind_a_real_time_client_drops_its_audio_without_an_error() -> None:
    d = bounded()
    d.opened(None, now=0.0)
    out = stream(d, pcm24(3.0), 0.0)  # in real time, and the engine runs no frame
    assert len(frames(out)) == 12
    dropped = drops(out)
    assert dropped and {x.reason for x in dropped} == {"engine_behind"}
    assert errors(out) == []


def test_a_client_faster_than_real_time_hears_it_at_most_once_in_a_while() -> None:
    d = bounded()
    d.opened(None, now=0.0)
    out = stream(d, pcm24(5.0), 0.0, pace=0)  # 5 s of audio at once
    (error,) = errors(out)
    assert error["error"]["code"] == "input_audio_buffer_full"
    assert "at most once in 10 s" in error["error"]["message"]
    assert {x.reason for x in drops(out)} == {"too_fast"}
    # The engine catches up a little; a burst again soon after: dropped, not told again.
    for _ in range(12):
        d.frame_dropped()
    out = stream(d, pcm24(3.0), 5.0, pace=0)
    assert errors(out) == [] and drops(out)
    out = stream(d, pcm24(3.0), 5.0 + FULL_ERROR_SECONDS, pace=0)
    assert len(errors(out)) == 1
