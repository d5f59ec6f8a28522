"""A VoiceChat conversation's streaming timeline on the engine thread: its frames, alone or
batched with other sessions' (:func:`run_rows`), its flush and cancel, and a tool's
output fed into it one step at a time."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import mlx.core as mx
import numpy as np

from realtime.models.base import (
    MAX_TOOL_RESULT_TOKENS,
    ContextLimitReached,
    Done,
    InferenceError,
    ModelEvent,
    ModelFigures,
    PromptUse,
    RowResult,
    Samples,
    ToolInput,
    tool_output_refusal,
)
from realtime.models.checkpoint import one_line
from realtime.models.voicechat.events import convert
from realtime.models.voicechat.tools import tool_response_text

if TYPE_CHECKING:
    from realtime.models.voicechat.keys import SessionKey

log = logging.getLogger(__name__)


class Timeline:
    """What every VoiceChat session keeps beside mlx-vlm's ``VoiceChatStreamingSession``
    (``inner``, which holds the timeline's state: caches, token lists, the RNN-T's and
    the detokenizers' state): its key, its prompt's use, and why it failed.

    Every method runs on the engine thread. After a failure (the context limit,
    a model error) ``push_audio`` keeps raising InferenceError, while ``flush``
    still ends the timeline with ``Done`` so a commit gets its ``response.done``.
    """

    def __init__(
        self, inner: Any, figures: ModelFigures, key: SessionKey, prompt_use: PromptUse
    ) -> None:
        self.prompt_use = prompt_use
        """Its prompt's prefill steps and how many came from the prompt cache."""
        self._inner = inner
        self._figures = figures
        self._key = key
        self._failed: str | None = None
        self._at_limit = False

    @property
    def frame_index(self) -> int:
        return int(self._inner.frame_index)

    def _check_open(self) -> None:
        if self._failed is not None:
            raise (ContextLimitReached if self._at_limit else InferenceError)(self._failed)
        if self._inner.closed:
            raise InferenceError("the session is closed")

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


class VoiceChatSession(Timeline):
    """One streaming timeline whose frames run through the project's own frame step
    (:mod:`realtime.models.voicechat.step`), alone or batched with other sessions'
    (:meth:`~realtime.models.voicechat.model.VoiceChatModel.step`), bit for bit what
    mlx-vlm's own ``push_audio`` gives.
    (mlx-vlm's own step, with its per-stage timings, is
    :class:`~realtime.models.voicechat.reference.ReferenceSession`.)"""

    def __init__(
        self,
        inner: Any,
        figures: ModelFigures,
        key: SessionKey,
        prompt_use: PromptUse,
        *,
        tool_chunk: int = 0,
    ) -> None:
        from realtime.models.voicechat.row import Seat
        from realtime.models.voicechat.step import check_state

        super().__init__(inner, figures, key, prompt_use)
        self._seat = Seat(inner)
        """Its place in a frame batch (released before anything reads its caches alone)."""
        self._tool_chunk = tool_chunk
        """Inserted steps a tool result's slice runs, its language model's in one pass
        (``--prefill sequence``; 0: one step a slice, bit for bit as always)."""
        self._pending = np.zeros(0, dtype=np.float32)
        check_state(inner)

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

    def row(self, frame: Samples) -> Any:
        """This session's row in a batched frame step."""

        from realtime.models.voicechat.row import StepRow

        return StepRow(self._inner, self._key, mx.array(frame), self._seat)

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        result = run_rows([(self, samples, sample_rate)], self._figures)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def flush(self, pad_partial: bool) -> list[ModelEvent]:
        from realtime.models.voicechat.keys import drawing_from

        if self._inner.closed:
            return []
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

    def cancel(self) -> list[ModelEvent]:
        self._pending = np.zeros(0, dtype=np.float32)
        self._seat.release()
        return [convert(e, self._figures) for e in self._inner.cancel()]

    def begin_tool_result(self, tool: ToolInput) -> VoiceChatToolResult:
        """Start feeding a tool's output (its tokens made by
        :meth:`~realtime.models.voicechat.model.VoiceChatModel.tool_input`) to the model
        (:class:`VoiceChatToolResult`; a few steps a slice under ``--prefill sequence``,
        :class:`~SequenceToolResult`). InferenceError
        when the session cannot take it."""
        self._check_open()
        if self._tool_chunk:
            return SequenceToolResult(self, list(tool.ids), self._tool_chunk)
        return VoiceChatToolResult(self, list(tool.ids))


MAX_TOOL_RESPONSE_TOKENS: Final = MAX_TOOL_RESULT_TOKENS
"""The longest tool output (in tokens, tags included) fed to the model."""


def tool_input(tokenizer: Any, output: str) -> ToolInput:
    """``output`` as the model reads it
    (:func:`realtime.models.voicechat.tools.tool_response_text`),
    tokenized; refused by size before tokenizing, and when its JSON nests too deeply
    to parse (CPython's recursion limit)."""
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
        """Run the next slice of inserted steps (:meth:`_run`); True once the last has run."""
        session = self._session
        session._check_open()
        try:
            recorded = self._run()
        except Exception as exc:
            log.exception("feeding a tool result failed")
            raise session.failed(exc) from exc
        if self._next < self.steps:
            return False
        self.closed_with = recorded
        return True

    def _run(self) -> int | None:
        """One inserted step; the function token it recorded."""
        from realtime.models.voicechat.row import StepRow
        from realtime.models.voicechat.step import inserted_step

        session = self._session
        forced = self._ids[self._next] if self._next < len(self._ids) else None
        recorded = inserted_step(StepRow(session._inner, session._key, None, session._seat), forced)
        self._next += 1
        return recorded


class SequenceToolResult(VoiceChatToolResult):
    """A tool's output fed ``chunk`` inserted steps a slice (the tool feed of
    ``--prefill sequence``; :class:`~realtime.models.base.ToolResultFeed`): the steps'
    language-model inputs in one pass, their TTS steps one by one."""

    def __init__(self, session: VoiceChatSession, ids: list[int], chunk: int) -> None:
        super().__init__(session, ids)
        self._chunk = max(1, chunk)

    def _run(self) -> int | None:
        """The next chunk of inserted steps; the function token the last recorded."""
        from realtime.models.voicechat.keys import drawing_from
        from realtime.models.voicechat.row import StepRow
        from realtime.models.voicechat.sequence import cache_arrays
        from realtime.models.voicechat.step import _silence, pad_tts_step

        session = self._session
        row = StepRow(session._inner, session._key, None, session._seat)
        inner = row.inner
        row.seat.release()
        model, config = inner.model, inner.config
        pad = config.pad_token_id
        start = self._next
        end = min(start + self._chunk, self.steps)
        started = inner._timeline_index > 0
        texts = [inner._text_tokens[-1] if started else pad] + [pad] * (end - start - 1)
        first = inner._function_tokens[-1] if started else pad
        functions = [first if start == 0 else self._ids[start - 1]]
        functions += [self._ids[k - 1] for k in range(start + 1, end)]
        stt = model.stt_model
        fused = (
            stt.embed_tokens(mx.array([texts], dtype=mx.int32))
            + _silence(model)
            + config.function_channel_weight * stt.embed_tokens(mx.array([functions], mx.int32))
        )
        output = stt(fused, cache=inner._language_cache)
        last = end == self.steps
        pending = []
        function_id = None
        if last:
            function_id = mx.argmax(output.function_logits[:, -1], axis=-1)
            pending.append(function_id)
        pending += cache_arrays(inner._language_cache)
        steps = end - start
        with drawing_from(row.key):
            for k in range(steps):
                if k == 0 and not started:
                    continue  # the timeline's first step has no TTS step
                pad_tts_step(inner, pad)
        pending.append(inner._previous_code)
        mx.eval(*pending)
        recorded = None
        if last:
            predicted = int(np.asarray(function_id).reshape(-1)[0])
            forced = [self._ids[k] for k in range(start, end - 1)]
            recorded = predicted
        else:
            forced = [self._ids[k] for k in range(start, end)]
        for token in forced:
            inner._text_tokens.append(pad)
            inner._function_tokens.append(token)
        if last:
            inner._text_tokens.append(pad)
            inner._function_tokens.append(recorded)
        inner._timeline_index += steps
        self._next = end
        return recorded


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
