"""Turns drawn from a full-duplex model's channels, one 80 ms frame at a time.

VoiceChat never takes turns explicitly; OpenAI clients think in them. This is
where the line is drawn, from the channels alone:

* **A model turn opens** on the first frame whose agent text channel carries a
  real token (not pad, silence, bos or eos: the adapter reports only real ones as
  text deltas).
* **It closes** on the text channel's end token (``AudioDelta.end_of_turn``) plus
  ``END_TAIL_FRAMES`` more frames, so speech still ringing out of the TTS is
  included; text in the tail cancels the end. A model that never says end gets
  the turn closed after ``QUIET_FRAMES`` frames without text.
* **A held turn** is one that opened with no response ready for it in a session
  where only the client opens responses (``turn_detection: null``, or
  ``create_response: false``): unheard, until a ``response.create`` claims it.
* **The user's turn** starts at the first transcript token and stops after
  ``USER_QUIET_FRAMES`` without one, or when the model takes the floor (with
  server VAD; otherwise only the client's commit ends it). Transcript that lags a
  commit still settles into the committed turn.

Frames in, :class:`TurnStep` (and :data:`UserBeat` values) out; what responses
and items they make is the dialect's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import attrs

from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    UserTranscriptDelta,
)
from realtime.openai.states import Trigger, TurnPhase, advance

END_TAIL_FRAMES: Final = 2
"""Frames of audio kept after the end token: the TTS's last syllable rings out."""
QUIET_FRAMES: Final = 25
"""A turn with no text for 2 s ends even without an end token."""
USER_QUIET_FRAMES: Final = 8
"""640 ms with no new user transcript ends the user's turn."""

_MUTED: Final = frozenset({TurnPhase.MUTED, TurnPhase.MUTED_TAIL})
_HELD: Final = frozenset({TurnPhase.HELD, TurnPhase.HELD_TAIL})
_HEARD: Final = frozenset({TurnPhase.SPEAKING, TurnPhase.TAIL})
_TAILS: Final = frozenset({TurnPhase.TAIL, TurnPhase.MUTED_TAIL, TurnPhase.HELD_TAIL})


@attrs.frozen(slots=True, eq=False)
class Channels:
    """One model frame, channel by channel."""

    index: int
    audio: AudioDelta | None
    text: bool
    """The agent text channel spoke (a real token) on this frame."""
    spoken: str
    functions: tuple[str, ...]
    """The function channel's deltas, in order: each may complete a call."""
    heard: str
    """The user transcript's new text."""


def channels(events: Sequence[ModelEvent], fallback_index: int) -> Channels:
    """``events`` of one frame sorted by channel; ``fallback_index`` numbers a frame
    without audio."""
    audio: AudioDelta | None = None
    text: list[str] = []
    functions: list[str] = []
    heard: list[str] = []
    for event in events:
        match event:
            case AudioDelta():
                audio = event
            case AssistantTextDelta():
                text.append(event.delta)
            case FunctionDelta():
                functions.append(event.delta)
            case UserTranscriptDelta():
                heard.append(event.delta)
    return Channels(
        index=audio.frame_index if audio is not None else fallback_index,
        audio=audio,
        text=bool(text),
        spoken="".join(text),
        functions=tuple(functions),
        heard="".join(heard),
    )


# --- the user's turn, as the client learns of it -------------------------------------------


@attrs.frozen(slots=True)
class SpeechStarted:
    item_id: str
    audio_start_ms: int


@attrs.frozen(slots=True)
class SpeechStopped:
    item_id: str
    audio_end_ms: int


@attrs.frozen(slots=True)
class Committed:
    """The user's turn is an item now (its transcript may still follow)."""

    item_id: str


@attrs.frozen(slots=True)
class Transcribed:
    item_id: str
    transcript: str
    seconds: float
    """How long the user spoke, by the transcript's frames."""


UserBeat = SpeechStarted | SpeechStopped | Committed | Transcribed


@attrs.frozen(slots=True)
class TurnStep:
    """What one frame did to the turns, in the order the client learns of it."""

    user: tuple[UserBeat, ...]
    speak: bool
    """The model speaks to the client on this frame (text, neither muted nor held)."""
    active: bool
    """A model turn is under way (after this frame's text, before its end)."""
    ended: bool
    """A model turn the client heard ended on this frame."""


@attrs.define(slots=True)
class _UserTurn:
    item_id: str
    start_frame: int
    transcript: str = ""
    last_frame: int = -1
    quiet: int = 0

    @property
    def spoke(self) -> bool:
        return self.last_frame >= 0


