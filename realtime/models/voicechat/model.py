"""NemotronLabs VoiceChat through mlx-vlm, adapted to the model seam.

mlx-vlm's ``nemotron_voicechat`` is the reference MLX implementation; this module
only loads it, opens its streaming sessions and converts its events (MLX arrays)
into the project's value types, on the engine thread that owns MLX.
Nothing here touches MLX at import time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_vlm.models.nemotron_voicechat import VoiceChatContextLimitError
from mlx_vlm.models.nemotron_voicechat.config import ModelConfig
from mlx_vlm.utils import load as mlx_vlm_load

from realtime.limits import PROMPT_CACHE_BYTES
from realtime.models.base import (
    MAX_TOOL_RESULT_TOKENS,
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    ContextLimitReached,
    Done,
    Frame,
    FunctionDelta,
    InferenceError,
    ModelEvent,
    ModelFigures,
    PromptUse,
    RowResult,
    Samples,
    SessionInitializationError,
    ToolInput,
    UserTranscriptDelta,
    step_each,
    tool_output_refusal,
)
from realtime.models.checkpoint import (
    CheckpointInfo,
    ModelLoadError,
    check_model_path,
    model_id_for,
    one_line,
)
from realtime.models.prompt_cache import AheadSlice, CacheFigures
from realtime.models.voicechat.cast import cast_once
from realtime.models.voicechat.codes import compile_rounds
from realtime.models.voicechat.fused import fuse, trace
from realtime.models.voicechat.prompt import LanguagePart, Prefill, PromptStates, VoicePart

if TYPE_CHECKING:
    from realtime.models.state_files import StateFiles
    from realtime.models.voicechat.keys import SessionKey

log = logging.getLogger("realtime.models.voicechat.model")

# Materialise weights in about this many steps so a long load shows progress.
_LOAD_PROGRESS_STEPS = 10
_LOAD_PROGRESS_MIN_BYTES = 1 << 30
"""Smaller checkpoints load in well under a second: their progress lines go to debug."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _materialize(model: Any, started: float) -> None:
    """Read the lazily mapped weights in, logging progress by bytes."""

    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    params = [value for _, value in flat]
    total = sum(int(p.nbytes) for p in params) or 1
    step = max(total // _LOAD_PROGRESS_STEPS, 1)
    progress = log.info if total >= _LOAD_PROGRESS_MIN_BYTES else log.debug
    group: list[Any] = []
    done = group_bytes = 0
    for value in params:
        group.append(value)
        group_bytes += int(value.nbytes)
        if group_bytes >= step:
            mx.eval(*group)
            done += group_bytes
            group, group_bytes = [], 0
            progress(
                "weights %3d%% (%s of %s in memory) after %.1f s",
                min(100, 100 * done // total),
                _gb(done),
                _gb(total),
                time.perf_counter() - started,
            )
    if group:
        mx.eval(*group)
        done += group_bytes
        progress(
            "weights 100%% (%s in memory) after %.1f s", _gb(done), time.perf_counter() - started
        )


def figures_of(config: Any) -> ModelFigures:
    """The figures of a checkpoint, from mlx-vlm's ``ModelConfig`` (``model.config``).

    The rates are the config's ``input_sample_rate`` and ``output_sample_rate``; a
    frame is ``round(input_sample_rate * frame_duration)`` samples, as mlx-vlm's
    streaming session cuts its input; an output frame is the codec's
    ``waveform_to_token_ratio`` (``hop_length`` times the ``downsample_rates``,
    4 x 7 x 7 x 9 = 1764); the codebooks are the TTS's ``num_quantizers``; the token
    ids are the config's. The tool-call markers are the trained format's (no config
    holds them). ValueError when parts of the config disagree (the mel front end's or
    the codec's rate, the codec's and the TTS's codebooks) or a figure is unusable.
    """
    codec, tts = config.codec_config, config.tts_config
    mel_rate = config.audio_config.preprocessor.sample_rate
    if mel_rate != config.input_sample_rate:
        raise ValueError(
            f"the mel front end expects {mel_rate} Hz but input_sample_rate is "
            f"{config.input_sample_rate}"
        )
    if codec.sample_rate != config.output_sample_rate:
        raise ValueError(
            f"the codec speaks {codec.sample_rate} Hz but output_sample_rate is "
            f"{config.output_sample_rate}"
        )
    if codec.num_quantizers != tts.num_quantizers:
        raise ValueError(
            f"the codec has {codec.num_quantizers} codebooks, the TTS {tts.num_quantizers}"
        )
    return attrs.evolve(
        VOICECHAT_FIGURES,
        input_sample_rate=config.input_sample_rate,
        output_sample_rate=config.output_sample_rate,
        frame_samples=round(config.input_sample_rate * float(config.frame_duration)),
        output_frame_samples=codec.waveform_to_token_ratio,
        codebooks=tts.num_quantizers,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        silence_token_id=config.silence_token_id,
    )


def checkpoint_figures(path: str | os.PathLike[str]) -> ModelFigures:
    """A checkpoint folder's figures from its ``config.json`` as mlx-vlm reads it
    (its defaults included), without loading any weight: for tools that must know
    them before a server or a model is up (the benchmarks encode audio ahead)."""

    info = check_model_path(path)
    config = json.loads((info.path / "config.json").read_text("utf-8"))
    return _loaded_figures(ModelConfig.from_dict(config), info.model_id)


def _loaded_figures(config: Any, model_id: str) -> ModelFigures:
    try:
        return figures_of(config)
    except ValueError as exc:
        raise ModelLoadError(f"{model_id} has unusable figures: {one_line(str(exc))}") from None


@attrs.frozen(slots=True, eq=False)
class OfflineResult:
    """One offline turn: the whole answer at once (``realtime generate`` without --stream)."""

    samples: Samples
    sample_rate: int
    text: str
    function_text: str
    transcript: str
    frames: int


class VoiceChatSession:
    """One streaming timeline over an mlx-vlm ``VoiceChatStreamingSession``.

    The session object keeps the timeline's state (caches, token lists, the RNN-T's
    and the detokenizers' state) as mlx-vlm builds it; its frames run through the
    project's own frame step (:mod:`realtime.models.voicechat.step`), alone or batched
    with other sessions' (:meth:`VoiceChatModel.step`), bit for bit what mlx-vlm's own
    ``push_audio`` gives. A session opened with ``profile=True`` runs mlx-vlm's own
    step instead (its per-stage timings are the reference measurement).

    Every method runs on the engine thread. After a failure (the context limit,
    a model error) ``push_audio`` keeps raising InferenceError, while ``flush``
    still ends the timeline with ``Done`` so a commit gets its ``response.done``.
    """

    def __init__(
        self, inner: Any, figures: ModelFigures, key: SessionKey, prompt_use: PromptUse
    ) -> None:
        from realtime.models.voicechat.row import Seat
        from realtime.models.voicechat.step import check_state

        self.prompt_use = prompt_use
        """Its prompt's prefill steps and how many came from the prompt cache."""
        self._inner = inner
        self._figures = figures
        self._key = key
        self._seat = Seat(inner)
        """Its place in a frame batch (released before anything reads its caches alone)."""
        self._failed: str | None = None
        self._at_limit = False
        self._pending = np.zeros(0, dtype=np.float32)
        self._reference = bool(getattr(inner, "_profiling", False))
        if not self._reference:
            check_state(inner)

    @property
    def frame_index(self) -> int:
        return int(self._inner.frame_index)

    def _check_open(self) -> None:
        if self._failed is not None:
            raise (ContextLimitReached if self._at_limit else InferenceError)(self._failed)
        if self._inner.closed:
            raise InferenceError("the session is closed")

    def take(self, samples: Samples, sample_rate: int) -> list[Samples]:
        """Check and buffer ``samples``; the whole frames they complete, in order.
        InferenceError (the session intact) for a wrong rate or shape."""
        self._check_open()
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim == 2 and 1 in chunk.shape:
            chunk = chunk.reshape(-1)
        if chunk.ndim != 1:
            raise InferenceError(f"audio must be mono 1-D samples, got shape {chunk.shape}")
        if sample_rate != self._figures.input_sample_rate:
            raise InferenceError(
                f"expected {self._figures.input_sample_rate} Hz PCM, received {sample_rate} Hz"
            )
        size = self._figures.frame_samples
        pending = np.concatenate([self._pending, chunk]) if self._pending.size else chunk
        whole = pending.shape[0] // size
        frames = [pending[i * size : (i + 1) * size] for i in range(whole)]
        self._pending = np.array(pending[whole * size :], dtype=np.float32)
        return frames

    def at_limit(self) -> bool:
        """The next frame would pass ``max_streaming_seconds`` (recorded: every later
        push raises ContextLimitReached)."""
        inner = self._inner
        if inner.max_frames is None or inner._frame_index < inner.max_frames:
            return False
        self._at_limit = True
        self._failed = (
            "the session's context limit (max_streaming_seconds) was reached; "
            f"no more audio is accepted (stream exceeded the configured {inner.max_frames}-"
            "frame context)"
        )
        return True

    def failed(self, exc: BaseException) -> InferenceError:
        """Record a model failure in this session's frame; the error to report."""
        self._failed = f"model failure: {type(exc).__name__}: {one_line(str(exc))}"
        return InferenceError(self._failed)

    def row(self, frame: Samples) -> Any:
        """This session's row in a batched frame step."""

        from realtime.models.voicechat.row import StepRow

        return StepRow(self._inner, self._key, mx.array(frame), self._seat)

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        if self._reference:
            return self._reference_push(samples, sample_rate)
        result = run_rows([(self, samples, sample_rate)], self._figures)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _reference_push(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:

        from realtime.models.voicechat.keys import drawing_from

        self._check_open()
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim != 1:
            raise InferenceError(f"audio must be mono 1-D samples, got shape {chunk.shape}")
        try:
            with drawing_from(self._key):
                events = self._inner.push_audio(chunk, sample_rate=sample_rate)
        except VoiceChatContextLimitError as exc:
            self.at_limit()
            assert self._failed is not None
            raise ContextLimitReached(self._failed) from exc
        except ValueError as exc:  # wrong sample rate or shape: the session is intact
            raise InferenceError(one_line(str(exc))) from exc
        except Exception as exc:
            log.exception("VoiceChat frame failed")
            raise self.failed(exc) from exc
        converted = [_convert(e, self._figures) for e in events]
        return _mark_turn_ends(self._inner, converted, self._figures.eos_token_id)

    def flush(self, pad_partial: bool) -> list[ModelEvent]:
        from realtime.models.voicechat.keys import drawing_from

        if self._inner.closed:
            return []
        if self._reference:
            return self._reference_flush(pad_partial)
        events: list[ModelEvent] = []
        # After a failure the pending partial frame is dropped, not run.
        if pad_partial and self._failed is None and self._pending.size:
            frame = np.zeros(self._figures.frame_samples, dtype=np.float32)
            frame[: self._pending.size] = self._pending
            self._pending = np.zeros(0, dtype=np.float32)
            if not self.at_limit():
                try:
                    with drawing_from(self._key):
                        events = _step_rows([self.row(frame)], self._figures)[0]
                except Exception as exc:
                    log.exception("VoiceChat flush failed")
                    self.failed(exc)
        self._pending = np.zeros(0, dtype=np.float32)
        self._seat.release()
        self._inner._closed = True
        self._inner._codec_cache.clear()
        events.append(Done(frame_index=self.frame_index))
        return events

    def _reference_flush(self, pad_partial: bool) -> list[ModelEvent]:
        from realtime.models.voicechat.keys import drawing_from

        pad = pad_partial and self._failed is None
        try:
            with drawing_from(self._key):
                events = self._inner.flush(pad_partial=pad)
        except Exception as exc:
            log.exception("VoiceChat flush failed")
            self.failed(exc)
            if not self._inner.closed:
                with drawing_from(self._key):
                    events = self._inner.flush(pad_partial=False)
                return [_convert(e, self._figures) for e in events]
            assert self._failed is not None
            raise InferenceError(self._failed) from exc
        return [_convert(e, self._figures) for e in events]

    def cancel(self) -> list[ModelEvent]:
        self._pending = np.zeros(0, dtype=np.float32)
        if not self._reference:
            self._seat.release()
        return [_convert(e, self._figures) for e in self._inner.cancel()]

    def begin_tool_result(self, tool: ToolInput) -> VoiceChatToolResult:
        """Start feeding a tool's output (:meth:`VoiceChatModel.tool_input` made its
        tokens) to the model (:class:`VoiceChatToolResult`). InferenceError when the
        session cannot take it."""
        self._check_open()
        if self._reference:
            raise InferenceError("a session opened with profile=True cannot take tool results")
        return VoiceChatToolResult(self, list(tool.ids))

    def profile_summary(self, drop_first: int = 1) -> dict[str, Any] | None:
        """Per-stage frame timings when the session was opened with ``profile=True``."""
        if not self._reference:
            return None
        summary: dict[str, Any] = self._inner.profile.summary(drop_first=drop_first)
        return summary


MAX_TOOL_RESPONSE_TOKENS: Final = MAX_TOOL_RESULT_TOKENS
"""The longest tool output (in tokens, tags included) fed to the model."""


def tool_input(tokenizer: Any, output: str) -> ToolInput:
    """``output`` as the model reads it (:func:`voicechat_step.tool_response_text`),
    tokenized; refused by size before tokenizing, and when its JSON nests too deeply
    to parse (CPython's recursion limit)."""
    from realtime.models.voicechat.step import tool_response_text

    refusal = tool_output_refusal(output)
    if refusal is not None:
        raise InferenceError(refusal)
    try:
        text = tool_response_text(output)
    except RecursionError:
        raise InferenceError("the tool output's JSON nests too deeply") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > MAX_TOOL_RESPONSE_TOKENS:
        raise InferenceError(
            f"the tool output is {len(ids)} tokens; at most {MAX_TOOL_RESPONSE_TOKENS} "
            "reach the model (one model step each): send a shorter result"
        )
    return ToolInput(output, tuple(int(i) for i in ids))


class VoiceChatToolResult:
    """A tool's output going into a session's timeline one step at a time (the engine
    runs other conversations' frames between the steps): the response tokens on the
    function channel, then one step where the model closes the response itself
    (:func:`realtime.models.voicechat.step.inserted_step`). Its answer follows in the
    session's next frames."""

    def __init__(self, session: VoiceChatSession, ids: list[int]) -> None:
        self._session = session
        self._ids = ids
        self._next = 0
        self.closed_with: int | None = None
        """The function token the model predicted after the response (trained: 22)."""

    @property
    def steps(self) -> int:
        return len(self._ids) + 1

    def advance(self) -> bool:
        """Run the next inserted step; True once the last has run."""
        from realtime.models.voicechat.row import StepRow
        from realtime.models.voicechat.step import inserted_step

        session = self._session
        session._check_open()
        forced = self._ids[self._next] if self._next < len(self._ids) else None
        try:
            recorded = inserted_step(
                StepRow(session._inner, session._key, None, session._seat), forced
            )
        except Exception as exc:
            log.exception("feeding a tool result failed")
            raise session.failed(exc) from exc
        self._next += 1
        if self._next < self.steps:
            return False
        self.closed_with = recorded
        return True


def _step_rows(rows: Sequence[Any], figures: ModelFigures) -> list[list[ModelEvent]]:
    from realtime.models.voicechat.keys import drawing_rows
    from realtime.models.voicechat.step import step_frames

    with drawing_rows([row.key for row in rows]):
        return step_frames(rows, figures)


def run_rows(
    frames: Sequence[tuple[VoiceChatSession, Samples, int]], figures: ModelFigures
) -> list[RowResult]:
    """Run each session's samples (any length: whole frames run, the rest waits for the
    next push), the sessions with a frame to run batched together frame after frame.
    One row's bad input or context limit is its own result; a failure of a batched
    computation fails every session in that batch (their states may be half advanced)."""
    results: list[RowResult] = [[] for _ in frames]
    queued = _take_all(frames, results)
    depth = 0
    while True:
        members = [
            i
            for i, frames_of in enumerate(queued)
            if depth < len(frames_of) and not isinstance(results[i], Exception)
        ]
        if not members:
            return results
        _run_depth(frames, queued, depth, members, results, figures)
        depth += 1


def _take_all(
    frames: Sequence[tuple[VoiceChatSession, Samples, int]], results: list[RowResult]
) -> list[list[Samples]]:
    """Each session's whole frames of its samples; a row whose samples are bad gets its
    InferenceError as its result and no frame."""
    queued: list[list[Samples]] = []
    for index, (session, samples, rate) in enumerate(frames):
        try:
            queued.append(session.take(samples, rate))
        except InferenceError as exc:
            results[index] = exc
            queued.append([])
    return queued


def _run_depth(
    frames: Sequence[tuple[VoiceChatSession, Samples, int]],
    queued: list[list[Samples]],
    depth: int,
    members: list[int],
    results: list[RowResult],
    figures: ModelFigures,
) -> None:
    """Frame ``depth`` of every member row as one batch: a row at its context limit
    gets ContextLimitReached instead, a failed batch fails every row that ran in it."""
    rows = []
    running = []
    for i in members:
        session = frames[i][0]
        if session.at_limit():
            assert session._failed is not None
            results[i] = ContextLimitReached(session._failed)
            continue
        rows.append(session.row(queued[i][depth]))
        running.append(i)
    if not rows:
        return
    try:
        stepped = _step_rows(rows, figures)
    except Exception as exc:
        log.exception("VoiceChat frame failed (%d sessions in the batch)", len(rows))
        for i in running:
            results[i] = frames[i][0].failed(exc)
    else:
        for i, events in zip(running, stepped, strict=True):
            current = results[i]
            assert not isinstance(current, Exception)
            current.extend(events)


_TOKEN_DELTAS: Final[dict[str, type[AssistantTextDelta] | type[FunctionDelta]]] = {
    "assistant_text_delta": AssistantTextDelta,
    "function_delta": FunctionDelta,
}
"""mlx-vlm's two token channels by event kind: the same fields, their own value type."""


def _convert(event: Any, figures: ModelFigures) -> ModelEvent:
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


def _mark_turn_ends(inner: Any, events: list[ModelEvent], eos: int) -> list[ModelEvent]:
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


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SessionInitializationError(f"seed must be an integer, got {seed!r}")
    value = int(seed)
    if not 0 <= value < 2**63:
        raise SessionInitializationError(f"seed must be in 0..2**63-1, got {value}")
    return value


@attrs.define(slots=True, eq=False)
class VoiceChatOpening:
    """A VoiceChat session opened in slices (:class:`realtime.models.base.Opening`).

    mlx-vlm opens a streaming session in its constructor: seed, TTS voice warm-up,
    then the system prompt prefilled one full timeline step (language model and TTS)
    per token, all in one call, during which nothing else could run. Here the
    prompt's prefill runs in slices of its own
    (:class:`realtime.models.voicechat.prompt.Prefill`: a few language-model steps a
    slice, and as many TTS steps while the seed's voice chain is shorter than the
    prompt), shared by every
    opening of that prompt and seed under way, and stored in the model's prompt cache;
    the opening's own session is then the constructor with a blank prompt (mlx-vlm
    skips a blank one) given copies of the stored parts. A prompt stored whole opens in
    one slice. The result is the session mlx-vlm's constructor gives, bit for bit
    (tests/test_sessions_isolation.py, tests/test_prompt_cache.py). Every slice draws
    from its session's own random key (:mod:`realtime.models.voicechat.keys`).
    """

    _runtime: Any
    _figures: ModelFigures
    _prompts: PromptStates
    _system_prompt: str | None = attrs.field(kw_only=True)
    _seed: int = attrs.field(kw_only=True)
    _max_streaming_seconds: float | None = attrs.field(kw_only=True)
    _profile: bool = attrs.field(default=False, kw_only=True)
    _scope: str | None = attrs.field(default=None, kw_only=True)
    """The prompt-cache scope (:meth:`VoiceChatModel.begin_session`)."""
    _prefill: Prefill | None = attrs.field(default=None, init=False)
    _parts: tuple[LanguagePart, VoicePart] | None = attrs.field(default=None, init=False)
    _use: PromptUse | None = attrs.field(default=None, init=False)
    _steps: int = attrs.field(default=0, init=False)
    _ran: int = attrs.field(default=0, init=False)

    @property
    def most_steps(self) -> int:
        """:data:`~realtime.models.voicechat.prompt.STEPS_PER_SLICE`
        (:class:`~realtime.models.base.SizedSlices`)."""
        from realtime.models.voicechat.prompt import STEPS_PER_SLICE

        return STEPS_PER_SLICE

    @property
    def steps_run(self) -> int:
        return self._ran

    @property
    def steps_left(self) -> int:
        """The shared read's steps left (0 before the first slice and once it is read:
        the next slice begins the opening, or opens the session, whole)."""
        prefill = self._prefill
        return 0 if self._use is None or prefill is None else prefill.steps_left

    def advance(self) -> VoiceChatSession | None:
        return self.advance_steps(self.most_steps)

    def advance_steps(self, steps: int) -> VoiceChatSession | None:
        """The next slice, its prefill's share at most ``steps`` model steps."""
        self._steps, self._ran = steps, 0
        try:
            if self._use is None:
                self._start()
            elif self._prefill is not None:
                self._wait_for_prefill()
                if self._prefill is None:
                    return None  # read: the session opens in a slice of its own
            if self._use is None or self._prefill is not None:
                return None
            return self._open()
        except SessionInitializationError:
            raise
        except Exception as exc:
            log.debug("opening a VoiceChat session failed", exc_info=True)
            raise SessionInitializationError(
                one_line(str(exc))
                if isinstance(exc, ValueError)
                else f"{type(exc).__name__}: {one_line(str(exc))}"
            ) from exc

    def _start(self) -> None:
        from realtime.models.voicechat.prompt import prompt_ids

        config = self._runtime.model.config
        text = config.default_system_prompt if self._system_prompt is None else self._system_prompt
        ids = tuple(prompt_ids(self._runtime, text))
        if ids:
            self._parts = self._prompts.parts(self._runtime, ids, self._seed, self._scope)
            if self._parts is None:
                self._prefill = self._prompts.join(self._runtime, ids, self._seed, self._scope)
                self._wait_for_prefill()
            else:
                self._prompts.store.count(hit=True)
        self._use = PromptUse(tokens=len(ids), cached=len(ids) if self._parts else 0)

    def _wait_for_prefill(self) -> None:
        prefill = self._prefill
        assert prefill is not None
        self._ran = prefill.advance(self._steps)
        if prefill.done:
            self._parts = prefill.parts()
            self._prefill = None
            self._prompts.leave(prefill)

    def _open(self) -> VoiceChatSession:
        from realtime.models.voicechat.prompt import construct, put_language, put_voice

        assert self._use is not None
        inner, key = construct(
            self._runtime, self._seed, self._max_streaming_seconds, self._profile
        )
        if self._parts is not None:
            language, voice = self._parts
            self._parts = None
            put_language(language, inner)
            put_voice(voice, inner, key)
        _check_streaming(inner, self._figures)
        log.info(
            "session opened: %d prompt tokens, %d from the prompt cache",
            self._use.tokens,
            self._use.cached,
        )
        return VoiceChatSession(inner, self._figures, key, self._use)

    def abandon(self) -> None:
        self._parts = None
        prefill, self._prefill = self._prefill, None
        if prefill is not None:
            self._prompts.leave(prefill)


class VoiceChatModel:
    """A loaded VoiceChat checkpoint (the RealtimeModel the engine serves)."""

    def __init__(
        self, runtime: Any, path: Path, figures: ModelFigures | None = None, *, cast: bool = True
    ) -> None:
        self._runtime = runtime  # mlx-vlm VoiceChatSession: model + tokenizer
        self._prompts = PromptStates(PROMPT_CACHE_BYTES)
        self._cast = cast
        """The load cast weights and fused modules (part of the state files' key)."""
        self._files: StateFiles | None = None
        self._path = path
        self._model_id = model_id_for(path)
        self._figures = figures_of(runtime.model.config) if figures is None else figures

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def path(self) -> str:
        """The absolute checkpoint folder."""
        return os.path.abspath(self._path)

    @property
    def figures(self) -> ModelFigures:
        """Read from the checkpoint's config when it loaded (:func:`figures_of`)."""
        return self._figures

    @property
    def runtime(self) -> Any:
        """mlx-vlm's VoiceChatSession (for tests and tools that compare against it)."""
        return self._runtime

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
        profile: bool = False,
    ) -> VoiceChatOpening:
        """Check the options; the opening seeds, warms the TTS voice prompt and prefills
        the system prompt in slices (:class:`VoiceChatOpening`)."""
        value = _check_seed(seed)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise SessionInitializationError("system_prompt must be a string")
        if max_streaming_seconds is not None and not (
            isinstance(max_streaming_seconds, (int, float))
            and np.isfinite(max_streaming_seconds)
            and max_streaming_seconds > 0
        ):
            raise SessionInitializationError(
                f"max_streaming_seconds must be a number > 0, got {max_streaming_seconds!r}"
            )
        return VoiceChatOpening(
            self._runtime,
            self._figures,
            self._prompts,
            system_prompt=system_prompt,
            seed=value,
            max_streaming_seconds=max_streaming_seconds,
            profile=profile,
            scope=prompt_scope,
        )

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        """Trace the TTS's compiled refinement rounds for ``batch_sizes`` rows
        (:func:`realtime.models.voicechat.codes.compile_rounds`) and the fused norms
        and rotary embeddings (:func:`realtime.models.voicechat.fused.trace`)."""
        compile_rounds(self._runtime.model.tts_model.tts_model, batch_sizes)
        trace(self._runtime.model, batch_sizes)

    def prompt_cache_figures(self) -> CacheFigures:
        """The prompt cache's bound, contents and counts (``/health``, ``/metrics``)."""
        return self._prompts.figures()

    def set_prompt_cache_bytes(self, max_bytes: int) -> None:
        """A new bound for the prompt cache (``--prompt-cache-bytes``), emptying it
        (its files and the chain built ahead stay as set); called on the engine thread
        before any session opens."""
        previous = self._prompts
        self._prompts = PromptStates(max_bytes, self._files)
        self._prompts.ahead_seed = previous.ahead_seed
        self._prompts.ahead_tokens = previous.ahead_tokens

    def pin_prompt_cache(self) -> None:
        """Keep the warmed prompts' states whatever later openings need
        (:meth:`realtime.models.voicechat.prompt.PromptStates.pin`)."""
        self._prompts.pin()

    def keep_states(
        self, directory: Path | None, max_bytes: int, *, ahead_seed: int, ahead_tokens: int
    ) -> None:
        """:class:`~realtime.models.prompt_cache.KeepsStates`: the state files (keyed by
        :meth:`state_identity`) and the chain built ahead; empties the cache."""
        from realtime.models.state_files import StateFiles

        self._files = None
        if directory is not None and max_bytes > 0:
            try:
                self._files = StateFiles(directory, max_bytes, self.state_identity(directory))
            except OSError as exc:
                log.warning("prompt states are not kept on disk: %s: %s", directory, exc)
        self.set_prompt_cache_bytes(self._prompts.store.max_bytes)
        self._prompts.ahead_seed = ahead_seed
        self._prompts.ahead_tokens = ahead_tokens

    def state_identity(self, directory: Path) -> dict[str, object]:
        """Everything a prompt state's bits depend on besides its prompt and seed: the
        checkpoint's contents, MLX's and mlx-vlm's versions, the device and backend,
        the CBLAS, the load-time casts and fused modules."""
        from importlib.metadata import version

        from realtime import cpu_blas
        from realtime.models.state_files import checkpoint_digest

        folder = Path(self.path)
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        return {
            "checkpoint": checkpoint_digest(files, directory),
            "mlx": version("mlx"),
            "mlx_vlm": version("mlx-vlm"),
            "device": str(mx.default_device()),
            "metal": bool(mx.metal.is_available()),
            "cuda": bool(getattr(getattr(mx, "cuda", None), "is_available", lambda: False)()),
            "cpu_blas": cpu_blas.active().describe(),
            "cast": self._cast,
            "fused": self._cast,
        }

    def ahead(self, steps: int, quiet: bool) -> AheadSlice:
        """:class:`~realtime.models.prompt_cache.KeepsStates`
        (:meth:`~realtime.models.voicechat.prompt.PromptStates.ahead`)."""
        return self._prompts.ahead(self._runtime, steps, quiet)

    def step(self, frames: Sequence[Frame]) -> list[RowResult]:
        """The sessions' frames as one batched frame step (:func:`run_rows`); sessions
        opened with ``profile=True`` (mlx-vlm's own step) one after another."""
        sessions = [session for session, _, _ in frames]
        if not all(isinstance(s, VoiceChatSession) and not s._reference for s in sessions):
            return step_each(frames)
        rows = [(cast("VoiceChatSession", s), samples, rate) for s, samples, rate in frames]
        return run_rows(rows, self._figures)

    def tool_input(self, output: str) -> ToolInput:
        """:class:`~realtime.models.base.PreparesToolResults` (the tokenizer only)."""
        return tool_input(self._runtime.tokenizer, output)

    def count_tokens(self, text: str) -> int:
        """Prefill steps for ``text`` as the system prompt: its tokens plus BOS and EOS
        (mlx-vlm skips a blank prompt)."""
        if not text.strip():
            return 0
        ids = self._runtime.tokenizer.encode(text, add_special_tokens=False)
        return len(ids) + 2

    def generate_offline(
        self,
        samples: Samples,
        *,
        system_prompt: str | None,
        seed: int,
        max_seconds: float | None = None,
    ) -> OfflineResult:
        """mlx-vlm's offline path: perceive all audio at once, then decode every frame."""

        value = _check_seed(seed)
        max_frames = None
        if max_seconds is not None:
            max_frames = max(2, int(max_seconds / self._figures.frame_seconds))
        try:
            result = self._runtime.generate(
                mx.array(np.asarray(samples, dtype=np.float32)),
                system_prompt=system_prompt,
                seed=value,
                max_frames=max_frames,
                extra_decoding_seconds=0.0,
            )
            audio = np.array(result.audio, dtype=np.float32).reshape(-1)
        except Exception as exc:
            raise InferenceError(f"{type(exc).__name__}: {one_line(str(exc))}") from exc
        tokenizer = self._runtime.tokenizer
        hidden = self._figures.hidden_token_ids
        function_ids = [int(t) for t in np.array(result.function_tokens).tolist()]
        function_text = tokenizer.decode(
            [t for t in function_ids if t not in hidden], skip_special_tokens=False
        )
        return OfflineResult(
            samples=audio,
            sample_rate=int(result.sample_rate),
            text=str(result.text),
            function_text=str(function_text),
            transcript=str(result.user_transcript or ""),
            frames=int(np.array(result.text_tokens).shape[0]),
        )

    def clear_cache(self) -> None:

        # Let queued device work finish first, so a closed session leaves nothing
        # running on MLX's stream worker when its buffers are freed.
        mx.synchronize()
        mx.clear_cache()


def _check_streaming(inner: Any, figures: ModelFigures) -> None:
    """The streaming session must cut and speak what the figures say: the server slices
    appends and the clients frame audio by them."""
    seen = (inner.input_sample_rate, inner.frame_samples, inner.output_sample_rate)
    want = (figures.input_sample_rate, figures.frame_samples, figures.output_sample_rate)
    if seen != want:
        inner.cancel()
        raise SessionInitializationError(
            f"the streaming session runs {seen[1]}-sample frames at {seen[0]} Hz in, "
            f"{seen[2]} Hz out; the model's figures say {want[1]} at {want[0]} Hz, {want[2]} Hz"
        )


def _describe(info: CheckpointInfo) -> str:
    kind = f"{info.quantization_bits}-bit LLM" if info.quantization_bits else "unquantized"
    try:
        index = json.loads((info.path / "model.safetensors.index.json").read_text("utf-8"))
        tensors = len(index.get("weight_map", {}))
    except (OSError, ValueError):
        tensors = 0
    shards = len(info.shards)
    return (
        f"{shards} shard{'s' if shards != 1 else ''}, {_gb(info.total_bytes)}"
        + (f", {tensors} tensors" if tensors else "")
        + f", {kind}"
    )


def load_voicechat(
    path: str | os.PathLike[str], *, info: CheckpointInfo | None = None, cast_weights: bool = True
) -> VoiceChatModel:
    """Load a VoiceChat checkpoint folder with mlx-vlm. Run it on the engine thread.

    No text warm-up is run: the first session's prefill warms what it needs. With
    ``cast_weights`` (the default), the weights that only meet float32 are cast to it
    once here (:mod:`realtime.models.voicechat.cast`; the same bits, fewer casts a frame),
    and their norms and rotary embeddings compiled for frame steps
    (:mod:`realtime.models.voicechat.fused`; the same bits, fewer kernels a frame).
    """

    info = info or check_model_path(path)
    started = time.perf_counter()
    log.info("loading %s from %s (%s)", info.model_id, info.path, _describe(info))
    model, processor = mlx_vlm_load(str(info.path), lazy=True, strict=True, trust_remote_code=False)
    log.info("model graph built and weights mapped in %.1f s", time.perf_counter() - started)
    figures = _loaded_figures(model.config, info.model_id)  # before reading the weights in
    log.debug("%s: %s", info.model_id, figures)
    _materialize(model, started)
    if cast_weights:
        grown = cast_once(model)
        log.info("cast once at load to the float32 they meet: %s more in memory", _gb(grown))
        log.debug("%d norms and rotary embeddings compiled for frame steps", fuse(model))
    runtime = model.create_session(processor)
    log.info("loaded %s in %.1f s", info.model_id, time.perf_counter() - started)
    return VoiceChatModel(runtime, info.path, figures, cast=cast_weights)


__all__ = [
    "OfflineResult",
    "VoiceChatModel",
    "VoiceChatSession",
    "checkpoint_figures",
    "figures_of",
    "load_voicechat",
]
