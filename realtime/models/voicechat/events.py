"""mlx-vlm's ``VoiceChatEvent`` values as the project's model events (MLX arrays become
numpy and ints), and the turn ends mlx-vlm leaves out of them."""

from __future__ import annotations

from typing import Any, Final

import attrs
import numpy as np

from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    FunctionDelta,
    InferenceError,
    ModelEvent,
    ModelFigures,
    UserTranscriptDelta,
)

_TOKEN_DELTAS: Final[dict[str, type[AssistantTextDelta] | type[FunctionDelta]]] = {
    "assistant_text_delta": AssistantTextDelta,
    "function_delta": FunctionDelta,
}
"""mlx-vlm's two token channels by event kind: the same fields, their own value type."""


def convert(event: Any, figures: ModelFigures) -> ModelEvent:
    """An mlx-vlm ``VoiceChatEvent`` as a project value (MLX arrays become numpy/ints);
    an audio frame that does not match the model's figures is an InferenceError."""
    kind = event.kind
    frame = int(event.frame_index or 0)
    if kind == "audio":
        from realtime.models.voicechat.step import float_samples

        samples = float_samples(event.samples)
        codes = tuple(int(c) for c in np.asarray(event.audio_codes).reshape(-1).tolist())
        rate = int(event.sample_rate or figures.output_sample_rate)
        if (
            samples.shape[0] != figures.output_frame_samples
            or len(codes) != figures.codebooks
            or rate != figures.output_sample_rate
        ):
            raise InferenceError(
                f"unexpected audio frame: {samples.shape[0]} samples at {rate} Hz, "
                f"{len(codes)} codes"
            )
        return AudioDelta(frame_index=frame, samples=samples, audio_codes=codes, sample_rate=rate)
    token_delta = _TOKEN_DELTAS.get(kind)
    if token_delta is not None:
        return token_delta(
            frame_index=frame,
            token_id=int(event.token_id),
            delta=str(event.delta),
            text=str(event.text),
        )
    if kind == "user_transcript_delta":
        return UserTranscriptDelta(
            frame_index=frame, delta=str(event.delta), transcript=str(event.text)
        )
    if kind == "done":
        return Done(frame_index=frame)
    if kind == "cancelled":
        return Cancelled(frame_index=frame)
    raise InferenceError(f"unknown VoiceChat event kind {kind!r}")


def mark_turn_ends(inner: Any, events: list[ModelEvent], eos: int) -> list[ModelEvent]:
    """Set ``end_of_turn`` on each frame whose agent text token was ``eos``.

    mlx-vlm drops the special tokens from its text deltas, so the token is read
    from the streaming session's token list: its last entries are the frames
    just run, one per frame, in order (the prompt prefill comes before them).
    """
    tokens = getattr(inner, "_text_tokens", None)
    if not tokens:
        return events
    last = int(inner.frame_index) - 1
    out: list[ModelEvent] = []
    for event in events:
        if isinstance(event, AudioDelta):
            back = last - event.frame_index + 1
            if 0 < back <= len(tokens) and int(tokens[-back]) == eos:
                event = attrs.evolve(event, end_of_turn=True)
        out.append(event)
    return out
