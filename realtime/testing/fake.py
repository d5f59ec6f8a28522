"""Models with no network behind them, for tests, scripted clients and benchmarks.

:class:`FakeModel` buffers audio like the real adapter and emits scriptable
per-frame text, transcript and function deltas, with injectable delays and
failures and a record of every call (which thread made it); with
``FakeOptions.batch_row_delay`` its :meth:`FakeModel.step` simulates a batched step
(one cost for the batch, a little more per row; each row's output its solo output). A :class:`Scene`
scripts a whole session frame by frame from what it hears; :func:`partner` is
one: a conversation partner that transcribes voiced input and answers when the
user goes quiet, speaking a tone (point an OpenAI client at a server with no
weights: ``Engine(lambda: FakeModel(partner([say("Hi!")])))``). :class:`NullModel`
is the zero-cost one: it only counts samples, so a benchmark served through the
real engine and socket measures the server and nothing else.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol

import attrs
import numpy as np

from realtime.models import base

Script = Callable[[int], str | None]
"""Frame index -> the delta a channel emits on that frame (None or "": nothing)."""

AudioScript = Callable[[int, base.Samples], base.Samples]
"""(frame index, the input frame heard) -> the frame's output samples (at the figures'
output rate)."""


@attrs.frozen(slots=True)
class Cue:
    """What a session says on one frame (``None`` or ``""``: nothing on that channel)."""

    text: str | None = None
    transcript: str | None = None
    function: str | None = None
    end_of_turn: bool = False
    """The text channel's end token (``AudioDelta.end_of_turn``)."""


QUIET: Final = Cue()
"""A frame with nothing on any channel (pad tokens)."""


class Scene(Protocol):
    """One session's script: sees each input frame, says what the frame carries."""

    def __call__(self, index: int, heard: base.Samples) -> Cue: ...


def _text(i: int) -> str:
    return f"t{i} "


def _transcript(i: int) -> str:
    return f"u{i} "


def _no_function(i: int) -> None:
    return None


@attrs.define
class FakeOptions:
    """What a :class:`FakeModel` does; mutable so a test can change it mid-run."""

    figures: base.ModelFigures = base.VOICECHAT_FIGURES
    """The model's rates, frame sizes and codebooks (another family's, to test that
    nothing assumes VoiceChat's)."""
    frame_delay: float = 0.0
    """Seconds each input frame 'computes' (sleeps on the engine thread)."""
    batch_row_delay: float | None = None
    """A batched step: :meth:`FakeModel.step` of B rows sleeps once for
    ``frame_delay + batch_row_delay x (B - 1)`` instead of ``frame_delay`` per row, the
    shape of a step bound by per-step overhead (weights read once for every row). None:
    no batched step, the rows run one after another (the cost of time slicing)."""
    audio_samples: int | None = None
    """Output samples per frame (None: ``figures.output_frame_samples``)."""
    fail_on_frame: int | None = None
    """Raise RuntimeError on this frame (an unexpected model failure)."""
    die_on_frame: int | None = None
    """Raise SystemExit on this frame, killing the engine thread."""
    open_error: str | None = None
    open_delay: float = 0.0
    """Seconds opening a session takes (warm-up and prompt prefill), in 10 ms slices
    between which the engine runs other work and honours a stop."""
    prefill_token_delay: float = 0.0
    """Seconds each system-prompt token's prefill slice takes (one token per character,
    as :meth:`FakeModel.count_tokens` counts), after ``open_delay``'s slices."""
    prefill_steps_per_slice: int = 1
    """Most of those steps (``open_delay``'s 10 ms ones, then the tokens') one slice runs:
    the engine asks for fewer to fit the gap between other conversations' frames
    (:class:`realtime.models.base.SizedSlices`), as it does of VoiceChat's prefill."""
    hang_on_frame: int | None = None
    """Block on this frame until ``FakeModel.unhang`` is set (a model call that never
    returns)."""
    hold_seeds: frozenset[int] = frozenset()
    """Every frame of a session opened with one of these seeds waits, before it runs,
    for a ``FakeModel.gate.release()`` (and releases ``FakeModel.held`` as it starts to
    wait): a test holds the engine thread while it queues other commands."""
    max_frames: int | None = None
    """Frames before the context limit (InferenceError) is hit."""
    text_every: int = 1
    """Text, transcript and function deltas go out on every n-th frame only."""
    text: Script = _text
    transcript: Script = _transcript
    function: Script = _no_function
    scene: Callable[[], Scene] | None = None
    """Makes each session's :class:`Scene`; when set it says what every frame carries
    (``text``, ``transcript``, ``function`` and ``text_every`` are not used)."""
    audio: AudioScript | None = None
    """The output samples of each frame (None: ``audio_samples`` samples at a level
    that follows the input's)."""
    tool_reply: Callable[[str], Reply] | None = None
    """What a session says once given a tool's output (its cues play on the frames
    after the output went in, before the scene's); None: it takes the output and says
    nothing of it. A tool result takes one engine slice per word of the output, plus
    one."""


