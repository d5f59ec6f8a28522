"""What the engine thread runs: the one long-lived thread that owns the model and runs
every model call.

MLX ties streams to the thread that created them, and trio's worker threads do not keep
their identity, so the model is loaded on, and only ever touched by, this thread
(:meth:`EngineThread.run`). It loops: take the next commands from the queue it shares
with the event loop (:class:`realtime.engine.line.Line`), run them (a batch of frames as
one model step, or one slice of an opening or a tool result, or one flush, cancel or
close), answer through each command's future, and, with nothing queued, run a slice of
the model's work no one waits for. The sessions it holds (by id), the openings under
way and everything the model keeps are this thread's alone: the event loop learns of
them only through the commands' results.

With ``batch_frames`` the frames that are due run as one batched model step
(:meth:`RealtimeModel.step` with one row per conversation, chosen by
:meth:`Scheduler.pop_batch`); each row keeps its own result, failure and deadline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

import attrs
import numpy as np

from realtime.engine import admission, fairshare, first_start, scheduler
from realtime.engine.commands import (
    KINDS,
    Cancel,
    Close,
    Command,
    EngineError,
    Flush,
    Open,
    Push,
    Queued,
    Step,
    ToolResult,
    dead_error,
    describe,
    settle,
)
from realtime.engine.line import OPEN_SLICE_FRAMES, STOP, Line
from realtime.engine.scheduler import Entry
from realtime.models import base as model
from realtime.models.base import (
    Frame,
    ModelEvent,
    ModelSession,
    PromptUse,
    RealtimeModel,
    RowResult,
)
from realtime.models.prompt_cache import KeepsStates
from realtime.observe import CommandKind

log = logging.getLogger(__name__)

STEPS_MOST: Final = 64
"""Most steps the engine asks of one sized slice (the model's own most bounds it too:
:attr:`~realtime.models.base.SizedSlices.most_steps`)."""

AHEAD_STEPS: Final = 16
"""Most steps of work no one waits for (a voice chain built ahead of need) in one idle
slice (:meth:`EngineThread._work_ahead`; :func:`realtime.engine.scheduler.idle_steps`
decides how many fit)."""

WARM_UP_DISCARDED: Final = 2
"""Warm-up steps of each batch size run before the measured ones (a fresh session's
first frames run slower while buffers and kernels warm up)."""


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


class EngineThread:
    """The engine thread's side of the engine: built by :class:`realtime.engine.facade.Engine`,
    which runs :meth:`run` on a thread of its own; nothing here is called from the event
    loop."""

    def __init__(
        self,
        loader: Callable[[], RealtimeModel],
        line: Line,
        *,
        batch_frames: bool,
        max_batch: int,
        warm_up: bool,
    ) -> None:
        self._loader = loader
        self._line = line
        self.batch_frames = batch_frames
        self.max_batch = max_batch
        self.warm_up = warm_up
        self._model: RealtimeModel | None = None
        self._sessions: dict[str, _Active] = {}
        self._openings: set[str] = set()
        """Opens under way."""
        self._slices: deque[float] = deque(maxlen=16)
        """The last slices of any sliced command: the dearest is a first slice's expected
        cost (an opening's first slice builds its session)."""
        self._step_seconds: deque[float] = deque(maxlen=16)
        """Engine seconds a model step of the last sized slices took."""
        self._wholes: deque[float] = deque(maxlen=16)
        """The last slices that could not be cut (a first slice, an opening's last):
        the dearest is what the next such slice is expected to cost."""
        self._after_frames = False
        """The last thing the engine ran was a frame step: the next frame of each stream
        is furthest off, the moment for a slice that fits no gap."""
        self._ahead_left = True
        """The model may have work no one waits for (:meth:`_work_ahead`)."""
        self._ahead_broken = False
        """It raised once, never again."""
        self._ahead_costs: deque[float] = deque(maxlen=16)
        """Engine seconds per step of the recent idle slices."""

    @property
    def model(self) -> RealtimeModel:
        if self._model is None:
            raise RuntimeError("the engine has not loaded a model")
        return self._model

    def run(self) -> None:
        """The thread's body: load, start up, then run commands until halted or dead."""
        if not self._load():
            return
        entries: list[Entry[str, Queued]] = []
        try:
            while self._line.dead_reason is None:
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
            self._line.die("shut down")
        except BaseException as exc:
            reason = f"engine thread died: {describe(exc)}"
            log.critical(reason, exc_info=True)
            self._line.die(reason)
            for entry in entries:
                settle(entry.item.future, exception=dead_error(entry.item.command, reason))
        finally:
            self._abandon_left()

    def _load(self) -> bool:
        """Load the model and start it up; whether the engine is ready (a failure has
        killed the engine and reached ``start`` through ``Line.loaded``)."""
        started = time.perf_counter()
        try:
            self._model = self._loader()
        except BaseException as exc:
            self._line.die(f"model failed to load: {describe(exc)}")
            self._line.loaded.set_exception(exc)
            return False
        self._line.model = self._model
        log.info(
            "model %s ready on thread %s in %.2f s",
            self._model.model_id,
            threading.current_thread().name,
            time.perf_counter() - started,
        )
        self._line.set_frame_seconds(self._model.figures.frame_seconds)
        try:
            self._start_up()
        except BaseException as exc:
            self._line.die(f"model failed to start: {describe(exc)}")
            self._line.loaded.set_exception(exc)
            return False
        self._line.loaded.set_result(self._model)
        return True

    def _await_work(self) -> list[Entry[str, Queued]] | None:
        """The next entries to run; ``[]`` after waiting for a wake-up (look again),
        None once halting with nothing left to run."""
        wait: float | None = None
        entries: list[Entry[str, Queued]] = []
        with self._line.lock:
            if not self._line.halting:
                wait = self._gather_wait(time.monotonic())
            if wait is None:
                entries = self._pop()
                if not entries and len(self._line.scheduler):
                    wait = self._share_wait(time.monotonic())
        if wait is not None:
            # A frame that will join this batch is on its way; any command
            # submitted meanwhile wakes the thread to look again.
            try:
                self._line.halting = self._line.wake.get(timeout=wait) is STOP or self._line.halting
            except queue.Empty:
                pass
            return []
        if not entries:
            if self._line.halting:
                return None
            if self._work_ahead():
                return []  # one idle slice ran: look at the queue again
            self._line.halting = self._line.wake.get() is STOP or self._line.halting
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
        with self._line.lock:
            frame = admission.frame_cost(
                len(self._sessions),
                self._line.capacity.step_times.costs(),
                batched=self.batch_frames,
            )
        steps = scheduler.idle_steps(
            streaming=streaming,
            frame_cost=frame,
            step_cost=max(self._ahead_costs) if self._ahead_costs else None,
            frame_seconds=self._line.frame_seconds,
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
        with self._line.lock:
            left = self._line.scheduler.drain()
        for queued in left:
            if queued.item.opening is not None:
                queued.item.opening.abandon()
            settle(queued.item.future, exception=dead_error(queued.item.command, None))
        for session_id in list(self._sessions):
            self._drop(session_id)
        with self._line.lock:
            self._line.capacity.reserved.clear()

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
                        with self._line.lock:
                            self._line.capacity.step_times.add(timing.seconds, rows)
        except Exception:
            log.exception("measuring the model step at start failed; admission waits for frames")
        finally:
            for session in sessions:
                try:
                    session.cancel()
                except Exception:
                    log.exception("closing a warm-up session failed")
            self.model.clear_cache()
        with self._line.lock:
            costs = self._line.capacity.step_times.costs()
        log.info(
            "measured the model step at start in %.1f s: %s",
            time.perf_counter() - began,
            ", ".join(f"{rows} row(s) p90 {cost * 1000:.1f} ms" for rows, cost in costs.items())
            or "nothing",
        )

    # --- running commands ------------------------------------------------------

    def _stopped(self, command: Command) -> bool:
        """A queued command that must not run its model work: its connection is gone or
        cancelled, the engine is shutting down, or (an opening or a tool result) its
        session's Close is queued."""
        if not isinstance(command, (Push, Open, ToolResult)):
            return False
        stop = command.stop
        return (
            self._line.halting
            or (stop is not None and stop.is_set())
            or (not isinstance(command, Push) and command.session_id in self._line.closing)
        )

    def _pop(self) -> list[Entry[str, Queued]]:
        """The commands that run next (a batch of frames, or one other command); under
        ``_state_lock``. An opening's slice or a tool result's step gives way to waiting
        frames (:meth:`_yields`) and, while other conversations stream, waits for its
        share of engine time (:meth:`_held_now`); ``[]`` when only held work is queued."""
        held = self._held_now(time.monotonic())
        return self._line.scheduler.pop_batch(self._joins_batch, self.max_batch, self._yields, held)

    def _waiting(self, frame: Entry[str, Queued], now: float) -> bool:
        """A frame due within a frame time: one that arrived (a burst's later frames,
        due a frame apart, are not waiting yet)."""
        return frame.due <= now + self._line.frame_seconds

    def _yields(self, entry: Entry[str, Queued], frame: Entry[str, Queued]) -> bool:
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
        return now < entry.due + self._line.extra_period

    def _joins_batch(self, entry: Entry[str, Queued]) -> bool:
        """A frame still wanted joins a batch; anything else runs alone."""
        command = entry.item.command
        return isinstance(command, Push) and not self._stopped(command)

    @contextlib.contextmanager
    def _beating(self, items: tuple[Queued, ...]) -> Iterator[_Timing]:
        """Around one model call: the commands it serves (the watchdog fails them if it
        hangs) and its heartbeat; the time it held the engine once it ends."""
        timing = _Timing()
        self._line.running = items
        self._line.last_beat = time.monotonic()
        started = time.perf_counter()
        try:
            yield timing
        finally:
            timing.seconds = time.perf_counter() - started
            self._line.last_beat = None
            self._line.running = ()

    def _count_extra(self, seconds: float, key: str | None = None) -> None:
        """Engine time of work that is not a frame (of conversation ``key``): for
        admission, and charged to the share such work gets while other conversations
        stream (:meth:`_held_now`)."""
        with self._line.lock:
            now = time.monotonic()
            self._line.capacity.extra_work.add(now, seconds)
            streams = self._streams(now, key)
            share = self._share_of(streams, self._line.capacity.step_times.costs())
            self._line.share.charge(now, seconds, share, contended=streams > 0)

    # --- fair share of engine time (realtime.engine.fairshare) ---------------------

    def _recent(self, now: float, besides: str | None) -> list[float]:
        """When each conversation but ``besides`` that streams (a frame in the last
        ``OPEN_SLICE_FRAMES`` frame times) handed over its latest frame."""
        recent = now - OPEN_SLICE_FRAMES * self._line.frame_seconds
        return [t for k, t in self._line.last_frame.items() if t >= recent and k != besides]

    def _streams(self, now: float, besides: str | None = None) -> int:
        """Conversations other than ``besides`` streaming now (a recent frame, or frames
        queued); under ``_state_lock``. A conversation's own frames wait behind its own
        opening or tool feed anyway, so they never hold that work back."""
        streaming = len(self._recent(now, besides))
        if streaming == 0:
            queued = self._line.scheduler.most_urgent(
                lambda e: e.key != besides and self._joins_batch(e)
            )
            return 0 if queued is None else 1
        return streaming

    def _share_of(self, streams: int, costs: dict[int, float]) -> float:
        """The share of wall time work that is not a frame gets beside ``streams``
        streaming conversations: what their predicted frames leave
        (:func:`realtime.engine.fairshare.extra_share`); under ``_state_lock``."""
        cost = admission.frame_cost(streams, costs, batched=self.batch_frames)
        return fairshare.extra_share((cost or 0.0) / self._line.frame_seconds)

    def _held_now(self, now: float) -> Callable[[Entry[str, Queued]], bool]:
        """Which commands wait for their share now: an opening's slice or a tool
        result's step while another conversation streams, when the share's bucket has no
        credit, or when the slice (its last one's cost) would not end in time for the
        next frame expected, unless the engine just stepped the frames and they have
        been on time for ``RECOVERY_FRAMES`` (:func:`realtime.engine.fairshare.recovered`).
        Under ``_state_lock``."""
        costs = self._line.capacity.step_times.costs()

        def held(entry: Entry[str, Queued]) -> bool:
            if not self._held(entry):
                return False
            streams = self._streams(now, entry.key)
            if streams == 0:
                return False
            if not self._line.share.may_run(now, self._share_of(streams, costs)):
                return True
            cost = self._least_cost(entry.item)
            deadline, step = self._next_frame(now, entry.key, streams, costs)
            if fairshare.fits(now, cost, deadline, step):
                return False
            # It will make a frame late wherever it runs: just after the frames ran, once
            # they have caught up from the last such slice.
            on_time, overdue = self._line.capacity.lateness.on_time_for(now), now - entry.due
            caught_up = fairshare.recovered(on_time, overdue, self._line.frame_seconds)
            return not (self._after_frames and caught_up)

        return held

    def _next_frame(
        self, now: float, key: str, streams: int, costs: dict[int, float]
    ) -> tuple[float | None, float]:
        """The deadline of the next frame expected of a conversation but ``key`` (None:
        none) and the step it will take; under ``_line.lock``."""
        lasts = self._recent(now, key)
        deadline = min(lasts) + 2 * self._line.frame_seconds if lasts else None
        return deadline, admission.gather_cost(costs, streams)

    def _per_step(self, item: Queued) -> float | None:
        """What one model step of a sized slice may cost: the dearest of its own last
        slice's and the recent sized slices' (a step's cost varies with the opening and
        its position in the prompt; None: none measured)."""
        own = []
        if item.slice_steps > 0 and item.slice_seconds is not None:
            own.append(item.slice_seconds / item.slice_steps)
        return max([*own, *self._step_seconds], default=None)

    def _least_cost(self, item: Queued) -> float:
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

    def _ask(self, entry: Entry[str, Queued]) -> int | None:
        """Steps the slice starting now may run (:func:`realtime.engine.fairshare.slice_steps`):
        what fits before another conversation's next frame; None while none streams."""
        with self._line.lock:
            now = time.monotonic()
            streams = self._streams(now, entry.key)
            if streams == 0:
                return None
            costs = self._line.capacity.step_times.costs()
            deadline, step = self._next_frame(now, entry.key, streams, costs)
        room = fairshare.gap(now, deadline, step)
        return fairshare.slice_steps(STEPS_MOST, room, self._per_step(entry.item))

    def _held(self, entry: Entry[str, Queued]) -> bool:
        """Model work that is not a frame and still wants to run (a stopped one runs at
        once: it ends without a model step)."""
        command = entry.item.command
        return isinstance(command, (Open, ToolResult)) and not self._stopped(command)

    def _share_wait(self, now: float) -> float:
        """How long to wait when only held work is queued: until the bucket has credit,
        at most a frame time (then look again: the streams may have stopped)."""
        self._after_frames = False
        streams = self._streams(now)
        share = self._share_of(streams, self._line.capacity.step_times.costs())
        wait = self._line.share.wait(now, share) if streams else 0.0
        if wait <= 0.0:
            wait = self._line.frame_seconds  # credit, but no gap fits: until a frame comes
        return min(self._line.frame_seconds, max(1e-3, wait))

    def _count_lateness(self, now: float, latenesses: list[float]) -> None:
        """Frames that ended ``latenesses`` after their deadlines: readiness and admission
        ask whether the admitted conversations keep real time."""
        with self._line.lock:
            for lateness in latenesses:
                self._line.capacity.lateness.add(now, lateness)

    def _execute(self, entry: Entry[str, Queued]) -> None:
        self._after_frames = False
        item = entry.item
        command = item.command
        if isinstance(command, (Open, ToolResult)):
            self._slice(entry)
            return
        if not item.future.set_running_or_notify_cancel():
            return
        kind = KINDS[type(command)]
        self._line.observer.command_started(kind)
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
        self._line.observer.command_finished(kind, timing.seconds)
        settle(item.future, result=result, exception=error)

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
        return EngineError("session_lost", describe(exc), during=kind)

    def _gather_wait(self, now: float) -> float | None:
        """Seconds to wait before the next batch runs (``None``: run it now): while the
        next frame of a conversation streaming in real time (one in the last two frame
        times, nothing queued now) should arrive before the batch's first frame is due,
        less the step the batch keeps back for itself when the load leaves room
        (:func:`realtime.engine.admission.gather_reserve`,
        :func:`realtime.engine.scheduler.gather_until`). Under ``_state_lock``."""
        if self.max_batch <= 1:
            return None
        head = self._line.scheduler.peek()
        if head is None or not self._joins_batch(head):
            return None
        queued = self._line.scheduler.keys()
        if len(queued) >= self.max_batch:
            return None
        recent = now - 2 * self._line.frame_seconds
        expected = [
            last + self._line.frame_seconds
            for key, last in self._line.last_frame.items()
            if key not in queued and last >= recent
        ]
        rows = len(queued) + len(expected)
        reserve = admission.gather_reserve(
            rows, self._line.capacity.step_times.costs(), self._line.frame_seconds
        )
        until = scheduler.gather_until(head.due, now, expected, reserve)
        return None if until is None else until - now

    def _step_frames(self, entries: list[Entry[str, Queued]]) -> None:
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
        outcomes: list[tuple[Entry[str, Queued], Step | None, EngineError | None]] = []
        for (entry, _), result in zip(rows, results, strict=True):
            if isinstance(result, Exception):
                outcomes.append((entry, None, self._failure(result, "push", entry.key)))
            else:
                outcomes.append((entry, Step(result, seconds, len(rows)), None))
        # Counted before any result wakes trio (see _execute).
        if all(step is not None for _, step, _ in outcomes):
            with self._line.lock:
                self._line.capacity.step_times.add(seconds, len(rows))
        self._line.observer.model_stepped(len(rows), seconds)
        now, queued = time.monotonic(), len(self._line.scheduler)
        self._count_lateness(now, [now - e.due for e, step, _ in outcomes if step is not None])
        self._after_frames = True
        for entry, step, _ in outcomes:
            if step is not None:
                self._line.observer.frame_deadline(now - entry.due, queued)
            self._line.observer.command_finished("push", time.perf_counter() - began)
        for entry, step, error in outcomes:
            settle(entry.item.future, result=step, exception=error)

    def _runnable_rows(
        self, entries: list[Entry[str, Queued]], began: float
    ) -> list[tuple[Entry[str, Queued], Frame]]:
        """The entries' frames that run, each with its session; a cancelled future is
        left alone, a stopped or unknown session's frame is settled at once."""
        rows: list[tuple[Entry[str, Queued], Frame]] = []
        for entry in entries:
            item, command = entry.item, entry.item.command
            assert isinstance(command, Push)
            if not item.future.set_running_or_notify_cancel():
                continue
            self._line.observer.command_started("push")
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

    def _skip(self, item: Queued, began: float, error: EngineError | None = None) -> None:
        """A frame that does not run: ``None`` (stopped) or its error, at once."""
        self._line.observer.command_finished("push", time.perf_counter() - began)
        settle(item.future, result=None, exception=error)

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

    def _slice(self, entry: Entry[str, Queued]) -> None:
        """Run one slice of a command that runs in slices (an :class:`Open`: warm-up, then
        one prompt token a slice, its result the session's :class:`PromptUse`; a
        :class:`ToolResult`: one inserted step a slice).

        The rest is queued again at the head of its session's commands, paced like a
        frame (:meth:`Scheduler.add_extra`): a frame that is due runs first, and the
        slices take the time the streaming sessions leave, back to back when nothing
        else waits. A stopped command (its connection closed or cancelled, its session's
        Close queued, the engine shutting down) ends before its next slice runs."""
        item, command = entry.item, entry.item.command
        assert isinstance(command, (Open, ToolResult))
        kind = KINDS[type(command)]
        if not item.started:
            if not item.future.set_running_or_notify_cancel():
                return
            item.started = True
            self._line.observer.command_started(kind)
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
                    error = EngineError("open_failed", describe(exc), during="open")
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
            with self._line.lock:
                if self._line.dead_reason is None:
                    self._line.scheduler.add_extra(
                        entry.key, item, time.monotonic(), self._line.extra_period, first=True
                    )
                    return
            error = dead_error(command, self._line.dead_reason)
        if item.opening is not None:
            self._abandon_opening(item)
        if item.began:
            self._openings.discard(entry.key)
        result = self._prompt_use(entry.key) if isinstance(command, Open) else None
        self._line.observer.command_finished(kind, item.engine_seconds)
        settle(item.future, result=result, exception=error)

    def _prompt_use(self, session_id: str) -> PromptUse:
        """How an open session read its system prompt: an :class:`Open`'s result (the
        event loop learns it from the command, never from the session itself)."""
        active = self._sessions.get(session_id)
        session = None if active is None else active.session
        if isinstance(session, model.UsesPrompt):
            return session.prompt_use
        return PromptUse()

    def _feed_step(self, item: Queued) -> bool:
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

    def _abandon_opening(self, item: Queued) -> None:
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
                with self._line.lock:
                    self._line.scheduler.forget(session_id)
                    self._line.last_frame.pop(session_id, None)
                    self._line.closing.discard(session_id)
                    self._line.capacity.release(session_id)
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

    def _open_step(self, item: Queued) -> bool:
        """One slice of an Open (the first checks and begins it); True once it is open."""
        command = item.command
        assert isinstance(command, Open)
        sid = command.session_id
        if self._stopped(command):
            raise EngineError("open_failed", "the connection is gone", during="open")
        if item.opening is None:
            if sid in self._sessions or sid in self._openings:
                raise EngineError("open_failed", f"session {sid} is already open", during="open")
            if len(self._sessions) + len(self._openings) >= self._line.capacity.slots:
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
