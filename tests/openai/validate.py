"""Strict checks of server events against the ``openai`` SDK's GA types.

The SDK's models accept unknown fields, so on top of pydantic validation of the
discriminated union (every required field, every literal) this also refuses
fields the GA types do not declare, except the session's ``id`` and ``object``
(sent by OpenAI itself and read by the SDK's own examples).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, TypeAdapter

ALLOWED_EXTRA = {("session", "id"), ("session", "object")}


@functools.cache
def _adapter() -> TypeAdapter[Any]:
    from openai.types.realtime import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent)


def _extras(model: Any, path: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    if isinstance(model, BaseModel):
        for key in model.model_extra or {}:
            if (path[-1] if path else "", key) not in ALLOWED_EXTRA:
                found.append(".".join((*path, key)))
        for name in type(model).model_fields:
            found += _extras(getattr(model, name), (*path, name))
    elif isinstance(model, list):
        for i, value in enumerate(model):
            found += _extras(value, (*path, str(i)))
    return found


def validate_ga(event: dict[str, Any]) -> Any:
    """The SDK model of ``event``; AssertionError when it is not a valid GA event."""
    model = _adapter().validate_python(event)
    assert type(model).__name__ != "dict", event
    assert model.type == event["type"], (model.type, event["type"])
    extra = _extras(model, ())
    assert not extra, f"{event['type']}: fields the GA types do not declare: {extra}"
    assert isinstance(event.get("event_id"), str) and event["event_id"].startswith("event_")
    return model