def tone(
    hz: float, amplitude: float = 0.5, *, figures: base.ModelFigures = base.VOICECHAT_FIGURES
) -> AudioScript:
    """A continuous sine at ``hz``: each frame picks up the phase where the last ended."""
    step = 2 * np.pi * hz / figures.output_sample_rate
    size = figures.output_frame_samples
    offsets = np.arange(size, dtype=np.float64)

    def audio(index: int, heard: base.Samples) -> base.Samples:
        phase = (offsets + index * size) * step
        return (amplitude * np.sin(phase)).astype(np.float32)

    return audio


def _check_input(closed: bool, sample_rate: int, figures: base.ModelFigures) -> None:
    """What mlx-vlm does: no resampling, so another rate is refused."""
    if closed:
        raise RuntimeError("streaming session is closed")
    if sample_rate != figures.input_sample_rate:
        raise base.InferenceError(
            f"expected {figures.input_sample_rate} Hz PCM, received {sample_rate} Hz"
        )


class FakeSession:
    """One timeline of a :class:`FakeModel`: real buffering, scripted output."""

    def __init__(self, model: FakeModel, seed: int, max_frames: int | None) -> None:
        self.model = model
        self.figures = model.figures
        self.seed = seed
        self.max_frames = max_frames
        self.scene = model.options.scene() if model.options.scene is not None else None
        self.pending = np.zeros(0, dtype=np.float32)
        self.frame_index = 0
        self.closed = False
        self.text = ""
        self.transcript = ""
        self.function = ""
        self.answering: deque[Cue] = deque()
        """A tool result's scripted follow-up, played before the scene."""
        self.tool_results: list[str] = []

    def begin_tool_result(self, tool: base.ToolInput) -> FakeToolFeed:
        """:class:`realtime.models.base.TakesToolResults`: the output goes in over one
        step per word plus one; ``FakeOptions.tool_reply`` says what follows."""
        self.model.record("tool_result", tool.text)
        if self.closed:
            raise base.InferenceError("the session is closed")
        return FakeToolFeed(self, tool.text)

    def _cue(self, i: int, frame: base.Samples) -> Cue:
        if self.answering:
            cue = self.answering.popleft()
            if self.scene is not None:
                self.scene(i, frame)  # the scene still hears the frame
            return cue
        if self.scene is not None:
            return self.scene(i, frame)
        opts = self.model.options
        if i % opts.text_every:
            return QUIET
        return Cue(opts.text(i), opts.transcript(i), opts.function(i))

    def _deltas(self, i: int, cue: Cue) -> list[base.ModelEvent]:
        events: list[base.ModelEvent] = []
        if cue.text:
            self.text += cue.text
            events.append(base.AssistantTextDelta(i, 100 + i, cue.text, self.text))
        if cue.transcript:
            self.transcript += cue.transcript
            events.append(base.UserTranscriptDelta(i, cue.transcript, self.transcript))
        if cue.function:
            self.function += cue.function
            events.append(base.FunctionDelta(i, 200 + i, cue.function, self.function))
        return events

    def _frame(self, frame: base.Samples, *, delay: bool = True) -> list[base.ModelEvent]:
        opts = self.model.options
        if self.max_frames is not None and self.frame_index >= self.max_frames:
            raise base.ContextLimitReached(f"context limit of {self.max_frames} frames reached")
        if delay and opts.frame_delay:
            time.sleep(opts.frame_delay)
        if opts.fail_on_frame == self.frame_index:
            raise RuntimeError("fake model failure")
        if opts.die_on_frame == self.frame_index:
            raise SystemExit("fake engine death")
        if opts.hang_on_frame == self.frame_index:
            self.model.hanging.set()
            self.model.unhang.wait()
        if self.seed in opts.hold_seeds:
            self.model.held.release()
            self.model.gate.acquire()
        i = self.frame_index
        cue = self._cue(i, frame)
        events = self._deltas(i, cue)
        if opts.audio is not None:
            samples = opts.audio(i, frame)
        else:
            level = float(np.abs(frame).mean()) if frame.size else 0.0
            size = opts.audio_samples
            if size is None:
                size = self.figures.output_frame_samples
            samples = np.full(size, min(level + 0.001 * (i % 7), 0.99), np.float32)
        codes = tuple((i + self.seed + k) % 1024 for k in range(self.figures.codebooks))
        rate = self.figures.output_sample_rate
        events.append(base.AudioDelta(i, samples, codes, rate, end_of_turn=cue.end_of_turn))
        self.model.frames_run += 1
        self.frame_index += 1
        return events

    def push_audio(self, samples: base.Samples, sample_rate: int) -> list[base.ModelEvent]:
        return self.push(samples, sample_rate, delay=True)

    def push(
        self, samples: base.Samples, sample_rate: int, *, delay: bool
    ) -> list[base.ModelEvent]:
        """:meth:`push_audio`; ``delay`` False when a batched step slept for its rows."""
        self.model.record("push", int(samples.shape[0]))
        _check_input(self.closed, sample_rate, self.figures)
        self.pending = np.concatenate([self.pending, samples.astype(np.float32)])
        events: list[base.ModelEvent] = []
        size = self.figures.frame_samples
        while self.pending.shape[0] >= size:
            frame, self.pending = self.pending[:size], self.pending[size:]
            events.extend(self._frame(frame, delay=delay))
        return events

    def flush(self, pad_partial: bool) -> list[base.ModelEvent]:
        self.model.record("flush", pad_partial)
        if self.closed:
            return []
        events: list[base.ModelEvent] = []
        if self.pending.shape[0] and pad_partial:
            frame = np.zeros(self.figures.frame_samples, np.float32)
            frame[: self.pending.shape[0]] = self.pending
            try:
                events.extend(self._frame(frame))
            except base.InferenceError:
                pass
        self.pending = np.zeros(0, dtype=np.float32)
        self.closed = True
        events.append(base.Done(self.frame_index))
        return events

    def cancel(self) -> list[base.ModelEvent]:
        self.model.record("cancel", None)
        if self.closed:
            return []
        self.closed = True
        return [base.Cancelled(self.frame_index)]


