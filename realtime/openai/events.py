"""GA OpenAI Realtime server events and the session object, as JSON-ready dicts.

Field sets follow the GA types of the ``openai`` SDK (``openai.types.realtime``);
every builder fills each required field, and every event carries a fresh
``event_id``. Nothing here keeps state: :mod:`realtime.openai.dialect` decides
what is sent, this module only spells it, and reads client events
(:func:`parse_client_event`) within bounds that keep any one message cheap;
:mod:`realtime.openai.messages` makes typed messages of them.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from typing import Any, Final

import attrs

from realtime import jsonbounds
from realtime.jsonbounds import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from realtime.jsonbounds import MAX_JSON_VALUES as MAX_JSON_VALUES
from realtime.jsonbounds import Shape as Shape
from realtime.jsonbounds import shape as shape
from realtime.jsonbounds import too_many_values as too_many_values
from realtime.jsonbounds import utf8_size as utf8_size
from realtime.openai.usage import usage as count_usage
from realtime.wire_audio import PCM24, PCMA, PCMU, WireFormat

Event = dict[str, Any]
Item = dict[str, Any]

FORMATS: Final = (PCM24, PCMU, PCMA)
"""The audio formats the GA dialect serves, each for input and output alike."""
DEFAULT_RATES: Final = {"audio/pcm": PCM24.rate, "audio/pcmu": PCMU.rate, "audio/pcma": PCMA.rate}
"""The rate of a format given without one (G.711 has none in the GA types)."""


def format_json(fmt: WireFormat) -> dict[str, Any]:
    """A format as GA session objects spell it: ``audio/pcm`` with its rate, G.711 by
    its type alone (``AudioPCMU`` and ``AudioPCMA`` declare no rate: 8 kHz is implied)."""
    spelled = fmt.as_json()
    if fmt.type != "audio/pcm":
        del spelled["rate"]
    return spelled


PCM_FORMAT: Final = format_json(PCM24)
DEFAULT_TURN_DETECTION: Final = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 640,
    "create_response": True,
    "interrupt_response": True,
}
"""Advertised because the model owns turn-taking; the numbers describe what the
server does (a user turn ends after 640 ms without new transcript), not a VAD."""
VOICE: Final = "voicechat"

_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
"""A ``\\uD800``-``\\uDFFF`` escape: half of a pair, or a lone surrogate."""


@attrs.frozen(slots=True)
class Invalid:
    """Why a client message was refused, as an ``invalid_request_error`` spells it
    (:func:`refused`)."""

    code: str
    message: str
    param: str | None = None
    """The field at fault, when one is."""
    event_id: str | None = None
    """The refused client event's own ``event_id``, echoed so the client can match."""


def _unicode(message: Any) -> bool:
    """Whether the parsed ``message`` can be sent back as UTF-8 (a ``\\ud800`` escape
    parses into a lone surrogate, which no UTF-8 encoder writes)."""
    try:
        serialize(message).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_client_event(frame: str | bytes | None, *, max_bytes: int) -> dict[str, Any] | Invalid:
    """One client message as an event object with a string ``type``, or why not.

    Cheap whatever the client sends: the size and the number of values are checked
    before ``json.loads`` builds anything, the nesting before anything walks the
    result recursively (a parse too deep for the C parser is refused the same way),
    and text that could not be echoed back is refused here rather than failing a
    socket write later.
    """
    if not isinstance(frame, str):
        return Invalid("invalid_json", "send JSON text messages")
    if len(frame) > max_bytes or utf8_size(frame) > max_bytes:
        return Invalid("message_too_large", f"message exceeds the {max_bytes}-byte limit")
    try:
        message = jsonbounds.load(frame)
    except jsonbounds.TooManyValues as exc:
        return Invalid("message_too_large", f"message {exc}; no client event needs that many")
    except jsonbounds.Refused as exc:
        return Invalid("invalid_json", f"message {exc}")
    if _SURROGATE_ESCAPE.search(frame) is not None and not _unicode(message):
        return Invalid(
            "invalid_json",
            "message holds an unpaired UTF-16 surrogate escape (\\ud800 to \\udfff), "
            "which is not Unicode text",
        )
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        return Invalid("invalid_event", "a client event is an object with a 'type'")
    return message


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def event(type_: str, **fields: Any) -> Event:
    return {"type": type_, "event_id": new_id("event"), **fields}


def serialize(ev: Event) -> str:
    return json.dumps(ev, separators=(",", ":"), ensure_ascii=False)


def error(
    message: str,
    *,
    code: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    client_event_id: str | None = None,
) -> Event:
    body: dict[str, Any] = {"type": type_, "code": code, "message": message}
    if param is not None:
        body["param"] = param
    if client_event_id is not None:
        body["event_id"] = client_event_id
    return event("error", error=body)


def refused(invalid: Invalid) -> Event:
    """The ``error`` event that refuses a client message (the session goes on)."""
    return error(
        invalid.message, code=invalid.code, param=invalid.param, client_event_id=invalid.event_id
    )


def default_session(session_id: str, model: str) -> dict[str, Any]:
    """The full GA session object a connection starts with."""
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": dict(PCM_FORMAT),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": dict(DEFAULT_TURN_DETECTION),
            },
            "output": {"format": dict(PCM_FORMAT), "voice": VOICE, "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
    }


def session_event(type_: str, session: dict[str, Any]) -> Event:
    return event(type_, session=copy.deepcopy(session))


# --- items --------------------------------------------------------------------------------


def assistant_message(
    item_id: str, status: str, *, transcript: str | None, text: bool = False
) -> Item:
    content: list[dict[str, Any]] = []
    if transcript is not None:
        content = [
            {"type": "output_text", "text": transcript}
            if text
            else {"type": "output_audio", "transcript": transcript}
        ]
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def user_message(item_id: str, transcript: str | None) -> Item:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def function_call(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def response(
    response_id: str,
    status: str,
    output: list[Item],
    *,
    modalities: list[str],
    metadata: Any = None,
    reason: str | None = None,
    usage: dict[str, Any] | None = None,
    output_format: WireFormat = PCM24,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output,
        "output_modalities": list(modalities),
        "audio": {"output": {"format": format_json(output_format), "voice": VOICE}},
        "conversation_id": "conv_default",
        "max_output_tokens": "inf",
        "metadata": metadata,
        "usage": usage if usage is not None else count_usage(),
    }
    if reason is not None:
        body["status_details"] = {"type": status, "reason": reason}
    return body
