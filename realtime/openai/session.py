"""The GA session object: what ``session.update`` may change, and what the model
is opened with.

An update is merged into a copy and applied whole or not at all: the first
refusal (as an :class:`~realtime.openai.events.Invalid`) leaves the session as it
was. Instructions and tools are the system prompt, prefilled once when the model
opens, so from then on they are frozen.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final, Literal

from realtime.endpoints import OPENAI_SESSION_KEYS
from realtime.limits import prompt_refusal
from realtime.models.voicechat.tools import render_prompt
from realtime.openai import events as ev
from realtime.wire_audio import WireFormat, parse_format

Session = dict[str, Any]
Side = Literal["input", "output"]

SESSION_KEYS: Final = OPENAI_SESSION_KEYS
"""The GA session's fields; others are ignored (but see
:data:`realtime.openai.messages.NATIVE_SESSION_FIELDS`). The native endpoint names
this endpoint when a client sends it one of these (:mod:`realtime.endpoints`)."""
_FIXED_KEYS: Final = ("type", "model")
"""Accepted in an update and never changed: one kind of session, one model."""
_AUDIO_KEYS: Final = {
    "input": frozenset({"format", "transcription", "noise_reduction", "turn_detection"}),
    "output": frozenset({"format", "voice", "speed"}),
}
"""The GA ``session.audio`` settings; the dialect keeps no others."""
FROZEN_KEYS: Final = ("instructions", "tools")
"""Part of the system prompt, which is prefilled once when the model opens."""


_TURN_SWITCHES: Final = ("create_response", "interrupt_response")
"""The ``turn_detection`` settings the dialect honours (both default to true);
the VAD's thresholds describe nothing the model does and are only echoed."""


def audio_format(session: Session, side: Side) -> WireFormat:
    """``session.audio.<side>.format`` as a :class:`WireFormat` (the session holds only
    formats :func:`updated` accepted)."""
    fmt = parse_format(session["audio"][side]["format"], ev.FORMATS, default_rates=ev.DEFAULT_RATES)
    assert isinstance(fmt, WireFormat), fmt
    return fmt


def vad(session: Session) -> bool:
    """Whether the server draws the user's turns (``turn_detection`` not null)."""
    detection: object = session["audio"]["input"]["turn_detection"]
    return detection is not None


def _switch(session: Session, name: str) -> bool:
    detection: dict[str, Any] | None = session["audio"]["input"]["turn_detection"]
    return detection is not None and detection.get(name, True) is not False


def server_responds(session: Session) -> bool:
    """Whether a model turn (or tool call) opens a response by itself: server VAD with
    ``create_response``. Otherwise only ``response.create`` opens one."""
    return _switch(session, "create_response")


def interrupts(session: Session) -> bool:
    """Whether the user starting to speak cancels the active response: server VAD
    with ``interrupt_response``."""
    return _switch(session, "interrupt_response")


def modalities(session: Session) -> list[str]:
    """The session's ``output_modalities``: ``["audio"]`` or ``["text"]``."""
    return list(session["output_modalities"])


def system_prompt(session: Session) -> str | None:
    """What the model is opened with: the session's instructions and its tools."""
    tools = [t for t in session.get("tools") or [] if isinstance(t, dict)]
    return render_prompt(session.get("instructions"), tools)


def prefilled(session: Session) -> Session:
    """The part of ``session`` the model is opened with (:data:`FROZEN_KEYS`)."""
    return {key: session.get(key) for key in FROZEN_KEYS}


def updated(
    session: Session,
    update: Session,
    *,
    applied: Session | None,
    max_prompt_tokens: int,
    count_tokens: Callable[[str], int],
) -> Session | ev.Invalid:
    """``session`` with ``update`` merged, or why it is refused. ``applied``: what
    the model was opened with (``None`` while it is not)."""
    merged = _merged(session, update)
    if isinstance(merged, ev.Invalid):
        return merged
    problem = _check(merged)
    if problem is None:
        problem = _frozen_change(merged, applied)
    if problem is None and any(merged.get(k) != session.get(k) for k in FROZEN_KEYS):
        problem = _prompt_too_long(merged, max_prompt_tokens, count_tokens)
    return merged if problem is None else problem


