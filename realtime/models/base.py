"""The model seam: what the engine drives, in the project's own value types.

A model adapter (VoiceChat, or a fake in tests) turns its native events into
these so that the engine, the wire protocol and the clients never see MLX
arrays or mlx-vlm classes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

import attrs
import numpy as np
import numpy.typing as npt

from realtime.models.voicechat import tools

Samples = npt.NDArray[np.float32]


def _count(minimum: int) -> Callable[[Any, attrs.Attribute[int], Any], None]:
    """A validator: an int (not a bool) of at least ``minimum``."""

    def check(_: Any, attribute: attrs.Attribute[int], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


def _markers(_: Any, attribute: attrs.Attribute[tuple[str, ...]], value: Any) -> None:
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty tuple of strings, got {value!r}")
    if not all(isinstance(m, str) and m for m in value):
        raise ValueError(f"{attribute.name} must hold non-empty strings, got {value!r}")


def _pattern(_: Any, attribute: attrs.Attribute[str], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty regular expression")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{attribute.name} is not a regular expression: {exc}") from None


_POSITIVE = _count(1)
_TOKEN_ID = _count(0)


@attrs.frozen(slots=True)
class ModelFigures:
    """The numbers of one model family that everything around the model depends on.

    The wire formats, the slicing of appends, the clients' framing and pacing and the
    dialects' text rules all follow from these, so they are read from the loaded model
    (``RealtimeModel.figures``; clients from ``session.updated``), never assumed: a
    model family with other rates or frame sizes then changes no code.
    """

    input_sample_rate: int = attrs.field(validator=_POSITIVE)
    """Hz of the mono PCM the model hears (it does not resample)."""
    output_sample_rate: int = attrs.field(validator=_POSITIVE)
    """Hz of the speech it emits."""
    frame_samples: int = attrs.field(validator=_POSITIVE)
    """Input samples per model step: the server cuts appends into slices of this size."""
    output_frame_samples: int = attrs.field(validator=_POSITIVE)
    """Output samples of each step's audio frame."""
    codebooks: int = attrs.field(validator=_POSITIVE)
    """RVQ codes per audio frame (``audio_codes``)."""
    bos_token_id: int = attrs.field(validator=_TOKEN_ID)
    eos_token_id: int = attrs.field(validator=_TOKEN_ID)
    """The agent text channel's end token: the model ends its turn
    (``AudioDelta.end_of_turn``)."""
    pad_token_id: int = attrs.field(validator=_TOKEN_ID)
    """What the text channel emits on a frame with nothing to say."""
    silence_token_id: int = attrs.field(validator=_TOKEN_ID)
    tool_call_start: tuple[str, ...] = attrs.field(validator=_markers)
    """Text on the function channel that opens a tool call (any one of them)."""
    tool_call_end: tuple[str, ...] = attrs.field(validator=_markers)
    """Text on the function channel that closes a tool call (any one of them)."""
    marker_pattern: str = attrs.field(validator=_pattern)
    """A regular expression matching every special-token text (the tool-call markers
    included) that never belongs in a tool call's payload."""

    def __attrs_post_init__(self) -> None:
        # One output frame per input frame: both must span the same time, or the
        # answer would drift from the conversation's clock.
        if self.frame_samples * self.output_sample_rate != (
            self.output_frame_samples * self.input_sample_rate
        ):
            raise ValueError(
                f"an input frame ({self.frame_samples} samples at {self.input_sample_rate} Hz)"
                f" and an output frame ({self.output_frame_samples} samples at "
                f"{self.output_sample_rate} Hz) must last equally long"
            )
        if len(self.hidden_token_ids) != 4:
            raise ValueError(
                "bos, eos, pad and silence token ids must differ, got "
                f"{self.bos_token_id}, {self.eos_token_id}, {self.pad_token_id}, "
                f"{self.silence_token_id}"
            )
        marker = re.compile(self.marker_pattern)
        unmatched = [
            m for m in self.tool_call_start + self.tool_call_end if not marker.fullmatch(m)
        ]
        if unmatched:
            raise ValueError(f"marker_pattern does not match the tool-call markers {unmatched}")

    @property
    def frame_seconds(self) -> float:
        """One model step in seconds (the pace of a live stream)."""
        return self.frame_samples / self.input_sample_rate

    @property
    def frame_ms(self) -> float:
        return 1000.0 * self.frame_samples / self.input_sample_rate

    @property
    def frames_per_second(self) -> float:
        return self.input_sample_rate / self.frame_samples

    @property
    def hidden_token_ids(self) -> frozenset[int]:
        """Text-channel tokens that never reach a text delta (bos, eos, pad, silence)."""
        return frozenset(
            (self.bos_token_id, self.eos_token_id, self.pad_token_id, self.silence_token_id)
        )


