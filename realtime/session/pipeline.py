"""One WebSocket session's model pipeline, the same for both endpoints.

A dialect is only its rules (a pure state machine: client frames, model results and
time in; events, :mod:`realtime.session.work` and closes out) and its serializer. This
module moves things between the socket, those rules and the engine, once for both
``/v1/realtime`` (:class:`~realtime.native.rules.Conversation`) and
``/openai/v1/realtime`` (:class:`~realtime.openai.connection.OpenAIRules`). Four
tasks share the session, beside the sender of :mod:`realtime.session.lifetime`:

* the *receiver* reads each message and feeds it to the rules (their answers are
  queued for the sender, never written by the receiver; work for the model is queued
  in arrival order, or handed to the engine at once when nothing is ahead of it; text
  the tokenizer must count runs on the tokenizing thread meanwhile);
* the *submitter* takes that work in order and hands audio to the engine frame by
  frame; open, commit and cancel travel as barriers;
* the *collector* awaits each frame (and barrier) in order through the session's
  waker and hands its events on, a frame's audio first. The submitter and the
  collector are joined by a bounded channel whose size sets the pipeline depth
  (``PIPELINE_DEPTH``): the next frame already waits on the engine when one
  finishes, and a cancel or disconnect sets the stop signal that the engine checks
  before each queued frame, so at most the running frame completes after it;
* the *timer* wakes the rules when their clock says (deadlines; the OpenAI
  dialect's silence feed).

The frame latency (a frame's audio arrival until its audio is handed to the
socket), the session report, the engine-failure value (:class:`~realtime.session.work.Failure`)
and the fast path are therefore the same on both endpoints.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Generator, Iterable, Sequence
from contextlib import closing
from typing import ClassVar, Final, Unpack

import attrs
import trio
from trio.lowlevel import RunVar

from realtime.engine.runner import Cancel as CancelCommand
from realtime.engine.runner import Engine, EngineError, Step
from realtime.engine.runner import Flush as FlushCommand
from realtime.engine.runner import Open as OpenCommand
from realtime.engine.runner import Push as PushCommand
from realtime.engine.runner import ToolResult as ToolResultCommand
from realtime.limits import Limits
from realtime.models.base import InferenceError, PreparesToolResults, Samples
from realtime.observe import SessionOutcome
from realtime.session.lifetime import PIPELINE_DEPTH, Audio, Lifetime, Serving, Transport
from realtime.session.rules import (
    CountsText,
    DialectFactory,
    Ended,
    EndsTurns,
    Event,
    FeedsTools,
    Output,
    Rules,
    lacking,
)
from realtime.session.work import (
    CancelModel,
    CountTokens,
    DroppedAudio,
    Failure,
    FeedModel,
    FlushModel,
    LimitRefused,
    OpenModel,
    RunAudio,
    StopModel,
    Work,
)

log = logging.getLogger("realtime.session.pipeline")

TOKENIZING_THREADS: Final = 1
"""Worker threads all connections share for tokenizing what a client sent (tool
outputs, OpenAI instructions): client-controlled work never runs on the engine thread
or the event loop, and never on more than this many threads at once."""

_TOKENIZING: RunVar[trio.CapacityLimiter] = RunVar("tokenizing")


def tokenizing() -> trio.CapacityLimiter:
    """This trio run's limiter for tokenizing threads (:data:`TOKENIZING_THREADS`)."""
    try:
        return _TOKENIZING.get()
    except LookupError:
        limiter = trio.CapacityLimiter(TOKENIZING_THREADS)
        _TOKENIZING.set(limiter)
        return limiter


def refusal(outputs: Iterable[Output]) -> str | None:
    """Why the rules refused the client message they answered with ``outputs`` (the
    first ``error`` event's message, both dialects spell it so), or ``None``."""
    for out in outputs:
        if isinstance(out, dict) and out.get("type") == "error":
            error = out.get("error")
            return str(error.get("message", "")) if isinstance(error, dict) else "refused"
    return None


@attrs.frozen(slots=True, eq=False)
class _Slice:
    future: concurrent.futures.Future[Step | None]
    tag: int
    received_at: float
    """Trio time as its audio arrived (``RunAudio.received_at``), for the frame latency."""
    samples: Samples
    """The frame's input (for a call recording)."""


@attrs.frozen(slots=True, eq=False)
class _Barrier:
    """Open, commit or cancel: runs once every earlier frame is out."""

    work: OpenModel | FlushModel | CancelModel | FeedModel
    done: trio.Event