def _invalid(param: str, message: str) -> ev.Invalid:
    return ev.Invalid("invalid_value", message, param)


def _merged(session: Session, update: Session) -> Session | ev.Invalid:
    merged = copy.deepcopy(session)
    for key, value in update.items():
        if key not in SESSION_KEYS or key in _FIXED_KEYS:
            continue
        if key == "audio":
            problem = _merge_audio(merged["audio"], value)
            if problem is not None:
                return problem
        else:
            merged[key] = value
    return merged


def _merge_audio(audio: Session, value: object) -> ev.Invalid | None:
    if not isinstance(value, dict):
        return _invalid("session.audio", "audio must be an object")
    for side in ("input", "output"):
        part = value.get(side)
        if part is None:
            continue
        if not isinstance(part, dict):
            return _invalid(f"session.audio.{side}", f"audio.{side} must be an object")
        for key, setting in part.items():
            problem = _audio_setting(audio[side], side, key, setting)
            if problem is not None:
                return problem
    return None


def _audio_setting(audio: Session, side: str, key: str, setting: object) -> ev.Invalid | None:
    """Set one ``session.audio.<side>`` setting, or why not."""
    if key == "format":
        fmt = parse_format(setting, ev.FORMATS, default_rates=ev.DEFAULT_RATES)
        if isinstance(fmt, str):
            return _invalid(f"session.audio.{side}.format", fmt)
        audio["format"] = ev.format_json(fmt)
    elif key == "turn_detection" and side == "input":
        detection = _turn_detection(setting)
        if isinstance(detection, ev.Invalid):
            return detection
        audio["turn_detection"] = detection
    elif key in _AUDIO_KEYS[side]:
        audio[key] = setting
    # Other keys are ignored, as unknown session keys are: were they kept, each
    # update could add one more to the session and every session.updated.
    return None


def _turn_detection(setting: object) -> Session | ev.Invalid | None:
    """``turn_detection`` as the session keeps it: null, or a VAD with both switches
    spelled out (as OpenAI echoes them, so a client reads what is in effect)."""
    param = "session.audio.input.turn_detection"
    if setting is None:
        return None
    if not isinstance(setting, dict) or setting.get("type") not in ("server_vad", "semantic_vad"):
        return _invalid(param, "turn_detection must be null, server_vad or semantic_vad")
    kept = dict(setting)
    for name in _TURN_SWITCHES:
        if kept.get(name) is None:  # absent or null: OpenAI's default
            kept[name] = True
        elif not isinstance(kept[name], bool):
            return _invalid(f"{param}.{name}", f"{name} must be true or false")
    return kept


def _check(session: Session) -> ev.Invalid | None:
    """What is wrong with a merged session, or None."""
    if session.get("instructions") is not None and not isinstance(session["instructions"], str):
        return _invalid("session.instructions", "instructions must be a string")
    tools = session.get("tools")
    if not isinstance(tools, list):
        return _invalid("session.tools", "tools must be a list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            return _invalid(f"session.tools[{i}]", "only function tools are served")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            return _invalid(f"session.tools[{i}].name", "a function tool needs a name")
    if session.get("output_modalities") not in (["audio"], ["text"]):
        return _invalid("session.output_modalities", "output_modalities is ['audio'] or ['text']")
    return None


def _frozen_change(merged: Session, applied: Session | None) -> ev.Invalid | None:
    """A change of what the model was opened with: refused, it cannot be redone."""
    if applied is None:
        return None
    changed = [k for k in FROZEN_KEYS if merged.get(k) != applied.get(k)]
    if not changed:
        return None
    return ev.Invalid(
        "session_already_started",
        f"{' and '.join(changed)} cannot change once the model has started: "
        "they are part of the system prompt it was opened with. Send them in "
        "the first session.update, before any audio or response.create; this "
        "update was not applied",
        f"session.{changed[0]}",
    )


def _prompt_too_long(
    session: Session, max_tokens: int, count_tokens: Callable[[str], int]
) -> ev.Invalid | None:
    refusal = prompt_refusal(
        system_prompt(session),
        max_tokens,
        count_tokens,
        field="session.instructions" + (" with the tools" if session["tools"] else ""),
    )
    if refusal is None:
        return None
    return _invalid("session.instructions", f"{refusal}; this update was not applied")
