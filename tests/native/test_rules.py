"""The per-connection rules, tested directly on the state machine (no socket, no engine)."""

from __future__ import annotations

import base64
import json
import typing
from collections.abc import Callable
from typing import Any

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from realtime.limits import Limits
from realtime.models.base import AssistantTextDelta, AudioDelta, Cancelled, Done
from realtime.native import wire as protocol
from realtime.native.rules import (
    MAX_QUEUED_MESSAGES,
    Conversation,
    Output,
    Phase,
    error_code_for,
)
from realtime.session import work
from realtime.session.close_codes import Close

FRAME = 1280


def conv(*, count_tokens: Callable[[str], int] = len, **limits: Any) -> Conversation:
    return Conversation(
        "sess_0123456789abcdef",
        Limits(**limits),
        model_id="fake-voicechat",
        model_path="/models/fake-voicechat",
        now=0.0,
        count_tokens=count_tokens,
    )


def received(c: Conversation, frame: str | bytes | None, now: float) -> list[Output]:
    """``receive``, and the pipeline's part: work the rules accepted is owed."""
    out = c.receive(frame, now)
    for item in out:
        if isinstance(item, (work.OpenModel, work.RunAudio, work.FlushModel, work.CancelModel)):
            c.backlog.accepted(item)
    return out


def frame_back(c: Conversation, now: float) -> Conversation:
    """The pipeline's part as a frame's result comes back (before the rules hear it)."""
    c.backlog.frame_back(now)
    return c


def finished(c: Conversation, now: float) -> Conversation:
    """The pipeline's part as an open, flush or cancel finishes."""
    c.backlog.finished(now)
    return c


def push_failed(kind: Any, message: str) -> work.Failure:
    """An audio slice's engine failure."""
    return work.Failure(kind, message, "push")


def msg(type_: str, **fields: Any) -> str:
    return json.dumps({"type": type_, **fields})


def append(samples: int, rate: int = 16000) -> str:
    audio = base64.b64encode(np.zeros(samples, "<i2").tobytes()).decode()
    return msg("input_audio_buffer.append", audio=audio, sample_rate=rate)


def errors(outputs: typing.Sequence[Output]) -> list[tuple[str, str]]:
    return [
        (o["error"]["code"], o["error"]["message"])
        for o in outputs
        if isinstance(o, dict) and o["type"] == "error"
    ]


def only_error(outputs: list[Output], limit: str | None = None) -> tuple[str, str]:
    """The one error event of ``outputs`` (and, for a limit, the limit it counts)."""
    counted = [o.limit for o in outputs if isinstance(o, work.LimitRefused)]
    assert counted == ([limit] if limit else []), outputs
    rest = [o for o in outputs if not isinstance(o, work.LimitRefused)]
    assert len(rest) == 1, outputs
    found = errors(rest)
    assert found, outputs
    return found[0]


def ready(c: Conversation) -> None:
    (item,) = received(c, msg("session.update", session={"seed": 3}), 0.0)
    assert isinstance(item, work.OpenModel) and item.seed == 3
    (updated,) = finished(c, 0.0).opened(None, 0.0)
    assert isinstance(updated, dict) and updated["type"] == "session.updated"
    assert updated["session"]["seed"] == 3 and c.phase is Phase.READY


def audio_events(frame: int) -> list[Any]:
    samples = np.zeros(1764, np.float32)
    return [
        AssistantTextDelta(frame, 100, "x", "x"),
        AudioDelta(frame, samples, tuple(range(31))),
    ]


# --- configuring ---------------------------------------------------------------------


def test_update_opens_the_session_and_answers_session_updated() -> None:
    c = conv()
    assert c.phase is Phase.CONFIGURING
    ready(c)


@pytest.mark.parametrize("frame", [append(FRAME), msg("input_audio_buffer.commit")])
def test_audio_or_commit_before_update_is_refused(frame: str) -> None:
    c = conv()
    code, message = only_error(received(c, frame, 0.0))
    assert code == "invalid_request" and "send session.update before" in message
    assert c.backlog.pending_samples == 0


