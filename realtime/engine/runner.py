"""The engine: one long-lived thread that owns the model and runs every model call.

MLX ties streams to the thread that created them, and trio's worker threads do
not keep their identity, so the model is loaded on, and only ever touched by,
the single thread started here. The async side submits typed commands
(:class:`Open`, :class:`Push`, :class:`Flush`, :class:`Cancel`, :class:`Close`,
:class:`ToolResult`)
and is woken through ``TrioToken.run_sync_soon`` (or, on a connection's per-frame
path, its :class:`Waker`) when the reply is ready; it never runs model code and never
parks a trio worker thread while the model computes.

With ``batch_frames`` the frames that are due run as one batched model step
(:meth:`RealtimeModel.step` with one row per conversation, chosen by
:meth:`Scheduler.pop_batch`); each row keeps its own result, failure and deadline.

The engine knows nothing of the wire protocol: its failures carry their own
:class:`FailureKind`, which the connection maps to wire error codes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import math
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, Literal, TypeVar, overload

import attrs
import numpy as np
import trio

from realtime.engine import admission, fairshare, first_start, scheduler
from realtime.engine.admission import ExtraWork, StepTimes
from realtime.engine.fairshare import FrameLateness, ShareBucket
from realtime.engine.scheduler import Entry, Scheduler
from realtime.models import base as model
from realtime.models.base import (
    Frame,
    ModelEvent,
    ModelSession,
    Opening,
    PromptUse,
    RealtimeModel,
    RowResult,
    Samples,
)
from realtime.models.prompt_cache import KeepsStates
from realtime.observe import CommandKind, Observer

log = logging.getLogger("realtime.engine.runner")

T = TypeVar("T")

AdmissionRefusal = Literal["busy", "overloaded"]
"""Why a new conversation is refused: every slot is held (``--max-sessions``), or the
measured step time says one more would make the open ones fall behind
(``--admission-margin``, :mod:`realtime.engine.admission`)."""

FailureKind = Literal["open_failed", "step_failed", "context_limit", "session_lost", "engine_dead"]
"""``open_failed``: nothing was opened, the client may try again. ``step_failed``: the
model refused this input but the session goes on (bad rate). ``context_limit``: the
session reached its ``max_streaming_seconds`` and takes no more audio.
``session_lost``: the session is gone. ``engine_dead``: the engine thread has stopped."""


class EngineError(Exception):
    """A command failed; ``kind`` says what is left of the session."""

    def __init__(self, kind: FailureKind, message: str, *, during: CommandKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message
        self.during: CommandKind = during

    @property
    def session_lost(self) -> bool:
        """True when the session is gone (the connection cannot go on with it)."""
        return self.kind in ("session_lost", "engine_dead")


class EngineLoadError(Exception):
    """The loader failed; the message is the model's own."""


# --- commands -------------------------------------------------------------------


@attrs.frozen(slots=True, eq=False)
class Open:
    """Open the session: seed, voice warm-up, system-prompt prefill. Result: ``None``."""

    session_id: str
    system_prompt: str | None
    seed: int
    max_streaming_seconds: float | None
    stop: threading.Event | None = None
    """Set when the connection is gone: a queued open is skipped."""
    prompt_scope: str | None = attrs.field(default=None, kw_only=True)
    """Whose prompt cache the prefill is looked up in and stored to (the tenant's
    name; None: the shared scope, where warmed prompts are)."""


@attrs.frozen(slots=True, eq=False)
class Push:
    """Run one slice of audio. Result: a :class:`Step`, or ``None`` when ``stop`` was set
    while it waited in the queue (a cancel or disconnect: queued audio must not run)."""

    session_id: str
    samples: Samples
    sample_rate: int
    stop: threading.Event | None = None


@attrs.frozen(slots=True)
class Flush:
    """Run the partial frame (zero-padded when ``pad_partial``) and end. Result: events."""

    session_id: str
    pad_partial: bool = True


@attrs.frozen(slots=True)
class Cancel:
    """End the session without running more audio. Result: events (``Cancelled``)."""

    session_id: str


@attrs.frozen(slots=True)
class Close:
    """Drop the session (cancel it if it is still running), clear the buffer cache and
    free the reservation. Result: ``None``."""

    session_id: str


@attrs.frozen(slots=True)
class ToolResult:
    """Give the session's model a tool's ``output`` (the OpenAI endpoint's
    ``function_call_output``), one inserted model step per slice with other sessions'
    frames between the slices (:class:`realtime.models.base.TakesToolResults`); the
    session's own later commands wait for it. Result: ``None``."""

    session_id: str
    tool: model.ToolInput
    """Tokenized before it is submitted (off the engine thread)."""
    stop: threading.Event | None = attrs.field(default=None, eq=False)
    """Set when the connection is gone or cancelled: the feed stops before its next
    step (a queued :class:`Close` of the session stops it too)."""


Command = Open | Push | Flush | Cancel | Close | ToolResult


@attrs.frozen(slots=True, eq=False)
class Step:
    """What one :class:`Push` produced, and the engine time it took."""

    events: list[ModelEvent]
    seconds: float
    """The model step this frame ran in; batched, the whole batch's (what one frame of
    this conversation held the shared engine for)."""
    rows: int = 1
    """Frames (one per conversation) in that model step."""


@attrs.define(slots=True)
class _Queued:
    command: Command
    future: concurrent.futures.Future[object]
    opening: Opening | None = None
    """An Open under way: its next slice runs when the scheduler picks it again."""
    engine_seconds: float = 0.0
    """A sliced command's engine time over all its slices."""
    started: bool = False
    """A sliced command whose first slice has run (its future is running)."""
    began: bool = False
    """An Open that passed its checks (it counts against the capacity until it ends)."""
    feed: model.ToolResultFeed | None = None
    """A ToolResult under way: its next step runs when the scheduler picks it again."""
    slice_seconds: float | None = None
    """A sliced command's last slice: what its next is expected to cost."""
    slice_steps: int = 0
    """Model steps its last slice ran, where the engine sizes its slices
    (:class:`~realtime.models.base.SizedSlices`; 0: none, or not sized)."""
    ask: int | None = None
    """Steps its next slice may run (None: as many as it likes), set as it starts."""


