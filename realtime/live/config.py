"""The Live session configuration (``SessionConfig``), checked strictly, and the session
resource (``SessionResource``) the server answers with.

Strict, as the Live API is: an unknown field is refused (``unknown_parameter``), a
field of the wrong type too, and what needs a backend this server has not (Responses or
Decisions delegation, stored sessions, WebRTC frontend capabilities, Decisions
triggers) is refused with why, never silently dropped. Pure: JSON in, a
:class:`LiveConfig` or an :class:`~realtime.openai.events.Invalid` out.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from realtime.live.messages import unknown_field
from realtime.openai import events as ev
from realtime.wire_audio import PCM16K, PCM24, PCMA, PCMU, WireFormat, parse_format

FORMATS: Final = (PCM24, PCM16K, PCMU, PCMA)
"""What a Live WebSocket may choose (one format both ways): PCM16 at 24 or 16 kHz,
G.711 μ-law or A-law at 8 kHz."""
DEFAULT_RATES: Final = {"audio/pcm": 24_000, "audio/pcmu": 8_000, "audio/pcma": 8_000}
DEFAULT_FORMAT: Final = PCM24
VOICE: Final = "voicechat"
"""The one voice the model speaks in (whatever voice a client names)."""
MAX_INPUT_ITEMS: Final = 128
"""Most startup history messages (the Live API's bound)."""

_CONFIG_KEYS: Final = frozenset(
    {
        "model",
        "audio",
        "client",
        "delegation",
        "input",
        "instructions",
        "safety_identifier",
        "store",
        "triggers",
    }
)
_ITEM_KEYS: Final = frozenset({"role", "content", "id", "status", "type"})
_PART_KEYS: Final = frozenset({"text", "type"})
_PART_TYPES: Final = {
    "developer": ("input_text",),
    "user": ("input_text",),
    "assistant": ("text", "output_text"),
}


@attrs.frozen(slots=True)
class LiveConfig:
    """A session configuration the server can serve."""

    model: str
    instructions: str | None
    history: tuple[tuple[str, str], ...]
    """The startup ``input``: (role, text) in order."""
    format: WireFormat
    delegation: dict[str, Any] | None
    safety_identifier: str | None
    raw_input: tuple[dict[str, Any], ...]
    """The ``input`` items as the client sent them (echoed in the resource)."""


def _bad(code: str, message: str, param: str) -> ev.Invalid:
    return ev.Invalid(code, message, param)


def _strict(value: object, allowed: frozenset[str], param: str) -> dict[str, Any] | ev.Invalid:
    if not isinstance(value, dict):
        return _bad("invalid_type", f"{param} must be an object", param)
    extra = unknown_field(value, allowed, f"{param}.")
    if extra is not None:
        return _bad("unknown_parameter", f"unknown parameter {extra!r}", extra)
    return value


def parse_config(session: Mapping[str, Any]) -> LiveConfig | ev.Invalid:
    """``session.start``'s ``session`` as a :class:`LiveConfig`, or the first problem."""
    checked = _strict(dict(session), _CONFIG_KEYS, "session")
    if isinstance(checked, ev.Invalid):
        return checked
    model = checked.get("model")
    if not isinstance(model, str) or not model:
        code = "missing_required_parameter" if model is None else "invalid_type"
        return _bad(code, "session.model is required (a model name)", "session.model")
    instructions = checked.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return _bad("invalid_type", "instructions must be a string", "session.instructions")
    refused = _unserved(checked)
    if refused is not None:
        return refused
    audio = _audio(checked.get("audio"))
    if isinstance(audio, ev.Invalid):
        return audio
    history = _history(checked.get("input"))
    if isinstance(history, ev.Invalid):
        return history
    delegation = _delegation(checked.get("delegation"), "session.delegation")
    if isinstance(delegation, ev.Invalid):
        return delegation
    safety = checked.get("safety_identifier")
    if safety is not None and not isinstance(safety, str):
        return _bad(
            "invalid_type", "safety_identifier must be a string", "session.safety_identifier"
        )
    items = tuple(dict(item) for item in checked.get("input") or ())
    return LiveConfig(
        model=model,
        instructions=instructions if instructions and instructions.strip() else None,
        history=history,
        format=audio,
        delegation=delegation,
        safety_identifier=safety,
        raw_input=items,
    )


def _unserved(session: Mapping[str, Any]) -> ev.Invalid | None:
    """What needs a feature this server has not, refused with why."""
    if session.get("store") not in (None, False):
        return _bad(
            "unsupported_feature",
            "stored sessions (store: true: forks, recording download) are not served here; "
            "record calls with the server's --record instead",
            "session.store",
        )
    if session.get("client") is not None:
        return _bad(
            "unsupported_feature",
            "client (WebRTC frontend capabilities) is for WebRTC sessions; this server "
            "serves the Live WebSocket only",
            "session.client",
        )
    triggers = session.get("triggers")
    if triggers is not None and triggers != []:
        return _bad(
            "unsupported_feature",
            "Decisions triggers need a Decisions backend, which this server has not",
            "session.triggers",
        )
    return None


def _audio(value: object) -> WireFormat | ev.Invalid:
    """The session's one format; a voice is checked for its type (the model speaks in
    one voice, :data:`VOICE`, whichever is named)."""
    if value is None:
        return DEFAULT_FORMAT
    audio = _strict(value, frozenset({"format", "output"}), "session.audio")
    if isinstance(audio, ev.Invalid):
        return audio
    fmt = DEFAULT_FORMAT
    if audio.get("format") is not None:
        checked = _strict(audio["format"], frozenset({"type", "rate"}), "session.audio.format")
        if isinstance(checked, ev.Invalid):
            return checked
        parsed = parse_format(checked, FORMATS, default_rates=DEFAULT_RATES)
        if isinstance(parsed, str):
            return _bad("invalid_value", parsed, "session.audio.format")
        fmt = parsed
    if audio.get("output") is not None:
        output = _strict(audio["output"], frozenset({"voice"}), "session.audio.output")
        if isinstance(output, ev.Invalid):
            return output
        asked = output.get("voice")
        if asked is not None and not isinstance(asked, (str, dict)):
            return _bad(
                "invalid_type",
                "voice is a voice name or a custom voice object",
                "session.audio.output.voice",
            )
    return fmt


def _history(value: object) -> tuple[tuple[str, str], ...] | ev.Invalid:
    if value is None:
        return ()
    if not isinstance(value, list):
        return _bad("invalid_type", "input must be a list of messages", "session.input")
    if len(value) > MAX_INPUT_ITEMS:
        return _bad(
            "invalid_value",
            f"input holds {len(value)} messages; at most {MAX_INPUT_ITEMS}",
            "session.input",
        )
    history = []
    for i, item in enumerate(value):
        one = _message(item, f"session.input[{i}]")
        if isinstance(one, ev.Invalid):
            return one
        history.append(one)
    return tuple(history)


def _message(item: object, param: str) -> tuple[str, str] | ev.Invalid:
    checked = _strict(item, _ITEM_KEYS, param)
    if isinstance(checked, ev.Invalid):
        return checked
    role = checked.get("role")
    if role not in _PART_TYPES:
        return _bad(
            "invalid_value",
            f"role must be developer, user or assistant, got {reprlib.repr(role)}",
            f"{param}.role",
        )
    if checked.get("type", "message") not in ("message", None):
        return _bad("invalid_value", "a history item's type is 'message'", f"{param}.type")
    if checked.get("status") not in (None, "incomplete", "completed"):
        return _bad("invalid_value", "status is incomplete or completed", f"{param}.status")
    if "id" in checked and not isinstance(checked["id"], (str, type(None))):
        return _bad("invalid_type", "id must be a string", f"{param}.id")
    content = checked.get("content")
    if not isinstance(content, list) or len(content) != 1:
        return _bad(
            "invalid_value",
            "a history message holds exactly one text part",
            f"{param}.content",
        )
    part = _strict(content[0], _PART_KEYS, f"{param}.content[0]")
    if isinstance(part, ev.Invalid):
        return part
    kinds = _PART_TYPES[str(role)]
    if part.get("type") not in (*kinds, None):
        return _bad(
            "invalid_value",
            f"a {role} message's part is of type {' or '.join(kinds)}",
            f"{param}.content[0].type",
        )
    text = part.get("text")
    if not isinstance(text, str):
        return _bad("invalid_type", "a part's text must be a string", f"{param}.content[0].text")
    return str(role), text


def _delegation(value: object, param: str) -> dict[str, Any] | ev.Invalid | None:
    """``delegation``: omitted, null or client (the application); the hosted backends
    are refused."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return _bad("invalid_type", "delegation must be an object or null", param)
    kind = value.get("type")
    if kind in ("responses", "decisions"):
        return _bad(
            "unsupported_feature",
            f"{kind} delegation needs OpenAI's hosted {kind.capitalize()} backend, which "
            "this server has not; use client delegation (omit delegation, or "
            "{'type': 'client'}) and answer session.delegation.created yourself",
            f"{param}.type",
        )
    if kind != "client":
        return _bad(
            "invalid_value", "delegation.type is client, responses or decisions", f"{param}.type"
        )
    checked = _strict(value, frozenset({"type", "acknowledgement_delay_ms"}), param)
    if isinstance(checked, ev.Invalid):
        return checked
    delay = checked.get("acknowledgement_delay_ms")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 0):
        return _bad(
            "invalid_value",
            "acknowledgement_delay_ms is a whole number of milliseconds >= 0",
            f"{param}.acknowledgement_delay_ms",
        )
    return dict(checked)


def updated_delegation(
    current: dict[str, Any] | None, update: Mapping[str, Any]
) -> dict[str, Any] | ev.Invalid | None:
    """``session.update``'s ``session`` (delegation and triggers only) applied to the
    current delegation, or why not."""
    checked = _strict(dict(update), frozenset({"delegation", "triggers"}), "session")
    if isinstance(checked, ev.Invalid):
        return checked
    triggers = checked.get("triggers")
    if triggers is not None and triggers != []:
        return _bad(
            "unsupported_feature",
            "Decisions triggers need a Decisions backend, which this server has not",
            "session.triggers",
        )
    if "delegation" not in checked:
        return current
    asked = _delegation(checked["delegation"], "session.delegation")
    if isinstance(asked, ev.Invalid) or asked is None:
        return asked if isinstance(asked, ev.Invalid) else current
    return {**(current or {}), **asked}


def resource(config: LiveConfig, *, session_id: str, model: str, expires_at: int) -> dict[str, Any]:
    """The ``SessionResource``: the configuration as resolved, with server defaults."""
    body: dict[str, Any] = {
        "id": session_id,
        "expires_at": expires_at,
        "model": model,
        "status": "active",
        "audio": {"format": config.format.as_json(), "output": {"voice": VOICE}},
        "delegation": config.delegation if config.delegation is not None else {"type": "client"},
        "input": [dict(item) for item in config.raw_input],
        "instructions": config.instructions or "",
        "store": False,
    }
    if config.safety_identifier is not None:
        body["safety_identifier"] = config.safety_identifier
    return body


def history_text(history: Sequence[tuple[str, str]]) -> str:
    """The startup history as one block of the prompt, a line a message."""
    names = {"developer": "Developer", "user": "User", "assistant": "Assistant"}
    return "\n".join(f"{names[role]}: {text}" for role, text in history)