def test_audio_right_after_update_is_queued_then_refused_if_the_open_fails() -> None:
    c = conv()
    (item,) = received(c, msg("session.update"), 0.0)
    assert isinstance(item, work.OpenModel)
    (run,) = received(c, append(FRAME), 0.0)
    assert isinstance(run, work.RunAudio) and c.backlog.pending_samples == FRAME
    (err,) = finished(c, 0.0).opened(work.Failure("open_failed", "prefill failed", "open"), 0.0)
    assert isinstance(err, dict)
    assert err["error"] == {"code": "session_initialization_failed", "message": "prefill failed"}
    refusal = c.begin_audio(run)
    assert refusal is not None and "send session.update before audio" in only_error(refusal)[1]
    c.backlog.audio_done(FRAME)  # the pipeline returns a dropped append's budget
    assert c.backlog.pending_samples == 0
    # The client may try again.
    ready(c)


def test_second_update_is_refused_in_flight_and_after() -> None:
    c = conv()
    received(c, msg("session.update"), 0.0)
    assert "already configured" in only_error(received(c, msg("session.update"), 0.0))[1]
    c2 = conv()
    ready(c2)
    assert "already configured" in only_error(received(c2, msg("session.update"), 0.0))[1]


def test_unknown_model_names_the_served_one() -> None:
    c = conv()
    code, message = only_error(received(c, msg("session.update", session={"model": "x"}), 0.0))
    assert code == "invalid_request" and "'fake-voicechat'" in message
    (item,) = received(c, msg("session.update", session={"model": "org/fake-voicechat"}), 0.0)
    assert isinstance(item, work.OpenModel)


def test_a_long_system_prompt_is_refused_before_any_model_work() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer
    c = conv(count_tokens=words, max_system_prompt_tokens=10)
    short = "one two three four five six seven eight"  # 8 words, 39 bytes: counted
    (item,) = received(c, msg("session.update", session={"system_prompt": short}), 0.0)
    assert isinstance(item, work.OpenModel)
    c2 = conv(count_tokens=words, max_system_prompt_tokens=10)
    long = " ".join(["w"] * 11)
    code, message = only_error(
        received(c2, msg("session.update", session={"system_prompt": long}), 0.0),
        "max_system_prompt_tokens",
    )
    assert code == "invalid_request" and "is 11 tokens, over the 10-token limit" in message
    assert not c2.update_in_flight
    huge = "x" * 100_000  # refused without tokenizing
    _, message = only_error(
        received(c2, msg("session.update", session={"system_prompt": huge}), 0.0),
        "max_system_prompt_tokens",
    )
    assert "100000 characters is far longer than the 10-token limit" in message


def test_ping_is_answered_in_every_phase() -> None:
    c = conv()
    for step in (lambda: None, lambda: ready(c), lambda: received(c, msg("session.cancel"), 0)):
        step()
        (pong,) = received(c, msg("session.ping"), 0.0)
        assert isinstance(pong, dict) and pong["type"] == "session.pong"


# --- audio and the budget ----------------------------------------------------------------


def test_wrong_sample_rate_is_answered_on_arrival() -> None:
    c = conv()
    ready(c)
    code, message = only_error(received(c, append(FRAME, rate=8000), 0.0))
    assert code == "inference_error" and "16000" in message and "8000" in message
    assert c.backlog.pending_samples == 0


def test_budget_counts_accepted_audio_until_it_is_submitted() -> None:
    c = conv(max_pending_audio_seconds=1.0)
    ready(c)
    (run,) = received(c, append(12800), 0.0)
    assert isinstance(run, work.RunAudio) and c.backlog.pending_samples == 12800
    _, message = only_error(received(c, append(6400), 0.0), "max_pending_audio_seconds")
    assert "backlog is full: 0.80 s waiting" in message and "0.40 s was refused" in message
    assert c.begin_audio(run) is None
    c.backlog.submitted(FRAME)
    assert c.backlog.pending_samples == 12800 - FRAME
    c.backlog.audio_done(12800 - FRAME)  # the rest was dropped
    assert c.backlog.pending_samples == 0


