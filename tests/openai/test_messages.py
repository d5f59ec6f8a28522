"""Typed client messages, parsed as pure functions: each GA event to its value, each
malformed one to the refusal the client sees (with its own ``event_id`` echoed)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from realtime.openai import events as ev
from realtime.openai import messages as msg


def parse(message: dict[str, Any]) -> msg.Parsed:
    return msg.parse_message(json.dumps(message), max_bytes=1 << 20)


def refusal(message: dict[str, Any]) -> ev.Invalid:
    parsed = parse(message)
    assert isinstance(parsed, ev.Invalid), parsed
    return parsed


def test_each_served_type_has_its_message() -> None:
    pcm = base64.b64encode(np.zeros(48, "<i2").tobytes()).decode()
    parsed = {
        "session.update": parse({"type": "session.update", "session": {"instructions": "x"}}),
        "input_audio_buffer.append": parse({"type": "input_audio_buffer.append", "audio": pcm}),
        "input_audio_buffer.commit": parse({"type": "input_audio_buffer.commit"}),
        "input_audio_buffer.clear": parse({"type": "input_audio_buffer.clear"}),
        "output_audio_buffer.clear": parse({"type": "output_audio_buffer.clear"}),
        "conversation.item.create": parse({"type": _CREATE, "item": {"type": "message"}}),
        "conversation.item.retrieve": parse({"type": "conversation.item.retrieve"}),
        "conversation.item.truncate": parse({"type": "conversation.item.truncate"}),
        "conversation.item.delete": parse({"type": "conversation.item.delete", "item_id": "i"}),
        "response.create": parse({"type": "response.create"}),
        "response.cancel": parse({"type": "response.cancel"}),
    }
    assert set(parsed) == msg.CLIENT_TYPES
    assert not any(isinstance(m, ev.Invalid) for m in parsed.values())
    append = parsed["input_audio_buffer.append"]
    assert isinstance(append, msg.AudioAppend) and append.samples.shape == (48,)
    assert parsed["conversation.item.delete"] == msg.ItemDelete("i")
    assert parsed["conversation.item.retrieve"] == msg.ItemRetrieve("None", "None")


def test_loose_fields_are_normalised_as_the_dialect_answers_them() -> None:
    truncate = {"type": "conversation.item.truncate", "item_id": 3, "audio_end_ms": -5}
    assert parse(truncate) == msg.ItemTruncate("3", 0, 0)
    assert parse({"type": "response.cancel", "response_id": ""}) == msg.ResponseCancel(None)
    assert parse({"type": "response.cancel", "response_id": 7}) == msg.ResponseCancel(None)
    create = {"type": "response.create", "response": {"metadata": {"k": "v"}}}
    assert parse(create) == msg.ResponseCreate({"k": "v"})
    assert parse({"type": "response.create", "response": 3}) == msg.ResponseCreate(None)
    retrieve = {"type": "conversation.item.retrieve", "item_id": [1]}
    assert parse(retrieve) == msg.ItemRetrieve("[1]", "[1]")


_CREATE = "conversation.item.create"
_MALFORMED = [
    ({"type": "session.update", "session": "x"}, "invalid_value", "session"),
    ({"type": "session.update", "session": {"type": "x"}}, "invalid_value", "session.type"),
    ({"type": "input_audio_buffer.append", "audio": "!!"}, "invalid_value", "audio"),
    ({"type": _CREATE, "item": 3}, "invalid_value", "item"),
    ({"type": _CREATE, "item": {"id": "i"}}, "invalid_value", "item"),
    ({"type": _CREATE, "item": {"type": "m", "id": 7}}, "invalid_value", "item.id"),
    ({"type": "nope"}, "unknown_event", "type"),
]  # fmt: skip


@pytest.mark.parametrize(("message", "code", "param"), _MALFORMED)
def test_a_malformed_message_is_refused_with_its_event_id(
    message: dict[str, Any], code: str, param: str
) -> None:
    refused = refusal({**message, "event_id": "client_1"})
    assert (refused.code, refused.param, refused.event_id) == (code, param, "client_1")
    error = ev.refused(refused)["error"]
    assert error == {
        "type": "invalid_request_error",
        "code": code,
        "message": refused.message,
        "param": param,
        "event_id": "client_1",
    }
    assert refusal({**message, "event_id": 5}).event_id is None  # not a string: not echoed


def test_frames_that_are_not_client_events_are_refused_before_any_type() -> None:
    for frame, code in ((b"{}", "invalid_json"), ("{", "invalid_json"), ("[1]", "invalid_event")):
        refused = msg.parse_message(frame, max_bytes=100)
        assert isinstance(refused, ev.Invalid)
        assert (refused.code, refused.param, refused.event_id) == (code, None, None)
