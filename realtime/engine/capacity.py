"""The engine's capacity: the slots conversations reserve, and the measurements that
decide whether one more is admitted.

A slot is taken on the event loop (a connection's ``try_reserve``) and freed on the
engine thread once it has run that conversation's :class:`~realtime.engine.commands.Close`,
so a slot is free only when the engine really is. With more than one slot a
reservation is also refused while the measured step time, the work that is not a
frame, or the frames' measured lateness say one more conversation would not keep up
(the rules are :mod:`realtime.engine.admission`'s and :mod:`realtime.engine.fairshare`'s;
this module keeps their numbers).

:class:`Capacity` takes no lock of its own: both sides of the thread line call it under
the engine's one state lock (:attr:`realtime.engine.line.Line.lock`), with the queue
it is decided with.
"""

from __future__ import annotations

import concurrent.futures
from typing import Literal

import attrs

from realtime.engine import admission
from realtime.engine.admission import ExtraWork, StepTimes
from realtime.engine.fairshare import FrameLateness

AdmissionRefusal = Literal["busy", "overloaded"]
"""Why a new conversation is refused: every slot is held (``--max-sessions``), or the
measured step time says one more would make the open ones fall behind
(``--admission-margin``, :mod:`realtime.engine.admission`)."""


@attrs.define(slots=True, eq=False)
class Capacity:
    """The slots held and what admission decides from; every call under the state lock."""

    slots: int
    """How many conversations may hold a reservation at once (``--max-sessions``)."""
    margin: float
    """``--admission-margin`` (0: admit by slots alone)."""
    batched: bool
    """Frames run as one batched step (``--batch-frames``): frames cost by batch size."""
    step_times: StepTimes = attrs.field(factory=StepTimes)
    """The engine thread's measured frame steps, per batch size."""
    extra_work: ExtraWork = attrs.field(factory=ExtraWork)
    """Engine time of the work that is not a frame, counted by admission."""
    lateness: FrameLateness = attrs.field(factory=FrameLateness)
    """How late the recent frames ended: readiness and admission by what happens."""
    reserved: set[str] = attrs.field(factory=set)
    """The sessions holding a slot."""
    releasing: dict[str, concurrent.futures.Future[object]] = attrs.field(factory=dict)
    """The queued Close of each reserved session whose client has left."""

    def refusal(self, now: float, frame_seconds: float) -> AdmissionRefusal | None:
        """Why a new conversation would be refused now (``None``: it would be served)."""
        held = len(self.reserved)
        if held >= self.slots:
            return "busy"
        if self.margin > 0 and held > 0:
            cost = self.frame_cost(held + 1, now, frame_seconds)
            if not admission.fits(held, cost, frame_seconds, self.margin):
                return "overloaded"
            if not self.lateness.keeps_real_time(now, frame_seconds):
                return "overloaded"  # the admitted conversations are falling behind
        return None

    def frame_cost(self, sessions: int, now: float, frame_seconds: float) -> float | None:
        """One frame of ``sessions`` conversations, and the work that is not a frame
        (measured over the last seconds), in engine seconds (``None``: not measured)."""
        cost = admission.frame_cost(sessions, self.step_times.costs(), batched=self.batched)
        if cost is None:
            return None
        return cost + self.extra_work.per_frame(now, frame_seconds)

    def release(self, session_id: str) -> None:
        """Free ``session_id``'s slot (its Close has run, or it never opened)."""
        self.reserved.discard(session_id)
        self.releasing.pop(session_id, None)

    def pending_release(self) -> concurrent.futures.Future[object] | None:
        """The first queued Close of a session whose client has left, if any."""
        pending = [f for f in self.releasing.values() if not f.done()]
        return pending[0] if pending else None
