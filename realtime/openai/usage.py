"""``response.usage`` as OpenAI defines its fields, counted from what the model did.

A full-duplex model has one context per session: its system prompt, then one step per
80 ms frame it hears (the client's audio, and the silence the server feeds while the
client is quiet), with a tool's output fed in as text. OpenAI counts a response's
input as the whole context the response was made from, so each response's input is the
session's context when it ended; its output is what the model made for it.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(slots=True)
class Context:
    """The session's model context so far, one per dialect, read by every response."""

    text_tokens: int = 0
    """The system prompt's tokens, and each tool output's, as the model's tokenizer
    counts them."""
    cached_tokens: int = 0
    """Of those, the prompt's tokens that came from the prompt cache (0 without one)."""
    audio_frames: int = 0
    """Frames the model has heard: one audio token each."""


@attrs.define(slots=True)
class Made:
    """What the model made for one response."""

    text_tokens: int = 0
    """Text-channel tokens spoken into its message, and function-channel tokens of its
    tool calls."""
    audio_frames: int = 0
    """Frames of its audio sent to the client: one audio token each."""


def usage(context: Context | None = None, made: Made | None = None) -> dict[str, Any]:
    """The ``usage`` object (all zeros for a response still in progress)."""
    context = context or Context()
    made = made or Made()
    inputs = context.text_tokens + context.audio_frames
    outputs = made.text_tokens + made.audio_frames
    return {
        "total_tokens": inputs + outputs,
        "input_tokens": inputs,
        "output_tokens": outputs,
        "input_token_details": {
            "text_tokens": context.text_tokens,
            "audio_tokens": context.audio_frames,
            "image_tokens": 0,
            "cached_tokens": context.cached_tokens,
            "cached_tokens_details": {
                "text_tokens": context.cached_tokens,
                "audio_tokens": 0,
                "image_tokens": 0,
            },
        },
        "output_token_details": {
            "text_tokens": made.text_tokens,
            "audio_tokens": made.audio_frames,
        },
    }
