"""The engine's thread line: the one state both of its sides touch, under one lock.

The event loop's side (:class:`realtime.engine.facade.Engine`) puts commands in; the
engine thread's side (:class:`realtime.engine.thread.EngineThread`) takes them out,
runs them and answers through each command's future. Between them there is only
this: the queue of commands (:attr:`Line.scheduler`, and :attr:`Line.wake`, the token
the engine thread sleeps on), the slots and measurements admission decides from
(:attr:`Line.capacity`), the pacing numbers the queue is read with, and the engine's
own state (dead, halting, hung, the heartbeat of the running model call). Every field
marked "under ``lock``" is read and written only while holding :attr:`Line.lock`; the
flags are single values one side writes and the other reads (a stale read costs one
more look, never a wrong answer). The sessions, the model's state and the openings
under way are the engine thread's alone and never cross.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Final

from realtime.engine.capacity import Capacity
from realtime.engine.commands import Queued, dead_error, settle
from realtime.engine.fairshare import ShareBucket
from realtime.engine.scheduler import Scheduler
from realtime.models.base import RealtimeModel
from realtime.observe import Observer

STOP: Final = object()
"""Put on :attr:`Line.wake` to have the engine thread halt."""

OPEN_SLICE_FRAMES: Final = 2
"""Work that is not a frame (an opening's slices, a tool result's steps) is due this
many frame times after it is queued, gives way to a waiting frame unless overdue by as
many (:meth:`EngineThread._yields`), and a conversation with a frame in the last this many
frame times counts as streaming (:meth:`EngineThread._streams`): while one does, that work
takes only its share of engine time (:meth:`EngineThread._held_now`)."""


class Line:
    """What both sides of the engine's thread line share (see the module's docstring)."""

    def __init__(self, capacity: Capacity, observer: Observer) -> None:
        self.lock = threading.Lock()
        self.wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        """One token per submitted command (and :data:`STOP`): the engine thread sleeps on
        it while the scheduler is empty."""
        self.scheduler: Scheduler[str, Queued] = Scheduler()  # under lock
        self.capacity = capacity  # under lock
        self.frame_seconds = 0.08
        """One frame of the loaded model (``figures.frame_seconds``): a frame's deadline.
        Set once by the engine thread when the model has loaded."""
        self.share = ShareBucket(self.frame_seconds)  # under lock
        """Engine seconds work that is not a frame may spend while conversations stream
        (:mod:`realtime.engine.fairshare`)."""
        self.closing: set[str] = set()  # under lock
        """Sessions whose Close is queued: their queued work is stopped."""
        self.last_frame: dict[str, float] = {}  # under lock
        """When each session's latest frame reached the engine (a batch's gathering)."""
        self.dead_reason: str | None = None
        """Why the engine stopped (``None``: it runs); set once, under lock."""
        self.halting = False
        """The engine is shutting down: its queued frames, openings and tool results are
        stopped."""
        self.hung = False
        """A model call never returned (the watchdog gave up on the thread)."""
        self.running: tuple[Queued, ...] = ()
        """The commands the running model call serves (a batch: one per row)."""
        self.last_beat: float | None = None
        """``time.monotonic()`` of the running command's start or last step (None: idle)."""
        self.observer = observer
        """Where the engine thread reports commands (replaced whole by the event loop)."""
        self.model: RealtimeModel | None = None
        """The model once the loader returned (set once by the engine thread, before its
        start-up work; ``None`` while loading or after a failed load)."""
        self.loaded: concurrent.futures.Future[RealtimeModel] = concurrent.futures.Future()
        """The model once the engine is ready (after its start-up work), or the load's
        failure: what :meth:`Engine.start` waits for."""

    @property
    def extra_period(self) -> float:
        """How long after it is queued work that is not a frame is due."""
        return OPEN_SLICE_FRAMES * self.frame_seconds

    def set_frame_seconds(self, frame_seconds: float) -> None:
        """The loaded model's frame time (the engine thread, once, before any command)."""
        with self.lock:
            self.frame_seconds = frame_seconds
            self.share = ShareBucket(frame_seconds)

    def die(self, reason: str) -> None:
        """Mark the engine dead and fail every queued command (from either side)."""
        with self.lock:
            if self.dead_reason is None:
                self.dead_reason = reason
            for entry in self.scheduler.drain():
                if entry.item.started:
                    # Under way on the engine thread: that thread abandons it; here its
                    # future fails, and the opening is dropped with the entry.
                    settle(
                        entry.item.future,
                        exception=dead_error(entry.item.command, self.dead_reason),
                    )
                elif entry.item.future.set_running_or_notify_cancel():
                    entry.item.future.set_exception(
                        dead_error(entry.item.command, self.dead_reason)
                    )
            self.capacity.reserved.clear()
