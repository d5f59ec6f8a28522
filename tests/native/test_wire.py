"""The sans-IO wire protocol: parsing, PCM conversion and event building."""

from __future__ import annotations

import base64
import json
import re
import typing
from typing import Any

import numpy as np
import pytest

from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    FunctionDelta,
    UserTranscriptDelta,
)
from realtime.native import wire as protocol
from realtime.native.wire import ProtocolError, parse_client_message

EVENT_ID = re.compile(r"^event_[0-9a-f]{16}$")


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_ids_have_the_wire_shape() -> None:
    assert EVENT_ID.match(protocol.new_event_id())
    assert re.match(r"^sess_[0-9a-f]{16}$", protocol.new_session_id())
    assert protocol.new_event_id() != protocol.new_event_id()


def test_pcm16_round_trip() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768, 1234, -4321], dtype="<i2")
    samples = protocol.pcm16_from_base64(b64(pcm.tobytes()))
    assert samples.dtype == np.float32
    np.testing.assert_array_equal(samples, pcm.astype(np.float32) / 32768)
    assert samples.min() >= -1.0 and samples.max() < 1.0
    # Back to the wire: round(clip(x) * 32767) of x = pcm / 32768.
    back = np.frombuffer(base64.b64decode(protocol.audio_to_base64(samples)), dtype="<i2")
    np.testing.assert_array_equal(back, np.rint(pcm / 32768 * 32767).astype(np.int16))


def test_audio_to_base64_clips_and_rounds() -> None:
    x = np.array([2.0, -2.0, 0.5, -0.5, 1e-5, 0.49999 / 32767], dtype=np.float32)
    out = np.frombuffer(base64.b64decode(protocol.audio_to_base64(x)), dtype="<i2")
    assert out.tolist() == [32767, -32767, 16384, -16384, 0, 0]


def test_pcm16_is_little_endian() -> None:
    samples = protocol.pcm16_from_base64(b64(b"\x01\x00\x00\x01"))
    assert (samples * 32768).tolist() == [1.0, 256.0]


def test_odd_byte_count_rejected() -> None:
    with pytest.raises(ProtocolError, match="odd number of bytes \\(3\\)"):
        protocol.pcm16_from_base64(b64(b"\x00\x01\x02"))


@pytest.mark.parametrize("bad", ["!!!!", "AAA", "AA=A", "YWJj\n"])
def test_invalid_base64_rejected(bad: str) -> None:
    with pytest.raises(ProtocolError, match="not valid base64"):
        protocol.pcm16_from_base64(bad)


def test_event_mapping_names_and_fields() -> None:
    samples = np.linspace(-1.5, 1.5, 1764, dtype=np.float32)
    codes = tuple(range(31))
    cases: list[tuple[Any, dict[str, Any]]] = [
        (
            AssistantTextDelta(3, 42, "lo", "hello"),
            {
                "type": "response.text.delta",
                "frame_index": 3,
                "token_id": 42,
                "delta": "lo",
                "text": "hello",
            },
        ),
        (
            FunctionDelta(4, 7, "{", "{"),
            {
                "type": "response.function.delta",
                "frame_index": 4,
                "token_id": 7,
                "delta": "{",
                "text": "{",
            },
        ),
        (
            UserTranscriptDelta(5, " hi", "oh hi"),
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "frame_index": 5,
                "delta": " hi",
                "transcript": "oh hi",
            },
        ),
        (Done(9), {"type": "response.done", "frame_index": 9}),
        (Cancelled(2), {"type": "response.cancelled", "frame_index": 2}),
    ]
    for event, expected in cases:
        wire = protocol.wire_event(event)
        assert EVENT_ID.match(wire.pop("event_id"))
        assert wire == expected
    audio = protocol.wire_event(AudioDelta(6, samples, codes))
    assert EVENT_ID.match(audio.pop("event_id"))
    pcm = np.frombuffer(base64.b64decode(audio.pop("delta")), dtype="<i2")
    assert audio == {
        "type": "response.audio.delta",
        "frame_index": 6,
        "format": "pcm16",
        "sample_rate": 22050,
        "channels": 1,
        "audio_codes": list(range(31)),
    }
    assert pcm.shape == (1764,)
    np.testing.assert_array_equal(pcm, np.rint(np.clip(samples, -1, 1) * 32767))
    with pytest.raises(ValueError, match="31"):
        protocol.wire_event(AudioDelta(6, samples, (1, 2)))


def test_error_event_shape() -> None:
    for code in typing.get_args(protocol.ErrorCode):
        event = protocol.error_event(code, "why")
        assert event["type"] == "error" and EVENT_ID.match(event["event_id"])
        assert event["error"] == {"code": code, "message": "why"}
    assert (
        json.loads(protocol.serialize(protocol.error_event("server_busy", "é")))["error"]["message"]
        == "é"
    )


