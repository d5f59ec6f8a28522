"""One WebSocket connection's plumbing, from accept to close, in one nursery.

The rules live in :class:`~realtime.conversation.Conversation`; this module only
moves things between the socket, that state machine and the engine. Five tasks
share the connection:

* the *receiver* reads each message and feeds it to the conversation (pings are
  answered at once, work for the model is queued in arrival order);
* the *submitter* takes that work in order and hands audio to the engine slice by
  slice; open, commit and cancel travel as barriers;
* the *collector* awaits each slice (and barrier) in order and queues its events,
  a frame's audio first. The submitter and the collector are joined by a bounded
  channel whose size sets the pipeline depth (``PIPELINE_DEPTH``): the next slice
  already waits on the engine when one finishes, and a cancel or disconnect sets
  the stop signal that the engine checks before each queued slice, so at most the
  running slice completes after it;
* the *timer* enforces the conversation's deadlines (configure, idle, stalled reader).

The lifetime both dialects share lives in :class:`~realtime.plumbing.SessionPlumbing`:
holding the slot, the greeting, the *sender* that owns every socket write, and on
every way out telling the engine to close the session (the engine frees the
reservation once it has) and reporting how it ended.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Generator, Iterable
from contextlib import closing

import attrs
import trio

from realtime import protocol
from realtime.conversation import (
    CancelSession,
    Conversation,
    FlushSession,
    LimitRefused,
    OpenSession,
    Output,
    RunAudio,
    StopModel,
    Work,
)
from realtime.engine import Cancel as CancelCommand
from realtime.engine import Engine, EngineError, FailureKind, Step
from realtime.engine import Flush as FlushCommand
from realtime.engine import Open as OpenCommand
from realtime.engine import Push as PushCommand
from realtime.limits import Limits
from realtime.models.base import FRAME_SAMPLES, INPUT_SAMPLE_RATE, ModelEvent
from realtime.observe import Observer, SessionOutcome
from realtime.plumbing import (
    PIPELINE_DEPTH,
    Audio,
    Refusal,
    SessionPlumbing,
    Transport,
)


@attrs.frozen(slots=True, eq=False)
class _Slice:
    future: concurrent.futures.Future[Step | None]
    append_id: int
    received_at: float
    """Trio time as its append arrived (``RunAudio.received_at``), for the frame latency."""


@attrs.frozen(slots=True, eq=False)
class _Barrier:
    """Open, commit or cancel: runs once every earlier slice is out."""

    work: OpenSession | FlushSession | CancelSession
    done: trio.Event


@attrs.frozen(slots=True)
class _Emit:
    """Outputs that must go out in order with the slices around them."""

    outputs: list[Output]


_Stage = _Slice | _Barrier | _Emit


class Connection(SessionPlumbing):
    """Runs one client's ``/v1/realtime`` session; ``run`` returns when it is over."""

    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        *,
        shutdown: trio.Event | None = None,
        observer: Observer | None = None,
    ) -> None:
        super().__init__(
            transport,
            engine,
            limits,
            session_id=protocol.new_session_id(),
            shutdown=shutdown,
            observer=observer,
        )
        model = engine.model
        self.conversation = Conversation(
            self.session_id,
            limits,
            model_id=model.model_id,
            model_path=model.path,
            now=trio.current_time(),
            count_tokens=model.count_tokens,
        )
        # Unbounded here: the conversation bounds it (MAX_QUEUED_MESSAGES).
        self._work_send, self._work_recv = trio.open_memory_channel[Work](math.inf)
        self._pipe_send, self._pipe_recv = trio.open_memory_channel[_Stage](PIPELINE_DEPTH - 2)

    # --- the dialect's part of the lifetime -------------------------------------------------

    def created_event(self) -> str:
        return protocol.serialize(protocol.session_created(self.session_id))

    def refusal_event(self, code: Refusal, message: str) -> str:
        wire: protocol.ErrorCode = "server_busy" if code == "server_busy" else "inference_error"
        return protocol.serialize(protocol.error_event(wire, message))

    def start_tasks(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._until_gone, self._receiver, name=self.task_name("receiver"))
        nursery.start_soon(self._submitter, name=self.task_name("submitter"))
        nursery.start_soon(self._until_gone, self._collector, name=self.task_name("collector"))
        nursery.start_soon(self._timer, name=self.task_name("timer"))

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None:
        self.conversation.connection_lost(outcome, reason)

    def sending(self, now: float) -> None:
        self.conversation.sending(now)

    def sent(self, now: float) -> None:
        self.conversation.sent(now)
        self.observer.send_queue(self.conversation.unsent)

    def ending(self) -> tuple[SessionOutcome, str]:
        conv = self.conversation
        return conv.outcome or "client_gone", conv.close_reason

    # --- carrying the conversation's outputs -----------------------------------------

    async def _apply(
        self, outputs: Iterable[Output], arrived: float = 0.0, *, direct: bool = False
    ) -> None:
        """``direct``: events may be written by this task (``send_or_queue``); only the
        receiver and the collector pass it, never the timer. ``arrived``: the frame's
        ``perf_counter()``, for the ``append_received`` hook only (a benchmark lines it
        up with its client's clock); the frame latency runs on trio's clock instead
        (``RunAudio.received_at``), like everything the conversation times."""
        for out in outputs:
            if isinstance(out, dict):
                await self._send_event(out, direct)
            elif isinstance(out, RunAudio):
                self.observer.append_received(arrived)
                self.observer.pending_audio(self.conversation.pending_samples / INPUT_SAMPLE_RATE)
                if not self._submit_now(out):
                    self._work_send.send_nowait(out)
            elif isinstance(out, (OpenSession, FlushSession, CancelSession)):
                self._work_send.send_nowait(out)
            elif isinstance(out, StopModel):
                self._stop.set()
            elif isinstance(out, LimitRefused):
                self.observer.limit_refused(out.limit)
            elif out.now:
                await self.close_now(out)
            else:
                await self.queue(out)

    async def _send_event(self, event: protocol.Event, direct: bool) -> None:
        if event["type"] == "error":
            self.observer.error_sent(event["error"]["code"])
        self.conversation.event_queued()
        text = protocol.serialize(event)
        await (self.send_or_queue(text) if direct else self.queue(text))

    # --- tasks ---------------------------------------------------------------------

    async def _receiver(self) -> None:
        conv = self.conversation
        while True:
            frame = await self.transport.receive()
            arrived = time.perf_counter()
            await self._apply(conv.receive(frame, trio.current_time()), arrived, direct=True)

    async def _timer(self) -> None:
        conv = self.conversation
        poll = conv.poll_interval()
        while True:
            now = trio.current_time()
            await self._apply(conv.check_timeouts(now))
            deadline = conv.next_deadline()
            target = now + poll if deadline is None else min(deadline.at, now + poll)
            await trio.sleep_until(target)

    async def _submitter(self) -> None:
        async for work in self._work_recv:
            if isinstance(work, RunAudio):
                await self._submit_audio(work)
                continue
            done = trio.Event()
            await self._pipe_send.send(_Barrier(work, done))
            if isinstance(work, OpenSession):
                # Audio behind it needs to know whether the session opened.
                await done.wait()

    async def _submit_audio(self, work: RunAudio) -> None:
        # closing(): a cancelled send still settles the append's accounts at once.
        with closing(self._audio_stages(work)) as stages:
            for stage in stages:
                await self._pipe_send.send(stage)

    def _submit_now(self, work: RunAudio) -> bool:
        """Hand a one-slice append to the engine from the receiver itself, when nothing
        is ahead of it: the submitter waits on an empty queue and the collector on the
        pipeline. A streamed frame then reaches the engine one trip through trio's
        scheduler sooner; anything else goes through the submitter."""
        if (
            work.append.samples.shape[0] > FRAME_SAMPLES
            or self._work_send.statistics().tasks_waiting_receive == 0
            or self._pipe_send.statistics().tasks_waiting_receive == 0
        ):
            return False
        with closing(self._audio_stages(work)) as stages:
            for stage in stages:
                self._pipe_send.send_nowait(stage)  # at most one, and the collector waits
        return True

    def _audio_stages(self, work: RunAudio) -> Generator[_Stage, None, None]:
        """Submit an append to the engine slice by slice; each slice's stage is yielded
        for the collector before the next is submitted (the pipeline's depth)."""
        conv = self.conversation
        instead = conv.begin_audio(work)
        if instead is not None:
            if instead:
                yield _Emit(instead)
            return
        samples = work.append.samples
        total = int(samples.shape[0])
        offset = 0
        try:
            while offset < total and conv.keep_submitting(work.append_id):
                piece = samples[offset : offset + FRAME_SAMPLES]
                future = self.engine.submit(
                    PushCommand(self.session_id, piece, work.append.sample_rate, self._stop)
                )
                n = int(piece.shape[0])
                offset += n
                conv.slice_submitted(n)
                self.observer.slice_submitted()
                self.observer.pending_audio(conv.pending_samples / INPUT_SAMPLE_RATE)
                yield _Slice(future, work.append_id, work.received_at)
        finally:
            conv.audio_done(total - offset)

    async def _collector(self) -> None:
        conv = self.conversation
        async for stage in self._pipe_recv:
            if isinstance(stage, _Slice):
                try:
                    step = await self.waker.result(stage.future)
                except EngineError as exc:
                    outputs = conv.slice_failed(
                        stage.append_id, exc.kind, exc.message, trio.current_time()
                    )
                    await self._apply(outputs)
                    continue
                self.observer.slice_collected()
                if step is None:
                    conv.slice_done(stage.append_id, None, trio.current_time())
                    continue
                self.step_seconds.append(step.seconds)
                events = conv.slice_done(stage.append_id, step.events, trio.current_time())
                await self._send_frame(events, stage.received_at)
            elif isinstance(stage, _Emit):
                await self._apply(stage.outputs)
            else:
                await self._run_barrier(stage.work)
                stage.done.set()

    async def _send_frame(self, events: list[protocol.Event], received_at: float) -> None:
        conv = self.conversation
        for event in events:
            conv.event_queued()
            text = protocol.serialize(event)
            if event["type"] == protocol.AUDIO_DELTA:
                await self.send_or_queue(Audio(text, received_at))
            else:
                await self.send_or_queue(text)

    async def _run_barrier(self, work: OpenSession | FlushSession | CancelSession) -> None:
        conv = self.conversation
        sid = self.session_id
        if isinstance(work, OpenSession):
            update = work.update
            started = time.perf_counter()
            try:
                await self.engine.run(
                    OpenCommand(
                        sid,
                        update.system_prompt,
                        update.seed,
                        update.max_streaming_seconds,
                        self._stop,
                    )
                )
            except EngineError as exc:
                failure = (exc.kind, exc.message)
                await self._apply(conv.opened(update, failure, trio.current_time()))
                return
            self.observer.session_opened(time.perf_counter() - started)
            await self._apply(conv.opened(update, None, trio.current_time()))
            return
        result: list[ModelEvent] | tuple[FailureKind, str] | None = None
        if conv.session_open:
            command = (
                FlushCommand(sid, work.pad_partial)
                if isinstance(work, FlushSession)
                else CancelCommand(sid)
            )
            try:
                result = await self.engine.run(command)
            except EngineError as exc:
                result = (exc.kind, exc.message)
        now = trio.current_time()
        if isinstance(work, FlushSession):
            await self._apply(conv.flushed(result, now))
        else:
            await self._apply(conv.cancelled(result, now))
