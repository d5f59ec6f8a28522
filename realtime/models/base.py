"""The model seam: what the engine drives, in the project's own value types.

A model adapter (VoiceChat, or a fake in tests) turns its native events into
these so that the engine, the wire protocol and the clients never see MLX
arrays or mlx-vlm classes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 22_050
FRAME_SAMPLES = 1280
OUTPUT_FRAME_SAMPLES = 1764
AUDIO_CODEBOOKS = 31

Samples = npt.NDArray[np.float32]


@attrs.frozen(slots=True)
class AssistantTextDelta:
    frame_index: int
    token_id: int
    delta: str
    text: str


@attrs.frozen(slots=True)
class FunctionDelta:
    frame_index: int
    token_id: int
    delta: str
    text: str


@attrs.frozen(slots=True)
class UserTranscriptDelta:
    frame_index: int
    delta: str
    transcript: str


@attrs.frozen(slots=True, eq=False)
class AudioDelta:
    """One frame of speech: float32 samples at ``sample_rate`` and its RVQ codes."""

    frame_index: int
    samples: Samples
    audio_codes: tuple[int, ...]
    sample_rate: int = OUTPUT_SAMPLE_RATE
    end_of_turn: bool = False
    """The agent text channel emitted its end token on this frame (the model ends
    its turn). Pad, silence, bos and eos never reach the text deltas, so this is
    the one piece of the text channel the dialects cannot see otherwise."""


@attrs.frozen(slots=True)
class Done:
    frame_index: int


@attrs.frozen(slots=True)
class Cancelled:
    frame_index: int


ModelEvent = (
    AssistantTextDelta | FunctionDelta | UserTranscriptDelta | AudioDelta | Done | Cancelled
)


class SessionInitializationError(Exception):
    """Opening a session failed (bad options, prompt prefill); maps to
    ``session_initialization_failed`` on the wire."""


class SessionStopped(SessionInitializationError):
    """Opening was stopped between two prefill steps: the connection went away or
    cancelled, so the rest of the system prompt is not worth computing."""


def _no_beat() -> None:
    pass


@attrs.frozen(slots=True, eq=False)
class StepControl:
    """What the engine hands a long model call (opening a session prefills the system
    prompt one model step per token): a stop signal checked between steps and a
    heartbeat called after each, which the hung-call watchdog reads."""

    stop: threading.Event | None = None
    beat: Callable[[], None] = _no_beat

    def step(self) -> None:
        """Call between two model steps: raise SessionStopped if stopped, else beat."""
        if self.stop is not None and self.stop.is_set():
            raise SessionStopped("the session was stopped while it opened")
        self.beat()


class InferenceError(Exception):
    """A running session cannot go on (context limit, model failure); maps to
    ``inference_error`` on the wire."""


class ContextLimitReached(InferenceError):
    """The session reached its ``max_streaming_seconds`` bound: it takes no more audio
    (the server says so once, ends the response and closes normally)."""


class ModelSession(Protocol):
    """One streaming timeline. Every method runs on the engine thread."""

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]: ...

    def flush(self, pad_partial: bool) -> list[ModelEvent]: ...

    def cancel(self) -> list[ModelEvent]: ...


class RealtimeModel(Protocol):
    """A loaded model. Built by a loader callable on the engine thread."""

    @property
    def model_id(self) -> str:
        """The id clients see in ``session.updated.model`` and ``/v1/models``."""
        ...

    @property
    def path(self) -> str | None:
        """Where it was loaded from, if anywhere; ``session.model`` may name it."""
        ...

    def open_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        control: StepControl | None = None,
    ) -> ModelSession:
        """Seed, warm up and prefill ``system_prompt``, calling ``control.step()``
        between prefill steps."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many model steps prefilling ``text`` as the system prompt takes."""
        ...

    def clear_cache(self) -> None:
        """Free cached device buffers; called when a session closes, never per frame."""
        ...