VOICECHAT_FIGURES: Final = ModelFigures(
    input_sample_rate=16_000,
    output_sample_rate=22_050,
    frame_samples=1280,
    output_frame_samples=1764,
    codebooks=31,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=12,
    silence_token_id=11,
    tool_call_start=tools.CALL_START,
    tool_call_end=tools.CALL_END,
    marker_pattern=tools.MARKER_PATTERN,
)
"""NemotronLabs VoiceChat 11B: 80 ms frames, 16 kHz in, 22 050 Hz out, 31 codebooks;
its tool-call markers are its tool format's (:mod:`realtime.models.voicechat.tools`)."""


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
    sample_rate: int = VOICECHAT_FIGURES.output_sample_rate
    """Set by each model from its figures; VoiceChat's by default."""
    end_of_turn: bool = False
    """The agent text channel emitted its end token on this frame (the model ends
    its turn). Pad, silence, bos and eos never reach the text deltas, so this is
    the one piece of the text channel the dialects cannot see otherwise."""


@attrs.frozen(slots=True)
class _End:
    """The end of a timeline; :class:`Done` and :class:`Cancelled` say how it ended."""

    frame_index: int
    """The frame count of the timeline when it ended."""


@attrs.frozen(slots=True)
class Done(_End):
    """A flush ran the rest of the input: the answer is complete."""


@attrs.frozen(slots=True)
class Cancelled(_End):
    """The session was cancelled: it runs no more frames."""


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


@attrs.frozen(slots=True)
class PromptUse:
    """How an opened session came by its system prompt: ``tokens`` prefill steps in all
    (0: no prompt), of which ``cached`` were copied from the model's prompt cache
    instead of computed (all or none). OpenAI ``usage.input_token_details.cached_tokens``
    reads it (:class:`UsesPrompt`)."""

    tokens: int = attrs.field(default=0, validator=_TOKEN_ID)
    cached: int = attrs.field(default=0, validator=_TOKEN_ID)


@runtime_checkable
class UsesPrompt(Protocol):
    """A session that says how its prompt was read (VoiceChat's)."""

    @property
    def prompt_use(self) -> PromptUse: ...


class ModelSession(Protocol):
    """One streaming timeline. Every method runs on the engine thread."""

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]: ...

    def flush(self, pad_partial: bool) -> list[ModelEvent]: ...

    def cancel(self) -> list[ModelEvent]: ...


MAX_TOOL_RESULT_TOKENS: Final = 512
"""The longest tool output (in tokens, tags included) fed to the model: each token is
one model step taken from the conversation's time."""
TOOL_OUTPUT_BYTES_PER_TOKEN: Final = 32
"""UTF-8 bytes of a tool output allowed per token of :data:`MAX_TOOL_RESULT_TOKENS`: a
JSON or text output of that many tokens is a few bytes a token, so an output past
:data:`MAX_TOOL_OUTPUT_BYTES` is refused before any tokenizing."""
MAX_TOOL_OUTPUT_BYTES: Final = MAX_TOOL_RESULT_TOKENS * TOOL_OUTPUT_BYTES_PER_TOKEN


@attrs.frozen(slots=True)
class ToolInput:
    """A tool's output as a session takes it: the client's ``text`` and the ``ids`` the
    model reads, tokenized before the engine sees it (off the engine thread)."""

    text: str
    ids: tuple[int, ...]