def test_an_append_larger_than_the_budget_says_so() -> None:
    c = conv(max_pending_audio_seconds=1.0)
    ready(c)
    _, message = only_error(received(c, append(32000), 0.0), "max_pending_audio_seconds")
    assert "this append of 2.00 s is larger than the 1 s limit" in message


def test_message_size_counts_utf8_bytes() -> None:
    c = conv(max_message_bytes=1000)
    frame = msg("session.ping", pad="€" * 400)  # 400 characters, 1200 bytes
    code, message = only_error(received(c, frame, 0.0), "max_message_bytes")
    assert code == "invalid_request" and "exceeds the 1000-byte limit" in message
    assert str(len(frame.encode())) in message
    (pong,) = received(c, msg("session.ping", pad="e" * 400), 0.0)
    assert isinstance(pong, dict)


def test_too_many_queued_messages_are_refused() -> None:
    c = conv(max_pending_audio_seconds=1000.0)
    ready(c)
    for _ in range(MAX_QUEUED_MESSAGES):
        (run,) = received(c, append(2), 0.0)
        assert isinstance(run, work.RunAudio)
    outputs = received(c, append(2), 0.0)
    assert "messages are waiting" in only_error(outputs, "max_queued_messages")[1]


def test_slices_give_audio_first_and_count_frames() -> None:
    c = conv()
    ready(c)
    (run,) = received(c, append(FRAME), 0.0)
    assert isinstance(run, work.RunAudio)
    assert c.begin_audio(run) is None
    c.backlog.submitted(FRAME)
    c.backlog.audio_done(0)
    events = frame_back(c, 0.0).slice_done(run.tag, audio_events(0), 0.0)
    assert [e["type"] for e in events] == ["response.audio.delta", "response.text.delta"]
    assert c.frames == 1
    assert frame_back(c, 0.0).slice_done(run.tag, None, 0.0) == []  # a skipped slice


def three_slices_two_in_flight(c: Conversation) -> work.RunAudio:
    """A ready session's three-slice append, begun, with two slices with the engine."""
    ready(c)
    (run,) = received(c, append(FRAME * 3), 0.0)
    assert isinstance(run, work.RunAudio)
    c.begin_audio(run)
    c.backlog.submitted(FRAME)
    c.backlog.submitted(FRAME)
    return run


def test_a_failed_append_errors_once_and_stops_submitting() -> None:
    c = conv()
    run = three_slices_two_in_flight(c)
    (err,) = frame_back(c, 0.0).slice_failed(
        run.tag, push_failed("step_failed", "context limit reached"), 0.0
    )
    assert isinstance(err, dict) and err["error"]["code"] == "inference_error"
    assert not c.keep_submitting(run.tag)
    # The slice already in flight: no second error, no events.
    assert (
        frame_back(c, 0.0).slice_failed(
            run.tag, push_failed("step_failed", "context limit reached"), 0.0
        )
        == []
    )
    (run2,) = received(c, append(FRAME), 0.0)
    assert isinstance(run2, work.RunAudio) and c.keep_submitting(run2.tag)


def test_the_context_limit_ends_the_response_once() -> None:
    c = conv()
    run = three_slices_two_in_flight(c)
    frame_back(c, 0.0).slice_done(run.tag, audio_events(0), 0.0)
    stop, err, done, close = c.slice_failed(
        run.tag, push_failed("context_limit", "context limit"), 0.0
    )
    assert isinstance(stop, work.StopModel)
    assert isinstance(err, dict) and err["error"]["code"] == "inference_error"
    assert isinstance(done, dict) and done["type"] == "response.done" and done["frame_index"] == 1
    assert close == Close(1000, "context limit reached") and c.outcome == "done"
    assert not c.keep_submitting(run.tag)
    assert (
        frame_back(c, 0.0).slice_failed(run.tag, push_failed("context_limit", "context limit"), 0.0)
        == []
    )


