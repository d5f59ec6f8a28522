"""The built-in demo's turn-taking: a wrapper that makes the random-weight demo answer.

The demo checkpoint is VoiceChat's real network with random weights: fed speech, its
text channel never answers, so nothing downstream of a turn (the browser page, the
clients, an OpenAI SDK session) could be checked without the real model. This layer
keeps every frame running through mlx-vlm's network on MLX (so the cost and the audio
path stay real) and decides the turns on the host instead:

* :func:`decide` is the turn policy, a pure state machine over each input frame's
  energy (:func:`frame_energy_db`): a noise floor that learns steady noise at once and
  wavering noise within seconds, speech that stands clearly above it for about 250 ms,
  the user's turn ending after about 560 ms below it, then a scripted answer, one token
  a frame, ended with the end token; speech during the answer cuts it short, as talking
  over the real model does.
* :class:`DemoTurnModel` wraps the demo's model (the :class:`RealtimeModel` seam) and
  rewrites each frame's events by the policy: the answer's text from the demo's own
  tokenizer, its audio the network's TTS output shaped as a voice rises and falls
  (:func:`voice_envelope`), silence (zeros and the codec's silence codes) outside an
  answer, the network's random text, function and transcript deltas dropped.

Only the demo is wrapped (``realtime serve`` / ``generate --stream`` without ``-m``);
a real checkpoint decides its turns by itself.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import numpy as np

from realtime.models import base
from realtime.models.prompt_cache import AheadSlice, CacheFigures, CachesPrompts, KeepsStates
from realtime.models.voicechat import tools

SILENT_DB: Final = -100.0
"""The energy of digital silence (and the lowest any frame is given)."""


def frame_energy_db(samples: base.Samples, frame_samples: int | None = None) -> float:
    """One frame's energy in dB relative to full scale (mean square of float samples in
    [-1, 1]), at least :data:`SILENT_DB`. ``frame_samples``: the length the frame is
    counted over, for a short last frame padded with zeros (as the model hears it)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"a frame must be mono 1-D samples, got shape {x.shape}")
    length = x.shape[0] if frame_samples is None else frame_samples
    if length < x.shape[0] or length <= 0:
        raise ValueError(f"cannot count {x.shape[0]} samples over a {length}-sample frame")
    power = float(np.dot(x, x)) / length
    if not math.isfinite(power):
        raise ValueError("a frame's samples must be finite")
    return max(10.0 * math.log10(power), SILENT_DB) if power > 0 else SILENT_DB