DELEGATE_TOOL: Final = "delegate"
"""The one tool the Live endpoint declares to the model (``realtime.live.prompt``): a
call of it is a delegation to the application. The demo calls it once a session."""

CONTEXT_KINDS: Final = ("instructions", "thinking", "commentary")
"""What the Live endpoint's client appends to the model's context, each fed as a tool
result (:func:`context_feed`); only commentary is meant to be spoken."""


def context_feed(kind: str, text: str) -> str:
    """Appended context as the tool result the model takes: ``{"<kind>": text}``."""
    return json.dumps({kind: text}, ensure_ascii=False)


def context_of(output: str) -> tuple[str, str] | None:
    """``(kind, text)`` when a tool result is appended context (:func:`context_feed`),
    else None."""
    if not output.startswith("{"):
        return None
    try:
        value = json.loads(output)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ((kind, text),) = value.items()
    if kind in CONTEXT_KINDS and isinstance(text, str):
        return kind, text
    return None


def tool_output_refusal(output: str) -> str | None:
    """Why ``output`` is refused before tokenizing (too many bytes), or None."""
    size = len(output.encode("utf-8", "surrogatepass"))
    if size > MAX_TOOL_OUTPUT_BYTES:
        return (
            f"the tool output is {size} bytes; at most {MAX_TOOL_OUTPUT_BYTES} "
            f"({MAX_TOOL_RESULT_TOKENS} tokens) reach the model: send a shorter result"
        )
    return None


@runtime_checkable
class PreparesToolResults(Protocol):
    """A model whose sessions take tool results (:class:`TakesToolResults`). Its
    :meth:`tool_input` is thread-safe and touches no device: the pipeline runs it on a
    bounded worker thread, off the engine thread and the event loop."""

    def tool_input(self, output: str) -> ToolInput:
        """Check (:func:`tool_output_refusal` first) and tokenize ``output``;
        InferenceError if it cannot go in (too long, nested too deeply)."""
        ...


class ToolResultFeed(Protocol):
    """A tool's output going into a session's timeline one model step at a time (the
    engine runs other conversations' frames between the steps)."""

    def advance(self) -> bool:
        """Run the next step; True once the last has run. InferenceError when the
        session cannot go on with it."""
        ...


@runtime_checkable
class TakesToolResults(Protocol):
    """A session whose model can be given a tool's result (VoiceChat: on its function
    channel, as it was trained; docs/nemotron-voicechat.md). Sessions of models without
    such an input do not have this method."""

    def begin_tool_result(self, tool: ToolInput) -> ToolResultFeed:
        """Start feeding ``tool`` (:meth:`PreparesToolResults.tool_input`);
        InferenceError if the session cannot take it."""
        ...


class Opening(Protocol):
    """A session being opened, one slice of work at a time, so the engine can run other
    conversations' frames between the slices: the first seeds and warms the voice up,
    each later one prefills one system-prompt token (one model step)."""

    def advance(self) -> ModelSession | None:
        """Run the next slice; the session once it is ready (then not called again).
        SessionInitializationError when opening failed."""
        ...

    def abandon(self) -> None:
        """Stop opening (the connection left, or a slice failed) and free its buffers."""
        ...


@runtime_checkable
class SizedSlices(Protocol):
    """An :class:`Opening` whose slices run as many model steps as the engine asks, 1 to
    :attr:`most_steps`: the engine sizes each slice to the time it may take beside the
    other conversations' frames (:mod:`realtime.engine.fairshare`). The slicing is only
    where the work pauses: the session it opens is the same whatever the sizes."""

    @property
    def most_steps(self) -> int:
        """The steps of a slice when nothing asks for less."""
        ...

    @property
    def steps_run(self) -> int:
        """Model steps the last slice ran (0: it ran none, e.g. it built the session)."""
        ...

    @property
    def steps_left(self) -> int:
        """Model steps left to run (0: the next slice is whole, it builds or opens the
        session and cannot be cut; the engine expects it to cost what such slices did)."""
        ...

    def advance_steps(self, steps: int) -> ModelSession | None:
        """:meth:`Opening.advance`, running at most ``steps`` (at least 1) model steps."""
        ...


