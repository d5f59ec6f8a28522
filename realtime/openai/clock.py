"""The dialect's time rules, with the time always passed in: the model's frame
clock (silence fed while the client is quiet) and the idle and stalled-reader
deadlines.

Once the model runs, its clock must keep going in real time, or it could never
answer after the user stops. Silence fills the gap, but only when the model is
more than ``SILENCE_SLACK_FRAMES`` behind real time (network jitter never
interleaves a real-time client with silence) and the engine keeps up.
"""

from __future__ import annotations

import math
from typing import Final

import attrs

SILENCE_SLACK_FRAMES: Final = 2
"""How far the model may fall behind real time before silence is fed: a client
streaming in real time is never interleaved with silence by network jitter."""
MAX_ENGINE_BACKLOG: Final = 2
"""Silence is only fed while the engine keeps up (at most this many frames queued)."""


@attrs.define(slots=True)
class FrameClock:
    """Frames handed to the engine and back, against real time since the model opened."""

    frame_seconds: float
    """One model frame (``ModelFigures.frame_seconds``): the unit of its clock."""
    start: float | None = None
    """When the model session opened (``None``: it has not)."""
    submitted: int = 0
    done: int = 0

    @property
    def backlog(self) -> int:
        """Frames with the engine, not yet back."""
        return self.submitted - self.done

    def silence_due(self, now: float) -> int:
        """How many frames of silence to feed at ``now``."""
        if self.start is None:
            return 0
        due = math.floor((now - self.start) / self.frame_seconds) - SILENCE_SLACK_FRAMES
        return max(0, min(due - self.submitted, MAX_ENGINE_BACKLOG - self.backlog))

    def next_frame(self, now: float) -> float:
        """When silence may next be due (not sooner than a quarter frame from ``now``,
        so an engine that falls behind is not polled in a spin)."""
        if self.start is None:
            return math.inf
        frame = self.start + (self.submitted + SILENCE_SLACK_FRAMES + 1) * self.frame_seconds
        return max(frame, now + self.frame_seconds / 4)


@attrs.define(slots=True)
class Deadlines:
    """The client's clocks: when it last sent, and how the writes to it go."""

    send_timeout: float
    idle_timeout: float
    last_message: float
    last_sent: float
    sending_since: float | None = None
    """When the write under way began (``None``: none is)."""
    closing_since: float | None = None
    """When the dialect decided to close: from then on the close is owed."""

    def sending(self, now: float) -> None:
        """A socket write starts (the stalled-reader clock runs until :meth:`sent`)."""
        self.sending_since = now

    def sent(self, now: float) -> None:
        self.sending_since = None
        self.last_sent = now

    def next_check(self, now: float, poll: float, *, closed: bool, dropped: bool) -> float:
        """When the client's deadlines next need a look: while serving at most ``poll``
        away (a write may start, and never end, without the clock being told); once
        closing only the stalled-reader deadline is left (no later write can make it
        earlier: the idle one has passed or no longer applies, and a time already past
        would spin the clock); none once the client is dropped."""
        stall = None if dropped else self.stall()
        if closed:
            return stall if stall is not None else math.inf
        at = min(self.idle(), now + poll)
        return at if stall is None else min(at, stall)

    def idle(self) -> float:
        """When a client that sends nothing is closed."""
        return self.last_message + self.idle_timeout

    def idle_passed(self, now: float) -> bool:
        """Whether the client has sent nothing for ``idle_timeout`` at ``now``."""
        return now - self.last_message >= self.idle_timeout

    def stall(self) -> float | None:
        """When a client that reads nothing is dropped (``None``: nothing is owed it).

        ``send_timeout`` after the write under way began, in every phase; and once
        closing, after the later of the close decision and the last write done: the
        close (and what is queued ahead of it) is owed then, even while no write is
        reported under way (the plumbing does not report a close frame's).
        """
        deadlines = []
        if self.sending_since is not None:
            deadlines.append(self.sending_since + self.send_timeout)
        if self.closing_since is not None:
            deadlines.append(max(self.closing_since, self.last_sent) + self.send_timeout)
        return min(deadlines, default=None)
