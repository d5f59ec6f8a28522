"""Engine time for work that is not a frame, and whether the frames keep real time:
pure rules, times passed in.

Every model call of the engine is charged the engine time it took. Frames are what
the conversations streaming need every frame period; everything else (an opening's
slices, a tool result's steps, voice-chain steps, flushes, cancels, closes) draws
from one :class:`ShareBucket` of engine seconds, refilled at a share of wall time
(:func:`extra_share`): what the streaming frames leave of the frame period, at
least ``MIN_SHARE`` (openings always progress) and at most ``MAX_SHARE``. While another
conversation streams, a slice runs only with credit in the bucket (and when it fits
before the next frame's deadline, or else right after a frame step: :func:`fits`,
:func:`recovered`); its measured time
is then charged, so the bucket may go into debt by one slice and that debt is paid
back in wall time before the next one. A slice that can be cut finer (an opening's
prefill) is asked for as many model steps as fit the gap before the next frame
(:func:`slice_steps`), so it fits whatever one step costs on the machine now.
So however many conversations open or feed at
once, and whatever one slice costs, the work together takes at most its share of
each stretch of time (plus one slice and the bucket's ``BURST_FRAMES``), where the
old rule ("one slice every two frame times") gave a slice of 150 ms 150 ms of every
160. While no other conversation streams the bucket is full: slices run back to back.

:class:`FrameLateness` keeps the lateness of the frames that ran in the last seconds,
so readiness and admission ask whether the admitted conversations *do* keep real
time, not only whether the measured step says they should (:func:`keeps_real_time`).
"""

from __future__ import annotations

from collections import deque
from typing import Final

import attrs

MIN_SHARE: Final = 0.1
"""The least share of wall time work that is not a frame gets while conversations
stream (even when their frames fill the engine: an opening always progresses)."""
MAX_SHARE: Final = 0.5
"""The most: on an engine with room to spare, openings and tool feeds still take at
most half of each frame period. (0.3, measured on the demo checkpoint beside three
cold openings, kept the victim no closer to real time, and one opening was 10 %
slower.)"""
HEADROOM: Final = 0.85
"""Frames and other work together aim for this share of each frame period (the rest:
the connections' own work, the GIL, a slow step)."""
BURST_FRAMES: Final = 1.0
"""The bucket holds at most this many frame periods' worth of share: short slices may
run a few in a row in one gap between frames."""


def extra_share(frame_load: float) -> float:
    """The share of wall time for work that is not a frame, while conversations stream
    whose frames take ``frame_load`` of each frame period (predicted engine seconds of
    one frame of each / frame seconds): what they leave under ``HEADROOM``, bounded by
    ``MIN_SHARE`` and ``MAX_SHARE``."""
    return min(MAX_SHARE, max(MIN_SHARE, HEADROOM - max(0.0, frame_load)))


@attrs.define(slots=True)
class ShareBucket:
    """Engine seconds that work other than frames may spend: refilled at ``share`` x
    wall time up to ``share x frame x BURST_FRAMES``, charged each such call's measured
    time (so it may go into debt by what one slice costs more than its credit)."""

    frame_seconds: float
    _credit: float = attrs.field(init=False, default=0.0)
    _at: float | None = attrs.field(init=False, default=None)
    _full: bool = attrs.field(init=False, default=True)
    """Nothing streamed since it was last charged: credit to the brim."""

    def _cap(self, share: float) -> float:
        return share * self.frame_seconds * BURST_FRAMES

    def credit(self, now: float, share: float) -> float:
        """Engine seconds in the bucket at ``now`` (``share``: the refill rate since the
        last call)."""
        if self._full or self._at is None:
            return self._cap(share)
        return min(self._cap(share), self._credit + share * max(0.0, now - self._at))

    def _settle(self, now: float, share: float) -> None:
        self._credit = self.credit(now, share)
        self._at = now if self._at is None else max(self._at, now)
        self._full = False

    def may_run(self, now: float, share: float) -> bool:
        """Whether a slice may start now: the bucket holds credit (more than none)."""
        return self.credit(now, share) > 0.0

    def wait(self, now: float, share: float) -> float:
        """Seconds until :meth:`may_run` (0: it may now)."""
        credit = self.credit(now, share)
        if credit > 0.0:
            return 0.0
        return -credit / share + 1e-4

    def charge(self, now: float, seconds: float, share: float, *, contended: bool) -> None:
        """Work that ended at ``now`` held the engine ``seconds``. ``contended`` False:
        no conversation streamed, so it took nobody's time and the bucket stays full."""
        if not contended:
            self._full, self._at = True, now
            return
        self._settle(now, share)
        self._credit -= max(0.0, seconds)


