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
* the shared lifetime (:class:`~realtime.plumbing.SessionPlumbing`): the slot, the
  greeting, the sender that owns every socket write (the dialect runs the
  stalled-reader clock), release on every way out and the session report.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Iterable

import attrs
import trio

from realtime.close_codes import CLOSE_INTERNAL, Close
from realtime.engine import Engine, EngineError, Step
from realtime.engine import Open as OpenCommand
from realtime.engine import Push as PushCommand
from realtime.limits import Limits
from realtime.models.base import INPUT_SAMPLE_RATE
from realtime.observe import Observer, SessionOutcome
from realtime.openai import events as ev
from realtime.openai.dialect import Dialect, OpenModel, Output, RunFrame
from realtime.plumbing import PIPELINE_DEPTH, Audio, Refusal, SessionPlumbing, Transport

AUDIO_DELTA = "response.output_audio.delta"
"""The event a frame's audio travels in: handed to the socket as plumbing ``Audio``, so
the frame latency is measured where the native endpoint measures it."""

log = logging.getLogger("realtime.openai")


@attrs.frozen(slots=True, eq=False)
class _Pending:
    """A frame on the engine, with when its audio arrived (for the frame latency)."""

    future: concurrent.futures.Future[Step | None] | None
    """``None``: the model session is not open, the frame was not run."""
    received_at: float
    """Trio time as the message (or the clock's tick) that made the frame arrived:
    the frame latency runs from there to the socket, as on the native endpoint."""


@attrs.frozen(slots=True, eq=False)
class _Frame:
    """A frame for the submitter, stamped as it arrived."""

    frame: RunFrame
    received_at: float


class OpenAIConnection(SessionPlumbing):
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
        super().__init__(
            transport,
            engine,
            limits,
            session_id=ev.new_id("sess"),
            shutdown=shutdown,
            observer=observer,
        )
        self.dialect = Dialect(
            self.session_id,
            engine.model.model_id,
            limits,
            now=trio.current_time(),
            count_tokens=engine.model.count_tokens,
        )
        self.outcome: SessionOutcome = "client_gone"
        self.close_reason = ""
        self._session_open = False
        # Unbounded here: the dialect bounds it (max_pending_audio_seconds of frames).
        self._work_send, self._work_recv = trio.open_memory_channel[OpenModel | _Frame](math.inf)
        self._pipe_send, self._pipe_recv = trio.open_memory_channel[_Pending](PIPELINE_DEPTH - 2)
        self._wake = trio.Event()

    # --- the dialect's part of the lifetime -------------------------------------------------

    def created_event(self) -> str:
        return ev.serialize(ev.session_event("session.created", self.dialect.session))

    def refusal_event(self, code: Refusal, message: str) -> str:
        return ev.serialize(ev.error(message, code=code, type_="server_error"))

    def start_tasks(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._until_gone, self._receiver, name=self.task_name("receiver"))
        nursery.start_soon(self._clock, name=self.task_name("clock"))
        nursery.start_soon(self._submitter, name=self.task_name("submitter"))
        nursery.start_soon(self._until_gone, self._collector, name=self.task_name("collector"))

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None:
        if not self.close_reason:
            self.outcome, self.close_reason = outcome, reason

    def sending(self, now: float) -> None:
        self.dialect.sending(now)

    def sent(self, now: float) -> None:
        self.dialect.sent(now)

    def ending(self) -> tuple[SessionOutcome, str]:
        return self.outcome, self.close_reason

    # --- carrying the dialect's outputs ------------------------------------------------

    async def _apply(
        self, outputs: Iterable[Output], *, direct: bool = False, received_at: float = 0.0
    ) -> None:
        """``direct``: events may be written by this task (``send_or_queue``); only the
        receiver and the collector pass it, never the clock. ``received_at``: when the
        message (or tick) these outputs answer arrived; the collector passes the
        frame's, so its audio carries it to the socket."""
        for out in outputs:
            if isinstance(out, dict):
                if out["type"] == "error":
                    self.observer.error_sent(out["error"]["code"])
                text = ev.serialize(out)
                item: str | Audio = Audio(text, received_at) if out["type"] == AUDIO_DELTA else text
                await (self.send_or_queue(item) if direct else self.queue(item))
            elif isinstance(out, OpenModel):
                self._work_send.send_nowait(out)
            elif isinstance(out, RunFrame):
                self._work_send.send_nowait(_Frame(out, received_at))
            else:
                self._closing(out)
                if out.now:
                    await self.close_now(out)
                else:
                    await self.queue(out)
        self._wake.set()

    def _closing(self, close: Close) -> None:
        self.close_reason = close.reason
        if close.now:
            self.outcome = "stalled_client"
        else:
            self.outcome = "error" if close.code == CLOSE_INTERNAL else "timeout"

    # --- tasks -----------------------------------------------------------------------------

    async def _receiver(self) -> None:
        while True:
            frame = await self.transport.receive()
            now = trio.current_time()
            await self._apply(self.dialect.receive(frame, now), direct=True, received_at=now)

    async def _clock(self) -> None:
        dialect = self.dialect
        while True:
            now = trio.current_time()
            await self._apply(dialect.tick(now), received_at=now)
            self._wake = trio.Event()
            with trio.move_on_at(dialect.next_tick(trio.current_time())):
                await self._wake.wait()

    async def _submitter(self) -> None:
        async for work in self._work_recv:
            if isinstance(work, OpenModel):
                await self._open(work)
                continue
            if not self._session_open:
                await self._pipe_send.send(_Pending(None, work.received_at))
                continue
            future = self.engine.submit(
                PushCommand(self.session_id, work.frame.samples, INPUT_SAMPLE_RATE, self._stop)
            )
            self.observer.slice_submitted()
            await self._pipe_send.send(_Pending(future, work.received_at))

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
                await self._apply(
                    self.dialect.failed(exc.message, lost=True, now=trio.current_time())
                )
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
                step = await self.waker.result(pending.future)
            except EngineError as exc:
                dialect.frame_dropped()
                await self._apply(
                    dialect.failed(exc.message, lost=exc.session_lost, now=trio.current_time())
                )
                continue
            self.observer.slice_collected()
            if step is None:
                dialect.frame_dropped()
                continue
            self.step_seconds.append(step.seconds)
            outputs = dialect.frame_done(step.events)
            await self._apply(outputs, direct=True, received_at=pending.received_at)