class FakeToolFeed:
    """A fake tool result going in (:class:`realtime.models.base.ToolResultFeed`)."""

    def __init__(self, session: FakeSession, output: str) -> None:
        self._session = session
        self._output = output
        self._left = len(output.split()) + 1

    def advance(self) -> bool:
        session = self._session
        if session.closed:
            raise base.InferenceError("the session is closed")
        session.model.record("tool_step", self._left)
        if session.model.options.frame_delay:
            time.sleep(session.model.options.frame_delay)
        self._left -= 1
        if self._left > 0:
            return False
        session.tool_results.append(self._output)
        reply = session.model.options.tool_reply
        if reply is not None:
            session.answering.extend(reply(self._output).cues)
        return True


class FakeOpening:
    """An opening whose steps sleep the given seconds each on the engine thread, up to
    ``most`` steps a slice, then make the session (:class:`realtime.models.base.Opening`,
    :class:`realtime.models.base.SizedSlices`)."""

    def __init__(
        self, slices: Sequence[float], make: Callable[[], base.ModelSession], most: int = 1
    ) -> None:
        self._slices = deque(slices)
        self._make = make
        self._most = max(1, most)
        self._ran = 0
        self.abandoned = False
        self.asked: list[int] = []
        """The steps each slice was asked for."""

    @property
    def most_steps(self) -> int:
        return self._most

    @property
    def steps_run(self) -> int:
        return self._ran

    @property
    def steps_left(self) -> int:
        return len(self._slices)

    def advance(self) -> base.ModelSession | None:
        return self.advance_steps(self._most)

    def advance_steps(self, steps: int) -> base.ModelSession | None:
        self.asked.append(steps)
        self._ran = 0
        if self._slices:
            while self._slices and self._ran < max(1, min(steps, self._most)):
                time.sleep(self._slices.popleft())
                self._ran += 1
            return None
        return self._make()

    def abandon(self) -> None:
        self.abandoned = True