def open_now(opening: Opening, control: StepControl | None = None) -> ModelSession:
    """Run every slice of ``opening`` in turn, calling ``control.step()`` before each
    (a stop raises SessionStopped): an open that nothing else shares the thread with."""
    control = control or StepControl()
    try:
        while True:
            control.step()
            session = opening.advance()
            if session is not None:
                return session
    except BaseException:
        opening.abandon()
        raise


def open_session(
    model: RealtimeModel,
    *,
    system_prompt: str | None,
    seed: int,
    max_streaming_seconds: float | None,
    control: StepControl | None = None,
) -> ModelSession:
    """Open a session of ``model`` in one go (:meth:`RealtimeModel.begin_session` and
    :func:`open_now`): for code that owns the thread (the offline CLI, tests)."""
    opening = model.begin_session(
        system_prompt=system_prompt, seed=seed, max_streaming_seconds=max_streaming_seconds
    )
    return open_now(opening, control)


@runtime_checkable
class CompilesStep(Protocol):
    """A model whose frame step has compiled pieces (VoiceChat's, ``mx.compile``): the
    engine has them traced at start for every batch size it may step, so no client's
    first frame pays the compilation."""

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        """Trace and build the compiled pieces for ``batch_sizes`` rows (engine thread)."""
        ...


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

    @property
    def figures(self) -> ModelFigures:
        """Its rates, frame sizes, codebooks and special tokens."""
        ...

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
    ) -> Opening:
        """Check the options and start opening a session (no model work yet): seed,
        voice warm-up and ``system_prompt`` prefill run in the opening's slices.
        ``prompt_scope``: a model that keeps prompt states looks them up and stores
        them under it only, besides the shared scope's (None: the shared one, where
        warmed prompts are), so one tenant's prompts never open faster for another.
        SessionInitializationError for bad options."""
        ...

    def step(self, frames: Sequence[Frame]) -> list[RowResult]:
        """Run one frame of each of these sessions (at most one frame per session) and
        return one :data:`RowResult` per frame, in the same order: that session's events,
        or the exception its row raised (the other rows' results stand, so one failing
        conversation never costs the others their frame). A model that can run the rows
        as one batched step does; :func:`step_each` runs them one after another. An
        exception raised by the call itself fails every row."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many model steps prefilling ``text`` as the system prompt takes."""
        ...

    def clear_cache(self) -> None:
        """Free cached device buffers; called when a session closes, never per frame."""
        ...


Frame = tuple[ModelSession, Samples, int]
"""One session's frame for :meth:`RealtimeModel.step`: the session, its samples and
their sample rate."""


RowResult = list[ModelEvent] | Exception
"""One row of :meth:`RealtimeModel.step`: the session's events, or what its row raised
(:class:`ContextLimitReached`, :class:`InferenceError`, anything else: the engine maps
each as it maps a failed single frame). Only ``Exception``: a ``BaseException`` such as
``SystemExit`` still ends the whole call."""


def step_each(frames: Sequence[Frame]) -> list[RowResult]:
    """:meth:`RealtimeModel.step` for a model without a batched step: each session's
    frame in turn, through its own streaming step, each row's failure caught as its
    own result."""
    results: list[RowResult] = []
    for session, samples, rate in frames:
        try:
            results.append(session.push_audio(samples, rate))
        except Exception as exc:
            results.append(exc)
    return results


def step_one(model: RealtimeModel, frame: Frame) -> list[ModelEvent]:
    """One session's frame through :meth:`RealtimeModel.step`, its failure raised: for
    code that steps one conversation alone (the offline CLI)."""
    results = model.step([frame])
    if len(results) != 1:
        raise RuntimeError(f"the model returned {len(results)} results for one frame")
    (result,) = results
    if isinstance(result, Exception):
        raise result
    return result
