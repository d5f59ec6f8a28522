"""Live client events as typed messages: one frozen value per event, built from the
client's JSON with every check that needs nothing but the message itself.

Strict, as the Live API is: a field the event does not define is an ``error``
(``unknown_parameter``), not ignored. :func:`parse_message` is the one door: bounded
JSON (:func:`realtime.openai.events.parse_client_event`, the same bounds as the
Realtime endpoint), a known ``type``, the fields that type takes. Checks that need the
session's state (started or not, the delegation ids, the format) are the rules'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import attrs

from realtime.openai import events as ev


@attrs.frozen(slots=True)
class _Message:
    event_id: str | None = attrs.field(default=None, kw_only=True)
    """The client's own ``event_id``: echoed as ``client_event_id``."""


@attrs.frozen(slots=True)
class Start(_Message):
    session: dict[str, Any]
    """The ``SessionConfig`` object, checked by :func:`realtime.live.config.parse_config`."""


@attrs.frozen(slots=True)
class Update(_Message):
    session: dict[str, Any]
    """The ``SessionUpdateConfig`` object (delegation and triggers only)."""


@attrs.frozen(slots=True)
class AudioAppend(_Message):
    audio: str
    """Base64 of raw audio in the session's format (decoded by the rules, which know it)."""


@attrs.frozen(slots=True)
class Mute(_Message):
    muted: bool
    """``session.input_audio.mute`` (True) or ``unmute`` (False)."""


ContextKind = Literal["instructions", "thinking", "commentary"]


@attrs.frozen(slots=True)
class ContextAppend(_Message):
    """``session.instructions.append``, ``session.thinking.append`` or
    ``session.commentary.append``: text the model takes into its context."""

    kind: ContextKind
    content: str
    delegation_id: str | None


@attrs.frozen(slots=True)
class Close(_Message):
    pass


@attrs.frozen(slots=True)
class Unserved(_Message):
    """A Live client event this server knows but cannot serve (a Responses or Decisions
    backend, audio fixtures): refused with why."""

    type: str


ClientMessage = Start | Update | AudioAppend | Mute | ContextAppend | Close | Unserved
Parsed = ClientMessage | ev.Invalid
_Raw = dict[str, Any]

UNSERVED: Final[Mapping[str, str]] = {
    "response.create": "a Responses delegation backend",
    "response.item.create": "a Responses delegation backend",
    "decision.create": "a Decisions delegation backend",
    "decision.item.create": "a Decisions delegation backend",
    "decision.item.delete": "a Decisions delegation backend",
    "session.output_audio.fixture.play": "audio fixtures",
}
"""Live client events that need what this server has not, and what that is."""

_CONTEXT: Final[Mapping[str, ContextKind]] = {
    "session.instructions.append": "instructions",
    "session.thinking.append": "thinking",
    "session.commentary.append": "commentary",
}


def unknown_field(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> str | None:
    """The first field of ``raw`` that ``allowed`` does not name (``where.field``), or None."""
    extra = sorted(str(key) for key in raw if key not in allowed)
    return f"{where}{extra[0]}" if extra else None


def _fields(raw: _Raw, allowed: frozenset[str], cid: str | None) -> ev.Invalid | None:
    extra = unknown_field(raw, allowed | {"type", "event_id"}, "")
    if extra is None:
        return None
    return ev.Invalid(
        "unknown_parameter", f"unknown parameter {extra!r} in {raw['type']}", extra, cid
    )


def _object(raw: _Raw, key: str, cid: str | None) -> dict[str, Any] | ev.Invalid:
    value = raw.get(key)
    if not isinstance(value, dict):
        return ev.Invalid(
            "missing_required_parameter" if value is None else "invalid_type",
            f"{raw['type']} needs a '{key}' object",
            key,
            cid,
        )
    return value


def _start(raw: _Raw, cid: str | None) -> Parsed:
    session = _fields(raw, frozenset({"session"}), cid) or _object(raw, "session", cid)
    return session if isinstance(session, ev.Invalid) else Start(session, event_id=cid)


def _update(raw: _Raw, cid: str | None) -> Parsed:
    session = _fields(raw, frozenset({"session"}), cid) or _object(raw, "session", cid)
    return session if isinstance(session, ev.Invalid) else Update(session, event_id=cid)


def _append(raw: _Raw, cid: str | None) -> Parsed:
    refused = _fields(raw, frozenset({"audio"}), cid)
    if refused is not None:
        return refused
    audio = raw.get("audio")
    if not isinstance(audio, str):
        return ev.Invalid("invalid_type", "audio must be a base64 string", "audio", cid)
    return AudioAppend(audio, event_id=cid)


def _context(raw: _Raw, cid: str | None) -> Parsed:
    refused = _fields(raw, frozenset({"content", "delegation_id"}), cid)
    if refused is not None:
        return refused
    content, delegation = raw.get("content"), raw.get("delegation_id")
    if not isinstance(content, str):
        code = "missing_required_parameter" if content is None else "invalid_type"
        return ev.Invalid(code, f"{raw['type']} needs 'content', a string", "content", cid)
    if delegation is not None and not isinstance(delegation, str):
        return ev.Invalid("invalid_type", "delegation_id is a string or null", "delegation_id", cid)
    return ContextAppend(_CONTEXT[raw["type"]], content, delegation, event_id=cid)


def _bare(make: Callable[[str | None], ClientMessage]) -> Callable[[_Raw, str | None], Parsed]:
    def parse(raw: _Raw, cid: str | None) -> Parsed:
        return _fields(raw, frozenset(), cid) or make(cid)

    return parse


_PARSERS: Final[Mapping[str, Callable[[_Raw, str | None], Parsed]]] = {
    "session.start": _start,
    "session.update": _update,
    "session.input_audio.append": _append,
    "session.input_audio.mute": _bare(lambda cid: Mute(True, event_id=cid)),
    "session.input_audio.unmute": _bare(lambda cid: Mute(False, event_id=cid)),
    **{kind: _context for kind in _CONTEXT},
    "session.close": _bare(lambda cid: Close(event_id=cid)),
}
CLIENT_TYPES: Final = frozenset(_PARSERS)
"""The Live client events this server serves."""


def parse_message(frame: str | bytes | None, *, max_bytes: int) -> Parsed:
    """One client frame as a typed message, or why it is refused."""
    raw = ev.parse_client_event(frame, max_bytes=max_bytes)
    if isinstance(raw, ev.Invalid):
        return raw
    kind: str = raw["type"]
    cid = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    if "event_id" in raw and not isinstance(raw["event_id"], str):
        return ev.Invalid("invalid_type", "event_id must be a string", "event_id", None)
    parse = _PARSERS.get(kind)
    if parse is not None:
        return parse(raw, cid)
    if kind in UNSERVED:
        return Unserved(kind, event_id=cid)
    return ev.Invalid("unknown_event", f"unknown Live client event type {kind!r}", "type", cid)