class Turns:
    """The model's turn and the user's, kept from frame to frame."""

    def __init__(self, new_id: Callable[[str], str], frame_seconds: float) -> None:
        self._new_id = new_id
        self._frame_seconds = frame_seconds
        self._frame_ms = round(frame_seconds * 1000)
        """One model frame, in the whole milliseconds the GA events carry."""
        self.phase = TurnPhase.BETWEEN
        self._quiet = 0
        """Frames of the model's turn without text."""
        self._tail = 0
        """Frames still to ring out after the end token (in a tail phase)."""
        self._user: _UserTurn | None = None
        self._settling: _UserTurn | None = None
        """A committed user turn whose transcript may still be arriving."""

    @property
    def active(self) -> bool:
        return self.phase is not TurnPhase.BETWEEN

    @property
    def speaking(self) -> bool:
        """A model turn the client hears is under way."""
        return self.phase in _HEARD

    @property
    def held(self) -> bool:
        """A model turn no response carries yet is under way (see :class:`TurnPhase`)."""
        return self.phase in _HELD

    @property
    def user_pending(self) -> bool:
        """The user's turn has started and is not committed yet."""
        return self._user is not None

    def mute(self) -> None:
        """The turn's response was cancelled, or the held turn is given up: the rest
        of it goes unheard."""
        if self.active:
            self.phase = advance(self.phase, Trigger.CANCEL)

    def claim(self) -> None:
        """A response takes the held turn: from now on the client hears it."""
        self.phase = advance(self.phase, Trigger.CLAIM)

    def forget_user(self) -> None:
        """``input_audio_buffer.clear``: the uncommitted user turn is dropped."""
        self._user = None

    def frame(self, frame: Channels, *, vad: bool, hold: bool = False) -> TurnStep:
        """One frame; ``hold``: a turn that opens on it has no response ready for it
        and none may open by itself (it is held)."""
        beats = self._hear(frame.heard, frame.index, vad=vad)
        speak = False
        if frame.text:
            self._quiet = 0
            opens = hold and self.phase is TurnPhase.BETWEEN
            self.phase = advance(self.phase, Trigger.HOLD if opens else Trigger.TEXT)
            speak = self.speaking
            floor = self.phase not in _MUTED
            if floor and vad and self._user is not None and self._user.spoke:
                # The model taking the floor ends the user's turn (heard or held):
                # commit it first, as OpenAI does; late transcript still settles into it.
                beats += self.commit(vad=vad, frame_index=frame.index)
        elif self.active:
            self._quiet += 1
        active = self.active
        return TurnStep(tuple(beats), speak, active, self._end(frame.audio))

    def _end(self, audio: AudioDelta | None) -> bool:
        """Whether the model's turn ends on this frame, and was heard."""
        if not self.active:
            return False
        if audio is not None and audio.end_of_turn and self.phase not in _TAILS:
            self.phase = advance(self.phase, Trigger.END_TOKEN)
            self._tail = END_TAIL_FRAMES
        elif self.phase in _TAILS:
            self._tail -= 1
        if (self.phase in _TAILS and self._tail <= 0) or self._quiet >= QUIET_FRAMES:
            heard = self.speaking
            self.phase = advance(self.phase, Trigger.TURN_END)
            self._quiet = 0
            return heard
        return False

    def _hear(self, said: str, frame: int, *, vad: bool) -> list[UserBeat]:
        beats: list[UserBeat] = []
        if self._settling is not None:
            beats += self._settle(self._settling, said)
            said = ""  # transcript lagging a commit belongs to the committed turn
        user = self._user
        if said:
            if user is None:
                user = self._user = _UserTurn(self._new_id("item"), frame)
                if vad:
                    beats.append(SpeechStarted(user.item_id, frame * self._frame_ms))
            user.transcript += said
            user.last_frame = frame
            user.quiet = 0
        elif user is not None and user.spoke:
            user.quiet += 1
            if vad and user.quiet >= USER_QUIET_FRAMES:
                beats += self.commit(vad=vad, frame_index=frame, settle=False)
        return beats

    def _settle(self, settling: _UserTurn, said: str) -> list[UserBeat]:
        """Late transcript for a committed turn; once quiet, its transcription."""
        if said:
            settling.transcript += said
            settling.quiet = 0
        else:
            settling.quiet += 1
        if settling.quiet >= USER_QUIET_FRAMES:
            return [self._transcribed(settling)]
        return []

    def commit(self, *, vad: bool, frame_index: int, settle: bool = True) -> list[UserBeat]:
        """End the user's turn (one that never spoke starts at ``frame_index``);
        ``settle``: transcript in the next frames still belongs to it."""
        user = self._user
        beats: list[UserBeat] = []
        if user is None:
            user = _UserTurn(self._new_id("item"), frame_index)
        elif vad and user.spoke:
            beats.append(SpeechStopped(user.item_id, (user.last_frame + 1) * self._frame_ms))
        self._user = None
        if self._settling is not None:
            beats.append(self._transcribed(self._settling))
        beats.append(Committed(user.item_id))
        if settle:
            self._settling = user
        else:
            beats.append(self._transcribed(user))
        return beats

    def _transcribed(self, user: _UserTurn) -> Transcribed:
        if self._settling is user:
            self._settling = None
        frames = max(user.last_frame + 1 - user.start_frame, 0)
        return Transcribed(user.item_id, user.transcript, frames * self._frame_seconds)