@attrs.define(slots=True)
class _Timing:
    """How long a model call held the engine (set when it ends)."""

    seconds: float = 0.0


@attrs.define(slots=True)
class _Active:
    session_id: str
    session: ModelSession
    finished: bool = False
    """Flushed or cancelled: closing must not cancel it again."""


_STOP: Final = object()

SIGNAL_POLL_SECONDS: Final = 0.1
"""How often the main thread, waiting for the model to load, lets a pending signal's
handler run."""

OPEN_SLICE_FRAMES: Final = 2
"""Work that is not a frame (an opening's slices, a tool result's steps) is due this
many frame times after it is queued, gives way to a waiting frame unless overdue by as
many (:meth:`Engine._yields`), and a conversation with a frame in the last this many
frame times counts as streaming (:meth:`Engine._streams`): while one does, that work
takes only its share of engine time (:meth:`Engine._held_now`)."""

STEPS_MOST: Final = 64
"""Most steps the engine asks of one sized slice (the model's own most bounds it too:
:attr:`~realtime.models.base.SizedSlices.most_steps`)."""

AHEAD_STEPS: Final = 16
"""Most steps of work no one waits for (a voice chain built ahead of need) in one idle
slice (:meth:`Engine._work_ahead`; :func:`realtime.engine.scheduler.idle_steps` decides
how many fit)."""

WARM_UP_DISCARDED: Final = 2
"""Warm-up steps of each batch size run before the measured ones (a fresh session's
first frames run slower while buffers and kernels warm up)."""

_KINDS: Final[dict[type[Command], CommandKind]] = {
    Open: "open",
    Push: "push",
    Flush: "flush",
    Cancel: "cancel",
    Close: "close",
    ToolResult: "tool_result",
}


