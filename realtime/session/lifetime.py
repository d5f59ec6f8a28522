"""What every WebSocket session shares, whatever dialect it speaks.

Both ``/v1/realtime`` (:mod:`realtime.native.connection`) and ``/openai/v1/realtime``
(:mod:`realtime.openai.connection`) hold the one engine slot for their client,
greet it, write every event through one sender task, watch for shutdown, and on
every way out tell the engine to close the session and report how it ended.
That lifetime lives here once, talking to the dialect's rules
(:class:`~realtime.session.rules.Rules`) directly; the pipeline
(:class:`~realtime.session.pipeline.Connection`) owns one and adds its tasks.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, TypedDict, Unpack, runtime_checkable

import attrs
import trio

from realtime.engine.runner import AdmissionRefusal, Engine, EngineError, Waker
from realtime.engine.runner import Close as CloseCommand
from realtime.limits import Limits
from realtime.observe import Observer, SessionOutcome, SessionReport
from realtime.session.close_codes import CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_TRY_AGAIN
from realtime.session.rules import Refusal, Rules, WatchesWrites
from realtime.telemetry.recording import Recorder, Recording
from realtime.tenants import Seat

log = logging.getLogger(__name__)

PIPELINE_DEPTH: Final = 2
"""Slices handed to the engine at once: one running, the next waiting in its queue.
A submitter→collector channel holds ``PIPELINE_DEPTH - 2`` slices: one more is
being awaited by the collector and one more waits in the submitter's send."""

RELEASE_GRACE: Final = 0.5
"""How long a new client waits for a slot whose previous client has already left."""

RECORDING_CLOSE_SECONDS: Final = 10.0
"""How long a session's end waits for its call recording's last write (``--record``)."""


