"""A scripted full-duplex model for the OpenAI-dialect tests (no weights).

Unlike :class:`realtime.models.fake.FakeModel`, which emits text on every frame,
this one behaves like a conversation partner, so a client's exchange does not
depend on timing: it transcribes voiced frames, and once the user has been quiet
for ``reply_after`` frames it plays its next :class:`Reply` frame by frame (text
tokens, pad frames, a tool call on the function channel, the end token), speaking
a pure tone at 22.05 kHz meanwhile. It records every frame it is pushed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import attrs
import numpy as np

from realtime.models.base import (
    AUDIO_CODEBOOKS,
    FRAME_SAMPLES,
    OUTPUT_FRAME_SAMPLES,
    OUTPUT_SAMPLE_RATE,
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    FunctionDelta,
    ModelEvent,
    Samples,
    UserTranscriptDelta,
)

TONE_HZ = 1000.0
VOICED_RMS = 0.01
WORDS = ("hello ", "there ", "model ", "how ", "are ", "you ")


@attrs.frozen
class Frame:
    """What the model says on one frame (``None``: a pad token)."""

    text: str | None = None
    function: str | None = None
    end: bool = False


PAD = Frame()
END = Frame(end=True)


@attrs.frozen
class Reply:
    frames: tuple[Frame, ...]

    @property
    def text(self) -> str:
        return "".join(f.text or "" for f in self.frames)


def say(*tokens: str | None) -> Reply:
    """A spoken reply: one token per frame (``None``: pad), the end token, then pads
    (the model listens again)."""
    return Reply((*(Frame(text=t) for t in tokens), END, PAD, PAD, PAD, PAD))


CALL = '<SPECIAL_20>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<SPECIAL_21>'


def call_then_say(*tokens: str | None) -> Reply:
    """A tool call on the function channel (in three pieces), then speech."""
    pieces = (CALL[:20], CALL[20:50], CALL[50:])
    return Reply((*(Frame(function=p) for p in pieces), PAD, *say(*tokens).frames))


class ScriptedSession:
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.frame_index = 0
        self.pending = np.zeros(0, np.float32)
        self.heard_voice = False
        self.quiet = 0
        self.words = 0
        self.playing: list[Frame] = []
        self.text = ""
        self.function = ""
        self.transcript = ""
        self.phase = 0.0
        self.closed = False

    def _frame(self, frame: Samples) -> list[ModelEvent]:
        i = self.frame_index
        model = self.model
        with model.lock:
            model.frames.append(frame.copy())
        events: list[ModelEvent] = []
        voiced = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) > VOICED_RMS
        if voiced:
            self.heard_voice = True
            self.quiet = 0
            if i % 2 == 0:
                word = WORDS[self.words % len(WORDS)]
                self.words += 1
                self.transcript += word
                events.append(UserTranscriptDelta(i, word, self.transcript))
        elif self.heard_voice:
            self.quiet += 1
            if self.quiet >= model.reply_after and model.replies:
                self.heard_voice = False
                self.playing += model.replies.pop(0).frames
        step = self.playing.pop(0) if self.playing else None
        speaking = step is not None and (step.text is not None or step.end)
        if step is not None and step.text:
            self.text += step.text
            events.append(AssistantTextDelta(i, 1000 + i, step.text, self.text))
        if step is not None and step.function:
            self.function += step.function
            events.append(FunctionDelta(i, 2000 + i, step.function, self.function))
        t = (np.arange(OUTPUT_FRAME_SAMPLES) + self.phase) / OUTPUT_SAMPLE_RATE
        amplitude = 0.5 if speaking or self.playing else 0.0
        samples = (amplitude * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
        self.phase += OUTPUT_FRAME_SAMPLES
        codes = tuple((i + k) % 1024 for k in range(AUDIO_CODEBOOKS))
        end = step is not None and step.end
        events.append(AudioDelta(i, samples, codes, end_of_turn=end))
        self.frame_index += 1
        return events

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        assert sample_rate == 16000
        self.pending = np.concatenate([self.pending, samples.astype(np.float32)])
        events: list[ModelEvent] = []
        while self.pending.shape[0] >= FRAME_SAMPLES:
            frame, self.pending = self.pending[:FRAME_SAMPLES], self.pending[FRAME_SAMPLES:]
            events += self._frame(frame)
        return events

    def flush(self, pad_partial: bool) -> list[ModelEvent]:
        self.closed = True
        return [Done(self.frame_index)]

    def cancel(self) -> list[ModelEvent]:
        if self.closed:
            return []
        self.closed = True
        return [Cancelled(self.frame_index)]


class ScriptedModel:
    """The :class:`~realtime.models.base.RealtimeModel` of :class:`ScriptedSession`."""

    def __init__(self, replies: Sequence[Reply] = (), *, reply_after: int = 3) -> None:
        self.replies = list(replies)
        self.reply_after = reply_after
        self.prompts: list[str | None] = []
        self.frames: list[Samples] = []
        self.lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return "scripted-voicechat"

    @property
    def path(self) -> str | None:
        return None

    def open_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        control: object = None,
    ) -> ScriptedSession:
        self.prompts.append(system_prompt)
        return ScriptedSession(self)

    def count_tokens(self, text: str) -> int:
        return len(text)

    def clear_cache(self) -> None:
        pass

    def heard(self) -> Samples:
        """Every 16 kHz sample the model was fed, in order."""
        with self.lock:
            return np.concatenate(self.frames) if self.frames else np.zeros(0, np.float32)