class FakeModel:
    """A :class:`~realtime.models.base.RealtimeModel` that records every call."""

    def __init__(
        self,
        options: FakeOptions | None = None,
        *,
        model_id: str = "fake-voicechat",
        path: str | None = "/models/fake-voicechat",
    ) -> None:
        self.options = options or FakeOptions()
        self._model_id = model_id
        self._path = path
        self.calls: list[tuple[str, Any, int]] = []
        """(method, argument, thread ident) for open, push, flush, cancel, clear_cache."""
        self.sessions: list[FakeSession] = []
        self.cache_clears = 0
        self.frames_run = 0
        self.load_thread = threading.get_ident()
        self.lock = threading.Lock()
        self.unhang = threading.Event()
        """Set it to let a frame blocked by ``hang_on_frame`` return."""
        self.hanging = threading.Event()
        """Set once a frame blocks on ``hang_on_frame`` (the engine thread is held)."""
        self.gate = threading.Semaphore(0)
        self.held = threading.Semaphore(0)
        """``hold_seeds``: one permit per frame that started to wait on ``gate``."""
        self.batches: list[int] = []
        """The rows of every :meth:`step` call, in order."""
        self.prompt_scopes: list[str | None] = []
        self.openings: list[FakeOpening] = []
        """Every opening begun, in order."""
        """The prompt-cache scope of every opening, in order (the tenant's name)."""

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def path(self) -> str | None:
        return self._path

    @property
    def figures(self) -> base.ModelFigures:
        return self.options.figures

    def record(self, name: str, arg: Any) -> None:
        with self.lock:
            self.calls.append((name, arg, threading.get_ident()))

    def calls_named(self, name: str) -> list[Any]:
        with self.lock:
            return [arg for n, arg, _ in self.calls if n == name]

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> FakeOpening:
        self.record("open", (system_prompt, seed, max_streaming_seconds))
        with self.lock:
            self.prompt_scopes.append(prompt_scope)
        options = self.options
        slices = [0.01] * math.ceil(round(options.open_delay / 0.01, 6))
        if options.prefill_token_delay > 0 and system_prompt:
            slices += [options.prefill_token_delay] * self.count_tokens(system_prompt)

        def opened() -> FakeSession:
            if self.options.open_error:
                raise base.SessionInitializationError(self.options.open_error)
            max_frames = self.options.max_frames
            if max_streaming_seconds is not None:
                max_frames = int(max_streaming_seconds / self.figures.frame_seconds)
            session = FakeSession(self, seed, max_frames)
            self.sessions.append(session)
            return session

        opening = FakeOpening(slices, opened, options.prefill_steps_per_slice)
        with self.lock:
            self.openings.append(opening)
        return opening

    def step(self, frames: Sequence[base.Frame]) -> list[base.RowResult]:
        """Each row's frame as its session would run it alone (so batched outputs equal
        solo ones); with ``batch_row_delay`` set, one sleep for the whole batch."""
        with self.lock:
            self.batches.append(len(frames))
        delay = self.options.batch_row_delay
        if delay is None:
            return base.step_each(frames)
        time.sleep(max(0.0, self.options.frame_delay + delay * (len(frames) - 1)))
        results: list[base.RowResult] = []
        for session, samples, rate in frames:
            try:
                if not isinstance(session, FakeSession):
                    raise TypeError(f"not a session of this model: {session!r}")
                results.append(session.push(samples, rate, delay=False))
            except Exception as exc:
                results.append(exc)
        return results

    def count_tokens(self, text: str) -> int:
        """One token per character (the real tokenizer needs fewer)."""
        return len(text)

    def tool_input(self, output: str) -> base.ToolInput:
        """:class:`~realtime.models.base.PreparesToolResults`: refused by size like a
        real model's, one token per character (recorded with the thread it ran on)."""
        self.record("tool_input", len(output))
        refusal = base.tool_output_refusal(output)
        if refusal is not None:
            raise base.InferenceError(refusal)
        return base.ToolInput(output, tuple(ord(c) for c in output))

    def clear_cache(self) -> None:
        self.record("clear_cache", None)
        self.cache_clears += 1


# --- a conversation partner ----------------------------------------------------------

VOICED_RMS: Final = 0.01
"""Input frames louder than this (RMS, float samples) are speech to :func:`partner`."""
WORDS: Final = ("hello ", "there ", "model ", "how ", "are ", "you ")


@attrs.frozen
class Reply:
    """One scripted model turn: a :class:`Cue` per frame."""

    cues: tuple[Cue, ...]

    @property
    def text(self) -> str:
        return "".join(c.text or "" for c in self.cues)


