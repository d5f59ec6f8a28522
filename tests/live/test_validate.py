"""The strict Live validator: what the stacks' tests hold every server event to."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.live.validate import validate_live

SESSION = {
    "id": "sess_1",
    "expires_at": 1_800_000_000,
    "model": "gpt-live-1",
    "status": "active",
    "instructions": "Be brief.",
    "audio": {"format": {"type": "audio/pcm", "rate": 24000}, "output": {"voice": "marin"}},
    "delegation": {"type": "client"},
}
VALID: list[dict[str, Any]] = [
    {"type": "session.started", "event_id": "event_1", "session": SESSION},
    {"type": "session.output_audio.delta", "delta": "AAAA"},
    {
        "type": "session.output_transcript.delta",
        "event_id": "event_2",
        "delta": "Hi",
        "start_ms": 0,
        "end_ms": 80,
    },
    {
        "type": "session.delegation.created",
        "event_id": "event_3",
        "offset_ms": 1200,
        "delegation": {"id": "dlg_1", "target": "client", "type": "delegation"},
    },
    {
        "type": "session.commentary.appended",
        "event_id": "event_4",
        "client_event_id": "c1",
        "start_ms": 1300,
        "end_ms": 1300,
    },
    {"type": "session.usage.updated", "event_id": "event_5", "usage": {"seconds": 3.0}},
    {
        "type": "session.closed",
        "event_id": "event_6",
        "reason": "close_requested",
        "session": SESSION,
        "usage": {"seconds": 3.0},
    },
    {
        "type": "error",
        "event_id": "event_7",
        "error": {"code": "unknown_parameter", "message": "no", "type": "invalid_request_error"},
    },
]


@pytest.mark.parametrize("event", VALID, ids=[e["type"] for e in VALID])
def test_valid_events_pass(event: dict[str, Any]) -> None:
    validate_live(event)


@pytest.mark.parametrize(
    ("event", "path"),
    [
        ({**VALID[0], "session": {**SESSION, "object": "live.session"}}, "session.object"),
        (
            {
                **VALID[0],
                "session": {
                    **SESSION,
                    "audio": {"format": {"type": "audio/pcm", "rate": 24000, "x": 1}},
                },
            },
            "session.audio.format.x",
        ),
        ({**VALID[3], "delegation": {**VALID[3]["delegation"], "task": "t"}}, "delegation.task"),
        # The types give an audio delta no event_id (nor client_event_id).
        ({**VALID[1], "event_id": "event_9"}, "event_id"),
    ],
)
def test_an_undeclared_field_fails_at_any_depth(event: dict[str, Any], path: str) -> None:
    with pytest.raises(AssertionError, match=path.replace(".", r"\.")):
        validate_live(event)


@pytest.mark.parametrize(
    "event",
    [
        {**VALID[3], "offset_ms": "1200"},  # strict: no string for a number
        {**VALID[4], "start_ms": None},
        {**VALID[6], "reason": "bye"},
        {k: v for k, v in VALID[0].items() if k != "event_id"},
        {**VALID[5], "usage": {}},
    ],
)
def test_an_invalid_event_fails(event: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        validate_live(event)


def test_an_unknown_type_fails() -> None:
    with pytest.raises(AssertionError, match="not a Live server event"):
        validate_live({"type": "response.done", "event_id": "event_1"})