@pytest.mark.parametrize("kind", ["session_lost", "engine_dead"])
def test_a_lost_session_closes_1011(kind: Any) -> None:
    c = conv()
    ready(c)
    (run,) = received(c, append(FRAME), 0.0)
    assert isinstance(run, work.RunAudio)
    c.begin_audio(run)
    c.backlog.submitted(FRAME)
    err, close = frame_back(c, 0.0).slice_failed(
        run.tag, push_failed(kind, "the model engine has stopped: x"), 0.0
    )
    assert isinstance(err, dict) and err["error"]["code"] == "inference_error"
    assert close == Close(1011, "the model engine has stopped: x")
    assert c.phase is Phase.CLOSED and c.outcome == "error"


# --- commit and cancel -----------------------------------------------------------------------


def test_commit_flushes_then_done_and_close_1000() -> None:
    c = conv()
    ready(c)
    (flush,) = received(c, msg("input_audio_buffer.commit", pad_partial=False), 0.0)
    assert flush == work.FlushModel(pad_partial=False) and c.phase is Phase.COMMITTED
    assert "already committed" in only_error(received(c, append(FRAME), 0.0))[1]
    assert "already committed" in only_error(received(c, msg("input_audio_buffer.commit"), 0))[1]
    out = finished(c, 0.0).flushed([*audio_events(0), Done(1)], 0.0)
    types = [o["type"] if isinstance(o, dict) else o for o in out]
    assert types == [
        "input_audio_buffer.committed",
        "response.audio.delta",
        "response.text.delta",
        "response.done",
        Close(1000, "response done"),
    ]
    assert c.outcome == "done"


def test_cancel_stops_the_model_then_cancelled_and_close_1000() -> None:
    c = conv()
    ready(c)
    assert received(c, msg("response.cancel"), 0.0) == [work.StopModel(), work.CancelModel()]
    assert c.phase is Phase.CANCELLED and not c.keep_submitting(0)
    assert received(c, msg("session.cancel"), 0.0) == []  # a second cancel is a no-op
    assert "was cancelled" in only_error(received(c, append(FRAME), 0.0))[1]
    assert "was cancelled" in only_error(received(c, msg("session.update"), 0.0))[1]
    out = finished(c, 0.0).cancelled([Cancelled(4)], 0.0)
    assert isinstance(out[0], dict) and out[0]["type"] == "response.cancelled"
    assert out[0]["frame_index"] == 4 and out[1] == Close(1000, "cancelled")
    assert c.outcome == "cancelled"


def test_cancel_before_any_session_answers_cancelled_at_frame_0() -> None:
    c = conv()
    received(c, msg("session.cancel"), 0.0)
    out = finished(c, 0.0).cancelled(None, 0.0)
    assert isinstance(out[0], dict) and out[0]["frame_index"] == 0


def test_cancel_while_the_open_is_queued_suppresses_the_open_error() -> None:
    c = conv()
    (item,) = received(c, msg("session.update"), 0.0)
    assert isinstance(item, work.OpenModel)
    received(c, msg("session.cancel"), 0.0)
    assert (
        finished(c, 0.0).opened(work.Failure("open_failed", "the connection is gone", "open"), 0.0)
        == []
    )


def test_open_failure_after_commit_refuses_the_commit() -> None:
    c = conv()
    (item,) = received(c, msg("session.update"), 0.0)
    assert isinstance(item, work.OpenModel)
    received(c, msg("input_audio_buffer.commit"), 0.0)
    finished(c, 0.0).opened(work.Failure("open_failed", "bad", "open"), 0.0)
    assert "before commit" in only_error(finished(c, 0.0).flushed(None, 0.0))[1]
    assert c.phase is Phase.CONFIGURING