def test_session_events() -> None:
    created = protocol.session_created("sess_0123456789abcdef")
    assert created["session"] == {
        "id": "sess_0123456789abcdef",
        "state": "configuring",
        "input_audio_format": {"type": "pcm16", "sample_rate": 16000},
        "output_audio_format": {"type": "pcm16", "sample_rate": 22050},
    }
    updated = protocol.session_updated("sess_x", "m", protocol.SessionUpdate(seed=3))
    assert updated["session"]["state"] == "ready" and updated["session"]["model"] == "m"
    assert updated["session"]["frame_samples"] == 1280 and updated["session"]["seed"] == 3
    # Every field a client already reads stays; output_frame_samples is the one added.
    assert list(updated["session"]) == [
        "id",
        "state",
        "model",
        "frame_samples",
        "output_frame_samples",
        "system_prompt",
        "seed",
        "max_streaming_seconds",
        "input_audio_format",
        "output_audio_format",
    ]
    assert updated["session"]["output_frame_samples"] == 1764
    assert updated["session"]["input_audio_format"] == created["session"]["input_audio_format"]
    assert updated["session"]["output_audio_format"] == created["session"]["output_audio_format"]


VALID: list[tuple[Any, Any]] = [
    ({"type": "session.update"}, protocol.SessionUpdate()),
    (
        {
            "type": "session.update",
            "session": {
                "seed": 5,
                "system_prompt": "hi",
                "max_streaming_seconds": 30,
                "model": "m",
            },
        },
        protocol.SessionUpdate(model="m", system_prompt="hi", seed=5, max_streaming_seconds=30.0),
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": 0.5, "seed": 0}},
        protocol.SessionUpdate(max_streaming_seconds=0.5),
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": None}},
        protocol.SessionUpdate(),
    ),
    ({"type": "input_audio_buffer.commit"}, protocol.AudioCommit(pad_partial=True)),
    (
        {"type": "input_audio_buffer.commit", "pad_partial": False},
        protocol.AudioCommit(pad_partial=False),
    ),
    ({"type": "session.cancel"}, protocol.Cancel("session.cancel")),
    ({"type": "response.cancel"}, protocol.Cancel("response.cancel")),
    ({"type": "session.ping", "event_id": "client-1"}, protocol.Ping()),
]


@pytest.mark.parametrize(("message", "expected"), VALID)
def test_parse_valid_messages(message: dict[str, Any], expected: Any) -> None:
    assert parse_client_message(json.dumps(message)) == expected


def test_parse_append() -> None:
    msg = parse_client_message(
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": b64(b"\x00\x40" * 3),
                "sample_rate": 16000,
            }
        )
    )
    assert isinstance(msg, protocol.AudioAppend)
    assert msg.sample_rate == 16000 and msg.samples.tolist() == [0.5, 0.5, 0.5]
    msg = parse_client_message(
        json.dumps({"type": "input_audio_buffer.append", "audio": "", "sample_rate": 8000})
    )
    assert isinstance(msg, protocol.AudioAppend)
    # Any positive rate parses; the connection answers a wrong one with inference_error.
    assert msg.sample_rate == 8000 and msg.samples.shape == (0,)


INVALID: list[tuple[Any, str]] = [
    ("{", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({}, "type is required"),
    ({"type": 3}, "type must be a string"),
    ({"type": "response.create"}, "unknown message type 'response.create'"),
    ({"type": "session.update", "session": []}, "session must be an object"),
    ({"type": "session.update", "session": {"seed": -1}}, "session.seed must be an integer"),
    ({"type": "session.update", "session": {"seed": 1.5}}, "session.seed must be an integer"),
    ({"type": "session.update", "session": {"seed": "1"}}, "session.seed must be an integer"),
    ({"type": "session.update", "session": {"seed": True}}, "session.seed must be an integer"),
    ({"type": "session.update", "session": {"seed": 2**64}}, "session.seed must be an integer"),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": 0}},
        "session.max_streaming_seconds must lie between 0.08 (one frame) and 86400",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": -3}},
        "session.max_streaming_seconds must lie between",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": "10"}},
        "session.max_streaming_seconds must be a number > 0",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": False}},
        "session.max_streaming_seconds must be a number > 0",
    ),
    (
        '{"type": "session.update", "session": {"max_streaming_seconds": Infinity}}',
        "session.max_streaming_seconds must lie between",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": 1e308}},
        "session.max_streaming_seconds must lie between",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": 1e-300}},
        "session.max_streaming_seconds must lie between",
    ),
    (
        {"type": "session.update", "session": {"max_streaming_seconds": 10**400}},
        "session.max_streaming_seconds must lie between",
    ),
    (
        {"type": "session.update", "session": {"instructions": "x", "tools": []}},
        "unknown session fields 'instructions', 'tools'; accepted fields: model, system_prompt",
    ),
    (
        '{"type": "session.update", "session": {"system_prompt": "a\\ud800b"}}',
        "session.system_prompt is not valid Unicode",
    ),
    ('{"type": "session.ping", "n": ' + "9" * 5000 + "}", "message cannot be read"),
    (
        {"type": "session.update", "session": {"system_prompt": 5}},
        "session.system_prompt must be a string",
    ),
    ({"type": "session.update", "session": {"model": ["m"]}}, "session.model must be a string"),
    ({"type": "input_audio_buffer.commit", "pad_partial": "yes"}, "pad_partial must be a boolean"),
    ({"type": "input_audio_buffer.commit", "pad_partial": 1}, "pad_partial must be a boolean"),
    ({"type": "input_audio_buffer.append"}, "audio is required"),
    ({"type": "input_audio_buffer.append", "audio": 5}, "audio must be a base64 string"),
    ({"type": "input_audio_buffer.append", "audio": "AAAA"}, "odd number of bytes"),
    (
        {"type": "input_audio_buffer.append", "audio": "", "sample_rate": "16000"},
        "sample_rate must be a positive integer",
    ),
    (
        {"type": "input_audio_buffer.append", "audio": "", "sample_rate": 0},
        "sample_rate must be a positive integer",
    ),
    (
        {"type": "input_audio_buffer.append", "audio": "", "sample_rate": 16000.0},
        "sample_rate must be a positive integer",
    ),
]


