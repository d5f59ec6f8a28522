"""§8: the protocol parser against arbitrary frames.

Whatever a client sends (text, bytes, deep or huge JSON, JSON of the right shape
with wrong values), ``parse_client_message`` returns one of the client messages or
raises ProtocolError, and nothing else. (The state machine has its own hypothesis
test in tests/native/test_rules.py.)
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from realtime.native.wire import (
    CLIENT_TYPES,
    SESSION_FIELDS,
    AudioAppend,
    AudioCommit,
    Cancel,
    Ping,
    ProtocolError,
    SessionUpdate,
    parse_client_message,
)

MESSAGES = (SessionUpdate, AudioAppend, AudioCommit, Cancel, Ping)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
audio_values = st.one_of(
    json_values,
    st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
    st.text(alphabet="ABCD+/=\n -_", max_size=40),
)
session_objects = st.dictionaries(
    st.sampled_from((*SESSION_FIELDS, "instructions", "tools", "audio")), json_values
)
shaped = st.fixed_dictionaries(
    {"type": st.sampled_from((*CLIENT_TYPES, "response.create", "", "SESSION.UPDATE"))},
    optional={
        "session": st.one_of(session_objects, json_values),
        "audio": audio_values,
        "sample_rate": json_values,
        "pad_partial": json_values,
        "event_id": json_values,
    },
)


def check(frame: str | bytes) -> None:
    try:
        message = parse_client_message(frame)
    except ProtocolError as exc:
        assert isinstance(exc.message, str) and exc.message
        return
    assert isinstance(message, MESSAGES), message


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@FUZZ
@given(st.text())
def test_any_text(frame: str) -> None:
    check(frame)


@FUZZ
@given(st.binary())
def test_any_bytes(frame: bytes) -> None:
    check(frame)


@FUZZ
@given(json_values)
def test_any_json(value: Any) -> None:
    check(dumps(value))


@FUZZ
@given(shaped)
def test_messages_of_the_right_shape_with_any_values(message: dict[str, Any]) -> None:
    check(dumps(message))


@FUZZ
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from("[{"))
def test_deep_nesting(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    inner = "1" if opener == "[" else ""
    if opener == "{":
        frame = '{"a":' * depth + "1" + closer * depth
    else:
        frame = opener * depth + inner + closer * depth
    check(frame)
    check('{"type": "session.update", "session": ' + frame + "}")


@FUZZ
@given(
    st.sampled_from(("seed", "max_streaming_seconds", "system_prompt", "model")),
    st.integers(min_value=4000, max_value=6000),
    st.sampled_from(("", "-", "0.", "1e")),
)
def test_numbers_beyond_the_int_string_limit(field: str, digits: int, prefix: str) -> None:
    number = prefix + "7" * digits
    check('{"type": "session.update", "session": {"' + field + '": ' + number + "}}")
    check('{"type": "input_audio_buffer.append", "audio": "", "sample_rate": ' + number + "}")


def test_huge_frames() -> None:
    check('{"type": "session.update", "session": {"system_prompt": "' + "€" * 2_000_000 + '"}}')
    check('{"type": "session.ping", "x": ' + "9" * 100_000 + "}")
    check('{"type": "input_audio_buffer.append", "audio": "' + "A" * 4_000_001 + '"}')
    check("[" * 1_000_000)