# --- time ---------------------------------------------------------------------------------------


def test_a_long_open_is_not_timed_out_by_the_server() -> None:
    """Reading a long new system prompt can take minutes; while it runs
    no server clock ends the session (the client bounds its own wait: --open-timeout)."""
    c = conv(configure_timeout=30.0, idle_timeout=120.0)
    (opening,) = received(c, msg("session.update", session={"system_prompt": "x" * 4000}), 1.0)
    assert isinstance(opening, work.OpenModel) and c.update_in_flight
    assert c.next_deadline() is None
    assert c.check_timeouts(600.0) == []
    finished(c, 601.0)
    out = c.opened(None, 601.0)
    assert [e["type"] for e in out if isinstance(e, dict)] == ["session.updated"]


def test_configure_timeout_counts_from_accept() -> None:
    c = conv(configure_timeout=30.0, idle_timeout=120.0)
    for t in range(5, 30, 5):
        received(c, msg("session.ping"), float(t))
    deadline = c.next_deadline()
    assert deadline is not None and (deadline.at, deadline.what) == (30.0, "configure")
    assert c.check_timeouts(29.9) == []
    err, close = c.check_timeouts(30.0)
    assert isinstance(err, dict)
    assert err["error"]["message"] == "no session.update within 30 s; closing"
    assert isinstance(close, Close) and close.code == 1008 and not close.now
    assert c.outcome == "timeout"


def test_idle_clock_only_runs_while_nothing_is_owed() -> None:
    c = conv(idle_timeout=3.0)
    ready(c)
    (run,) = received(c, append(FRAME * 2), 10.0)
    assert isinstance(run, work.RunAudio)
    assert c.next_deadline() is None  # accepted audio is waiting
    c.begin_audio(run)
    c.backlog.submitted(FRAME)
    c.backlog.submitted(FRAME)
    c.backlog.audio_done(0)
    assert c.next_deadline() is None  # slices are running
    for i in range(2):
        for _ in frame_back(c, 20.0).slice_done(run.tag, audio_events(i), 20.0):
            c.backlog.event_queued()
    assert c.next_deadline() is None  # events wait for the socket
    for _ in range(4):
        c.backlog.sending(25.0)
        c.backlog.sent(26.0)
    deadline = c.next_deadline()
    assert deadline is not None and (deadline.at, deadline.what) == (29.0, "idle")
    assert c.check_timeouts(28.9) == []
    assert "no message for 3 s" in errors(c.check_timeouts(29.0))[0][1]


def test_a_client_that_stops_reading_is_dropped_at_once() -> None:
    c = conv(send_timeout=10.0)
    ready(c)
    c.backlog.event_queued()
    c.backlog.sending(5.0)
    assert c.check_timeouts(14.0) == []
    assert c.check_timeouts(15.0) == [Close(1008, "client stopped reading", now=True)]
    assert c.outcome == "stalled_client"