class TransportClosed(Exception):
    """The peer has gone away: ``code`` is the close code of the client's own close
    frame (it hung up), None when the connection dropped without one; ``outcome``:
    the session's outcome when the transport decided it (a resume grace that ran out)."""

    def __init__(self, code: int | None = None, outcome: SessionOutcome | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.outcome = outcome


class Transport(Protocol):
    """What the plumbing needs from a WebSocket (the ASGI one, or an in-memory fake)."""

    async def receive(self) -> str | bytes | None: ...

    async def send(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


@runtime_checkable
class Resumable(Protocol):
    """A transport that outlives its sockets (:class:`realtime.session.link.Link`): the
    session's clock pauses while no socket is attached, and it sends link messages."""

    notify: Callable[[str], None]

    def now(self) -> float: ...
    def real_time(self, at: float) -> float: ...
    async def wait_attached(self) -> None: ...
    async def offer(self) -> None: ...
    async def send_notice(self, text: str) -> None: ...


@attrs.frozen(slots=True)
class Notice:
    """A link message for the sender (an ``error`` answering a bad ack): written to the
    attached socket in order with the events, neither numbered nor journaled."""

    text: str


class CloseOrder(Protocol):
    """A state machine's decision to close: after the queued events, or ``now`` (the
    client stopped reading: release first, then close)."""

    @property
    def code(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def now(self) -> bool: ...


@attrs.frozen(slots=True)
class Audio:
    """A frame's audio event, with when its input arrived (for the frame latency)."""

    text: str
    received_at: float
    """``trio.current_time()`` as the append arrived: the clock the state machine
    runs on, and the one ``_write`` reads when the event is handed to the socket."""


Outgoing = str | Audio | Notice | CloseOrder


class Serving(TypedDict, total=False):
    """What the server hands every connection beside its socket, engine and limits."""

    shutdown: trio.Event | None
    """Set when the server shuts down (the session closes 1001)."""
    observer: Observer | None
    recording: Recording | None
    """``--record``: where call recordings go."""
    tenant: Seat | None
    """Whose key the client carried: its share of conversations, its label, its
    prompt-cache scope (None: no key is asked for)."""


def busy_message(engine: Engine, why: AdmissionRefusal) -> str:
    """What a refused client reads: which of the two limits it met."""
    if why == "overloaded":
        step = engine.step_p90
        measured = f" at {1000 * step:.0f} ms a frame step" if step is not None else ""
        held = engine.reserved
        return (
            f"the server is at its real-time capacity ({held} conversation"
            f"{'' if held == 1 else 's'}{measured}); try again later"
        )
    if engine.capacity == 1:
        return "another session is active on this server; try again when it ends"
    return f"all {engine.capacity} conversations of this server are in use; try again when one ends"


class Lifetime:
    """One client's session over one WebSocket, in one nursery: the slot, the
    greeting, the sender, the closes and the report. It reads the dialect's
    ``rules`` itself (greeting, refusal, how the session ended, the write clock);
    its owner starts the dialect's other tasks (``run``'s ``start_tasks``)."""

    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        rules: Rules,
        **serving: Unpack[Serving],
    ) -> None:
        shutdown, observer = serving.get("shutdown"), serving.get("observer")
        recording = serving.get("recording")
        self.tenant = serving.get("tenant")
        self.prompt_scope = self.tenant.prompt_scope if self.tenant is not None else None
        """The prompt-cache scope this session's openings use (None: the shared one)."""
        self.transport = transport
        self.link = transport if isinstance(transport, Resumable) else None
        """The transport again when it is resumable (None: a plain socket)."""
        self.now: Callable[[], float] = (
            self.link.now if self.link is not None else trio.current_time
        )
        """The session's clock: trio's, less the seconds a resumable one was detached."""
        self.engine = engine
        self.limits = limits
        self.rules = rules
        self._watcher = rules if isinstance(rules, WatchesWrites) else None
        """The rules again, when they keep a clock of their own on socket writes."""
        session_id = rules.session_id
        self.session_id = session_id
        self.shutdown = shutdown if shutdown is not None else trio.Event()
        self.observer = observer if observer is not None else Observer()
        self.recorder = (
            recording.session(session_id, engine.model.figures) if recording else Recorder()
        )
        """``--record``: this session's call recording (by default one that records nothing)."""
        self.close_code: int | None = None
        self._started = trio.current_time()
        self.stop = threading.Event()
        """Set on cancel or release: the engine skips this session's queued work."""
        self._closed_on_engine: concurrent.futures.Future[None] | None = None
        self._writing = False
        """A task other than the sender is writing an event (``send_or_queue``)."""
        self._written = trio.lowlevel.ParkingLot()
        self.frames_sent = 0
        """Frames whose audio was handed to the socket (the session report)."""
        self.step_seconds: list[float] = []
        """Engine time of each model step of this session (the session report)."""
        self.frame_latency: list[float] = []
        """Each frame's latency, its audio received until handed to the socket."""
        self.sessions_at_start = 0
        """Engine slots held once this one was taken (the session report)."""
        self.waker = Waker()
        """For the one task that awaits the model's output frame by frame."""
        self._out_send, self._out_recv = trio.open_memory_channel[Outgoing](
            limits.send_queue_events
        )
        if self.link is not None:
            self.link.notify = self._notify

    def _notify(self, text: str) -> None:
        """Queue a link message for the sender; dropped when the queue is full (a client
        that sends bad acks and reads nothing gets no answer to them)."""
        try:
            self._out_send.send_nowait(Notice(text))
        except trio.WouldBlock:
            pass

    # --- the rules' side of a socket write ------------------------------------------

    def _sending(self, now: float) -> None:
        """A socket write starts (the stalled-reader clock runs until ``_sent``)."""
        self.rules.backlog.sending(now)
        if self._watcher is not None:
            self._watcher.sending(now)

    def _sent(self, now: float) -> None:
        backlog = self.rules.backlog
        backlog.sent(now)
        if self._watcher is not None:
            self._watcher.sent(now)
        self.observer.send_queue(self.session_id, backlog.unsent)

    def report(self) -> SessionReport:
        """The session report, the same for both dialects: the figures are counted
        here, on the shared path; only the outcome is the dialect's."""
        outcome, reason = self.rules.ending()
        return SessionReport(
            session_id=self.session_id,
            outcome=outcome,
            duration=trio.current_time() - self._started,
            frames=self.frames_sent,
            step_seconds=tuple(self.step_seconds),
            frame_latency=tuple(self.frame_latency),
            sessions=self.sessions_at_start,
            close_code=self.close_code,
            close_reason=reason,
            frame_seconds=self.engine.model.figures.frame_seconds,
            tenant=self.tenant.name if self.tenant is not None else None,
        )

    def task_name(self, role: str) -> str:
        """``SESSION_ID:role``, as the connection's tasks are named (trio's task tree,
        debuggers, tests that check which task wrote an event)."""
        return f"{self.session_id}:{role}"

    # --- the lifetime ---------------------------------------------------------------

    async def run(self, start_tasks: Callable[[trio.Nursery], None]) -> None:
        """Serve the client until the connection is over (``start_tasks`` starts the
        dialect's tasks in its nursery); the slot is released on every way out."""
        try:
            await self._serve(start_tasks)
        finally:
            if self.tenant is not None:
                self.tenant.give_back()
            self.waker.close()

    async def _serve(self, start_tasks: Callable[[trio.Nursery], None]) -> None:
        tenant = self.tenant.name if self.tenant is not None else None
        if not self.engine.alive:
            self.observer.connection_refused("engine_unavailable", tenant)
            message = f"the model engine has stopped: {self.engine.dead_reason}"
            await self._refuse("engine_unavailable", message, CLOSE_INTERNAL)
            return
        # The tenant's own share first: a tenant at its limit is told so, whatever the
        # server's slots are doing (its seat goes back when ``run`` ends).
        over = self.tenant.take() if self.tenant is not None else None
        if over is not None:
            self.observer.connection_refused("tenant_limit", tenant)
            log.info("refused a connection (1013): %s", over)
            await self._refuse("server_busy", over, CLOSE_TRY_AGAIN)
            return
        if not await self._reserve():
            why = self.engine.refusal() or "busy"
            self.observer.connection_refused(why, tenant)
            message = busy_message(self.engine, why)
            log.info("refused a connection (1013): %s", message)
            await self._refuse("server_busy", message, CLOSE_TRY_AGAIN)
            return
        self.sessions_at_start = self.engine.reserved
        self.observer.session_started(self.session_id, tenant)
        if tenant is None:
            log.info("session %s opened", self.session_id)
        else:
            log.info("session %s opened (tenant %s)", self.session_id, tenant)
        going_away = False
        try:
            greeting = self.rules.created_event()
            if greeting is not None:
                created = self.rules.serialize(greeting)
                self.recorder.event("server", created)
                await self.transport.send(created)
            if self.link is not None:
                await self.link.offer()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.until_gone, self._sender, name=self.task_name("sender"))
                nursery.start_soon(self.recorder.writer, name=self.task_name("recorder"))
                start_tasks(nursery)
                await self.shutdown.wait()
                going_away = True
                self.rules.connection_lost("shutdown", "server shutting down")
                nursery.cancel_scope.cancel()
        except TransportClosed as closed:
            self.client_gone(closed.code, closed.outcome)
        finally:
            self.release()
            if going_away and self.close_code is None:
                self.close_code = CLOSE_GOING_AWAY
                with trio.move_on_after(1.0):
                    await self._close_transport(CLOSE_GOING_AWAY, "server shutting down")
            self.observer.session_ended(self.report())
            log.info("session %s closed (code %s)", self.session_id, self.close_code)
            # On the worker thread, the client gone; bounded, so a stuck disk cannot
            # hold this handler (the thread finishes or fails on its own).
            with trio.CancelScope(shield=True), trio.move_on_after(RECORDING_CLOSE_SECONDS):
                await self.recorder.close()

    async def _reserve(self) -> bool:
        """Take the slot. If its holder has already left and the engine is closing that
        session, wait for it a little (``RELEASE_GRACE``): a client that arrives just
        as another's connection drops (a balancer hands the replica on at once) is
        served, not refused; a departed session's longer work still answers busy."""
        if self.engine.try_reserve(self.session_id):
            return True
        pending = self.engine.release_pending()
        if pending is None:
            return False
        with trio.move_on_after(RELEASE_GRACE):
            try:
                await Engine.result(pending)
            except EngineError:
                pass
        return self.engine.try_reserve(self.session_id)

    async def _refuse(self, code: Refusal, message: str, close_code: int) -> None:
        self.close_code = close_code
        try:
            await self.transport.send(self.rules.serialize(self.rules.refusal_event(code, message)))
            await self.transport.close(close_code, message[:120])
        except TransportClosed:
            pass

    def release(self) -> concurrent.futures.Future[None]:
        """Tell the engine to close the session; synchronous so it runs even when
        cancelled, and idempotent. The engine frees the slot once it has run it."""
        if self._closed_on_engine is None:
            self.stop.set()
            self._closed_on_engine = self.engine.submit(CloseCommand(self.session_id))
        return self._closed_on_engine

    async def _release_and_wait(self) -> None:
        """Release, and wait until the engine is really free: a client that connects
        as soon as it sees this connection's close must find the slot free."""
        try:
            await Engine.result(self.release())
        except EngineError:
            pass  # a dead engine has freed the slot already

    def client_gone(self, code: int | None = None, outcome: SessionOutcome | None = None) -> None:
        """The client hung up (its close frame's ``code``: ``closed``) or its connection
        dropped (``client_gone``; ``outcome``: the transport's own word, a resume grace
        that ran out); an outcome the rules decided first (``done``, ...) stands, and
        only a session that really lost its client logs it."""
        if outcome is not None:
            self.rules.connection_lost(outcome, "no resume within the grace period")
            log.info("session %s: no resume within the grace period", self.session_id)
            return
        if code is not None:
            if self.close_code is None:
                self.close_code = code
            self.rules.connection_lost("closed", f"client closed ({code})")
            return
        self.rules.connection_lost("client_gone", "client went away")
        if self.rules.ending()[0] == "client_gone":
            log.info("session %s: client went away", self.session_id)

    def finish(self) -> None:
        """End the connection: cancel every task of its nursery."""
        self._nursery.cancel_scope.cancel()

    async def until_gone(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run a task that reads or writes the socket; the peer going away ends the
        whole connection."""
        try:
            await task()
        except TransportClosed as closed:
            self.client_gone(closed.code, closed.outcome)
            self.finish()

    async def _close_transport(self, code: int, reason: str) -> None:
        try:
            await self.transport.close(code, reason)
        except TransportClosed:
            pass

    async def _close_within(self, code: int, reason: str, seconds: float) -> None:
        """Close the WebSocket, and abort its TCP connection if the close has not gone
        out within ``seconds``: a client that reads nothing must not hold the
        connection open by not reading its close (or a write still ahead of it).

        Hypercorn shields socket writes, so a timeout around the close cannot end a
        write that is stuck; a second task aborts the connection instead, which makes
        the stuck write fail at once (it then cancels the close, for a transport that
        cannot abort but whose close is cancellable).
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._abort_after, seconds, nursery.cancel_scope)
            await self._close_transport(code, reason)
            nursery.cancel_scope.cancel()

    async def _abort_after(self, seconds: float, close: trio.CancelScope) -> None:
        await trio.sleep(seconds)
        abort: Callable[[], object] | None = getattr(self.transport, "abort", None)
        if abort is not None:
            log.warning("session %s: aborting its TCP connection", self.session_id)
            abort()
        close.cancel()

    # --- writing ----------------------------------------------------------------------

    async def queue(self, item: Outgoing) -> None:
        """Hand an event (or a close after the events already queued) to the sender.

        Without a yield while the queue has room: a frame queues two or three events,
        and each yield would cost the collector a trip through trio's scheduler."""
        try:
            self._out_send.send_nowait(item)
        except trio.WouldBlock:
            await self._out_send.send(item)

    async def close_now(self, close: CloseOrder) -> None:
        """Drop a client that reads nothing while events wait for it.

        Hypercorn shields socket writes, so a blocked write cannot be cancelled: the
        session and the slot are released first, then the connection is told to
        close, which completes once the write finishes or the TCP connection dies.
        If it has not within ``send_timeout``, the transport's TCP connection is
        aborted (``_close_within``), which ends the blocked write and frees the
        descriptor.
        """
        log.warning(
            "session %s: client read nothing for %.1f s; dropping it",
            self.session_id,
            self.limits.send_timeout,
        )
        self.release()
        self.close_code = close.code
        self.finish()
        # Shielded: the cancel above must not stop the close; bounded, so a client
        # that never reads again cannot hold this task forever.
        with trio.CancelScope(shield=True):
            await self._close_within(close.code, close.reason, self.limits.send_timeout)

    async def send_or_queue(self, item: str | Audio) -> None:
        """Hand an event to the client, written by the calling task itself when the
        sender is idle with nothing queued, queued behind what waits otherwise.

        Written at once, a frame's audio (or a pong) reaches the socket one trip
        through trio's scheduler sooner (docs/performance.md). The collector
        (a model frame's events) and the receiver (answers to the client's own
        messages) call this, each run under ``_until_gone`` like the sender; the clock
        never does, so it stays free to notice a client that has stopped reading
        (``close_now``) even while such a write is stuck.
        """
        if self._writing or self._out_send.statistics().tasks_waiting_receive == 0:
            await self.queue(item)
            return
        self._writing = True
        try:
            await self._write(item)
        finally:
            self._writing = False
            self._written.unpark_all()

    async def _write(self, item: str | Audio) -> None:
        self._sending(self.now())
        self.recorder.event("server", item if isinstance(item, str) else item.text)
        if isinstance(item, str):
            await self.transport.send(item)
            self._sent(self.now())
            return
        self.observer.hop("audio_sending", time.perf_counter())
        await self.transport.send(item.text)
        self.observer.hop("audio_sent", time.perf_counter())
        now = self.now()
        # Trio's clock, like ``received_at``: the frame latency is one clock's difference,
        # measured here for both dialects (append received until handed to the socket).
        self.frames_sent += 1
        latency = now - item.received_at
        self.frame_latency.append(latency)
        self.observer.frame_sent(latency)
        self._sent(now)

    async def _sender(self) -> None:
        async for item in self._out_recv:
            while self._writing:  # a frame's event queued before this one goes first
                await self._written.park()
            if isinstance(item, (str, Audio)):
                await self._write(item)
            elif isinstance(item, Notice):
                if self.link is not None:
                    await self.link.send_notice(item.text)
            else:
                self.close_code = item.code
                await self._release_and_wait()
                # Bounded like a stalled write: the client may read nothing more.
                await self._close_within(item.code, item.reason, self.limits.send_timeout)
                self.finish()
                return
