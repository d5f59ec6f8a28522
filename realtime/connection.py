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
* the *sender* owns every socket write;
* the *timer* enforces the conversation's deadlines (configure, idle, stalled reader).

Whatever ends the connection, the engine is told to close the session, and the
engine frees the reservation once it has done so.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, Protocol

import attrs
import trio

from realtime import protocol
from realtime.conversation import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CLOSE_TRY_AGAIN,
    CancelSession,
    Close,
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
from realtime.engine import Close as CloseCommand
from realtime.engine import Engine, EngineError, FailureKind, Step
from realtime.engine import Flush as FlushCommand
from realtime.engine import Open as OpenCommand
from realtime.engine import Push as PushCommand
from realtime.limits import Limits
from realtime.models.base import FRAME_SAMPLES, INPUT_SAMPLE_RATE, ModelEvent
from realtime.observe import Observer, SessionReport

log = logging.getLogger("realtime.connection")

PIPELINE_DEPTH: Final = 2
"""Slices handed to the engine at once: one running, the next waiting in its queue.
The submitter→collector channel holds ``PIPELINE_DEPTH - 2`` slices: one more is
being awaited by the collector and one more waits in the submitter's send."""

AUDIO_DELTA: Final = "response.audio.delta"


class TransportClosed(Exception):
    """The peer has gone away."""


