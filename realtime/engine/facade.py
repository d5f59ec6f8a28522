"""What the event loop calls: the engine's public face (:class:`Engine`).

The event loop submits typed commands (:mod:`realtime.engine.commands`: :class:`Open`,
:class:`Push`, :class:`Flush`, :class:`Cancel`, :class:`Close`, :class:`ToolResult`) and is
woken through ``TrioToken.run_sync_soon`` (or, on a connection's per-frame path, its
:class:`Waker`) when the reply is ready; it never runs model code and never parks a trio
worker thread while the model computes. It takes and frees slots
(:mod:`realtime.engine.capacity`), and watches the engine thread's heartbeat
(:func:`watch_for_hung_calls`). What the engine thread does with the commands is
:mod:`realtime.engine.thread`; the state the two sides share is
:class:`realtime.engine.line.Line`, and nothing else crosses.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, overload

import trio

from realtime.engine.capacity import AdmissionRefusal, Capacity
from realtime.engine.commands import (
    Cancel,
    Close,
    Command,
    EngineLoadError,
    Flush,
    Open,
    Push,
    Queued,
    Step,
    ToolResult,
    dead_error,
    settle,
)
from realtime.engine.line import STOP, Line
from realtime.engine.thread import EngineThread
from realtime.models.base import ModelEvent, PromptUse, RealtimeModel
from realtime.observe import Observer

log = logging.getLogger(__name__)

T = TypeVar("T")

SIGNAL_POLL_SECONDS: Final = 0.1
"""How often the main thread, waiting for the model to load, lets a pending signal's
handler run."""


class Waker:
    """A socket pair that wakes one task when a command it awaits has finished.

    :meth:`Engine.result` wakes its caller through ``run_sync_soon``: trio's I/O loop
    first runs its own wake-up task, which then reschedules the caller, one pass
    through the scheduler later. A connection's collector awaits a result on every
    frame, on the path from the model's output to the client, so it gets a socket of
    its own: the engine thread writes one byte, and the I/O loop reschedules the
    collector directly (one scheduler pass less on the frame's path; its cost is in
    docs/performance.md). One task at a time waits on a waker; :meth:`close` it when done.
    """

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._lock = threading.Lock()
        self._closed = False

    def _wake(self, _: object) -> None:
        # Under the lock: a closed socket's descriptor may already belong to another
        # connection, and a stray byte must never reach it.
        with self._lock:
            if not self._closed:
                try:
                    self._write.send(b"\0")
                except OSError:
                    pass  # full: it is readable already

    async def result(self, future: concurrent.futures.Future[T]) -> T:
        """Await ``future`` (from any thread) without parking a thread."""
        if future.done():
            await trio.lowlevel.checkpoint()
            return future.result()
        future.add_done_callback(self._wake)
        while not future.done():
            await trio.lowlevel.wait_readable(self._read)
            try:
                while self._read.recv(256):
                    pass
            except BlockingIOError:
                pass
        return future.result()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._read.close()
            self._write.close()


class Engine:
    """What the event loop calls: the engine's public face. It starts the engine thread
    (:class:`~realtime.engine.thread.EngineThread`), which holds the sessions (by id), and
    keeps the reservations; it talks to that thread only through the commands and their
    futures, and the shared :class:`~realtime.engine.line.Line` under its lock.

    ``capacity`` sessions may hold a reservation at once (1: the seed's rule, one
    conversation per process). A reservation is taken by a connection
    (``try_reserve``) and freed by the engine thread once it has run that session's
    :class:`Close`: a slot is only free when the engine really is, so ``/health`` and
    the next client see the truth. With ``capacity`` > 1 a reservation is also refused
    while the measured step time says one more session would not keep up
    (``admission_margin``; 0: never).

    Commands wait in a :class:`~realtime.engine.scheduler.Scheduler`: each session's in the
    order sent, among sessions earliest deadline first (a frame is due one frame time
    after it was submitted, and a frame after its session's previous one; flush,
    cancel and close at once). An :class:`Open` (warm-up, then one prompt token a
    slice) and a :class:`ToolResult` (one inserted step a slice) run in slices paced
    like frames, so long prompts and tool outputs take the time the running sessions
    leave and never stall them; each stops before its next slice once its connection
    closes or cancels. All of them together get a share of engine time while other conversations
    stream, charged as measured (:mod:`realtime.engine.fairshare`): a slice waits for
    credit, and for a gap it fits in or the moment just after the frames ran. Their
    engine time counts in admission (:class:`~realtime.engine.admission.ExtraWork`), and
    so does the measured lateness of the frames (refused while they fall behind).

    With ``batch_frames`` (``--batch-frames``), a frame that runs takes with it the head
    frame of every other session whose head is a frame (at most ``max_batch``, the
    capacity by default) and the model steps them as one batch of rows: frames only run
    early, none waits for others to arrive. Admission then predicts from the step time
    measured per batch size (:mod:`realtime.engine.admission`).
    """

    def __init__(
        self,
        loader: Callable[[], RealtimeModel],
        *,
        observer: Observer | None = None,
        capacity: int = 1,
        admission_margin: float = 0.0,
        batch_frames: bool = False,
        max_batch: int | None = None,
        warm_up: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if not admission_margin >= 0:
            raise ValueError(f"admission_margin must be >= 0, got {admission_margin}")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.capacity = capacity
        self.admission_margin = admission_margin
        self.batch_frames = batch_frames
        """Run the frames that are due as one model step (``--batch-frames``)."""
        self.max_batch = (max_batch or capacity) if batch_frames else 1
        """Most rows in one model step (the capacity by default; 1: time-sliced)."""
        self.warm_up = warm_up
        """Measure the step at the batch sizes admission predicts from before the engine
        reports ready, so the first clients are admitted by measurement."""
        self._line = Line(
            Capacity(capacity, admission_margin, batch_frames),
            observer if observer is not None else Observer(),
        )
        worker = EngineThread(
            loader,
            self._line,
            batch_frames=batch_frames,
            max_batch=self.max_batch,
            warm_up=warm_up,
        )
        self._thread = threading.Thread(target=worker.run, name="realtime-engine", daemon=True)

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> RealtimeModel:
        """Start the thread, load the model on it, and block until it is ready.

        A failed load raises :class:`EngineLoadError`. Anything raised in the waiting
        thread itself (``KeyboardInterrupt`` on Ctrl-C) is re-raised at once, without
        waiting for the load: it cannot be cancelled, so the engine is abandoned
        instead (see :meth:`_abandon`) and the caller decides how to exit.
        """
        loaded = self._line.loaded
        try:
            self._thread.start()
            while True:
                # Waited for in short steps: a signal the kernel hands to the loading
                # thread (any thread may get a process's signal) runs Python's handler
                # only once the main thread runs again, and a wait without a timeout
                # never returns for it (a SIGINT then hung the process).
                try:
                    error = loaded.exception(timeout=SIGNAL_POLL_SECONDS)
                    break
                except concurrent.futures.TimeoutError:
                    continue
        except BaseException as exc:
            self._abandon(f"interrupted while the model was loading ({type(exc).__name__})")
            raise
        if error is not None:
            self._thread.join()  # the loader has returned: the thread is ending
            raise EngineLoadError(str(error) or type(error).__name__) from error
        return loaded.result()

    def _abandon(self, reason: str) -> None:
        """Give up on a load still running: report dead now and let the (daemon) thread
        end on its own once the load returns, instead of waiting for commands."""
        self._line.die(reason)
        self._line.wake.put(STOP)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop and join: the queued frames, openings and tool results are stopped (the
        one running ends its step), flushes, cancels and closes still run, and every
        open session is cancelled."""
        if self._thread.is_alive():
            self._line.halting = True  # read between commands: a feed stops at its next step
            self._line.wake.put(STOP)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine thread still busy after %.1f s; leaving it", timeout or 0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._line.dead_reason is None

    @property
    def dead_reason(self) -> str | None:
        return self._line.dead_reason

    @property
    def hung(self) -> bool:
        """A model call never returned: the process must be restarted (a Python thread
        cannot be killed)."""
        return self._line.hung

    def busy_for(self, now: float) -> float:
        """Seconds since the running command started or last made progress (0: idle)."""
        beat = self._line.last_beat
        return 0.0 if beat is None else max(0.0, now - beat)

    def declare_hung(self, reason: str) -> None:
        """Give up on the thread: fail the running and every queued command, free the
        slot and report dead, so waiting and new clients get an error at once."""
        line = self._line
        with line.lock:
            line.hung = True
            if line.dead_reason is None:
                line.dead_reason = reason
            running = line.running
        for item in running:
            settle(item.future, exception=dead_error(item.command, reason))
        line.die(reason)

    @property
    def loaded_model(self) -> RealtimeModel | None:
        """The model once loaded (``None`` while loading or after a failed load)."""
        return self._line.model

    @property
    def model(self) -> RealtimeModel:
        model = self._line.model
        if model is None:
            raise RuntimeError("the engine has not loaded a model")
        return model

    def observe(self, observer: Observer) -> None:
        """Report commands to ``observer`` from now on (the server's metrics and logs)."""
        self._line.observer = observer

    # --- reservation --------------------------------------------------------

    def try_reserve(self, session_id: str) -> bool:
        """Take one of the ``capacity`` slots for ``session_id``; False when all are held
        or admission by load refuses (:meth:`refusal` says which)."""
        line = self._line
        with line.lock:
            if line.dead_reason is None and self._refusal() is None:
                line.capacity.reserved.add(session_id)
                return True
            return False

    def refusal(self) -> AdmissionRefusal | None:
        """Why a new conversation would be refused now (``None``: it would be served)."""
        with self._line.lock:
            return self._refusal()

    def _refusal(self) -> AdmissionRefusal | None:
        """:meth:`refusal`, under the lock."""
        return self._line.capacity.refusal(time.monotonic(), self._line.frame_seconds)

    @property
    def step_p90(self) -> float | None:
        """The p90 of recent model steps of any batch size, in seconds (``None``: too
        few measured)."""
        with self._line.lock:
            return self._line.capacity.step_times.quantile()

    @property
    def step_costs(self) -> dict[int, float]:
        """The p90 of recent model steps per batch size (rows), for the sizes measured
        often enough: what admission by load predicts from."""
        with self._line.lock:
            return self._line.capacity.step_times.costs()

    def admission_cost(self) -> float | None:
        """The predicted engine time of one frame of every open conversation and one
        more, and of the recent work that is not a frame (``None``: not measured): what
        admission compares with margin x frame."""
        line = self._line
        with line.lock:
            held = len(line.capacity.reserved)
            return line.capacity.frame_cost(held + 1, time.monotonic(), line.frame_seconds)

    @property
    def queue_depth(self) -> int:
        """Commands waiting for the engine thread, all sessions together."""
        return len(self._line.scheduler)

    def is_reserved(self) -> bool:
        """Whether any session holds a slot."""
        return bool(self._line.capacity.reserved)

    @property
    def reserved(self) -> int:
        """How many slots are held now."""
        return len(self._line.capacity.reserved)

    def release_pending(self) -> concurrent.futures.Future[object] | None:
        """When every slot is held: the queued Close of a session whose client has
        left, if any (the first queued); a slot frees once that future completes."""
        with self._line.lock:
            return self._line.capacity.pending_release()

    # --- commands -----------------------------------------------------------

    @overload
    def submit(self, command: Push) -> concurrent.futures.Future[Step | None]: ...

    @overload
    def submit(self, command: Flush | Cancel) -> concurrent.futures.Future[list[ModelEvent]]: ...

    @overload
    def submit(self, command: Open) -> concurrent.futures.Future[PromptUse]: ...

    @overload
    def submit(self, command: Close | ToolResult) -> concurrent.futures.Future[None]: ...

    def submit(self, command: Command) -> concurrent.futures.Future[object]:  # type: ignore[misc]
        """Queue a command for the engine thread; the future holds its typed result."""
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        line = self._line
        with line.lock:
            if line.dead_reason is not None or not self._thread.is_alive():
                future.set_exception(dead_error(command, line.dead_reason))
                if isinstance(command, Close):
                    line.capacity.reserved.discard(command.session_id)
            else:
                now, queued = time.monotonic(), Queued(command, future)
                if isinstance(command, Push):
                    line.scheduler.add_paced(command.session_id, queued, now, line.frame_seconds)
                    line.last_frame[command.session_id] = now
                elif isinstance(command, (Open, ToolResult)):
                    line.scheduler.add_extra(command.session_id, queued, now, line.extra_period)
                else:
                    line.scheduler.add(command.session_id, queued, now)
                if isinstance(command, Close):
                    # The session's opening or tool result is stopped: its Close, due at
                    # once, must not make that work urgent (its frames stop on their own
                    # signal, which the connection sets before it closes).
                    line.closing.add(command.session_id)
                    if command.session_id in line.capacity.reserved:
                        line.capacity.releasing[command.session_id] = future
        line.wake.put(None)
        return future

    @staticmethod
    async def result(future: concurrent.futures.Future[T]) -> T:
        """Await a submitted command's result without parking a thread."""
        if not future.done():
            token = trio.lowlevel.current_trio_token()
            ready = trio.Event()

            def wake(_: object) -> None:
                try:
                    token.run_sync_soon(ready.set)
                except trio.RunFinishedError:
                    pass

            future.add_done_callback(wake)
            await ready.wait()
        else:
            await trio.lowlevel.checkpoint()
        return future.result()

    @overload
    async def run(self, command: Push) -> Step | None: ...

    @overload
    async def run(self, command: Flush | Cancel) -> list[ModelEvent]: ...

    @overload
    async def run(self, command: Open) -> PromptUse: ...

    @overload
    async def run(self, command: Close | ToolResult) -> None: ...

    async def run(self, command: Command) -> object:
        """Submit a command and await its result."""
        future: concurrent.futures.Future[object] = self.submit(command)  # type: ignore[assignment]
        return await self.result(future)


async def watch_for_hung_calls(
    engine: Engine,
    max_step_seconds: float,
    on_hung: Callable[[str], Awaitable[None]],
) -> None:
    """Declare the engine hung when one model call makes no progress for
    ``max_step_seconds`` (a frame, a prefill step, a flush), then run ``on_hung``.

    A Python thread cannot be killed, so the process must end for its supervisor to
    restart it; ``on_hung`` decides how (the launcher exits non-zero after a grace).
    """
    period = min(1.0, max_step_seconds / 4)
    while engine.alive:
        await trio.sleep(period)
        stuck = engine.busy_for(time.monotonic())
        if stuck > max_step_seconds and engine.alive:
            reason = (
                f"a model call made no progress for {stuck:.1f} s "
                f"(limit {max_step_seconds:g} s, --max-step-seconds); the engine is hung "
                "and the server must be restarted"
            )
            log.critical(reason)
            engine.declare_hung(reason)
            await on_hung(reason)
            return