def _settle(
    future: concurrent.futures.Future[object],
    *,
    result: object = None,
    exception: BaseException | None = None,
) -> None:
    """Complete a future unless it already is (a hung call's future is failed early)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
    """Owns the model thread, the sessions open on it (by id) and the reservations.

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
    engine time counts in admission (:class:`ExtraWork`), and so does the measured
    lateness of the frames (refused while they fall behind).

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
        reports ready (:meth:`_start_up`), so the first clients are admitted by
        measurement."""
        self._loader = loader
        self._observer = observer if observer is not None else Observer()
        self._wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        """One token per submitted command (and _STOP): the engine thread sleeps on it
        while the scheduler is empty."""
        self._scheduler: Scheduler[str, _Queued] = Scheduler()  # under _state_lock
        self._frame_seconds = 0.08
        """One frame of the loaded model (``figures.frame_seconds``): a frame's deadline."""
        self._step_times = StepTimes()  # under _state_lock
        self._extra_work = ExtraWork()  # under _state_lock
        """Engine time of the work that is not a frame, counted by admission."""
        self._closing: set[str] = set()  # under _state_lock
        """Sessions whose Close is queued: their queued work is stopped."""
        self._halting = False
        """The engine is shutting down: its queued frames, openings and tool results are
        stopped."""
        self._share = ShareBucket(self._frame_seconds)  # under _state_lock
        """Engine seconds work that is not a frame may spend while conversations stream
        (:mod:`realtime.engine.fairshare`)."""
        self._lateness = FrameLateness()  # under _state_lock
        """How late the recent frames ended: readiness and admission by what happens."""
        self._last_frame: dict[str, float] = {}  # under _state_lock
        """When each session's latest frame reached the engine (a batch's gathering)."""
        self._thread = threading.Thread(target=self._run, name="realtime-engine", daemon=True)
        self._loaded: concurrent.futures.Future[RealtimeModel] = concurrent.futures.Future()
        self._state_lock = threading.Lock()
        self._dead_reason: str | None = None
        self._reserved: set[str] = set()
        self._releasing: dict[str, concurrent.futures.Future[object]] = {}
        """The queued Close of each reserved session whose client has left."""
        self._model: RealtimeModel | None = None
        self._sessions: dict[str, _Active] = {}  # engine thread only
        self._openings: set[str] = set()  # engine thread only: Opens under way
        self._slices: collections.deque[float] = collections.deque(maxlen=16)
        """The last slices of any sliced command: the dearest is a first slice's expected
        cost (an opening's first slice builds its session). Engine thread only."""
        self._step_seconds: collections.deque[float] = collections.deque(maxlen=16)
        """Engine seconds a model step of the last sized slices took (engine thread)."""
        self._wholes: collections.deque[float] = collections.deque(maxlen=16)
        """The last slices that could not be cut (a first slice, an opening's last):
        the dearest is what the next such slice is expected to cost (engine thread)."""
        self._after_frames = False  # engine thread only
        """The last thing the engine ran was a frame step: the next frame of each stream
        is furthest off, the moment for a slice that fits no gap."""
        self._running: tuple[_Queued, ...] = ()
        """The commands the running model call serves (a batch: one per row)."""
        self._last_beat: float | None = None
        """``time.monotonic()`` of the running command's start or last step (None: idle)."""
        self._hung = False
        self._ahead_left = True  # engine thread only
        """The model may have work no one waits for (:meth:`_work_ahead`)."""
        self._ahead_broken = False  # engine thread only: it raised once, never again
        self._ahead_costs: deque[float] = deque(maxlen=16)  # engine thread only
        """Engine seconds per step of the recent idle slices."""

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> RealtimeModel:
        """Start the thread, load the model on it, and block until it is ready.

        A failed load raises :class:`EngineLoadError`. Anything raised in the waiting
        thread itself (``KeyboardInterrupt`` on Ctrl-C) is re-raised at once, without
        waiting for the load: it cannot be cancelled, so the engine is abandoned
        instead (see :meth:`_abandon`) and the caller decides how to exit.
        """
        try:
            self._thread.start()
            while True:
                # Waited for in short steps: a signal the kernel hands to the loading
                # thread (any thread may get a process's signal) runs Python's handler
                # only once the main thread runs again, and a wait without a timeout
                # never returns for it (a SIGINT then hung the process).
                try:
                    error = self._loaded.exception(timeout=SIGNAL_POLL_SECONDS)
                    break
                except concurrent.futures.TimeoutError:
                    continue
        except BaseException as exc:
            self._abandon(f"interrupted while the model was loading ({type(exc).__name__})")
            raise
        if error is not None:
            self._thread.join()  # the loader has returned: the thread is ending
            raise EngineLoadError(str(error) or type(error).__name__) from error
        return self._loaded.result()

    def _abandon(self, reason: str) -> None:
        """Give up on a load still running: report dead now and let the (daemon) thread
        end on its own once the load returns, instead of waiting for commands."""
        self._die(reason)
        self._wake.put(_STOP)

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop and join: the queued frames, openings and tool results are stopped (the
        one running ends its step), flushes, cancels and closes still run, and every
        open session is cancelled."""
        if self._thread.is_alive():
            self._halting = True  # read between commands: a feed stops at its next step
            self._wake.put(_STOP)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine thread still busy after %.1f s; leaving it", timeout or 0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._dead_reason is None

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def hung(self) -> bool:
        """A model call never returned: the process must be restarted (a Python thread
        cannot be killed)."""
        return self._hung

    def busy_for(self, now: float) -> float:
        """Seconds since the running command started or last made progress (0: idle)."""
        beat = self._last_beat
        return 0.0 if beat is None else max(0.0, now - beat)

    def declare_hung(self, reason: str) -> None:
        """Give up on the thread: fail the running and every queued command, free the
        slot and report dead, so waiting and new clients get an error at once."""
        with self._state_lock:
            self._hung = True
            if self._dead_reason is None:
                self._dead_reason = reason
            running = self._running
        for item in running:
            _settle(item.future, exception=self._dead_error(item.command, reason))
        self._die(reason)

    @property
    def loaded_model(self) -> RealtimeModel | None:
        """The model once loaded (``None`` while loading or after a failed load)."""
        return self._model

    @property
    def model(self) -> RealtimeModel:
        if self._model is None:
            raise RuntimeError("the engine has not loaded a model")
        return self._model

    def observe(self, observer: Observer) -> None:
        """Report commands to ``observer`` from now on (the server's metrics and logs)."""
        self._observer = observer

    # --- reservation --------------------------------------------------------

    def try_reserve(self, session_id: str) -> bool:
        """Take one of the ``capacity`` slots for ``session_id``; False when all are held
        or admission by load refuses (:meth:`refusal` says which)."""
        with self._state_lock:
            if self._dead_reason is None and self._refusal() is None:
                self._reserved.add(session_id)
                return True
            return False

    def refusal(self) -> AdmissionRefusal | None:
        """Why a new conversation would be refused now (``None``: it would be served)."""
        with self._state_lock:
            return self._refusal()

    def _refusal(self) -> AdmissionRefusal | None:
        held = len(self._reserved)
        if held >= self.capacity:
            return "busy"
        if self.admission_margin > 0 and held > 0:
            cost = self._frame_cost(held + 1)
            if not admission.fits(held, cost, self._frame_seconds, self.admission_margin):
                return "overloaded"
            if not self._lateness.keeps_real_time(time.monotonic(), self._frame_seconds):
                return "overloaded"  # the admitted conversations are falling behind
        return None

    def _frame_cost(self, sessions: int) -> float | None:
        """One frame of ``sessions`` conversations, and the work that is not a frame
        (measured over the last seconds), in engine seconds; under ``_state_lock``."""
        costs = self._step_times.costs()
        cost = admission.frame_cost(sessions, costs, batched=self.batch_frames)
        if cost is None:
            return None
        return cost + self._extra_work.per_frame(time.monotonic(), self._frame_seconds)

    @property
    def step_p90(self) -> float | None:
        """The p90 of recent model steps of any batch size, in seconds (``None``: too
        few measured)."""
        with self._state_lock:
            return self._step_times.quantile()

    @property
    def step_costs(self) -> dict[int, float]:
        """The p90 of recent model steps per batch size (rows), for the sizes measured
        often enough: what admission by load predicts from."""
        with self._state_lock:
            return self._step_times.costs()

    def admission_cost(self) -> float | None:
        """The predicted engine time of one frame of every open conversation and one
        more, and of the recent work that is not a frame (``None``: not measured): what
        admission compares with margin x frame."""
        with self._state_lock:
            return self._frame_cost(len(self._reserved) + 1)

    def prompt_use(self, session_id: str) -> PromptUse:
        """How an open session read its system prompt (set once when it opened and never
        changed, so the event loop may read it once its ``Open`` has returned)."""
        active = self._sessions.get(session_id)
        session = None if active is None else active.session
        if isinstance(session, model.UsesPrompt):
            return session.prompt_use
        return PromptUse()

    @property
    def queue_depth(self) -> int:
        """Commands waiting for the engine thread, all sessions together."""
        return len(self._scheduler)

    def is_reserved(self) -> bool:
        """Whether any session holds a slot."""
        return bool(self._reserved)

    @property
    def reserved(self) -> int:
        """How many slots are held now."""
        return len(self._reserved)

    def _release(self, session_id: str) -> None:
        with self._state_lock:
            self._reserved.discard(session_id)
            self._releasing.pop(session_id, None)

    # --- commands -----------------------------------------------------------

    @overload
    def submit(self, command: Push) -> concurrent.futures.Future[Step | None]: ...

    @overload
    def submit(self, command: Flush | Cancel) -> concurrent.futures.Future[list[ModelEvent]]: ...

    @overload
    def submit(self, command: Open | Close | ToolResult) -> concurrent.futures.Future[None]: ...

    def submit(self, command: Command) -> concurrent.futures.Future[object]:  # type: ignore[misc]
        """Queue a command for the engine thread; the future holds its typed result."""
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._state_lock:
            if self._dead_reason is not None or not self._thread.is_alive():
                future.set_exception(self._dead_error(command, self._dead_reason))
                if isinstance(command, Close):
                    self._reserved.discard(command.session_id)
            else:
                now, queued = time.monotonic(), _Queued(command, future)
                if isinstance(command, Push):
                    self._scheduler.add_paced(command.session_id, queued, now, self._frame_seconds)
                    self._last_frame[command.session_id] = now
                elif isinstance(command, (Open, ToolResult)):
                    self._scheduler.add_extra(command.session_id, queued, now, self._extra_period)
                else:
                    self._scheduler.add(command.session_id, queued, now)
                if isinstance(command, Close):
                    # The session's opening or tool result is stopped: its Close, due at
                    # once, must not make that work urgent (its frames stop on their own
                    # signal, which the connection sets before it closes).
                    self._closing.add(command.session_id)
                    if command.session_id in self._reserved:
                        self._releasing[command.session_id] = future
        self._wake.put(None)
        return future

    def release_pending(self) -> concurrent.futures.Future[object] | None:
        """When every slot is held: the queued Close of a session whose client has
        left, if any (the first queued); a slot frees once that future completes."""
        with self._state_lock:
            pending = [f for f in self._releasing.values() if not f.done()]
        return pending[0] if pending else None

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
    async def run(self, command: Open | Close | ToolResult) -> None: ...

    async def run(self, command: Command) -> object:
        """Submit a command and await its result."""
        future: concurrent.futures.Future[object] = self.submit(command)  # type: ignore[assignment]
        return await self.result(future)

    # --- the engine thread ----------------------------------------------------

    def _run(self) -> None:
        if not self._load():
            return
        entries: list[Entry[str, _Queued]] = []
        try:
            while self._dead_reason is None:
                work = self._await_work()
                if work is None:
                    break
                entries = work
                if not entries:
                    continue
                if isinstance(entries[0].item.command, Push):
                    self._step_frames(entries)
                else:
                    self._execute(entries[0])
                entries = []
                self._ahead_left = True  # a command may leave work for idle time
            self._die("shut down")
        except BaseException as exc:
            reason = f"engine thread died: {_describe(exc)}"
            log.critical(reason, exc_info=True)
            self._die(reason)
            for entry in entries:
                _settle(entry.item.future, exception=self._dead_error(entry.item.command, reason))
        finally:
            self._abandon_left()

    def _load(self) -> bool:
        """Load the model and start it up; whether the engine is ready (a failure has
        killed the engine and reached ``start`` through ``_loaded``)."""
        started = time.perf_counter()
        try:
            self._model = self._loader()
        except BaseException as exc:
            self._die(f"model failed to load: {_describe(exc)}")
            self._loaded.set_exception(exc)
            return False
        log.info(
            "model %s ready on thread %s in %.2f s",
            self._model.model_id,
            threading.current_thread().name,
            time.perf_counter() - started,
        )
        self._frame_seconds = self._model.figures.frame_seconds
        self._share = ShareBucket(self._frame_seconds)
        try:
            self._start_up()
        except BaseException as exc:
            self._die(f"model failed to start: {_describe(exc)}")
            self._loaded.set_exception(exc)
            return False
        self._loaded.set_result(self._model)
        return True

    def _await_work(self) -> list[Entry[str, _Queued]] | None:
        """The next entries to run; ``[]`` after waiting for a wake-up (look again),
        None once halting with nothing left to run."""
        wait: float | None = None
        entries: list[Entry[str, _Queued]] = []
        with self._state_lock:
            if not self._halting:
                wait = self._gather_wait(time.monotonic())
            if wait is None:
                entries = self._pop()
                if not entries and len(self._scheduler):
                    wait = self._share_wait(time.monotonic())
        if wait is not None:
            # A frame that will join this batch is on its way; any command
            # submitted meanwhile wakes the thread to look again.
            try:
                self._halting = self._wake.get(timeout=wait) is _STOP or self._halting
            except queue.Empty:
                pass
            return []
        if not entries:
            if self._halting:
                return None
            if self._work_ahead():
                return []  # one idle slice ran: look at the queue again
            self._halting = self._wake.get() is _STOP or self._halting
            return []
        return entries

    def _work_ahead(self) -> bool:
        """With nothing queued, one slice of the model's work no one waits for (the
        voice chain built ahead, state files written: :class:`KeepsStates`), as many
        steps as :func:`~realtime.engine.scheduler.idle_steps` lets fit before a frame
        that arrives meanwhile is due; whether one ran. A file is written only while no
        conversation is open. Not counted in admission: it yields to any command."""
        work_model = self._model
        if self._ahead_broken or not self._ahead_left:
            return False
        if not isinstance(work_model, KeepsStates):
            return False
        streaming = bool(self._sessions)
        with self._state_lock:
            frame = admission.frame_cost(
                len(self._sessions), self._step_times.costs(), batched=self.batch_frames
            )
        steps = scheduler.idle_steps(
            streaming=streaming,
            frame_cost=frame,
            step_cost=max(self._ahead_costs) if self._ahead_costs else None,
            frame_seconds=self._frame_seconds,
            most=AHEAD_STEPS,
        )
        quiet = not self._sessions and not self._openings
        if steps == 0 and not quiet:
            return False
        with self._beating(()) as timing:
            try:
                work = work_model.ahead(steps, quiet)
            except Exception:
                log.exception("work ahead of need failed; the engine does no more of it")
                self._ahead_broken = True
                return False
        if work.steps:
            self._ahead_costs.append(timing.seconds / work.steps)
        self._ahead_left = work.more
        if not work.more and self._ahead_costs:
            self._clear_cache_if_alone()  # the buffers the build used
            self._ahead_costs.clear()
        return True

    def _abandon_left(self) -> None:
        """As the engine thread ends: every queued command fails with the engine's
        death, every session is dropped and every reservation released."""
        with self._state_lock:
            left = self._scheduler.drain()
        for queued in left:
            if queued.item.opening is not None:
                queued.item.opening.abandon()
            _settle(queued.item.future, exception=self._dead_error(queued.item.command, None))
        for session_id in list(self._sessions):
            self._drop(session_id)
        with self._state_lock:
            self._reserved.clear()

    # --- start-up ---------------------------------------------------------------

    def _start_up(self) -> None:
        """Model work that runs once, on the engine thread, after the load and before the
        engine reports ready (``start`` returns, so ``/ready`` and every client wait for
        it). Each kind of warm-up is one step here."""
        self._compile_step()
        if self.warm_up:
            self._measure_steps()

    def _compile_step(self) -> None:
        """Have a model with compiled step pieces (:class:`~realtime.models.base.CompilesStep`)
        trace them for every batch size this engine steps (1 to ``max_batch``), so the
        compilation is paid here and not by the first conversation of each size."""
        if not isinstance(self.model, model.CompilesStep):
            return
        sizes = range(1, self.max_batch + 1)
        log.info("%s", first_start.start_note(len(sizes)))
        began = time.perf_counter()
        try:
            self.model.compile_step(sizes)
        except Exception:
            log.exception("compiling the model step at start failed; frames compile as they come")
            return
        log.info(
            "compiled the model step for %d batch size(s) at start in %.2f s",
            len(sizes),
            time.perf_counter() - began,
        )

    def _measure_steps(self) -> None:
        """Step silence through sessions opened for it at the batch sizes admission
        predicts from (1, and ``max_batch`` when batching: two sizes give admission its
        line over every size between), ``MIN_SAMPLES`` measured steps each after
        ``WARM_UP_DISCARDED``, so admission decides from measurement from the first
        client on; the sessions are closed and the buffer cache cleared after. Real
        frames replace these times as they run (each size keeps its last ``WINDOW``)."""
        began = time.perf_counter()
        figures = self.model.figures
        silence = np.zeros(figures.frame_samples, np.float32)
        sizes = sorted({1, self.max_batch})
        sessions: list[ModelSession] = []
        try:
            for seed in range(sizes[-1]):
                sessions.append(
                    model.open_session(
                        self.model, system_prompt=None, seed=seed, max_streaming_seconds=None
                    )
                )
            for rows in sizes:
                frames = [(session, silence, figures.input_sample_rate) for session in sessions]
                for n in range(WARM_UP_DISCARDED + admission.MIN_SAMPLES):
                    with self._beating(()) as timing:
                        results = self._step_rows(frames[:rows])
                    failed = next((r for r in results if isinstance(r, Exception)), None)
                    if failed is not None:
                        raise failed
                    if n >= WARM_UP_DISCARDED:
                        with self._state_lock:
                            self._step_times.add(timing.seconds, rows)
        except Exception:
            log.exception("measuring the model step at start failed; admission waits for frames")
        finally:
            for session in sessions:
                try:
                    session.cancel()
                except Exception:
                    log.exception("closing a warm-up session failed")
            self.model.clear_cache()
        log.info(
            "measured the model step at start in %.1f s: %s",
            time.perf_counter() - began,
            ", ".join(
                f"{rows} row(s) p90 {cost * 1000:.1f} ms" for rows, cost in self.step_costs.items()
            )
            or "nothing",
        )

    # --- the engine thread ------------------------------------------------------

    @property
    def _extra_period(self) -> float:
        return OPEN_SLICE_FRAMES * self._frame_seconds

    def _stopped(self, command: Command) -> bool:
        """A queued command that must not run its model work: its connection is gone or
        cancelled, the engine is shutting down, or (an opening or a tool result) its
        session's Close is queued."""
        if not isinstance(command, (Push, Open, ToolResult)):
            return False
        stop = command.stop
        return (
            self._halting
            or (stop is not None and stop.is_set())
            or (not isinstance(command, Push) and command.session_id in self._closing)
        )

    def _pop(self) -> list[Entry[str, _Queued]]:
        """The commands that run next (a batch of frames, or one other command); under
        ``_state_lock``. An opening's slice or a tool result's step gives way to waiting
        frames (:meth:`_yields`) and, while other conversations stream, waits for its
        share of engine time (:meth:`_held_now`); ``[]`` when only held work is queued."""
        held = self._held_now(time.monotonic())
        return self._scheduler.pop_batch(self._joins_batch, self.max_batch, self._yields, held)

    def _waiting(self, frame: Entry[str, _Queued], now: float) -> bool:
        """A frame due within a frame time: one that arrived (a burst's later frames,
        due a frame apart, are not waiting yet)."""
        return frame.due <= now + self._frame_seconds

    def _yields(self, entry: Entry[str, _Queued], frame: Entry[str, _Queued]) -> bool:
        """Whether an opening's slice or a tool result's step gives way to ``frame``: when
        the frame is waiting, unless the step has been overdue for ``OPEN_SLICE_FRAMES``
        frame times (frames kept the engine busy all along: an overloaded engine still
        lets openings progress, within their share, :meth:`_held`). So a slice starts
        just after the waiting frames ran, when the next frame is furthest off."""
        if not isinstance(entry.item.command, (Open, ToolResult)):
            return False
        now = time.monotonic()
        if not self._waiting(frame, now):
            return False
        return now < entry.due + self._extra_period

    def _joins_batch(self, entry: Entry[str, _Queued]) -> bool:
        """A frame still wanted joins a batch; anything else runs alone."""
        command = entry.item.command
        return isinstance(command, Push) and not self._stopped(command)

    @contextlib.contextmanager
    def _beating(self, items: tuple[_Queued, ...]) -> Iterator[_Timing]:
        """Around one model call: the commands it serves (the watchdog fails them if it
        hangs) and its heartbeat; the time it held the engine once it ends."""
        timing = _Timing()
        self._running = items
        self._last_beat = time.monotonic()
        started = time.perf_counter()
        try:
            yield timing
        finally:
            timing.seconds = time.perf_counter() - started
            self._last_beat = None
            self._running = ()

    def _count_extra(self, seconds: float, key: str | None = None) -> None:
        """Engine time of work that is not a frame (of conversation ``key``): for
        admission, and charged to the share such work gets while other conversations
        stream (:meth:`_held_now`)."""
        with self._state_lock:
            now = time.monotonic()
            self._extra_work.add(now, seconds)
            streams = self._streams(now, key)
            share = self._share_of(streams, self._step_times.costs())
            self._share.charge(now, seconds, share, contended=streams > 0)

    # --- fair share of engine time (realtime.engine.fairshare) ---------------------

    def _recent(self, now: float, besides: str | None) -> list[float]:
        """When each conversation but ``besides`` that streams (a frame in the last
        ``OPEN_SLICE_FRAMES`` frame times) handed over its latest frame."""
        recent = now - OPEN_SLICE_FRAMES * self._frame_seconds
        return [t for k, t in self._last_frame.items() if t >= recent and k != besides]

    def _streams(self, now: float, besides: str | None = None) -> int:
        """Conversations other than ``besides`` streaming now (a recent frame, or frames
        queued); under ``_state_lock``. A conversation's own frames wait behind its own
        opening or tool feed anyway, so they never hold that work back."""
        streaming = len(self._recent(now, besides))
        if streaming == 0:
            queued = self._scheduler.most_urgent(
                lambda e: e.key != besides and self._joins_batch(e)
            )
            return 0 if queued is None else 1
        return streaming

    def _share_of(self, streams: int, costs: dict[int, float]) -> float:
        """The share of wall time work that is not a frame gets beside ``streams``
        streaming conversations: what their predicted frames leave
        (:func:`realtime.engine.fairshare.extra_share`); under ``_state_lock``."""
        cost = admission.frame_cost(streams, costs, batched=self.batch_frames)
        return fairshare.extra_share((cost or 0.0) / self._frame_seconds)

    def _held_now(self, now: float) -> Callable[[Entry[str, _Queued]], bool]:
        """Which commands wait for their share now: an opening's slice or a tool
        result's step while another conversation streams, when the share's bucket has no
        credit, or when the slice (its last one's cost) would not end in time for the
        next frame expected, unless the engine just stepped the frames and they have
        been on time for ``RECOVERY_FRAMES`` (:func:`realtime.engine.fairshare.recovered`).
        Under ``_state_lock``."""
        costs = self._step_times.costs()

        def held(entry: Entry[str, _Queued]) -> bool:
            if not self._held(entry):
                return False
            streams = self._streams(now, entry.key)
            if streams == 0:
                return False
            if not self._share.may_run(now, self._share_of(streams, costs)):
                return True
            cost = self._least_cost(entry.item)
            deadline, step = self._next_frame(now, entry.key, streams, costs)
            if fairshare.fits(now, cost, deadline, step):
                return False
            # It will make a frame late wherever it runs: just after the frames ran, once
            # they have caught up from the last such slice.
            on_time, overdue = self._lateness.on_time_for(now), now - entry.due
            caught_up = fairshare.recovered(on_time, overdue, self._frame_seconds)
            return not (self._after_frames and caught_up)

        return held

    def _next_frame(
        self, now: float, key: str, streams: int, costs: dict[int, float]
    ) -> tuple[float | None, float]:
        """The deadline of the next frame expected of a conversation but ``key`` (None:
        none) and the step it will take; under ``_state_lock``."""
        lasts = self._recent(now, key)
        deadline = min(lasts) + 2 * self._frame_seconds if lasts else None
        return deadline, admission.gather_cost(costs, streams)

    def _per_step(self, item: _Queued) -> float | None:
        """What one model step of a sized slice may cost: the dearest of its own last
        slice's and the recent sized slices' (a step's cost varies with the opening and
        its position in the prompt; None: none measured)."""
        own = []
        if item.slice_steps > 0 and item.slice_seconds is not None:
            own.append(item.slice_seconds / item.slice_steps)
        return max([*own, *self._step_seconds], default=None)

    def _least_cost(self, item: _Queued) -> float:
        """What the next slice costs at least: a sized one with steps left, one step
        (:meth:`_per_step`); a whole one (a first slice, or the session opening), the
        dearest of the recent whole slices (unknown: more than any gap); another, its
        last."""
        opening = item.opening
        if isinstance(opening, model.SizedSlices) and opening.steps_left > 0:
            per_step = self._per_step(item)
            if per_step is not None:
                return per_step
        if item.slice_seconds is None or isinstance(opening, model.SizedSlices):
            # Nothing measured yet (a fresh engine): fits no gap, so it runs just after
            # the frames, where any cost does least harm.
            return max(self._wholes, default=max(self._slices, default=math.inf))
        return item.slice_seconds

    def _ask(self, entry: Entry[str, _Queued]) -> int | None:
        """Steps the slice starting now may run (:func:`realtime.engine.fairshare.slice_steps`):
        what fits before another conversation's next frame; None while none streams."""
        with self._state_lock:
            now = time.monotonic()
            streams = self._streams(now, entry.key)
            if streams == 0:
                return None
            deadline, step = self._next_frame(now, entry.key, streams, self._step_times.costs())
        room = fairshare.gap(now, deadline, step)
        return fairshare.slice_steps(STEPS_MOST, room, self._per_step(entry.item))

    def _held(self, entry: Entry[str, _Queued]) -> bool:
        """Model work that is not a frame and still wants to run (a stopped one runs at
        once: it ends without a model step)."""
        command = entry.item.command
        return isinstance(command, (Open, ToolResult)) and not self._stopped(command)

    def _share_wait(self, now: float) -> float:
        """How long to wait when only held work is queued: until the bucket has credit,
        at most a frame time (then look again: the streams may have stopped)."""
        self._after_frames = False
        streams = self._streams(now)
        share = self._share_of(streams, self._step_times.costs())
        wait = self._share.wait(now, share) if streams else 0.0
        if wait <= 0.0:
            wait = self._frame_seconds  # credit, but no gap fits: until a frame comes
        return min(self._frame_seconds, max(1e-3, wait))

    def _count_lateness(self, now: float, latenesses: list[float]) -> None:
        """Frames that ended ``latenesses`` after their deadlines: readiness and admission
        ask whether the admitted conversations keep real time."""
        with self._state_lock:
            for lateness in latenesses:
                self._lateness.add(now, lateness)

    def _dead_error(self, command: Command, reason: str | None) -> EngineError:
        return EngineError(
            "engine_dead",
            f"the model engine has stopped: {reason or 'not running'}",
            during=_KINDS[type(command)],
        )

    def _die(self, reason: str) -> None:
        """Mark the engine dead and fail every queued command, under the submit lock."""
        with self._state_lock:
            if self._dead_reason is None:
                self._dead_reason = reason
            for entry in self._scheduler.drain():
                if entry.item.started:
                    # Under way on the engine thread: that thread abandons it; here its
                    # future fails, and the opening is dropped with the entry.
                    _settle(
                        entry.item.future,
                        exception=self._dead_error(entry.item.command, self._dead_reason),
                    )
                elif entry.item.future.set_running_or_notify_cancel():
                    entry.item.future.set_exception(
                        self._dead_error(entry.item.command, self._dead_reason)
                    )
            self._reserved.clear()

    def _execute(self, entry: Entry[str, _Queued]) -> None:
        self._after_frames = False
        item = entry.item
        command = item.command
        if isinstance(command, (Open, ToolResult)):
            self._slice(entry)
            return
        if not item.future.set_running_or_notify_cancel():
            return
        kind = _KINDS[type(command)]
        self._observer.command_started(kind)
        result: object = None
        error: BaseException | None = None
        with self._beating((item,)) as timing:
            try:
                result = self._dispatch(command)
            except Exception as exc:
                error = self._failure(exc, kind, command.session_id)
        self._count_extra(timing.seconds, command.session_id)
        # Before the result wakes trio: afterwards this thread goes straight back to its
        # queue instead of holding the GIL the woken connection needs.
        self._observer.command_finished(kind, timing.seconds)
        _settle(item.future, result=result, exception=error)

    def _failure(self, exc: Exception, kind: CommandKind, session_id: str) -> EngineError:
        """What a command's (or one batch row's) exception leaves of its session: the
        one mapping, so a failed row of a batch ends as that frame alone would."""
        if isinstance(exc, EngineError):
            return exc
        if isinstance(exc, model.ContextLimitReached):
            return EngineError("context_limit", str(exc), during=kind)
        if isinstance(exc, model.InferenceError):
            # The model reports a condition it survives (a wrong rate).
            return EngineError("step_failed", str(exc), during=kind)
        log.error("%s failed for %s; dropping the session", kind, session_id, exc_info=exc)
        self._drop(session_id)
        return EngineError("session_lost", _describe(exc), during=kind)

    def _gather_wait(self, now: float) -> float | None:
        """Seconds to wait before the next batch runs (``None``: run it now): while the
        next frame of a conversation streaming in real time (one in the last two frame
        times, nothing queued now) should arrive before the batch's first frame is due,
        less the step the batch keeps back for itself when the load leaves room
        (:func:`realtime.engine.admission.gather_reserve`,
        :func:`realtime.engine.scheduler.gather_until`). Under ``_state_lock``."""
        if self.max_batch <= 1:
            return None
        head = self._scheduler.peek()
        if head is None or not self._joins_batch(head):
            return None
        queued = self._scheduler.keys()
        if len(queued) >= self.max_batch:
            return None
        recent = now - 2 * self._frame_seconds
        expected = [
            last + self._frame_seconds
            for key, last in self._last_frame.items()
            if key not in queued and last >= recent
        ]
        rows = len(queued) + len(expected)
        reserve = admission.gather_reserve(rows, self._step_times.costs(), self._frame_seconds)
        until = scheduler.gather_until(head.due, now, expected, reserve)
        return None if until is None else until - now

    def _step_frames(self, entries: list[Entry[str, _Queued]]) -> None:
        """Run these :class:`Push` entries (one per session) as one model step; each
        row's future gets its own :class:`Step` or error, and each frame is counted
        against its own deadline."""
        began = time.perf_counter()
        rows = self._runnable_rows(entries, began)
        if not rows:
            return
        with self._beating(tuple(entry.item for entry, _ in rows)) as timing:
            results = self._step_rows([frame for _, frame in rows])
        seconds = timing.seconds
        outcomes: list[tuple[Entry[str, _Queued], Step | None, EngineError | None]] = []
        for (entry, _), result in zip(rows, results, strict=True):
            if isinstance(result, Exception):
                outcomes.append((entry, None, self._failure(result, "push", entry.key)))
            else:
                outcomes.append((entry, Step(result, seconds, len(rows)), None))
        # Counted before any result wakes trio (see _execute).
        if all(step is not None for _, step, _ in outcomes):
            with self._state_lock:
                self._step_times.add(seconds, len(rows))
        self._observer.model_stepped(len(rows), seconds)
        now, queued = time.monotonic(), len(self._scheduler)
        self._count_lateness(now, [now - e.due for e, step, _ in outcomes if step is not None])
        self._after_frames = True
        for entry, step, _ in outcomes:
            if step is not None:
                self._observer.frame_deadline(now - entry.due, queued)
            self._observer.command_finished("push", time.perf_counter() - began)
        for entry, step, error in outcomes:
            _settle(entry.item.future, result=step, exception=error)

    def _runnable_rows(
        self, entries: list[Entry[str, _Queued]], began: float
    ) -> list[tuple[Entry[str, _Queued], Frame]]:
        """The entries' frames that run, each with its session; a cancelled future is
        left alone, a stopped or unknown session's frame is settled at once."""
        rows: list[tuple[Entry[str, _Queued], Frame]] = []
        for entry in entries:
            item, command = entry.item, entry.item.command
            assert isinstance(command, Push)
            if not item.future.set_running_or_notify_cancel():
                continue
            self._observer.command_started("push")
            if self._stopped(command):
                self._skip(item, began)  # a cancel or disconnect: queued audio must not run
                continue
            try:
                session = self._session(command.session_id, "push")
            except EngineError as exc:
                self._skip(item, began, exc)
                continue
            rows.append((entry, (session, command.samples, command.sample_rate)))
        return rows

    def _skip(self, item: _Queued, began: float, error: EngineError | None = None) -> None:
        """A frame that does not run: ``None`` (stopped) or its error, at once."""
        self._observer.command_finished("push", time.perf_counter() - began)
        _settle(item.future, result=None, exception=error)

    def _step_rows(self, frames: list[Frame]) -> list[RowResult]:
        """One model step of ``frames``; a call that raises, or answers with the wrong
        number of rows, fails every row as a single frame's failure would."""
        try:
            results = list(self.model.step(frames))
        except Exception as exc:
            return [exc] * len(frames)
        if len(results) != len(frames):
            wrong = RuntimeError(f"the model returned {len(results)} rows for {len(frames)}")
            return [wrong] * len(frames)
        return results

    def _slice(self, entry: Entry[str, _Queued]) -> None:
        """Run one slice of a command that runs in slices (an :class:`Open`: warm-up, then
        one prompt token a slice; a :class:`ToolResult`: one inserted step a slice).

        The rest is queued again at the head of its session's commands, paced like a
        frame (:meth:`Scheduler.add_extra`): a frame that is due runs first, and the
        slices take the time the streaming sessions leave, back to back when nothing
        else waits. A stopped command (its connection closed or cancelled, its session's
        Close queued, the engine shutting down) ends before its next slice runs."""
        item, command = entry.item, entry.item.command
        assert isinstance(command, (Open, ToolResult))
        kind = _KINDS[type(command)]
        if not item.started:
            if not item.future.set_running_or_notify_cancel():
                return
            item.started = True
            self._observer.command_started(kind)
        done = False
        error: EngineError | None = None
        item.ask = self._ask(entry) if isinstance(command, Open) else None
        with self._beating((item,)) as timing:
            try:
                step = self._open_step if isinstance(command, Open) else self._feed_step
                done = step(item)
            except EngineError as exc:
                error = exc
            except Exception as exc:
                if isinstance(command, Open):
                    log.exception("opening session %s failed", entry.key)
                    error = EngineError("open_failed", _describe(exc), during="open")
                else:
                    error = self._failure(exc, kind, entry.key)
        item.engine_seconds += timing.seconds
        item.slice_seconds = timing.seconds
        self._slices.append(timing.seconds)
        if item.slice_steps > 0:
            self._step_seconds.append(timing.seconds / item.slice_steps)
        elif isinstance(command, Open):
            self._wholes.append(timing.seconds)
        self._count_extra(timing.seconds, entry.key)
        if error is None and not done:
            with self._state_lock:
                if self._dead_reason is None:
                    self._scheduler.add_extra(
                        entry.key, item, time.monotonic(), self._extra_period, first=True
                    )
                    return
            error = self._dead_error(command, self._dead_reason)
        if item.opening is not None:
            self._abandon_opening(item)
        if item.began:
            self._openings.discard(entry.key)
        self._observer.command_finished(kind, item.engine_seconds)
        _settle(item.future, result=None, exception=error)

    def _feed_step(self, item: _Queued) -> bool:
        """One step of a ToolResult (the first checks the session and begins the feed);
        True once the output is in."""
        command = item.command
        assert isinstance(command, ToolResult)
        if self._stopped(command):
            raise EngineError(
                "step_failed",
                "the tool result was stopped: its connection closed or cancelled",
                during="tool_result",
            )
        if item.feed is None:
            session = self._session(command.session_id, "tool_result")
            if not isinstance(session, model.TakesToolResults):
                raise EngineError(
                    "step_failed", "this model takes no tool results", during="tool_result"
                )
            item.feed = session.begin_tool_result(command.tool)
        return item.feed.advance()

    def _abandon_opening(self, item: _Queued) -> None:
        opening, item.opening = item.opening, None
        if opening is None:
            return
        try:
            opening.abandon()
        except Exception:
            log.exception("abandoning an opening session failed")
        self._clear_cache_if_alone()

    def _dispatch(self, command: Command) -> list[ModelEvent] | None:
        """Run one command that is not a frame (frames: :meth:`_step_frames`)."""
        match command:
            case Flush(session_id, pad_partial):
                active = self._active_session(session_id, "flush")
                active.finished = True
                return active.session.flush(pad_partial)
            case Cancel(session_id):
                active = self._active_session(session_id, "cancel")
                active.finished = True
                return active.session.cancel()
            case Close(session_id):
                self._drop(session_id)
                with self._state_lock:
                    self._scheduler.forget(session_id)
                    self._last_frame.pop(session_id, None)
                    self._closing.discard(session_id)
                self._release(session_id)
                return None
        raise AssertionError(f"not dispatched here: {command!r}")

    def _active_session(self, session_id: str, kind: CommandKind) -> _Active:
        active = self._sessions.get(session_id)
        if active is None:
            raise EngineError("session_lost", f"no open session {session_id}", during=kind)
        return active

    def _session(self, session_id: str, kind: CommandKind) -> ModelSession:
        active = self._active_session(session_id, kind)
        if active.finished:
            raise EngineError("step_failed", f"session {session_id} has ended", during=kind)
        return active.session

    def _open_step(self, item: _Queued) -> bool:
        """One slice of an Open (the first checks and begins it); True once it is open."""
        command = item.command
        assert isinstance(command, Open)
        sid = command.session_id
        if self._stopped(command):
            raise EngineError("open_failed", "the connection is gone", during="open")
        if item.opening is None:
            if sid in self._sessions or sid in self._openings:
                raise EngineError("open_failed", f"session {sid} is already open", during="open")
            if len(self._sessions) + len(self._openings) >= self.capacity:
                raise EngineError(
                    "open_failed",
                    f"{len(self._sessions) + len(self._openings)} sessions are open on the "
                    "engine, its capacity",
                    during="open",
                )
            try:
                item.opening = self.model.begin_session(
                    system_prompt=command.system_prompt,
                    seed=command.seed,
                    max_streaming_seconds=command.max_streaming_seconds,
                    prompt_scope=command.prompt_scope,
                )
            except model.SessionInitializationError as exc:
                raise EngineError("open_failed", str(exc), during="open") from exc
            self._openings.add(sid)
            item.began = True
        opening, item.slice_steps = item.opening, 0
        try:
            if isinstance(opening, model.SizedSlices):
                ask = opening.most_steps if item.ask is None else item.ask
                session = opening.advance_steps(min(opening.most_steps, ask))
                item.slice_steps = opening.steps_run
            else:
                session = opening.advance()
        except model.SessionInitializationError as exc:
            raise EngineError("open_failed", str(exc), during="open") from exc
        if session is None:
            return False
        item.opening = None
        self._sessions[sid] = _Active(sid, session)
        return True

    def _drop(self, session_id: str) -> None:
        """Forget a session (cancelling it if it still runs) and free cached buffers
        once no other session is left to reuse them."""
        active = self._sessions.pop(session_id, None)
        if active is None:
            return
        if not active.finished:
            try:
                active.session.cancel()
            except Exception:
                log.exception("cancelling session %s on close failed", active.session_id)
        self._clear_cache_if_alone()

    def _clear_cache_if_alone(self) -> None:
        """Free the model's cached device buffers when no session is open or opening.

        Not while others run: clearing waits for the device and makes their next steps
        allocate every buffer again, so a churn of opens and closes would slow every
        live conversation; their steps reuse the cache instead (MLX bounds it)."""
        if self._model is None or self._sessions or self._openings:
            return
        try:
            self._model.clear_cache()
        except Exception:
            log.exception("clearing the model's buffer cache failed")


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