@pytest.mark.parametrize(("message", "reason"), INVALID)
def test_parse_invalid_messages(message: Any, reason: str) -> None:
    frame = message if isinstance(message, str) else json.dumps(message)
    with pytest.raises(ProtocolError) as info:
        parse_client_message(frame)
    assert reason in info.value.message


def test_binary_frames_rejected() -> None:
    with pytest.raises(ProtocolError, match="binary frames are not supported"):
        parse_client_message(b'{"type": "session.ping"}')


@pytest.mark.parametrize(
    ("requested", "ok"),
    [
        ("NemotronLabs-VoiceChat-11B-4bit", True),
        ("mlx-community/NemotronLabs-VoiceChat-11B-4bit", True),
        ("models/NemotronLabs-VoiceChat-11B-4bit", True),
        ("models/NemotronLabs-VoiceChat-11B-4bit/", True),
        ("mlx-community/NemotronLabs-VoiceChat-11B-8bit", False),
        ("", False),
        ("gpt-4o-realtime", False),
    ],
)
def test_model_matches(requested: str, ok: bool) -> None:
    assert (
        protocol.model_matches(
            requested, "NemotronLabs-VoiceChat-11B-4bit", "models/NemotronLabs-VoiceChat-11B-4bit"
        )
        is ok
    )


HINT = (
    "this is the native VoiceChat endpoint; the OpenAI Realtime dialect is at /openai/v1/realtime"
)


def unknown_fields(*names: str) -> str:
    """The refusal of an update with these unknown fields, as it read before any hint."""
    listed = ", ".join(repr(n) for n in names)
    return (
        f"unknown session field{'s' if len(names) > 1 else ''} {listed}; "
        "accepted fields: model, system_prompt, seed, max_streaming_seconds"
    )


def unknown_type(kind: str) -> str:
    return f"unknown message type {kind!r}; expected one of {', '.join(protocol.CLIENT_TYPES)}"


def update(**session: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": session}


OPENAI_SHAPED: list[tuple[dict[str, Any], str]] = [
    (update(type="realtime", instructions="Be brief."), unknown_fields("instructions", "type")),
    (update(audio={}), unknown_fields("audio")),
    (update(output_modalities=["audio"], x=1), unknown_fields("output_modalities", "x")),
    (update(tools=[]), unknown_fields("tools")),
    (
        {"type": "conversation.item.create", "item": {"type": "message"}},
        unknown_type("conversation.item.create"),
    ),
    ({"type": "response.create"}, unknown_type("response.create")),
    ({"type": "input_audio_buffer.clear"}, unknown_type("input_audio_buffer.clear")),
    ({"type": "output_audio_buffer.clear"}, unknown_type("output_audio_buffer.clear")),
]


@pytest.mark.parametrize(("message", "refusal"), OPENAI_SHAPED)
def test_openai_shaped_messages_name_the_openai_endpoint(
    message: dict[str, Any], refusal: str
) -> None:
    """An OpenAI client at /v1/realtime: the same refusal, plus one clause saying where
    its dialect is served."""
    with pytest.raises(ProtocolError) as info:
        parse_client_message(json.dumps(message))
    assert info.value.message == f"{refusal}; {HINT}"


def test_other_refusals_keep_their_text_without_the_hint() -> None:
    """Only what an OpenAI client sends gets the hint; other mistakes read as before."""
    cases = [
        ({"type": "nope"}, unknown_type("nope")),
        (update(x=1), unknown_fields("x")),
        (update(prompt_=1, seed=1), unknown_fields("prompt_")),
    ]
    for message, refusal in cases:
        with pytest.raises(ProtocolError) as info:
            parse_client_message(json.dumps(message))
        assert info.value.message == refusal