RECOVERY_FRAMES: Final = 1
"""A slice that fits no gap makes a frame late wherever it runs: it waits until the
frames have ended on time for this many frame periods (the streams have caught up
from the last one), so such slices cannot pile lateness on lateness. (4 made one cold
opening beside a stream three times slower than before, with no gain to the stream.)"""


PATIENCE_FRAMES: Final = 8
"""A slice overdue by this many frame periods no longer waits for the frames to catch
up: on an engine whose frames are always late, openings still progress (at their
share)."""


def recovered(on_time_for: float, overdue: float, frame_seconds: float) -> bool:
    """Whether a slice that will make the next frame late may run, the frames having
    ended on time for ``on_time_for`` seconds and the slice ``overdue`` seconds past its
    due time: they have caught up from the last such slice, or it has waited long
    enough."""
    return (
        on_time_for >= RECOVERY_FRAMES * frame_seconds or overdue >= PATIENCE_FRAMES * frame_seconds
    )


def fits(now: float, cost: float, next_deadline: float | None, step: float) -> bool:
    """Whether a slice of ``cost`` seconds started at ``now`` still lets the next frame
    expected (due at ``next_deadline``; ``None``: none expected), a ``step`` long, end by
    its deadline. A slice that does not fit waits for the moment just after the frames
    ran, when the next one is furthest off (the engine's rule)."""
    return next_deadline is None or now + cost + step <= next_deadline


def gap(now: float, next_deadline: float | None, step: float) -> float | None:
    """Seconds a slice started at ``now`` may take and still let the next frame expected
    (due at ``next_deadline``, a ``step`` long) end by its deadline; ``None``: no frame is
    expected, so nothing bounds it."""
    return None if next_deadline is None else next_deadline - step - now


def slice_steps(most: int, room: float | None, per_step: float | None) -> int:
    """Model steps of the next slice of work that can be cut finer (an opening's prefill,
    1 to ``most`` steps): as many as ``room`` seconds hold (:func:`gap`) at ``per_step``
    seconds a step (measured on its last slices); ``most`` when nothing bounds it, one
    while the cost of a step is unknown or no room is left. So a slice fits the gap the
    frames leave whatever the machine's speed, down to one step (which cannot be cut:
    it fits or it waits, :func:`fits`)."""
    most = max(1, most)
    if room is None:
        return most
    if per_step is None or per_step <= 0.0 or room <= 0.0:
        return 1
    return max(1, min(most, int(room / per_step)))


LATENESS_WINDOW_SECONDS: Final = 2.0
"""How far back frame lateness is judged (a few dozen frames of a few conversations;
short enough that /ready turns 200 again soon after the load goes)."""
MIN_LATE_SAMPLES: Final = 8
"""Frames needed in the window before they say the engine is behind."""
BEHIND_QUANTILE: Final = 0.9


def keeps_real_time(latenesses: list[float], frame_seconds: float) -> bool:
    """Whether frames that ended ``latenesses`` seconds after their deadlines keep real
    time: fewer than one in ten more than a frame period late (later than two frame
    times after it reached the engine, the real-time bound), or too few to tell."""
    if len(latenesses) < MIN_LATE_SAMPLES:
        return True
    ordered = sorted(latenesses)
    return ordered[min(len(ordered) - 1, int(BEHIND_QUANTILE * len(ordered)))] <= frame_seconds


@attrs.define(slots=True)
class FrameLateness:
    """The lateness of the frames that ended in the last ``window`` seconds."""

    window: float = LATENESS_WINDOW_SECONDS
    _frames: deque[tuple[float, float]] = attrs.field(init=False, factory=deque)

    def add(self, now: float, lateness: float) -> None:
        """A frame ended at ``now``, ``lateness`` seconds after its deadline."""
        self._frames.append((now, lateness))
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._frames and self._frames[0][0] <= now - self.window:
            self._frames.popleft()

    def on_time_for(self, now: float) -> float:
        """Seconds since the last frame in the window that ended after its deadline (the
        whole window when none did)."""
        self._expire(now)
        late = [at for at, lateness in self._frames if lateness > 0.0]
        return now - late[-1] if late else self.window

    def keeps_real_time(self, now: float, frame_seconds: float) -> bool:
        """:func:`keeps_real_time` over the frames of the window."""
        self._expire(now)
        return keeps_real_time([late for _, late in self._frames], frame_seconds)
