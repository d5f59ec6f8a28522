"""Admission by load: whether one more conversation would keep every open one in real time.

Conversations on one engine share its thread: each needs one model step per frame
time, so ``n`` of them keep up while ``n x step <= frame``. The engine measures its
frame steps; a new conversation is admitted while

    (open + 1) x p90(recent frame steps) <= margin x frame time

``margin`` (``--admission-margin``, 0.75 by default) leaves room for what the step
time does not show: the connections' own work on the event loop, the GIL they share
with the engine thread, a slow frame. A conversation alone is always admitted (the
behaviour of one conversation per process), and so is any before enough frames have
run to measure (``MIN_SAMPLES``). Pure: the engine keeps the numbers, tests pass them.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import attrs

WINDOW: Final = 64
"""Frame steps remembered: a few seconds of one conversation, under a second of four."""
MIN_SAMPLES: Final = 16
"""Frame steps measured before the rule applies (the first frames of a session run
slower while buffers and kernels warm up, so a few are not a measurement)."""
QUANTILE: Final = 0.9


@attrs.define(slots=True)
class StepTimes:
    """The engine's most recent frame step durations, in seconds."""

    window: int = WINDOW
    _times: deque[float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._times = deque(maxlen=self.window)

    def add(self, seconds: float) -> None:
        self._times.append(seconds)

    def __len__(self) -> int:
        return len(self._times)

    def quantile(self, q: float = QUANTILE) -> float | None:
        """The ``q`` quantile of the remembered steps (``None`` before ``MIN_SAMPLES``)."""
        if len(self._times) < MIN_SAMPLES:
            return None
        ordered = sorted(self._times)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def admits(open_sessions: int, step: float | None, frame_seconds: float, margin: float) -> bool:
    """Whether one more conversation keeps ``open_sessions`` (and itself) real time, with
    frame steps of ``step`` seconds (``None``: not measured yet); ``margin`` 0: always."""
    if margin <= 0 or step is None or open_sessions == 0:
        return True
    return (open_sessions + 1) * step <= margin * frame_seconds


def sessions_within(step: float | None, frame_seconds: float, margin: float) -> int | None:
    """How many conversations the rule admits at this step time (``None``: no bound)."""
    if margin <= 0 or step is None or step <= 0:
        return None
    return max(1, int(margin * frame_seconds / step))
