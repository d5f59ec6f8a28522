"""The two WebSocket endpoints and the words that tell them apart.

Each dialect refuses what only the other one sends with a hint naming the right
endpoint (a client pointed at the wrong one otherwise sees only an "unknown field").
The vocabulary lives here, below both dialects, so the native protocol never imports
the OpenAI package: the OpenAI dialect's parser table and session merge use these
sets as theirs (tests check they agree).
"""

from __future__ import annotations

from typing import Final, Literal

NATIVE_PATH: Final = "/v1/realtime"
OPENAI_PATH: Final = "/openai/v1/realtime"
LIVE_PATH: Final = "/openai/v1/live/sessions"
"""OpenAI's Live API (GPT-Live): ``base_url=http://HOST:PORT/openai/v1`` reaches it."""

ErrorCode = Literal[
    "invalid_request",
    "server_busy",
    "session_initialization_failed",
    "inference_error",
    "resume_failed",
    "resync_required",
    "invalid_ack",
    "session_replaced",
]
"""The native endpoint's ``error.code`` values (SPEC). Here, below the dialects, so the
metrics declare a series for each without importing the native dialect (which stands
above the session, which writes the call recordings in telemetry)."""

OPENAI_CLIENT_TYPES: Final = frozenset(
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
"""The OpenAI Realtime GA client events the OpenAI dialect serves."""

OPENAI_SESSION_KEYS: Final = frozenset(
    {
        "type",
        "instructions",
        "tools",
        "tool_choice",
        "audio",
        "output_modalities",
        "max_output_tokens",
        "model",
        "include",
        "tracing",
        "truncation",
        "prompt",
    }
)
"""The GA session's fields (the OpenAI dialect ignores others)."""

OPENAI_DIALECT_HINT: Final = (
    f"this is the native VoiceChat endpoint; the OpenAI Realtime dialect is at {OPENAI_PATH}"
)
"""Added to a native refusal of what only an OpenAI Realtime client sends."""
NATIVE_PROTOCOL_HINT: Final = f"the native VoiceChat protocol is at {NATIVE_PATH}"
"""Added to an OpenAI-dialect refusal of what only a native client sends."""
