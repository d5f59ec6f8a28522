"""Live server events as JSON-ready dicts, each with every field ``openai.types.live``
requires and nothing it does not declare (tests validate every event strictly).

Nothing here keeps state: :mod:`realtime.live.rules` decides what is sent.
"""

from __future__ import annotations

from typing import Any, Final

from realtime.openai.events import Invalid, new_id

Event = dict[str, Any]

CLOSE_REASONS: Final = ("close_requested", "expired", "connection_lost")
"""The ``session.closed`` reasons this server sends (``content`` and ``remote_hangup``
need a safety filter and a phone leg it has not)."""


def event(type_: str, *, client_event_id: str | None = None, **fields: Any) -> Event:
    body: Event = {"type": type_, "event_id": new_id("event"), **fields}
    if client_event_id is not None:
        body["client_event_id"] = client_event_id
    return body


def audio_delta(delta: str) -> Event:
    """``session.output_audio.delta``: on the primary WebSocket it carries no
    ``event_id`` and no timestamps (only reflected sideband audio has them)."""
    return {"type": "session.output_audio.delta", "delta": delta}


def error(
    message: str,
    *,
    code: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    client_event_id: str | None = None,
) -> Event:
    """An ``error`` event; ``client_event_id`` both in the error and on the event."""
    body: dict[str, Any] = {"code": code, "message": message, "type": type_}
    if param is not None:
        body["param"] = param
    if client_event_id is not None:
        body["client_event_id"] = client_event_id
    return event("error", client_event_id=client_event_id, error=body)


def refused(invalid: Invalid) -> Event:
    """The ``error`` event that refuses a client message (the session goes on)."""
    return error(
        invalid.message, code=invalid.code, param=invalid.param, client_event_id=invalid.event_id
    )


def span(type_: str, start_ms: int, end_ms: int, **fields: Any) -> Event:
    """An event placed on the session timeline."""
    return event(type_, start_ms=start_ms, end_ms=end_ms, **fields)


def usage(seconds: float, usage_ratio: float | None) -> dict[str, Any]:
    """``SessionUsage`` (whole seconds, cumulative) and, when the context limit is
    known, the ``context_window``."""
    fields: dict[str, Any] = {"usage": {"seconds": float(int(seconds))}}
    if usage_ratio is not None:
        fields["context_window"] = {"usage_ratio": min(1.0, max(0.0, usage_ratio))}
    return fields
