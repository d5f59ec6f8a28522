"""One ``/openai/v1/realtime`` connection's plumbing, from accept to close, in one nursery.

The rules live in :class:`~realtime.openai.dialect.Dialect`; this module moves
things between the socket, the dialect and the engine, with the same shape as
:mod:`realtime.connection`:

* the *receiver* feeds each client message to the dialect;
* the *clock* wakes the dialect to feed silence frames (the model's clock runs in
  real time while the client is quiet) and to enforce the idle timeout;
* the *submitter* opens the model session, then hands frames to the engine in
  order; the *collector* awaits them in order. A zero-size channel joins them, so
  one frame runs while the next waits in the engine's queue (``PIPELINE_DEPTH``);
* the *sender* owns every socket write.

Whatever ends the connection, the engine is told to close the session and frees
the reservation once it has.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable

import attrs
import trio

from realtime.connection import PIPELINE_DEPTH, Transport, TransportClosed
from realtime.engine import Close as CloseCommand
from realtime.engine import Engine, EngineError, Step
from realtime.engine import Open as OpenCommand
from realtime.engine import Push as PushCommand
from realtime.limits import Limits
from realtime.models.base import INPUT_SAMPLE_RATE
from realtime.observe import Observer, SessionOutcome, SessionReport
from realtime.openai import events as ev
from realtime.openai.dialect import CLOSE_INTERNAL, Close, Dialect, OpenModel, Output, RunFrame

log = logging.getLogger("realtime.openai")

CLOSE_GOING_AWAY = 1001
CLOSE_TRY_AGAIN = 1013


@attrs.frozen(slots=True, eq=False)
class _Pending:
    """A frame on the engine, with when it was handed over (for the frame latency)."""

    future: concurrent.futures.Future[Step | None] | None
    """``None``: the model session is not open, the frame was not run."""
    submitted_at: float


class OpenAIConnection:
    """Runs one client's OpenAI-dialect session; ``run`` returns when it is over."""

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
        self.session_id = ev.new_id("sess")
        self.dialect = Dialect(
            self.session_id, engine.model.model_id, limits, now=trio.current_time()
        )
        self.close_code: int | None = None
        self.outcome: SessionOutcome = "client_gone"
        self.close_reason = ""
        self._started = trio.current_time()
        self._stop = threading.Event()
        self._released: concurrent.futures.Future[None] | None = None
        self._session_open = False
        self._frames_sent = 0
        self._step_seconds: list[float] = []
        self._out_send, self._out_recv = trio.open_memory_channel[str | Close](
            limits.send_queue_events
        )
        # Unbounded here: the dialect bounds it (max_pending_audio_seconds of frames).
        self._work_send, self._work_recv = trio.open_memory_channel[OpenModel | RunFrame](math.inf)
        self._pipe_send, self._pipe_recv = trio.open_memory_channel[_Pending](PIPELINE_DEPTH - 2)
        self._wake = trio.Event()

    async def run(self) -> None:
        if not self.engine.alive:
            self.observer.connection_refused("engine_unavailable")
            await self._refuse("the model engine has stopped", "engine_unavailable", 1011)
            return
        if not self.engine.try_reserve(self.session_id):
            self.observer.connection_refused("busy")
            await self._refuse(
                "another session is active on this server; try again when it ends",
                "server_busy",
                CLOSE_TRY_AGAIN,
            )
            return
        self.observer.session_started(self.session_id)
        log.info("openai session %s opened", self.session_id)
        try:
            created = ev.session_event("session.created", self.dialect.session)
            await self.transport.send(ev.serialize(created))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._until_gone, self._receiver)
                nursery.start_soon(self._until_gone, self._sender)
                nursery.start_soon(self._clock)
                nursery.start_soon(self._submitter)
                nursery.start_soon(self._collector)
                await self.shutdown.wait()
                self.outcome, self.close_reason = "shutdown", "server shutting down"
                nursery.cancel_scope.cancel()
            if self.outcome == "shutdown":
                self.close_code = CLOSE_GOING_AWAY
                with trio.move_on_after(1.0):
                    await self._close_transport(CLOSE_GOING_AWAY, "server shutting down")
        except TransportClosed:
            pass
        finally:
            self._release()
            self.observer.session_ended(
                SessionReport(
                    session_id=self.session_id,
                    outcome=self.outcome,
                    duration=trio.current_time() - self._started,
                    frames=self._frames_sent,
                    step_seconds=tuple(self._step_seconds),
                    close_code=self.close_code,
                    close_reason=self.close_reason,
                )
            )
            log.info("openai session %s closed (code %s)", self.session_id, self.close_code)

    async def _refuse(self, message: str, code: str, close_code: int) -> None:
        self.close_code = close_code
        try:
            await self.transport.send(
                ev.serialize(ev.error(message, code=code, type_="server_error"))
            )
            await self.transport.close(close_code, message[:120])
        except TransportClosed:
            pass

    def _release(self) -> concurrent.futures.Future[None]:
        """Close the session on the engine (idempotent, synchronous: runs when cancelled)."""
        if self._released is None:
            self._stop.set()
            self._released = self.engine.submit(CloseCommand(self.session_id))
        return self._released

    async def _until_gone(self, task: Callable[[], Awaitable[None]]) -> None:
        try:
            await task()
        except TransportClosed:
            self.outcome, self.close_reason = "client_gone", "client went away"
            self._nursery.cancel_scope.cancel()

    async def _close_transport(self, code: int, reason: str) -> None:
        try:
            await self.transport.close(code, reason)
        except TransportClosed:
            pass

    # --- carrying the dialect's outputs ------------------------------------------------

    async def _apply(self, outputs: Iterable[Output]) -> None:
        for out in outputs:
            if isinstance(out, dict):
                if out["type"] == "error":
                    self.observer.error_sent(out["error"]["code"])
                await self._out_send.send(ev.serialize(out))
            elif isinstance(out, (OpenModel, RunFrame)):
                self._work_send.send_nowait(out)
            else:
                await self._out_send.send(out)
        self._wake.set()

    # --- tasks -----------------------------------------------------------------------------

    async def _receiver(self) -> None:
        while True:
            frame = await self.transport.receive()
            await self._apply(self.dialect.receive(frame, trio.current_time()))

    async def _sender(self) -> None:
        async for item in self._out_recv:
            if isinstance(item, Close):
                self.close_code = item.code
                self.close_reason = item.reason
                self.outcome = "error" if item.code == CLOSE_INTERNAL else "timeout"
                self._release()
                await self._close_transport(item.code, item.reason)
                self._nursery.cancel_scope.cancel()
                return
            await self.transport.send(item)

    async def _clock(self) -> None:
        dialect = self.dialect
        while True:
            await self._apply(dialect.tick(trio.current_time()))
            self._wake = trio.Event()
            with trio.move_on_at(dialect.next_tick(trio.current_time())):
                await self._wake.wait()

    async def _submitter(self) -> None:
        async for work in self._work_recv:
            if isinstance(work, OpenModel):
                await self._open(work)
                continue
            if not self._session_open:
                await self._pipe_send.send(_Pending(None, time.perf_counter()))
                continue
            future = self.engine.submit(
                PushCommand(self.session_id, work.samples, INPUT_SAMPLE_RATE, self._stop)
            )
            self.observer.slice_submitted()
            await self._pipe_send.send(_Pending(future, time.perf_counter()))

    async def _open(self, work: OpenModel) -> None:
        started = time.perf_counter()
        failure: str | None = None
        try:
            await self.engine.run(
                OpenCommand(
                    session_id=self.session_id,
                    system_prompt=work.system_prompt,
                    seed=0,
                    max_streaming_seconds=None,
                    stop=self._stop,
                )
            )
        except EngineError as exc:
            failure = exc.message
            if exc.session_lost:
                await self._apply(self.dialect.failed(exc.message, lost=True))
                return
        else:
            self._session_open = True
            self.observer.session_opened(time.perf_counter() - started)
        await self._apply(self.dialect.opened(failure, trio.current_time()))

    async def _collector(self) -> None:
        dialect = self.dialect
        async for pending in self._pipe_recv:
            if pending.future is None:
                dialect.frame_dropped()
                continue
            try:
                step = await Engine.result(pending.future)
            except EngineError as exc:
                dialect.frame_dropped()
                await self._apply(dialect.failed(exc.message, lost=exc.session_lost))
                continue
            self.observer.slice_collected()
            if step is None:
                dialect.frame_dropped()
                continue
            self._step_seconds.append(step.seconds)
            outputs = dialect.frame_done(step.events)
            if any(
                isinstance(o, dict) and o["type"] == "response.output_audio.delta" for o in outputs
            ):
                self._frames_sent += 1
                self.observer.frame_sent(time.perf_counter() - pending.submitted_at)
            await self._apply(outputs)