def _close_by_commit(c: Conversation) -> list[Output]:
    received(c, append(FRAME * 4 + FRAME // 2), 1.0)
    received(c, msg("input_audio_buffer.commit"), 1.0)
    return finished(c, 2.0).flushed([*audio_events(0), Done(1)], 2.0)


def _close_by_cancel(c: Conversation) -> list[Output]:
    received(c, msg("session.cancel"), 1.0)
    return finished(c, 2.0).cancelled([Cancelled(0)], 2.0)


def _close_by_idle_timeout(c: Conversation) -> list[Output]:
    return c.check_timeouts(2.0)  # idle_timeout=1: nothing owed since 0


def _close_by_lost_session(c: Conversation) -> list[Output]:
    (run,) = received(c, append(FRAME), 1.0)
    assert isinstance(run, work.RunAudio)
    c.begin_audio(run)
    c.backlog.submitted(FRAME)
    c.backlog.audio_done(0)
    return frame_back(c, 2.0).slice_failed(run.tag, push_failed("session_lost", "gone"), 2.0)


@pytest.mark.parametrize(
    "decide",
    [_close_by_commit, _close_by_cancel, _close_by_idle_timeout, _close_by_lost_session],
)
def test_a_client_that_stops_reading_after_the_close_is_decided_is_still_dropped(
    decide: typing.Callable[[Conversation], list[Output]],
) -> None:
    """The red team's attack (commit, then read nothing): the stalled-reader deadline
    holds in the closing phase too, or the last events' write holds the slot forever."""
    c = conv(send_timeout=10.0, idle_timeout=1.0)
    ready(c)
    outputs = decide(c)
    (close,) = [o for o in outputs if isinstance(o, Close)]
    assert not close.now and c.phase is Phase.CLOSED
    for _ in (o for o in outputs if isinstance(o, dict)):
        c.backlog.event_queued()
    assert c.next_deadline() is None  # nothing is being written: no clock runs
    c.backlog.sending(100.0)  # the first of the last events: the client reads nothing
    deadline = c.next_deadline()
    assert deadline is not None and (deadline.at, deadline.what) == (110.0, "send")
    assert c.check_timeouts(109.9) == []
    assert c.check_timeouts(110.0) == [Close(1008, "client stopped reading", now=True)]
    assert c.outcome == "stalled_client" and c.close_reason == "client stopped reading"
    # Decided once: the drop is not repeated while the plumbing carries it out.
    assert c.next_deadline() is None and c.check_timeouts(500.0) == []


def test_the_closing_phase_keeps_only_the_stalled_reader_clock() -> None:
    """Once the close is decided the configure and idle clocks stop (the client has
    nothing more to say); a write that completes stops the stalled-reader one."""
    c = conv(send_timeout=10.0, idle_timeout=1.0, configure_timeout=1.0)
    ready(c)
    outputs = _close_by_commit(c)
    for _ in (o for o in outputs if isinstance(o, dict)):
        c.backlog.event_queued()
    for t in range(len(outputs) - 1):
        c.backlog.sending(3.0 + t)
        c.backlog.sent(3.5 + t)
    assert c.next_deadline() is None and c.check_timeouts(1000.0) == []
    assert c.outcome == "done"


def test_no_deadline_once_the_plumbing_ended_the_connection() -> None:
    c = conv(send_timeout=10.0)
    ready(c)
    c.backlog.event_queued()
    c.backlog.sending(5.0)
    c.connection_lost("shutdown", "server shutting down")
    assert c.next_deadline() is None and c.check_timeouts(100.0) == []
    assert c.outcome == "shutdown"


def test_error_codes_of_engine_failures() -> None:
    def code(kind: Any, during: Any) -> str:
        return error_code_for(work.Failure(kind, "x", during))

    assert code("open_failed", "open") == "session_initialization_failed"
    assert code("session_lost", "open") == "session_initialization_failed"
    assert code("engine_dead", "open") == "inference_error"
    for kind in ("step_failed", "session_lost", "engine_dead"):
        assert code(kind, "push") == "inference_error"


# --- any sequence of frames --------------------------------------------------------------------

EVENT_TYPES = {
    "error",
    "session.pong",
    "session.updated",
    "input_audio_buffer.committed",
    "response.audio.delta",
    "response.text.delta",
    "response.done",
    "response.cancelled",
}
ERROR_CODES = set(typing.get_args(protocol.ErrorCode))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
frames = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    json_values.map(json.dumps),
    st.builds(
        lambda t, body: json.dumps({"type": t, **body}),
        st.sampled_from([*protocol.CLIENT_TYPES, "nope"]),
        st.dictionaries(st.sampled_from(["session", "audio", "sample_rate", "x"]), json_values),
    ),
    st.sampled_from(
        [
            msg("session.update"),
            msg("session.update", session={"seed": 1, "max_streaming_seconds": 5}),
            append(FRAME),
            append(3000),
            append(FRAME, rate=8000),
            msg("input_audio_buffer.commit"),
            msg("session.cancel"),
            msg("session.ping"),
        ]
    ),
)
engine_outcomes = st.sampled_from(
    ["ok", "open_failed", "step_failed", "context_limit", "session_lost", "dead"]
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.tuples(frames, engine_outcomes), max_size=25))
def test_any_frames_give_only_documented_events_and_closes(
    script: list[tuple[str | bytes, str]],
) -> None:
    """Whatever arrives, and however the engine answers, the state machine only
    answers with documented events, error codes and close codes, and never raises."""
    c = conv(max_pending_audio_seconds=1.0)
    out: list[Output] = []
    now = 0.0
    for frame, outcome in script:
        now += 0.1
        outputs = received(c, frame, now)
        out += outputs
        for item in outputs:
            out += _run(c, item, outcome, now)
        out += c.check_timeouts(now)
    closes = [o for o in out if isinstance(o, Close)]
    assert len(closes) <= 1
    assert all(o.code in (1000, 1008, 1011) for o in closes)
    for o in out:
        assert isinstance(
            o,
            (
                dict,
                Close,
                work.StopModel,
                work.OpenModel,
                work.RunAudio,
                work.FlushModel,
                work.CancelModel,
                work.LimitRefused,
            ),
        )
        if isinstance(o, dict):
            assert o["type"] in EVENT_TYPES
            assert o["event_id"].startswith("event_")
            if o["type"] == "error":
                assert o["error"]["code"] in ERROR_CODES and o["error"]["message"]
    assert c.backlog.pending_samples >= 0


