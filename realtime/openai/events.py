"""GA OpenAI Realtime server events and the session object, as JSON-ready dicts.

Field sets follow the GA types of the ``openai`` SDK (``openai.types.realtime``);
every builder fills each required field, and every event carries a fresh
``event_id``. Nothing here keeps state: :mod:`realtime.openai.dialect` decides
what is sent, this module only spells it.
"""

from __future__ import annotations

import copy
import json
import secrets
from typing import Any, Final

from realtime.openai.audio import WIRE_RATE

Event = dict[str, Any]
Item = dict[str, Any]

PCM_FORMAT: Final = {"type": "audio/pcm", "rate": WIRE_RATE}
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

CLIENT_TYPES: Final = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "output_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
    }
)


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
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output,
        "output_modalities": list(modalities),
        "audio": {"output": {"format": dict(PCM_FORMAT), "voice": VOICE}},
        "conversation_id": "conv_default",
        "max_output_tokens": "inf",
        "metadata": metadata,
        "usage": {
            "total_tokens": 0,
            "input_tokens": 0,
            "output_tokens": 0,
        },
    }
    if reason is not None:
        body["status_details"] = {"type": status, "reason": reason}
    return body
