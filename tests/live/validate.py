"""Strict checks of Live server events against the ``openai`` SDK's ``openai.types.live``.

The SDK reads server events with ``construct`` (no validation) and its models accept
unknown fields, so a server could drift from the protocol unnoticed by the SDK. Here
every event is validated with pydantic (strict: no coercion of a string to a number)
against the ``ServerEvent`` union, and any field the types do not declare, at any
depth, fails: the Live API itself is strict about unknown fields.
"""

from __future__ import annotations

import functools
import typing
from typing import Any

from pydantic import BaseModel, TypeAdapter


@functools.cache
def _adapter() -> TypeAdapter[Any]:
    from openai.types.live import ServerEvent

    return TypeAdapter(ServerEvent)


@functools.cache
def _members() -> dict[str, TypeAdapter[Any]]:
    """Each ``ServerEvent`` member by its ``type``: validated alone first, so that a
    failure names that event's fields rather than every member of the union."""
    from openai.types.live import ServerEvent

    (union, *_) = typing.get_args(ServerEvent)
    members: dict[str, TypeAdapter[Any]] = {}
    for member in typing.get_args(union):
        for literal in typing.get_args(member.model_fields["type"].annotation):
            members[literal] = TypeAdapter(member)
    return members


def undeclared(model: object, path: tuple[str, ...] = ()) -> list[str]:
    """The dotted paths of every field in ``model`` (a validated SDK model, or a list
    or dict holding some) that its type does not declare."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        found += [".".join((*path, key)) for key in model.model_extra or {}]
        for name in type(model).model_fields:
            found += undeclared(getattr(model, name), (*path, name))
    elif isinstance(model, list | tuple):
        for i, value in enumerate(model):
            found += undeclared(value, (*path, str(i)))
    elif isinstance(model, dict):
        for key, value in model.items():
            found += undeclared(value, (*path, str(key)))
    return found


def validate_live(event: dict[str, Any]) -> None:
    """AssertionError (or pydantic's ValidationError) unless ``event`` is a valid Live
    server event with no field its type does not declare."""
    member = _members().get(event.get("type"))  # type: ignore[arg-type]
    assert member is not None, f"not a Live server event type: {event!r:.300}"
    member.validate_python(event, strict=True)
    model = _adapter().validate_python(event, strict=True)
    assert isinstance(model, BaseModel), event
    assert getattr(model, "type", None) == event["type"], (type(model).__name__, event)
    extra = undeclared(model)
    assert not extra, f"{event['type']}: fields openai.types.live does not declare: {extra}"