class Transport(Protocol):
    """What the plumbing needs from a WebSocket (the ASGI one, or an in-memory fake)."""

    async def receive(self) -> str | bytes | None: ...

    async def send(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@attrs.frozen(slots=True)
class _Audio:
    """A frame's audio event, with when its append arrived (for the frame latency)."""

    text: str
    received_at: float


_Outgoing = str | _Audio | Close


@attrs.frozen(slots=True, eq=False)
class _Slice:
    future: concurrent.futures.Future[Step | None]
    append_id: int
    received_at: float


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


class Connection:
    """Runs one client's session; ``run`` returns when the connection is over."""

    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        *,
        shutdown: trio.Event | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.transport = transport
        self.engine = engine
        self.limits = limits
        self.shutdown = shutdown if shutdown is not None else trio.Event()
        self.observer = observer if observer is not None else Observer()
        self.session_id = protocol.new_session_id()
        model = engine.model
        self.conversation = Conversation(
            self.session_id,
            limits,
            model_id=model.model_id,
            model_path=model.path,
            now=trio.current_time(),
            count_tokens=model.count_tokens,
        )
        self.close_code: int | None = None
        self._started = trio.current_time()
        self._closed_on_engine: concurrent.futures.Future[None] | None = None
        self._stop = threading.Event()
        """Set on cancel or release: the engine skips this session's queued work."""
        self._out_send, self._out_recv = trio.open_memory_channel[_Outgoing](
            limits.send_queue_events
        )
        # Unbounded here: the conversation bounds it (MAX_QUEUED_MESSAGES).
        self._work_send, self._work_recv = trio.open_memory_channel[Work](math.inf)
        self._pipe_send, self._pipe_recv = trio.open_memory_channel[_Stage](PIPELINE_DEPTH - 2)

    # --- entry point ------------------------------------------------------------

    async def run(self) -> None:
        if not self.engine.alive:
            self.observer.connection_refused("engine_unavailable")
            await self._refuse(
                "inference_error",
                f"the model engine has stopped: {self.engine.dead_reason}",
                CLOSE_INTERNAL,
            )
            return
        if not self.engine.try_reserve(self.session_id):
            self.observer.connection_refused("busy")
            log.info("refused a connection: another session is active (1013)")
            await self._refuse(
                "server_busy",
                "another session is active on this server; try again when it ends",
                CLOSE_TRY_AGAIN,
            )
            return
        self.observer.session_started(self.session_id)
        log.info("session %s opened", self.session_id)
        urgent: Close | None = None
        try:
            await self.transport.send(protocol.serialize(protocol.session_created(self.session_id)))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._until_gone, self._receiver)
                nursery.start_soon(self._submitter)
                nursery.start_soon(self._collector)
                nursery.start_soon(self._until_gone, self._sender)
                nursery.start_soon(self._timer)
                await self.shutdown.wait()
                urgent = Close(CLOSE_GOING_AWAY, "server shutting down")
                self.conversation.connection_lost("shutdown", urgent.reason)
                nursery.cancel_scope.cancel()
        except TransportClosed:
            self._client_gone()
        finally:
            self._release()
            if urgent is not None and self.close_code is None:
                self.close_code = urgent.code
                with trio.move_on_after(1.0):
                    await self._close_transport(urgent)
            self._report()

    async def _refuse(self, code: protocol.ErrorCode, message: str, close_code: int) -> None:
        self.close_code = close_code
        try:
            await self.transport.send(protocol.serialize(protocol.error_event(code, message)))
            await self.transport.close(close_code, message[:120])
        except TransportClosed:
            pass

    def _release(self) -> concurrent.futures.Future[None]:
        """Tell the engine to close the session; synchronous so it runs even when
        cancelled, and idempotent. The engine frees the slot once it has run it."""
        if self._closed_on_engine is None:
            self._stop.set()
            self._closed_on_engine = self.engine.submit(CloseCommand(self.session_id))
        return self._closed_on_engine

    async def _release_and_wait(self) -> None:
        """Release, and wait until the engine is really free: a client that connects
        as soon as it sees this connection's close must find the slot free."""
        try:
            await Engine.result(self._release())
        except EngineError:
            pass  # a dead engine has freed the slot already

    def _report(self) -> None:
        conv = self.conversation
        report = SessionReport(
            session_id=self.session_id,
            outcome=conv.outcome or "client_gone",
            duration=trio.current_time() - self._started,
            frames=conv.frames,
            step_seconds=tuple(conv.step_seconds),
            close_code=self.close_code,
            close_reason=conv.close_reason,
        )
        self.observer.session_ended(report)
        log.info("session %s closed (code %s)", self.session_id, self.close_code)

    def _client_gone(self) -> None:
        log.info("session %s: client went away", self.session_id)
        self.conversation.connection_lost("client_gone", "client went away")

    def _finish(self) -> None:
        self._nursery.cancel_scope.cancel()

    async def _until_gone(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a socket task; the peer going away ends the whole connection."""
        try:
            await task()
        except TransportClosed:
            self._client_gone()
            self._finish()

    async def _close_transport(self, close: Close) -> None:
        try:
            await self.transport.close(close.code, close.reason)
        except TransportClosed:
            pass

    # --- carrying the conversation's outputs -----------------------------------------

    async def _apply(self, outputs: Iterable[Output], received_at: float = 0.0) -> None:
        for out in outputs:
            if isinstance(out, dict):
                await self._send_event(out)
            elif isinstance(out, RunAudio):
                self.observer.append_received(received_at)
                self.observer.pending_audio(self.conversation.pending_samples / INPUT_SAMPLE_RATE)
                self._work_send.send_nowait(out)
            elif isinstance(out, (OpenSession, FlushSession, CancelSession)):
                self._work_send.send_nowait(out)
            elif isinstance(out, StopModel):
                self._stop.set()
            elif isinstance(out, LimitRefused):
                self.observer.limit_refused(out.limit)
            elif out.now:
                await self._close_now(out)
            else:
                await self._out_send.send(out)

    async def _send_event(self, event: protocol.Event) -> None:
        if event["type"] == "error":
            self.observer.error_sent(event["error"]["code"])
        self.conversation.event_queued()
        await self._out_send.send(protocol.serialize(event))

    async def _close_now(self, close: Close) -> None:
        """Drop a client that reads nothing while events wait for it.

        Hypercorn shields socket writes, so a blocked write cannot be cancelled:
        the session and the slot are released here first, then the connection
        is told to close, which completes once the write finishes or the TCP
        connection dies. If it has not within ``send_timeout``, the transport's TCP
        connection is aborted (where it can be: ``abort()``), which ends the blocked
        write and frees the descriptor.
        """
        log.warning(
            "session %s: client read nothing for %.1f s; dropping it",
            self.session_id,
            self.limits.send_timeout,
        )
        self._release()
        self.close_code = close.code
        self._finish()
        # Shielded: the cancel above must not stop the close; bounded, so a client
        # that never reads again cannot hold this task forever.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.limits.send_timeout) as bounded:
                await self._close_transport(close)
            abort: Callable[[], object] | None = getattr(self.transport, "abort", None)
            if bounded.cancelled_caught and abort is not None:
                log.warning("session %s: aborting its TCP connection", self.session_id)
                abort()

    # --- tasks ---------------------------------------------------------------------

    async def _receiver(self) -> None:
        conv = self.conversation
        while True:
            frame = await self.transport.receive()
            received_at = time.perf_counter()
            await self._apply(conv.receive(frame, trio.current_time()), received_at)

    async def _sender(self) -> None:
        conv = self.conversation
        observer = self.observer
        async for item in self._out_recv:
            if isinstance(item, Close):
                self.close_code = item.code
                await self._release_and_wait()
                await self._close_transport(item)
                self._finish()
                return
            conv.sending(trio.current_time())
            if isinstance(item, _Audio):
                observer.audio_send(True)
                await self.transport.send(item.text)
                observer.audio_send(False)
                observer.frame_sent(time.perf_counter() - item.received_at)
            else:
                await self.transport.send(item)
            conv.sent(trio.current_time())
            observer.send_queue(conv.unsent)

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
        conv = self.conversation
        instead = conv.begin_audio(work)
        if instead is not None:
            if instead:
                await self._pipe_send.send(_Emit(instead))
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
                await self._pipe_send.send(_Slice(future, work.append_id, work.received_at))
        finally:
            conv.audio_done(work, total - offset)

    async def _collector(self) -> None:
        conv = self.conversation
        async for stage in self._pipe_recv:
            if isinstance(stage, _Slice):
                try:
                    step = await Engine.result(stage.future)
                except EngineError as exc:
                    outputs = conv.slice_failed(
                        stage.append_id, exc.kind, exc.message, trio.current_time()
                    )
                    await self._apply(outputs)
                    continue
                self.observer.slice_collected()
                if step is None:
                    conv.slice_done(stage.append_id, None, 0.0, trio.current_time())
                    continue
                events = conv.slice_done(
                    stage.append_id, step.events, step.seconds, trio.current_time()
                )
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
            if event["type"] == AUDIO_DELTA:
                await self._out_send.send(_Audio(text, received_at))
            else:
                await self._out_send.send(text)

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