def _run(c: Conversation, item: Output, outcome: str, now: float) -> list[Output]:
    """Play the engine's part for one output, with a scripted outcome."""
    failure: work.Failure | None = None
    if outcome != "ok":
        kind: Any = "engine_dead" if outcome == "dead" else outcome
        failure = work.Failure(
            kind, "scripted failure", "open" if isinstance(item, work.OpenModel) else "push"
        )
    if isinstance(item, work.OpenModel):
        return finished(c, now).opened(
            failure if outcome in ("ok", "open_failed", "dead") else None, now
        )
    if isinstance(item, work.RunAudio):
        n = int(item.samples.shape[0])
        instead = c.begin_audio(item)
        if instead is not None:
            c.backlog.audio_done(n)  # dropped: the pipeline returns its budget
            return instead
        out: list[Output] = []
        c.backlog.submitted(n)
        c.backlog.audio_done(0)
        if failure is None or outcome == "open_failed":
            out += frame_back(c, now).slice_done(item.tag, audio_events(c.frames), now)
        else:
            assert failure is not None
            out += frame_back(c, now).slice_failed(item.tag, failure, now)
        return out
    if isinstance(item, work.FlushModel):
        return finished(c, now).flushed([Done(c.frames)] if c.session_open else None, now)
    if isinstance(item, work.CancelModel):
        return finished(c, now).cancelled([Cancelled(c.frames)] if c.session_open else None, now)
    return []


@pytest.mark.parametrize(
    ("frame", "size"),
    [("a" * 10, 10), ("é" * 10, 20), ("€" * 10, 30), ("😀" * 10, 40), (b"\xff" * 7, 7)],
)
def test_the_message_limit_counts_utf8_bytes(frame: str | bytes, size: int) -> None:
    """One rule for both endpoints (``limits.message_size``): exact near the limit."""
    from realtime.limits import message_size

    assert message_size(frame, 8) == size
    assert message_size(frame, 10**6) <= size  # far from the limit: not encoded


def test_phases_change_only_along_the_transition_table() -> None:
    from realtime.native.rules import TRANSITIONS

    assert set(TRANSITIONS) == set(Phase)
    c = conv()
    ready(c)
    received(c, msg("session.cancel"), 0.0)
    assert c.phase is Phase.CANCELLED
    with pytest.raises(AssertionError, match="no transition CANCELLED -> READY"):
        c._enter(Phase.READY)
