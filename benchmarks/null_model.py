"""A zero-cost model: a fixed event set per 1280-sample frame, no compute.

Served through the real engine, protocol and socket, it shows the server's
own per-frame ceiling with the model taken out of the measurement.
"""

from __future__ import annotations

import numpy as np

from realtime.models.base import (
    AUDIO_CODEBOOKS,
    FRAME_SAMPLES,
    OUTPUT_FRAME_SAMPLES,
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    InferenceError,
    ModelEvent,
    Samples,
)

_SAMPLES = (np.sin(np.arange(OUTPUT_FRAME_SAMPLES, dtype=np.float32) * 0.05) * 0.2).astype(
    np.float32
)
_CODES = tuple(range(AUDIO_CODEBOOKS))


class NullSession:
    """Counts samples instead of buffering them; each full frame yields text + audio."""

    def __init__(self) -> None:
        self.pending = 0
        self.frame_index = 0
        self.closed = False

    def _frames(self) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        while self.pending >= FRAME_SAMPLES:
            self.pending -= FRAME_SAMPLES
            i = self.frame_index
            events.append(AssistantTextDelta(i, 100, "a", "a"))
            events.append(AudioDelta(i, _SAMPLES, _CODES))
            self.frame_index += 1
        return events

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        if self.closed:
            raise RuntimeError("streaming session is closed")
        if sample_rate != 16_000:
            raise InferenceError(f"expected 16000 Hz PCM, received {sample_rate} Hz")
        self.pending += int(samples.shape[0])
        return self._frames()

    def flush(self, pad_partial: bool) -> list[ModelEvent]:
        if self.closed:
            return []
        if self.pending and pad_partial:
            self.pending = FRAME_SAMPLES
        events = self._frames()
        self.pending = 0
        self.closed = True
        events.append(Done(self.frame_index))
        return events

    def cancel(self) -> list[ModelEvent]:
        if self.closed:
            return []
        self.closed = True
        return [Cancelled(self.frame_index)]


class NullModel:
    """The :class:`~realtime.models.base.RealtimeModel` of :class:`NullSession`."""

    @property
    def model_id(self) -> str:
        return "null-model"

    @property
    def path(self) -> str | None:
        return None

    def open_session(
        self, *, system_prompt: str | None, seed: int, max_streaming_seconds: float | None
    ) -> NullSession:
        return NullSession()

    def clear_cache(self) -> None:
        pass