def _positive(_: Any, attribute: attrs.Attribute[float], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{attribute.name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _level(_: Any, attribute: attrs.Attribute[float], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{attribute.name} must be a number, got {value!r}")
    if not (math.isfinite(value) and SILENT_DB <= value <= 0):
        raise ValueError(f"{attribute.name} must be a level in {SILENT_DB:g}..0 dBFS, got {value}")


@attrs.frozen(slots=True)
class TurnRules:
    """The policy's numbers. Times are in seconds and counted in whole frames of
    ``frame_seconds`` (at VoiceChat's 80 ms: onset 3 frames, end 7, steady 4)."""

    frame_seconds: float = attrs.field(default=0.08, validator=_positive)
    margin_db: float = attrs.field(default=9.0, validator=_positive)
    """Speech stands this far above the noise floor: room for a noise that wavers by a
    few dB (babble, a low rumble) without counting as speech."""
    min_speech_db: float = attrs.field(default=-50.0, validator=_level)
    """Quieter frames are never speech, whatever the floor (a near-silent microphone's
    hiss over digital silence)."""
    initial_floor_db: float = attrs.field(default=-60.0, validator=_level)
    """The floor before anything is heard: a quiet room, so a session that opens with
    speech hears it from its first frame (noise from the start is caught as steady)."""
    steady_db: float = attrs.field(default=2.0, validator=_positive)
    """Frames whose energies lie within this spread are steady: noise, not speech
    (white noise's 80 ms frames stay within half a dB; speech moves several dB from
    syllable to syllable)."""
    steady_seconds: float = attrs.field(default=0.32, validator=_positive)
    """A steady stretch this long lifts the floor to its level at once."""
    memory_seconds: float = attrs.field(default=3.0, validator=_positive)
    """The floor is never below the quietest frame of this long a stretch: a noise that
    wavers (never steady) is learned within it, while speech, which pauses between
    words and breaths, keeps the floor down at its pauses."""
    onset_seconds: float = attrs.field(default=0.24, validator=_positive)
    """Speech this long (frames above the floor, not steady) opens the user's turn."""
    onset_gap_seconds: float = attrs.field(default=0.16, validator=_positive)
    """A gap this long inside the onset is a consonant or a syllable's dip, not the end
    of it."""
    end_seconds: float = attrs.field(default=0.56, validator=_positive)
    """This long below the floor's threshold ends the user's turn; the answer's first
    token comes on the next frame."""

    onset_frames: int = attrs.field(init=False)
    onset_gap_frames: int = attrs.field(init=False)
    steady_frames: int = attrs.field(init=False)
    end_frames: int = attrs.field(init=False)
    memory_frames: int = attrs.field(init=False)
    """The times above in frames, counted once (the policy runs on every frame)."""

    def __attrs_post_init__(self) -> None:
        steady = self.frames(self.steady_seconds)
        counts = {
            "onset_frames": self.frames(self.onset_seconds),
            "onset_gap_frames": self.frames(self.onset_gap_seconds),
            "steady_frames": steady,
            "end_frames": self.frames(self.end_seconds),
            "memory_frames": max(self.frames(self.memory_seconds), steady),
        }
        for name, value in counts.items():
            object.__setattr__(self, name, value)

    def frames(self, seconds: float) -> int:
        """``seconds`` in whole frames, at least one."""
        return max(1, round(seconds / self.frame_seconds))


class Hear(enum.Enum):
    """What a frame tells of the user's turn."""

    NOTHING = "nothing"
    STARTED = "started"
    """Speech was confirmed on this frame: the user's turn has begun."""
    VOICED = "voiced"
    """A later frame of the user's turn, above the threshold."""


@attrs.frozen(slots=True)
class Plan:
    """What the demo does on one frame."""

    hear: Hear = Hear.NOTHING
    token: int | None = None
    """The answer's text token on this frame."""
    speak: bool = False
    """The answer's audio (the network's TTS output) plays on this frame."""
    end_of_turn: bool = False
    """The answer ends on this frame (its end token, or cut short by the user)."""
    heard_seconds: float | None = None
    """Set on the frame the user's turn ended: how long they spoke."""
    interrupted: bool = False
    """The user's speech cut the answer short on this frame."""


_NOTHING: Final = Plan()
_VOICED: Final = Plan(hear=Hear.VOICED)
_END: Final = Plan(speak=True, end_of_turn=True)


@attrs.frozen(slots=True)
class _Onset:
    """Speech being confirmed: its first frame, the energies of its frames above the
    threshold, the frames below it since the last one."""

    start: int
    voiced: tuple[float, ...]
    gap: int = 0


@attrs.frozen(slots=True)
class _UserTurn:
    start: int
    last_voiced: int
    quiet: int = 0


@attrs.frozen(slots=True)
class _Answer:
    tokens: tuple[int, ...]
    said: int = 0
    """Tokens already said; once all are, the next frame is the end frame."""


@attrs.frozen(slots=True)
class TurnState:
    """The policy's state between frames (:func:`initial_state`, then :func:`decide`)."""

    frame: int
    floor_db: float
    recent: tuple[float, ...] = ()
    """The last frames' energies (the floor's memory; its tail the steady window)."""
    onset: _Onset | None = None
    user: _UserTurn | None = None
    answer: _Answer | None = None

    @property
    def hearing(self) -> bool:
        """The user's turn is under way."""
        return self.user is not None

    @property
    def answering(self) -> bool:
        return self.answer is not None


Script = Callable[[float], Sequence[int]]
"""The answer to a user's turn of so many seconds, as text-channel token ids."""


def initial_state(rules: TurnRules) -> TurnState:
    return TurnState(frame=0, floor_db=rules.initial_floor_db)


def _spread(values: Sequence[float]) -> float:
    return max(values) - min(values) if values else 0.0


def _floor(rules: TurnRules, floor: float, recent: tuple[float, ...], energy: float) -> float:
    """The noise floor after a frame (``recent`` ends with it): down at once to anything
    quieter; up to the quietest frame of the memory once it is full; up at once to a
    steady stretch (so a steady noise, however loud, is floor within its window).
    Speech never lifts it while it pauses within the memory."""
    floor = min(floor, energy)
    if len(recent) >= rules.memory_frames:
        floor = max(floor, min(recent))
    steady = recent[-rules.steady_frames :]
    if len(steady) == rules.steady_frames and _spread(steady) <= rules.steady_db:
        floor = max(floor, min(steady))
    return floor


def decide(
    rules: TurnRules, state: TurnState, energy_db: float, script: Script
) -> tuple[TurnState, Plan]:
    """One frame of input energy through the policy: the next state and the frame's plan.

    ``script`` gives the answer's tokens once a user's turn has ended (an empty answer
    says nothing). Pure: the same states, energies and script give the same plans.
    """
    if isinstance(energy_db, bool) or not isinstance(energy_db, (int, float)):
        raise ValueError(f"energy_db must be a number, got {energy_db!r}")
    if math.isnan(energy_db) or energy_db == math.inf:
        raise ValueError(f"energy_db must be a level in dBFS, got {energy_db}")
    energy = max(float(energy_db), SILENT_DB)
    recent = (*state.recent, energy)[-rules.memory_frames :]
    floor = _floor(rules, state.floor_db, recent, energy)
    voiced = energy >= max(floor + rules.margin_db, rules.min_speech_db)
    now = state.frame
    if state.user is not None:
        return _hearing(rules, state.user, now, floor, recent, voiced=voiced, script=script)
    onset = _onset_after(rules, state.onset, now, energy, voiced=voiced)
    if onset is not None and _confirmed(rules, onset):
        user = _UserTurn(start=onset.start, last_voiced=now)
        cut = state.answer is not None and state.answer.said > 0
        plan = Plan(hear=Hear.STARTED, end_of_turn=cut, interrupted=cut)
        return TurnState(now + 1, floor, recent, user=user), plan
    answer, plan = _answering(state.answer)
    return TurnState(now + 1, floor, recent, onset=onset, answer=answer), plan


def _onset_after(
    rules: TurnRules, onset: _Onset | None, now: int, energy: float, *, voiced: bool
) -> _Onset | None:
    if voiced:
        if onset is None:
            return _Onset(start=now, voiced=(energy,))
        return _Onset(start=onset.start, voiced=(*onset.voiced, energy))
    if onset is None or onset.gap + 1 > rules.onset_gap_frames:
        return None
    return attrs.evolve(onset, gap=onset.gap + 1)


def _confirmed(rules: TurnRules, onset: _Onset) -> bool:
    """Long enough above the threshold, and not steady. The first frame is left out of
    the spread: a noise that starts inside it makes that frame quieter, not speech."""
    return len(onset.voiced) >= rules.onset_frames and _spread(onset.voiced[1:]) > rules.steady_db


def _hearing(
    rules: TurnRules,
    user: _UserTurn,
    now: int,
    floor: float,
    recent: tuple[float, ...],
    *,
    voiced: bool,
    script: Script,
) -> tuple[TurnState, Plan]:
    if voiced:
        return TurnState(now + 1, floor, recent, user=_UserTurn(user.start, now)), _VOICED
    quiet = user.quiet + 1
    if quiet < rules.end_frames:
        going = _UserTurn(user.start, user.last_voiced, quiet)
        return TurnState(now + 1, floor, recent, user=going), _NOTHING
    seconds = (user.last_voiced - user.start + 1) * rules.frame_seconds
    tokens = tuple(script(seconds))
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"the script's tokens must be ids >= 0, got {token!r}")
    answer = _Answer(tokens) if tokens else None
    return TurnState(now + 1, floor, recent, answer=answer), Plan(heard_seconds=seconds)


def answer_now(state: TurnState, tokens: Sequence[int]) -> TurnState:
    """``state`` with an answer of ``tokens`` starting on the next frame (a tool's result
    came back): whatever the user's turn or answer was under way gives way to it."""
    answer = _Answer(tuple(tokens)) if tokens else None
    return TurnState(state.frame, state.floor_db, state.recent, answer=answer)


def _answering(answer: _Answer | None) -> tuple[_Answer | None, Plan]:
    """The answer after this frame, and what the frame says of it."""
    if answer is None:
        return None, _NOTHING
    if answer.said < len(answer.tokens):
        token = answer.tokens[answer.said]
        return _Answer(answer.tokens, answer.said + 1), Plan(token=token, speak=True)
    return None, _END


# --- the answer's voice: the network's noise, shaped as speech rises and falls -----------

SYLLABLE_HZ: Final = 4.0
"""Syllables a second: a voice's loudness rises and falls at about this rate."""
VOICE_DIP: Final = 0.1
"""The gain between syllables (-20 dB): a voice dips, it does not stop."""


def voice_envelope(start: int, count: int, sample_rate: int) -> np.ndarray[Any, Any]:
    """The gains of samples ``start`` to ``start + count`` of an answer: a syllable a
    :data:`SYLLABLE_HZ` period, rising from :data:`VOICE_DIP` to 1 and back.

    The random network's voice is noise of a steady loudness (its 80 ms frames stay
    within a dB or two), which the turn policy rightly takes for noise, so the demo
    never heard its own answer through speakers. A real voice moves several dB from
    syllable to syllable; shaped so, the demo's answer is heard as speech, by the
    policy as by anyone listening, and cuts itself short when its echo comes back
    (the reason for echo cancellation)."""
    t = np.arange(start, start + count, dtype=np.float64) / sample_rate
    rise = np.sin(np.pi * SYLLABLE_HZ * t) ** 2
    return (VOICE_DIP + (1.0 - VOICE_DIP) * rise).astype(np.float32)


# --- the wrapper: the model seam around the demo's VoiceChat model ----------------------


def reply_text(seconds: float) -> str:
    """The demo's answer: what it heard, marked as the demo's. The demo tokenizer spells
    any text (byte-level BPE) but holds few whole words, so most of this goes a letter
    a token: short, so the answer fits the 3 s of silence clients append by default."""
    return f"(demo) I heard you for {seconds:.1f} s."


def tool_reply_text(output: str) -> str | None:
    """The demo's answer once given a tool's result: the result's first words, so a
    client's tool round trip shows in the conversation (the network took the result
    on its function channel; its random weights make nothing of it). Context a Live
    client appended (:func:`realtime.models.base.context_of`) is answered only when it
    is commentary, in its own words; thinking and instructions are silent (None)."""
    context = base.context_of(output)
    if context is not None:
        kind, text = context
        if kind != "commentary":
            return None
        output = text
    words = " ".join(output.split())
    short = words if len(words) <= 40 else words[:37] + "..."
    return f"(demo) The tool said: {short}"


# --- tool calls: the first declared tool, called in VoiceChat's own format ---------------

_PLACEHOLDERS: Final[dict[str, Any]] = {
    "string": "example",
    "integer": 1,
    "number": 1.0,
    "boolean": True,
    "array": [],
    "null": None,
}


def declared_tool(system_prompt: str | None) -> Mapping[str, Any] | None:
    """The first tool ``system_prompt`` declares
    (:func:`realtime.models.voicechat.tools.declared_tools`), or None (none declared,
    or a listing that does not parse)."""
    return next(iter(tools.declared_tools(system_prompt)), None)


_NO_VALUE: Final = object()
"""What :func:`_given_value` returns for a schema that names no value of its own."""


def _given_value(schema: Mapping[Any, Any]) -> Any:
    """The value ``schema`` names itself: its first example, else its default, else its
    const, else its first enum; :data:`_NO_VALUE` when it names none."""
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return examples[0]
    for key in ("default", "const"):
        if key in schema:
            return schema[key]
    enum_values = schema.get("enum")
    if isinstance(enum_values, list) and enum_values:
        return enum_values[0]
    return _NO_VALUE


def example_value(schema: object, depth: int = 0) -> Any:
    """A value for a JSON schema: its first example, else its default, else its first
    enum or const, else a placeholder of its type (an object's properties filled in
    the same way)."""
    if not isinstance(schema, Mapping):
        return _PLACEHOLDERS["string"]
    given = _given_value(schema)
    if given is not _NO_VALUE:
        return given
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "null")
    properties = schema.get("properties")
    if kind == "object" or (kind is None and isinstance(properties, Mapping)):
        if depth >= 8 or not isinstance(properties, Mapping):
            return {}
        return {str(k): example_value(v, depth + 1) for k, v in properties.items()}
    return _PLACEHOLDERS.get(kind, _PLACEHOLDERS["string"]) if isinstance(kind, str) else "example"


def tool_call_text(tool: Mapping[str, Any], figures: base.ModelFigures) -> str:
    """One call of ``tool`` on the function channel, in VoiceChat's format
    (:func:`realtime.models.voicechat.tools.render_call`, with the markers the figures
    name), its arguments from the tool's parameter schema."""
    arguments = example_value(tool.get("parameters", {"type": "object"}))
    if not isinstance(arguments, dict):
        arguments = {}
    return tools.render_call(tool["name"], arguments, tools.Markers.of(figures))


HEARD_START: Final = "(demo) speech"
"""The user transcript when speech is confirmed (the demo recognises no words)."""
HEARD_MORE: Final = "."
"""The user transcript's delta on each later frame of speech, so a dialect that follows
the transcript sees the user's turn go on as long as the speech does."""


class Speller(Protocol):
    """The demo tokenizer's two directions, as the answer's text deltas need them."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@attrs.frozen(slots=True)
class TokenizerSpeller:
    """A Hugging Face tokenizer (mlx-vlm's ``runtime.tokenizer``) as a :class:`Speller`,
    special tokens neither added nor skipped, as mlx-vlm's own text deltas decode."""

    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


class _Channel:
    """The answers' running text, delta by delta, as mlx-vlm's accumulator keeps it (the
    tokens decoded again, the new tail the delta), but per answer, so a long session's
    frame does not decode every answer before it."""

    def __init__(self, speller: Speller) -> None:
        self._speller = speller
        self._tokens: list[int] = []
        self._before = ""
        self._turn = ""

    @property
    def text(self) -> str:
        return self._before + self._turn

    def next_answer(self) -> None:
        self._before, self._turn, self._tokens = self.text, "", []

    def add(self, token: int) -> str:
        self._tokens.append(token)
        updated = self._speller.decode(self._tokens)
        if updated.startswith(self._turn):
            delta = updated[len(self._turn) :]
        else:
            delta = self._speller.decode([token])
        self._turn = updated
        return delta


class DemoTurnSession:
    """One conversation: the inner session's frames, rewritten by the policy.

    The energies are counted over the same frames the inner session cuts its input
    into (full frames as they fill; on a padded flush, the short tail over a whole
    frame), so each audio frame the network returns meets its own input's energy.
    """

    def __init__(
        self, inner: base.ModelSession, model: DemoTurnModel, tool: Mapping[str, Any] | None = None
    ) -> None:
        self.inner = inner
        self.model = model
        self._figures = model.figures
        self._rules = model.rules
        self._state = initial_state(model.rules)
        self._pending = np.zeros(0, dtype=np.float32)
        self._text = _Channel(model.speller)
        self._function = _Channel(model.speller)
        self._call: tuple[int, ...] = ()
        if tool is not None:
            self._call = tuple(model.speller.encode(tool_call_text(tool, self._figures)))
        """The function channel's tokens of the call that answers each of the user's
        turns (none when the session declares no tool): the tool's result, once a
        client sends it, is answered in words (:meth:`begin_tool_result`)."""
        self._once = tool is not None and tool.get("name") == base.DELEGATE_TOOL
        """The Live endpoint's ``delegate`` tool is called once, after the user's first
        turn; later turns are answered in words."""
        self._heard = ""
        self._voiced = 0
        """Samples of the answer under way already played (its envelope's position)."""
        self._silence = np.zeros(self._figures.output_frame_samples, dtype=np.float32)
        self._silence.flags.writeable = False

    @property
    def prompt_use(self) -> base.PromptUse:
        """The inner session's (:class:`realtime.models.base.UsesPrompt`)."""
        return (
            self.inner.prompt_use if isinstance(self.inner, base.UsesPrompt) else base.PromptUse()
        )

    @property
    def state(self) -> TurnState:
        """The policy's state (for tests and diagnostics)."""
        return self._state

    def push_audio(self, samples: base.Samples, sample_rate: int) -> list[base.ModelEvent]:
        return self.after_push(samples, self.inner.push_audio(samples, sample_rate))

    def after_push(
        self, samples: base.Samples, events: list[base.ModelEvent]
    ) -> list[base.ModelEvent]:
        """The inner session's events for a push of ``samples``, rewritten."""
        chunk = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._pending = np.concatenate([self._pending, chunk])  # a copy: never the caller's
        return self._rewrite(events, pad=False)

    def flush(self, pad_partial: bool) -> list[base.ModelEvent]:
        events = self.inner.flush(pad_partial)
        out = self._rewrite(events, pad=True)
        self._pending = np.zeros(0, dtype=np.float32)
        return out

    def cancel(self) -> list[base.ModelEvent]:
        return self.inner.cancel()

    def begin_tool_result(self, tool: base.ToolInput) -> base.ToolResultFeed:
        """The network takes the result (:class:`TakesToolResults`); once it is in, the
        demo answers with :func:`tool_reply_text` on the next frames."""
        if not isinstance(self.inner, base.TakesToolResults):
            raise base.InferenceError("this model takes no tool results")
        return _DemoToolFeed(self, self.inner.begin_tool_result(tool), tool.text)

    def answer(self, text: str) -> None:
        """Start an answer of ``text`` on the next frame."""
        self._text.next_answer()
        self._voiced = 0
        self._state = answer_now(self._state, self.model.speller.encode(text))

    def _next_energy(self, pad: bool) -> float:
        size = self._figures.frame_samples
        if self._pending.shape[0] >= size:
            frame, self._pending = self._pending[:size], self._pending[size:]
            return frame_energy_db(frame)
        if pad and self._pending.shape[0]:
            frame, self._pending = self._pending, np.zeros(0, dtype=np.float32)
            return frame_energy_db(frame, size)
        raise base.InferenceError(
            "the demo's turn layer lost count of the frames: the network returned a "
            f"frame for {self._pending.shape[0]} pending input samples"
        )

    def _rewrite(self, events: list[base.ModelEvent], *, pad: bool) -> list[base.ModelEvent]:
        out: list[base.ModelEvent] = []
        for event in events:
            if isinstance(event, base.AudioDelta):
                self._state, plan = decide(
                    self._rules, self._state, self._next_energy(pad), self._reply
                )
                out += self._frame(event, plan)
            elif isinstance(event, (base.Done, base.Cancelled)):
                out.append(event)
            elif not isinstance(
                event, (base.AssistantTextDelta, base.FunctionDelta, base.UserTranscriptDelta)
            ):
                raise base.InferenceError(f"the demo's turn layer got an unknown event {event!r}")
        return out

    def _reply(self, seconds: float) -> list[int]:
        if self._call:
            return []  # the call is the answer; the tool's result brings the words
        self._text.next_answer()
        return self.model.speller.encode(reply_text(seconds))

    def _frame(self, audio: base.AudioDelta, plan: Plan) -> list[base.ModelEvent]:
        index = audio.frame_index
        out: list[base.ModelEvent] = []
        if plan.hear is not Hear.NOTHING:
            said = HEARD_MORE
            if plan.hear is Hear.STARTED:
                said = HEARD_START  # a turn's first delta: no space before it
            self._heard += said
            out.append(
                base.UserTranscriptDelta(frame_index=index, delta=said, transcript=self._heard)
            )
        if plan.heard_seconds is not None and self._call:
            out += self._calling(index)
            if self._once:
                self._call = ()
        if plan.token is not None:
            delta = self._text.add(plan.token)
            out.append(
                base.AssistantTextDelta(
                    frame_index=index, token_id=plan.token, delta=delta, text=self._text.text
                )
            )
        if plan.speak:
            out.append(self._voice(audio, plan.end_of_turn))
        else:
            self._voiced = 0
            out.append(
                attrs.evolve(
                    audio,
                    samples=self._silence,
                    audio_codes=self.model.silence_codes,
                    end_of_turn=plan.end_of_turn,
                )
            )
        return out

    def _voice(self, audio: base.AudioDelta, end_of_turn: bool) -> base.AudioDelta:
        """A frame of the answer: the network's audio under the voice's envelope."""
        samples = np.asarray(audio.samples, dtype=np.float32).reshape(-1)
        gains = voice_envelope(self._voiced, samples.shape[0], audio.sample_rate)
        self._voiced = 0 if end_of_turn else self._voiced + samples.shape[0]
        return attrs.evolve(audio, samples=samples * gains, end_of_turn=end_of_turn)

    def _calling(self, index: int) -> list[base.ModelEvent]:
        """The call, a token a delta, whole on the frame the user's turn ended (one
        frame, not a few tokens a frame as the real model: a client's tool handler runs
        at once)."""
        self._function.next_answer()
        out: list[base.ModelEvent] = []
        for token in self._call:
            delta = self._function.add(token)
            text = self._function.text
            out.append(
                base.FunctionDelta(frame_index=index, token_id=token, delta=delta, text=text)
            )
        return out


class _DemoToolFeed:
    """The network's feed of a tool result; the demo's answer once it is in."""

    def __init__(self, session: DemoTurnSession, inner: base.ToolResultFeed, output: str) -> None:
        self._session = session
        self._inner = inner
        self._output = output

    def advance(self) -> bool:
        if not self._inner.advance():
            return False
        reply = tool_reply_text(self._output)
        if reply is not None:
            self._session.answer(reply)
        return True


class DemoTurnOpening:
    """The inner model's opening; its session comes out wrapped."""

    def __init__(
        self, inner: base.Opening, model: DemoTurnModel, tool: Mapping[str, Any] | None = None
    ) -> None:
        self._inner = inner
        self._model = model
        self._tool = tool

    @property
    def most_steps(self) -> int:
        """The inner opening's (:class:`~realtime.models.base.SizedSlices`; 1 when its
        slices cannot be sized)."""
        inner = self._inner
        return inner.most_steps if isinstance(inner, base.SizedSlices) else 1

    @property
    def steps_run(self) -> int:
        inner = self._inner
        return inner.steps_run if isinstance(inner, base.SizedSlices) else 0

    @property
    def steps_left(self) -> int:
        inner = self._inner
        return inner.steps_left if isinstance(inner, base.SizedSlices) else 0

    def advance(self) -> DemoTurnSession | None:
        return self._wrap(self._inner.advance())

    def advance_steps(self, steps: int) -> DemoTurnSession | None:
        """The inner opening's slice of at most ``steps`` steps, when it sizes them."""
        inner = self._inner
        if isinstance(inner, base.SizedSlices):
            return self._wrap(inner.advance_steps(steps))
        return self._wrap(inner.advance())

    def _wrap(self, session: base.ModelSession | None) -> DemoTurnSession | None:
        return None if session is None else DemoTurnSession(session, self._model, self._tool)

    def abandon(self) -> None:
        self._inner.abandon()


class DemoTurnModel:
    """The demo's model with the host-side turn policy on top (a :class:`RealtimeModel`).

    Everything but the turns is the inner model's: its id, path, figures, prompt
    counting, cache, and every frame's network step (one batched call for all rows).
    """

    def __init__(
        self,
        inner: base.RealtimeModel,
        speller: Speller,
        silence_codes: Sequence[int],
        rules: TurnRules | None = None,
    ) -> None:
        figures = inner.figures
        codes = tuple(int(c) for c in silence_codes)
        if len(codes) != figures.codebooks or any(c < 0 for c in codes):
            raise ValueError(
                f"silence_codes must be {figures.codebooks} codes >= 0, got {len(codes)}"
            )
        self.rules = rules or TurnRules(frame_seconds=figures.frame_seconds)
        if not math.isclose(self.rules.frame_seconds, figures.frame_seconds):
            raise ValueError(
                f"the rules count {self.rules.frame_seconds} s frames, the model "
                f"{figures.frame_seconds} s"
            )
        self.inner = inner
        self.speller = speller
        self.silence_codes = codes
        hidden = figures.hidden_token_ids
        sample = speller.encode(reply_text(1.0))
        if not sample or hidden.intersection(sample):
            raise ValueError(
                "the demo tokenizer cannot spell the demo's answer "
                f"(ids {sample}; bos, eos, pad and silence are {sorted(hidden)})"
            )

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def path(self) -> str | None:
        return self.inner.path

    @property
    def figures(self) -> base.ModelFigures:
        return self.inner.figures

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> DemoTurnOpening:
        opening = self.inner.begin_session(
            system_prompt=system_prompt,
            seed=seed,
            max_streaming_seconds=max_streaming_seconds,
            prompt_scope=prompt_scope,
        )
        return DemoTurnOpening(opening, self, declared_tool(system_prompt))

    def step(self, frames: Sequence[base.Frame]) -> list[base.RowResult]:
        """Unwrap the rows, run the inner model's step on all of them at once, rewrite
        each row's events (a row that failed keeps its exception)."""
        sessions: list[DemoTurnSession] = []
        rows: list[base.Frame] = []
        for session, samples, rate in frames:
            if not isinstance(session, DemoTurnSession) or session.model is not self:
                raise TypeError(f"not a session of this demo model: {session!r}")
            sessions.append(session)
            rows.append((session.inner, samples, rate))
        results = self.inner.step(rows)
        if len(results) != len(frames):
            raise RuntimeError(f"the model returned {len(results)} rows for {len(frames)}")
        out: list[base.RowResult] = []
        for session, (_, samples, _), result in zip(sessions, frames, results, strict=True):
            if isinstance(result, Exception):
                out.append(result)
                continue
            try:
                out.append(session.after_push(samples, result))
            except Exception as exc:
                out.append(exc)
        return out

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def tool_input(self, output: str) -> base.ToolInput:
        """The inner model's (:class:`PreparesToolResults`)."""
        if not isinstance(self.inner, base.PreparesToolResults):
            raise base.InferenceError("this model takes no tool results")
        return self.inner.tool_input(output)

    def prompt_cache_figures(self) -> CacheFigures:
        """The inner model's prompt cache (the demo turns change no prompt state)."""
        if isinstance(self.inner, CachesPrompts):
            return self.inner.prompt_cache_figures()
        return CacheFigures(0, 0, 0, 0, 0, 0, 0)

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        if isinstance(self.inner, base.CompilesStep):
            self.inner.compile_step(batch_sizes)

    def set_prompt_cache_bytes(self, max_bytes: int) -> None:
        if isinstance(self.inner, CachesPrompts):
            self.inner.set_prompt_cache_bytes(max_bytes)

    def pin_prompt_cache(self) -> None:
        if isinstance(self.inner, CachesPrompts):
            self.inner.pin_prompt_cache()

    def keep_states(
        self, directory: Path | None, max_bytes: int, *, ahead_seed: int, ahead_tokens: int
    ) -> None:
        """The inner model's (:class:`KeepsStates`)."""
        if isinstance(self.inner, KeepsStates):
            self.inner.keep_states(
                directory, max_bytes, ahead_seed=ahead_seed, ahead_tokens=ahead_tokens
            )

    def ahead(self, steps: int, quiet: bool) -> AheadSlice:
        if isinstance(self.inner, KeepsStates):
            return self.inner.ahead(steps, quiet)
        return AheadSlice(0, False)

    def clear_cache(self) -> None:
        self.inner.clear_cache()


def demo_turns(model: base.RealtimeModel) -> DemoTurnModel:
    """The loaded demo checkpoint with the demo's turns (run it where the model loaded:
    the codec's silence codes are read from an MLX array)."""
    from realtime.models.voicechat.model import VoiceChatModel

    if not isinstance(model, VoiceChatModel):
        raise TypeError(f"demo turns wrap the demo's VoiceChat model, got {type(model).__name__}")
    runtime = model.runtime
    codes = np.asarray(runtime.model.tts_model.codec_silence_tokens).reshape(-1).tolist()
    return DemoTurnModel(model, TokenizerSpeller(runtime.tokenizer), codes)


__all__ = [
    "DemoTurnModel",
    "DemoTurnSession",
    "Hear",
    "Plan",
    "TurnRules",
    "TurnState",
    "decide",
    "declared_tool",
    "demo_turns",
    "example_value",
    "frame_energy_db",
    "initial_state",
    "reply_text",
    "tool_call_text",
    "voice_envelope",
]
