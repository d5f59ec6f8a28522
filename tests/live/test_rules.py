"""The Live dialect's state machine as a pure function of client events, model frames and
the time: every server event it emits validates strictly against ``openai.types.live``."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from realtime.limits import Limits
from realtime.live.rules import (
    MAX_QUEUED_FEEDS,
    NOTICE_SECONDS,
    START_GRACE_SECONDS,
    LiveRules,
    Phase,
)
from realtime.models.base import (
    DELEGATE_TOOL,
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    UserTranscriptDelta,
    context_feed,
)
from realtime.session.close_codes import CLOSE_NORMAL, CLOSE_POLICY, Close
from realtime.session.rules import Output
from realtime.session.work import (
    CountTokens,
    Failure,
    FeedModel,
    LimitRefused,
    OpenModel,
    RunAudio,
    StopModel,
)
from realtime.wire_audio import PCMU, ulaw_encode
from tests.live.validate import validate_live

FIGURES = VOICECHAT_FIGURES
CALL = f'<TOOLCALL>[{{"name": "{DELEGATE_TOOL}", "arguments": {{"task": "look"}}}}]</TOOLCALL>'


def words(text: str) -> int:
    return len(text.split()) + 2


def new(limits: Limits | None = None, now: float = 0.0) -> LiveRules:
    return LiveRules(
        "sess_test",
        "demo-model",
        limits or Limits(),
        now=now,
        figures=FIGURES,
        count_tokens=words,
        created_at=1_000_000.0,
    )


def events(outputs: list[Output]) -> list[dict[str, Any]]:
    found = [o for o in outputs if isinstance(o, dict)]
    for event in found:
        validate_live(event)
    return found


def types(outputs: list[Output]) -> list[str]:
    return [e["type"] for e in events(outputs)]


def send(rules: LiveRules, message: dict[str, Any], now: float = 0.1) -> list[Output]:
    return rules.receive(json.dumps(message), now)


def error_code(outputs: list[Output]) -> str:
    [error] = [e for e in events(outputs) if e["type"] == "error"]
    return str(error["error"]["code"])


def started(session: dict[str, Any] | None = None, limits: Limits | None = None) -> LiveRules:
    """Rules whose session has started (the prompt counted, the model opened)."""
    rules = new(limits)
    out = send(rules, {"type": "session.start", "session": session or {"model": "gpt-live-1"}})
    [count] = [o for o in out if isinstance(o, CountTokens)]
    out = rules.counted(count.text, count.count(count.text), 0.2)
    assert any(isinstance(o, OpenModel) for o in out), out
    out = rules.opened(None, 1.0)
    assert types(out) == ["session.started"]
    return rules


def frame(index: int, *extra: ModelEvent, samples: int = 1764) -> list[ModelEvent]:
    audio = AudioDelta(
        frame_index=index,
        samples=np.full(samples, 0.25, np.float32),
        sample_rate=FIGURES.output_sample_rate,
        audio_codes=(0,) * FIGURES.codebooks,
    )
    return [*extra, audio]


def test_nothing_but_session_start_first() -> None:
    rules = new()
    out = send(rules, {"type": "session.input_audio.append", "audio": ""})
    assert error_code(out) == "session_not_started"
    assert rules.phase is Phase.AWAITING


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"model": "m", "voice": "marin"}, "unknown_parameter", "session.voice"),
        ({}, "missing_required_parameter", "session.model"),
        ({"model": "m", "instructions": 3}, "invalid_type", "session.instructions"),
        (
            {"model": "m", "delegation": {"type": "responses", "responses": {}}},
            "unsupported_feature",
            "session.delegation.type",
        ),
        ({"model": "m", "store": True}, "unsupported_feature", "session.store"),
        (
            {"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}},
            "invalid_value",
            "session.audio.format",
        ),
        (
            {"model": "m", "input": [{"role": "system", "content": [{"text": "x"}]}]},
            "invalid_value",
            "session.input[0].role",
        ),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"text": "x", "x": 1}]}]},
            "unknown_parameter",
            "session.input[0].content[0].x",
        ),
    ],
)
def test_session_start_is_strict(session: dict[str, Any], code: str, param: str) -> None:
    rules = new()
    out = send(rules, {"type": "session.start", "event_id": "evt_1", "session": session})
    [error] = events(out)
    assert error["error"]["code"] == code, error
    assert error["error"]["param"] == param, error
    assert error["client_event_id"] == "evt_1"
    assert rules.phase is Phase.AWAITING  # the client may start again


def test_unknown_event_field_is_refused() -> None:
    rules = started()
    out = send(rules, {"type": "session.input_audio.mute", "now": True})
    assert error_code(out) == "unknown_parameter"


def test_start_opens_the_model_with_instructions_history_and_delegate_tool() -> None:
    rules = new()
    session = {
        "model": "gpt-live-1",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        ],
        "audio": {"format": {"type": "audio/pcmu"}, "output": {"voice": "marin"}},
    }
    out = send(rules, {"type": "session.start", "event_id": "s1", "session": session})
    [count] = out
    assert isinstance(count, CountTokens)
    assert rules.session_open is False
    [opened] = rules.counted(count.text, 100, 0.3)
    assert isinstance(opened, OpenModel) and opened.system_prompt == count.text
    prompt = opened.system_prompt or ""
    assert prompt.startswith("Be brief.\n\nConversation so far:\nUser: Hi\nAssistant: Hello")
    assert f'"name": "{DELEGATE_TOOL}"' in prompt
    [started_event] = events(rules.opened(None, 1.0))
    assert started_event["client_event_id"] == "s1"
    resource = started_event["session"]
    assert resource["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}
    assert resource["expires_at"] == 1_000_000 + 3600
    assert resource["delegation"] == {"type": "client"}


def test_prompt_over_the_limit_names_the_flag_and_start_can_be_retried() -> None:
    rules = new(Limits(max_system_prompt_tokens=64))
    out = send(rules, {"type": "session.start", "session": {"model": "m", "instructions": "x"}})
    [count] = out
    assert isinstance(count, CountTokens)
    [error] = events(rules.counted(count.text, 65, 0.2))
    assert "--max-system-prompt-tokens" in error["error"]["message"]
    assert rules.phase is Phase.AWAITING
    out = send(rules, {"type": "session.start", "session": {"model": "m"}})
    assert isinstance(out[0], CountTokens)


def test_audio_before_started_is_told_once_then_dropped_counted() -> None:
    rules = new()
    send(rules, {"type": "session.start", "session": {"model": "m"}})
    append = {"type": "session.input_audio.append", "audio": base64.b64encode(b"\0" * 960).decode()}
    first = send(rules, append, 0.2)
    assert error_code(first) == "session_not_started"
    second = send(rules, append, 0.3)
    assert events(second) == [] and LimitRefused("live_audio_dropped") in second
    later = send(rules, append, 0.2 + NOTICE_SECONDS)
    assert error_code(later) == "session_not_started"


def test_g711_audio_becomes_model_frames_and_mute_is_silence() -> None:
    rules = started({"model": "m", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}})
    pcm = (np.sin(np.arange(640) / 5.0) * 8000).astype(np.int16)  # 80 ms at 8 kHz
    audio = base64.b64encode(ulaw_encode(pcm).tobytes()).decode()
    frames: list[RunAudio] = []
    for _ in range(3):
        out = send(rules, {"type": "session.input_audio.append", "audio": audio}, 1.05)
        frames += [o for o in out if isinstance(o, RunAudio)]
    assert frames and all(f.samples.shape == (FIGURES.frame_samples,) for f in frames)
    assert all(f.sample_rate == FIGURES.input_sample_rate for f in frames)
    assert any(np.abs(f.samples).max() > 0.05 for f in frames)
    [muted] = events(send(rules, {"type": "session.input_audio.mute", "event_id": "m"}, 1.1))
    assert muted == {**muted, "type": "session.input_audio.muted", "client_event_id": "m"}
    quiet = []
    for _ in range(2):
        out = send(rules, {"type": "session.input_audio.append", "audio": audio}, 1.15)
        quiet += [o for o in out if isinstance(o, RunAudio)]
    assert quiet and all(not f.samples.any() for f in quiet)
    assert types(send(rules, {"type": "session.input_audio.unmute"}, 1.2)) == [
        "session.input_audio.unmuted"
    ]


def test_bad_audio_and_oversized_appends_are_refused() -> None:
    rules = started()
    out = send(rules, {"type": "session.input_audio.append", "audio": "not base64!"}, 1.1)
    assert error_code(out) == "invalid_value"
    long = base64.b64encode(b"\0" * 2 * 24_000 * 21).decode()  # 21 s at 24 kHz
    out = send(rules, {"type": "session.input_audio.append", "audio": long}, 1.2)
    assert error_code(out) == "invalid_value"
    assert "--max-pending-audio-seconds" in events(out)[0]["error"]["message"]


def test_frames_go_out_on_the_timeline_and_delegate_calls_become_delegations() -> None:
    rules = started()
    heard = UserTranscriptDelta(frame_index=0, delta="hi ", transcript="hi ")
    out = rules.slice_done(0, frame(0, heard), 1.1)
    assert types(out) == ["session.input_transcript.delta", "session.output_audio.delta"]
    [transcript, audio] = events(out)
    assert (transcript["start_ms"], transcript["end_ms"]) == (0, 80)
    assert "event_id" not in audio  # the primary WebSocket's audio carries none
    said = AssistantTextDelta(frame_index=1, token_id=5, delta="Sure", text="Sure")
    call = FunctionDelta(frame_index=1, token_id=6, delta=CALL, text=CALL)
    other = FunctionDelta(
        frame_index=1,
        token_id=7,
        delta='<TOOLCALL>[{"name": "x", "arguments": {}}]</TOOLCALL>',
        text="",
    )
    out = rules.slice_done(1, frame(1, said, call, other), 1.2)
    assert types(out) == [
        "session.output_transcript.delta",
        "session.delegation.created",
        "session.output_audio.delta",
    ]
    delegation = events(out)[1]
    assert delegation["offset_ms"] == 160
    assert delegation["delegation"]["target"] == "client"


def test_usage_each_second_of_the_timeline() -> None:
    rules = started()
    seen = []
    for i in range(26):
        seen += [e for e in events(rules.slice_done(i, frame(i), 1.0 + i * 0.08))]
    usage = [e["usage"]["seconds"] for e in seen if e["type"] == "session.usage.updated"]
    assert usage == [1.0, 2.0]


def delegated(rules: LiveRules) -> str:
    call = FunctionDelta(frame_index=0, token_id=6, delta=CALL, text=CALL)
    created = [
        e
        for e in events(rules.slice_done(0, frame(0, call), 1.1))
        if e["type"] == "session.delegation.created"
    ]
    return str(created[0]["delegation"]["id"])


def test_commentary_reaches_the_model_and_is_acknowledged() -> None:
    rules = started()
    delegation = delegated(rules)
    out = send(
        rules,
        {
            "type": "session.commentary.append",
            "event_id": "c1",
            "delegation_id": delegation,
            "content": "It is sunny.",
        },
        1.2,
    )
    assert out == [FeedModel(context_feed("commentary", "It is sunny."))]
    [ack] = events(rules.fed(None, 1.3, 9))
    assert ack["type"] == "session.commentary.appended"
    assert ack["client_event_id"] == "c1" and ack["start_ms"] == ack["end_ms"] == 80


def test_appends_name_a_delegation_of_this_session_and_are_bounded() -> None:
    rules = started()
    out = send(
        rules, {"type": "session.thinking.append", "delegation_id": "deleg_x", "content": "hm"}
    )
    assert error_code(out) == "invalid_value"
    for _ in range(MAX_QUEUED_FEEDS):
        out = send(rules, {"type": "session.thinking.append", "content": "hm"})
        assert isinstance(out[0], FeedModel)
    out = send(rules, {"type": "session.thinking.append", "content": "hm"})
    assert error_code(out) == "rate_limit_exceeded"
    failed = rules.fed(Failure("step_failed", "too long", "tool_result"), 1.5, 0)
    assert error_code(failed) == "invalid_value"


def test_instructions_appended_within_the_prompt_limit() -> None:
    limit = 400
    rules = started(limits=Limits(max_system_prompt_tokens=limit))
    left = limit - rules._prompt_tokens
    out = send(rules, {"type": "session.instructions.append", "content": "be kind"})
    [count] = out
    assert isinstance(count, CountTokens)
    out = rules.counted(count.text, left + 1, 1.3)
    assert "--max-system-prompt-tokens" in events(out)[0]["error"]["message"]
    send(rules, {"type": "session.instructions.append", "content": "be kind"})
    [feed] = rules.counted("be kind", left, 1.4)
    assert feed == FeedModel(context_feed("instructions", "be kind"))


def test_close_requested() -> None:
    rules = started()
    out = send(rules, {"type": "session.close", "event_id": "bye"}, 2.0)
    assert out[0] == StopModel()
    assert types(out) == ["session.usage.updated", "session.closed"]
    closed = events(out)[1]
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    assert out[-1] == Close(CLOSE_NORMAL, "session close_requested")
    assert rules.ending()[0] == "done"
    assert send(rules, {"type": "session.close"}, 2.1) == []


def test_expired_at_the_session_limit() -> None:
    rules = started(limits=Limits(live_max_seconds=0.24))  # three frames
    outs: list[Output] = []
    ran = 0
    for step in range(10):
        now = 1.0 + 0.5 * (step + 1)
        due = [o for o in rules.check_timeouts(now) if isinstance(o, RunAudio)]
        for _ in due:
            outs += rules.slice_done(ran, frame(ran), now)
            ran += 1
    assert ran == 3  # the timeline stops at the limit
    closed = [e for e in events(outs) if e["type"] == "session.closed"]
    assert [c["reason"] for c in closed] == ["expired"]


def test_unserved_events_say_why() -> None:
    rules = started()
    out = send(rules, {"type": "response.create"})
    assert error_code(out) == "unsupported_feature"
    out = send(rules, {"type": "session.output_audio.fixture.play", "fixture": "x"})
    assert error_code(out) == "unsupported_feature"


def test_no_start_within_the_configure_timeout() -> None:
    rules = new(Limits(configure_timeout=5.0))
    assert rules.next_check(0.0) <= 5.0
    out = rules.check_timeouts(5.0)
    assert error_code(out) == "session_start_timeout"
    assert out[-1] == Close(CLOSE_POLICY, "no session.start within 5 s; closing")


def test_a_client_that_stops_reading_is_dropped() -> None:
    rules = started(limits=Limits(send_timeout=2.0))
    rules.sending(3.0)
    assert rules.next_check(3.0) <= 5.0
    out = rules.check_timeouts(5.0)
    assert out == [Close(CLOSE_POLICY, "client stopped reading", now=True)]
    assert rules.ending()[0] == "stalled_client"


def test_silence_keeps_the_timeline_in_real_time() -> None:
    """From the client's first audio, or ``START_GRACE_SECONDS`` after the start."""
    rules = started()  # opened at 1.0
    assert rules.next_check(1.1) <= 1.0 + START_GRACE_SECONDS
    assert not [o for o in rules.check_timeouts(1.0 + START_GRACE_SECONDS - 0.01) if o]
    later = 1.0 + START_GRACE_SECONDS + 0.08 * 5
    quiet = [o for o in rules.check_timeouts(later) if isinstance(o, RunAudio)]
    assert quiet and all(not o.samples.any() for o in quiet)
    assert rules.next_check(later) > later  # no spin once the clock runs


def test_output_audio_is_in_the_session_format() -> None:
    rules = started({"model": "m", "audio": {"format": {"type": "audio/pcmu"}}})
    raw = b""
    for i in range(4):
        for event in events(rules.slice_done(i, frame(i), 1.1)):
            if event["type"] == "session.output_audio.delta":
                raw += base64.b64decode(event["delta"])
    # One byte a sample at 8 kHz: at most 4 frames' worth (the resampler holds a little).
    assert 0 < len(raw) <= 4 * 640
    assert PCMU.seconds(len(raw)) <= 0.32