@attrs.frozen(slots=True)
class _Emit:
    """Outputs that must go out in order with the frames around them."""

    outputs: list[Output]


_Stage = _Slice | _Barrier | _Emit


class Connection:
    """Runs one client's session; ``run`` returns when it is over. A dialect's
    connection says how to build its rules (``dialect``); the lifetime (slot,
    greeting, sender, closes, report) is a :class:`~realtime.session.lifetime.Lifetime`
    this pipeline owns."""

    dialect: ClassVar[DialectFactory]
    """Builds the rules: ``(model, limits, now) -> Rules``."""

    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        **serving: Unpack[Serving],
    ) -> None:
        rules = type(self).dialect(engine.model, limits, trio.current_time())
        self.rules: Rules = rules
        self.lifetime = Lifetime(transport, engine, limits, rules, **serving)
        self._now = self.lifetime.now
        """The session's clock (trio's; a resumable session's stands still while detached)."""
        self.session_id = rules.session_id
        self.engine = engine
        self.observer = self.lifetime.observer
        self._ends = rules if isinstance(rules, EndsTurns) else None
        self._feeds = rules if isinstance(rules, FeedsTools) else None
        self._counts = rules if isinstance(rules, CountsText) else None
        self._frame = engine.model.figures.frame_samples
        """The model's frame: audio goes to the engine one of these at a time."""
        self._rate = engine.model.figures.input_sample_rate
        self.backlog = rules.backlog
        # Unbounded here: the rules bound it (queued messages, pending audio).
        self._work_send, self._work_recv = trio.open_memory_channel[Work](math.inf)
        self._pipe_send, self._pipe_recv = trio.open_memory_channel[_Stage](PIPELINE_DEPTH - 2)
        self._wake = trio.Event()
        """Set when the rules' clock moved earlier than the timer's wait."""
        self._timer_at = math.inf

    async def run(self) -> None:
        """Serve the client until the connection is over."""
        await self.lifetime.run(self._start_tasks)

    @property
    def close_code(self) -> int | None:
        """The close code the connection ended with (None while it runs)."""
        return self.lifetime.close_code

    def ending(self) -> tuple[SessionOutcome, str]:
        """How the session ended and why, as the dialect's rules decided it."""
        return self.rules.ending()

    def _start_tasks(self, nursery: trio.Nursery) -> None:
        life = self.lifetime
        nursery.start_soon(life.until_gone, self._receiver, name=life.task_name("receiver"))
        nursery.start_soon(self._submitter, name=life.task_name("submitter"))
        nursery.start_soon(life.until_gone, self._collector, name=life.task_name("collector"))
        nursery.start_soon(self._timer, name=life.task_name("timer"))

    def _pending_seconds(self) -> float:
        return self.backlog.pending_samples / self._rate

    # --- carrying the rules' outputs ---------------------------------------------------

    async def _apply(
        self, outputs: Iterable[Output], arrived: float = 0.0, *, direct: bool = False
    ) -> None:
        """``direct``: events may be written by this task (``send_or_queue``); only the
        receiver and the collector pass it, never the timer. ``arrived``: the frame's
        ``perf_counter()``, for the ``append_received`` hop only (a benchmark lines it
        up with its client's clock); the frame latency runs on trio's clock instead
        (``RunAudio.received_at``), like everything the rules time."""
        for out in outputs:
            if isinstance(out, dict):
                await self._send_event(out, direct)
            elif isinstance(out, RunAudio):
                self.backlog.accepted(out)
                self.observer.hop("append_received", arrived)
                self.observer.pending_audio(self.session_id, self._pending_seconds())
                if not self._submit_now(out):
                    self._work_send.send_nowait(out)
            elif isinstance(out, (OpenModel, FlushModel, CancelModel, FeedModel)):
                self.backlog.accepted(out)
                self._work_send.send_nowait(out)
            elif isinstance(out, CountTokens):
                counts = self._counts or lacking(self.rules, out, CountsText)
                tokens = await self._count(out)
                await self._apply(counts.counted(out.text, tokens, self._now()), direct=direct)
            elif isinstance(out, StopModel):
                self.lifetime.stop.set()
            elif isinstance(out, LimitRefused):
                self.observer.limit_refused(out.limit)
            elif isinstance(out, DroppedAudio):
                self.observer.input_audio_dropped(out.reason, out.seconds)
                if out.note:
                    log.info("session %s: %s", self.session_id, out.note)
            elif out.now:
                await self.lifetime.close_now(out)
            else:
                await self.lifetime.queue(out)
        self._clock_moved()

    async def _count(self, work: CountTokens) -> int | Exception:
        """A client's text counted on the tokenizing thread (:func:`tokenizing`): never
        on the event loop, whose other connections it would hold up."""
        try:
            return await trio.to_thread.run_sync(work.count, work.text, limiter=tokenizing())
        except Exception as exc:  # the tokenizer refused the text: the rules say so
            return exc

    def _clock_moved(self) -> None:
        """Wake the timer if the rules now want it sooner than it waits (a deadline
        set, a silence frame due); a later time it finds out when it wakes anyway."""
        if self.rules.next_check(self._now()) < self._timer_at:
            self._wake.set()

    async def _send_event(self, event: Event, direct: bool) -> None:
        if event["type"] == "error":
            self.observer.error_sent(event["error"]["code"])
        self.backlog.event_queued()
        text = self.rules.serialize(event)
        await (self.lifetime.send_or_queue(text) if direct else self.lifetime.queue(text))

    # --- tasks ---------------------------------------------------------------------

    async def _receiver(self) -> None:
        rules = self.rules
        while True:
            frame = await self.lifetime.transport.receive()
            arrived = time.perf_counter()
            # Queued for the sender, never written here: a write that finds the socket
            # dead makes Hypercorn put the disconnect into its (full) receive queue from
            # inside the write, which only this task drains.
            outputs = rules.receive(frame, self._now())
            if frame is not None:  # recorded as the rules took it, never parsed again
                self.lifetime.recorder.received(frame, refusal(outputs))
            await self._apply(outputs, arrived)

    async def _timer(self) -> None:
        rules, link = self.rules, self.lifetime.link
        while True:
            if link is not None:
                await link.wait_attached()  # no timer fires while detached
            self._timer_at = math.inf  # its own outputs need no wake
            await self._apply(rules.check_timeouts(self._now()))
            self._wake = trio.Event()
            self._timer_at = rules.next_check(self._now())
            at = self._timer_at if link is None else link.real_time(self._timer_at)
            with trio.move_on_at(at):
                await self._wake.wait()

    async def _submitter(self) -> None:
        async for work in self._work_recv:
            if isinstance(work, RunAudio):
                await self._submit_audio(work)
                continue
            done = trio.Event()
            await self._pipe_send.send(_Barrier(work, done))
            if isinstance(work, OpenModel):
                # Audio behind it needs to know whether the session opened.
                await done.wait()

    async def _submit_audio(self, work: RunAudio) -> None:
        # closing(): a cancelled send still settles the audio's accounts at once.
        with closing(self._audio_stages(work)) as stages:
            for stage in stages:
                await self._pipe_send.send(stage)

    def _submit_now(self, work: RunAudio) -> bool:
        """Hand one frame of audio to the engine from the receiver itself, when nothing
        is ahead of it: the submitter waits on an empty queue and the collector on the
        pipeline. A streamed frame then reaches the engine one trip through trio's
        scheduler sooner; anything else goes through the submitter."""
        if (
            work.samples.shape[0] > self._frame
            or self._work_send.statistics().tasks_waiting_receive == 0
            or self._pipe_send.statistics().tasks_waiting_receive == 0
        ):
            return False
        with closing(self._audio_stages(work)) as stages:
            for stage in stages:
                self._pipe_send.send_nowait(stage)  # at most one, and the collector waits
        return True

    def _audio_stages(self, work: RunAudio) -> Generator[_Stage, None, None]:
        """Submit audio to the engine frame by frame; each frame's stage is yielded for
        the collector before the next is submitted (the pipeline's depth)."""
        rules, backlog = self.rules, self.backlog
        samples = work.samples
        total = int(samples.shape[0])
        instead = rules.begin_audio(work)
        if instead is not None:
            backlog.audio_done(total)  # dropped: its budget comes back
            if instead:
                yield _Emit(list(instead))
            return
        offset = 0
        try:
            while offset < total and rules.keep_submitting(work.tag):
                piece = samples[offset : offset + self._frame]
                future = self.engine.submit(
                    PushCommand(self.session_id, piece, work.sample_rate, self.lifetime.stop)
                )
                n = int(piece.shape[0])
                offset += n
                backlog.submitted(n)
                self.observer.hop("slice_submitted", time.perf_counter())
                self.observer.pending_audio(self.session_id, self._pending_seconds())
                yield _Slice(future, work.tag, work.received_at, piece)
        finally:
            backlog.audio_done(total - offset)

    async def _collector(self) -> None:
        rules = self.rules
        async for stage in self._pipe_recv:
            if isinstance(stage, _Slice):
                try:
                    step = await self.lifetime.waker.result(stage.future)
                except EngineError as exc:
                    now = self._now()
                    self.backlog.frame_back(now)
                    await self._apply(rules.slice_failed(stage.tag, Failure.of(exc), now))
                    continue
                now = self._now()
                self.backlog.frame_back(now)
                self.observer.hop("slice_collected", time.perf_counter())
                if step is None:
                    rules.slice_done(stage.tag, None, now)
                    continue
                self.lifetime.step_seconds.append(step.seconds)
                self.lifetime.recorder.frame(stage.samples, step.events)
                events = rules.slice_done(stage.tag, step.events, now)
                await self._send_frame(events, stage.received_at)
            elif isinstance(stage, _Emit):
                await self._apply(stage.outputs)
            else:
                await self._run_barrier(stage.work)
                stage.done.set()

    async def _send_frame(self, outputs: Sequence[Output], received_at: float) -> None:
        """A frame's outputs: its events written by the collector itself when it can
        (its audio carrying ``received_at`` to the socket), anything else applied."""
        rules = self.rules
        for event in outputs:
            if not isinstance(event, dict):
                await self._apply((event,))
                continue
            if event["type"] == "error":
                self.observer.error_sent(event["error"]["code"])
            self.backlog.event_queued()
            text = rules.serialize(event)
            if event["type"] == rules.audio_event:
                await self.lifetime.send_or_queue(Audio(text, received_at))
            else:
                await self.lifetime.send_or_queue(text)
        self._clock_moved()

    async def _feed(self, output: str) -> tuple[Failure | None, int]:
        """Give the model a tool's output: tokenized on a bounded worker thread (off the
        engine thread and the event loop, refused by size before any tokenizing), then
        fed by the engine as token ids; why it could not (or None), and its tokens."""
        if not self.rules.session_open:
            return Failure("step_failed", "the model session is not open", "tool_result"), 0
        model = self.engine.model
        if not isinstance(model, PreparesToolResults):
            return Failure("step_failed", "this model takes no tool results", "tool_result"), 0
        try:
            tool = await trio.to_thread.run_sync(model.tool_input, output, limiter=tokenizing())
        except InferenceError as exc:
            return Failure("step_failed", str(exc), "tool_result"), 0
        try:
            await self.engine.run(ToolResultCommand(self.session_id, tool, self.lifetime.stop))
        except EngineError as exc:
            return Failure.of(exc), 0
        return None, len(tool.ids)

    async def _run_barrier(self, work: OpenModel | FlushModel | CancelModel | FeedModel) -> None:
        rules = self.rules
        sid = self.session_id
        if isinstance(work, FeedModel):
            feeds = self._feeds or lacking(rules, work, FeedsTools)
            failure, tokens = await self._feed(work.output)
            if failure is None:
                self.lifetime.recorder.tool_result(work.output)
            self.backlog.finished(self._now())
            await self._apply(feeds.fed(failure, self._now(), tokens))
            return
        if isinstance(work, OpenModel):
            started = time.perf_counter()
            command = OpenCommand(
                sid,
                work.system_prompt,
                work.seed,
                work.max_streaming_seconds,
                self.lifetime.stop,
                prompt_scope=self.lifetime.prompt_scope,
            )
            try:
                await self.engine.run(command)
            except EngineError as exc:
                self.backlog.finished(self._now())
                await self._apply(rules.opened(Failure.of(exc), self._now()))
                return
            self.observer.session_opened(time.perf_counter() - started)
            self.backlog.finished(self._now())
            prompt = self.engine.prompt_use(sid)
            await self._apply(rules.opened(None, self._now(), prompt=prompt))
            return
        ends = self._ends or lacking(rules, work, EndsTurns)
        result: Ended = None
        if rules.session_open:
            ending = (
                FlushCommand(sid, work.pad_partial)
                if isinstance(work, FlushModel)
                else CancelCommand(sid)
            )
            try:
                result = await self.engine.run(ending)
            except EngineError as exc:
                result = Failure.of(exc)
        now = self._now()
        self.backlog.finished(now)
        if isinstance(work, FlushModel):
            await self._apply(ends.flushed(result, now))
        else:
            await self._apply(ends.cancelled(result, now))
