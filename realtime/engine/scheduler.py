"""The engine thread's order of work when several conversations share it: pure logic.

Each conversation's commands run in the order it sent them (its frames, a flush, a
close); among conversations, the one whose most urgent queued command is due first
runs next (earliest deadline first). A frame is due one frame time after it reached
the engine, and never sooner than a frame after the same conversation's previous
frame, so conversations streaming in real time take turns frame by frame and none
can starve another: a burst of audio is due as if it had arrived in real time, and
runs in the time the live conversations leave. Model work that is not a frame (an
opening's slices, a tool result's steps: :meth:`Scheduler.add_extra`) is paced too,
never due at once: a step is due a period after it is queued and after its
conversation's latest frame; and it gives way to a waiting frame when the engine says
so (``yields`` in :meth:`Scheduler.pop_batch`), and waits while the engine holds it
(``held``: all such work together gets a share of engine time, measured, however many
conversations open or feed at once; :mod:`realtime.engine.fairshare`).
Flush, cancel and close are due the moment they arrive, and a conversation is as
urgent as its most urgent command, so they never wait behind another conversation's
backlog for more than the one step running (the engine stops a closing conversation's
queued work first, so a close promotes nothing that still costs a model step).

Batching (:meth:`Scheduler.pop_batch`): the command that runs next, when it is a
frame, takes with it the head frame of every other conversation whose head is a
frame, so the model steps them as one batch. Those frames only run early. A batch may
also wait for the frames it expects (:func:`gather_until`): the next frame of each
conversation streaming in real time, but only those that arrive before the batch's
first frame is due, so no frame waits past its deadline for the batch it joins, and
conversations whose frames arrive at different points of the 80 ms cycle still step
together instead of each on its own (one step per conversation per frame is what
overloads a busy engine).

Times are plain floats passed in by the caller (the engine's monotonic clock; tests
pass their own), so every rule here is tested without threads or a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

import attrs

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@attrs.frozen(slots=True)
class Entry(Generic[K, T]):
    """One queued command of one conversation, with the time it is due."""

    key: K
    item: T
    due: float
    seq: int
    """Arrival order: ties in due time go to the one that came first."""


def gather_until(
    lead_due: float, now: float, expected: Iterable[float], step: float = 0.0
) -> float | None:
    """When a batch whose first frame is due at ``lead_due`` should run, to take along
    the frames ``expected`` (when each other conversation streaming in real time should
    hand its next frame over): the latest of them still to come that arrives early
    enough for the batch, a ``step`` long, to end by ``lead_due`` (``step`` 0: to start
    by then). None: none is expected in time, run now. The engine chooses ``step``
    (:func:`realtime.engine.admission.gather_reserve`)."""
    start_by = lead_due - max(0.0, step)
    waits = [t for t in expected if now < t <= start_by]
    return max(waits) if waits else None


def idle_steps(
    *,
    streaming: bool,
    frame_cost: float | None,
    step_cost: float | None,
    frame_seconds: float,
    most: int,
) -> int:
    """How many steps of work no one waits for (a voice chain built ahead) one slice
    may run, the engine having nothing queued: a frame that arrives as the slice starts
    waits for it, then takes its own step, and must still end within a frame time.

    With conversations ``streaming``, the slice takes at most half of what a frame
    period leaves after their frame step (``frame_cost``, measured), so a frame that
    finds it running is never late because of it; none until both the frame and the
    step are measured (``step_cost``), and none when frames leave no room. With none
    streaming, half a frame time's worth, at least one step (an opening waits one step
    at most; a first slice of one step measures the step). At most ``most``."""
    if most <= 0:
        return 0
    if not streaming:
        if step_cost is None or step_cost <= 0:
            return 1
        return max(1, min(most, int(frame_seconds / 2 / step_cost)))
    if frame_cost is None or step_cost is None or step_cost <= 0:
        return 0
    room = (frame_seconds - frame_cost) / 2
    return max(0, min(most, int(room / step_cost)))


@attrs.define(slots=True)
class Scheduler(Generic[K, T]):
    """Per-conversation FIFO queues, served earliest deadline first."""

    _queues: dict[K, deque[Entry[K, T]]] = attrs.field(factory=dict)
    _paced: dict[K, float] = attrs.field(factory=dict)
    """Each conversation's latest frame deadline (:meth:`add_paced`)."""
    _seq: int = 0
    _size: int = 0

    def __len__(self) -> int:
        """Commands queued, all conversations together (the queue depth)."""
        return self._size

    def add(self, key: K, item: T, due: float) -> None:
        """Queue ``item`` behind ``key``'s other commands."""
        self._queues.setdefault(key, deque()).append(self._entry(key, item, due))

    def add_paced(self, key: K, item: T, now: float, period: float) -> float:
        """Queue a frame of ``key``, due one ``period`` after it arrived, and never sooner
        than one ``period`` after ``key``'s previous frame; its deadline.

        A conversation streaming in real time is unaffected (its frames arrive a period
        apart); one that hands over a burst has its frames due a period apart, as if
        they had arrived in real time, so a burst takes the engine's spare time and
        never the turn of a conversation whose frame was due sooner. Order only: with
        nothing else queued a burst still runs back to back.
        """
        due = max(now, self._paced.get(key, now)) + period
        self._paced[key] = due
        self.add(key, item, due)
        return due

    def add_extra(
        self, key: K, item: T, now: float, period: float, *, first: bool = False
    ) -> float:
        """Queue a step of model work of ``key`` that is not a frame (an opening's slice,
        a tool result's step), behind its other commands or, ``first``, ahead of them (the
        rest of a command run in slices keeps its place); its deadline.

        Due a ``period`` after now and after ``key``'s latest frame's deadline, never at
        once: a frame that is due sooner runs first. Order only: with nothing else
        queued the steps still run back to back.
        """
        due = max(now, self._paced.get(key, now)) + period
        (self.add_first if first else self.add)(key, item, due)
        return due

    def forget(self, key: K) -> None:
        """Drop what is kept of ``key`` (its session closed)."""
        self._paced.pop(key, None)

    def add_first(self, key: K, item: T, due: float) -> None:
        """Queue ``item`` ahead of ``key``'s other commands: the rest of a command run
        in slices (a session opening) keeps its place in its conversation's order."""
        self._queues.setdefault(key, deque()).appendleft(self._entry(key, item, due))

    def _entry(self, key: K, item: T, due: float) -> Entry[K, T]:
        if math.isnan(due):
            raise ValueError("a due time cannot be NaN")
        self._seq += 1
        self._size += 1
        return Entry(key, item, due, self._seq)

    def urgency(self, key: K) -> tuple[float, int] | None:
        """When ``key``'s most urgent command is due (and its arrival order)."""
        queue = self._queues.get(key)
        if not queue:
            return None
        return self._urgency(queue)

    @staticmethod
    def _urgency(queue: deque[Entry[K, T]]) -> tuple[float, int]:
        return min((e.due, e.seq) for e in queue)

    def peek(self) -> Entry[K, T] | None:
        """The command that runs next: the head of the most urgent conversation."""
        best: tuple[float, int] | None = None
        head: Entry[K, T] | None = None
        for queue in self._queues.values():
            urgency = self._urgency(queue)
            if best is None or urgency < best:
                best, head = urgency, queue[0]
        return head

    def pop(self) -> Entry[K, T] | None:
        """Take the command that runs next (``None``: nothing is queued)."""
        head = self.peek()
        if head is not None:
            self._take_head(head.key)
        return head

    def _take_head(self, key: K) -> Entry[K, T]:
        queue = self._queues[key]
        head = queue.popleft()
        self._size -= 1
        if not queue:
            del self._queues[key]
        return head

    def most_urgent(self, joins: Callable[[Entry[K, T]], bool]) -> Entry[K, T] | None:
        """The head of the most urgent conversation whose head ``joins`` a batch."""
        best: tuple[float, int] | None = None
        head: Entry[K, T] | None = None
        for queue in self._queues.values():
            if joins(queue[0]):
                urgency = self._urgency(queue)
                if best is None or urgency < best:
                    best, head = urgency, queue[0]
        return head

    def pop_batch(
        self,
        joins: Callable[[Entry[K, T]], bool],
        limit: int,
        yields: Callable[[Entry[K, T], Entry[K, T]], bool] | None = None,
        held: Callable[[Entry[K, T]], bool] | None = None,
    ) -> list[Entry[K, T]]:
        """Take the command that runs next and, when it ``joins`` a batch, the head of
        every other conversation whose head joins too, most urgent first, at most
        ``limit`` entries in all (``[]``: nothing is queued, or every head is ``held``).

        At most one entry per conversation and only heads, so each conversation's own
        order holds; the first entry is what :meth:`pop` would take, so a batch never
        delays the command that is due: the others only run early. Except when that
        command does not join and ``yields(it, frame)`` to the most urgent head that
        joins (work that gives way to frames): then that head leads instead. A head
        that is ``held`` (work out of its share of engine time) waits: the most urgent
        head that is not leads.
        """
        lead = self.peek() if held is None else self.most_urgent(lambda e: not held(e))
        if lead is None:
            return []
        if yields is not None and not joins(lead):
            frame = self.most_urgent(joins)
            if frame is not None and yields(lead, frame):
                lead = frame
        self._take_head(lead.key)
        batch = [lead]
        if limit <= 1 or not joins(lead):
            return batch
        joining = sorted(
            (
                (self._urgency(queue), key)
                for key, queue in self._queues.items()
                if key != lead.key and joins(queue[0])
            ),
            key=lambda pair: pair[0],
        )
        for _, key in joining[: limit - 1]:
            batch.append(self._take_head(key))
        return batch

    def keys(self) -> set[K]:
        """The conversations with something queued."""
        return set(self._queues)

    def remove(self, key: K) -> list[Entry[K, T]]:
        """Take every queued command of ``key``, in order (its session is gone)."""
        queue = self._queues.pop(key, None)
        if queue is None:
            return []
        self._size -= len(queue)
        return list(queue)

    def drain(self) -> list[Entry[K, T]]:
        """Take everything, in run order (the engine stopped)."""
        out = []
        while (entry := self.pop()) is not None:
            out.append(entry)
        return out

    def __iter__(self) -> Iterator[Entry[K, T]]:
        for queue in self._queues.values():
            yield from queue