def say(*tokens: str | None) -> Reply:
    """A spoken reply: one text token per frame (``None``: a pad), the end token, then
    pads (the model listens again)."""
    return Reply((*(Cue(text=t) for t in tokens), Cue(end_of_turn=True), *[QUIET] * 4))


class _Partner:
    """Transcribes voiced frames (a word every other frame) and, once the user has been
    quiet for ``reply_after`` frames, plays the next reply."""

    def __init__(self, replies: list[Reply], reply_after: int, words: tuple[str, ...]) -> None:
        self.replies = replies
        self.reply_after = reply_after
        self.words = words
        self.said = 0
        self.heard_voice = False
        self.quiet = 0
        self.playing: deque[Cue] = deque()

    def __call__(self, index: int, heard: base.Samples) -> Cue:
        word: str | None = None
        if float(np.sqrt(np.mean(np.square(heard, dtype=np.float64)))) > VOICED_RMS:
            self.heard_voice = True
            self.quiet = 0
            if index % 2 == 0:
                word = self.words[self.said % len(self.words)]
                self.said += 1
        elif self.heard_voice:
            self.quiet += 1
            if self.quiet >= self.reply_after and self.replies:
                self.heard_voice = False
                self.playing.extend(self.replies.pop(0).cues)
        cue = self.playing.popleft() if self.playing else QUIET
        return attrs.evolve(cue, transcript=word) if word else cue


def partner(
    replies: Iterable[Reply] = (),
    *,
    reply_after: int = 3,
    words: tuple[str, ...] = WORDS,
    hz: float = 1000.0,
    figures: base.ModelFigures = base.VOICECHAT_FIGURES,
) -> FakeOptions:
    """Options for a conversation partner: it transcribes what it hears as ``words``,
    answers each time the user goes quiet with the next of ``replies`` (shared by the
    model's sessions, in order), and speaks a continuous tone at ``hz``."""
    queue = list(replies)
    return FakeOptions(
        figures=figures,
        scene=lambda: _Partner(queue, reply_after, words),
        audio=tone(hz, figures=figures),
    )


# --- zero cost ------------------------------------------------------------------------


class NullSession:
    """Counts samples instead of buffering them; each full frame yields text + audio."""

    def __init__(self, model: NullModel) -> None:
        self.figures = model.figures
        self.samples = model.samples
        self.codes = model.codes
        self.pending = 0
        self.frame_index = 0
        self.closed = False

    def _frames(self) -> list[base.ModelEvent]:
        events: list[base.ModelEvent] = []
        size, rate = self.figures.frame_samples, self.figures.output_sample_rate
        while self.pending >= size:
            self.pending -= size
            i = self.frame_index
            events.append(base.AssistantTextDelta(i, 100, "a", "a"))
            events.append(base.AudioDelta(i, self.samples, self.codes, rate))
            self.frame_index += 1
        return events

    def push_audio(self, samples: base.Samples, sample_rate: int) -> list[base.ModelEvent]:
        _check_input(self.closed, sample_rate, self.figures)
        self.pending += int(samples.shape[0])
        return self._frames()

    def flush(self, pad_partial: bool) -> list[base.ModelEvent]:
        if self.closed:
            return []
        if self.pending and pad_partial:
            self.pending = self.figures.frame_samples
        events = self._frames()
        self.pending = 0
        self.closed = True
        events.append(base.Done(self.frame_index))
        return events

    def cancel(self) -> list[base.ModelEvent]:
        if self.closed:
            return []
        self.closed = True
        return [base.Cancelled(self.frame_index)]


class NullModel:
    """The :class:`~realtime.models.base.RealtimeModel` of :class:`NullSession`."""

    def __init__(self, figures: base.ModelFigures = base.VOICECHAT_FIGURES) -> None:
        self._figures = figures
        size = figures.output_frame_samples
        self.samples: base.Samples = (
            np.sin(np.arange(size, dtype=np.float32) * 0.05) * 0.2
        ).astype(np.float32)
        """One shared output frame: the null model allocates nothing per frame."""
        self.codes = tuple(range(figures.codebooks))

    @property
    def model_id(self) -> str:
        return "null-model"

    @property
    def path(self) -> str | None:
        return None

    @property
    def figures(self) -> base.ModelFigures:
        return self._figures

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> FakeOpening:
        return FakeOpening([], lambda: NullSession(self))

    def step(self, frames: Sequence[base.Frame]) -> list[base.RowResult]:
        return base.step_each(frames)

    def count_tokens(self, text: str) -> int:
        return len(text)

    def clear_cache(self) -> None:
        pass
