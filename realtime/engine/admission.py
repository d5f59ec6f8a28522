"""Admission by load: whether one more conversation would keep every open one in real time.

Conversations on one engine share its thread, and every one of them needs a frame
stepped each frame time. What that costs depends on the scheduler:

* **time-sliced** (``--no-batch-frames``): each frame is its own model step, so ``n``
  conversations need ``n x step`` of every frame time;
* **batched** (``--batch-frames``): the frames that are due run as one step of ``B``
  rows, whose cost grows far slower than ``B`` when the step is bound by per-step
  overhead. The engine keeps the step times of each batch size apart
  (:class:`StepTimes`), and the cost of ``n`` conversations is the measured step at
  ``B = n``, else a least-squares line ``a + b x B`` over the sizes measured, never
  below the cost of the largest measured size under ``n`` nor above the smallest one
  over it (:func:`batched_cost`).

A new conversation is admitted while the predicted engine time of one frame of every
conversation, itself included, and of the work that is not a frame, fits:

    frame_cost(open + 1) + extra <= margin x frame time

``extra`` is the engine time recent openings, tool results, flushes, cancels and
closes took per frame time (:class:`ExtraWork`): that work runs as single steps beside
the batch, so it is counted as measured rather than predicted.

The prediction is checked against what happens: while more than one in ten of the
frames of the last 2 s ended over a frame period late, the admitted conversations are
falling behind and no new one is admitted (``/ready`` 503 ``overloaded``:
:class:`realtime.engine.fairshare.FrameLateness`), whatever the step time predicts.

``margin`` (``--admission-margin``, 0.75 by default) leaves room for what the step
time does not show: the connections' own work on the event loop, the GIL they share
with the engine thread, a slow frame. A conversation alone is always admitted (the
behaviour of one conversation per process), and so is any before enough frames have
run to measure (``MIN_SAMPLES``). Pure: the engine keeps the numbers, tests pass them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

WINDOW: Final = 64
"""Frame steps remembered (per batch size): a few seconds of one conversation, under a
second of four."""
MIN_SAMPLES: Final = 16
"""Frame steps measured before the rule applies (the first frames of a session run
slower while buffers and kernels warm up, so a few are not a measurement)."""
QUANTILE: Final = 0.9


def quantile(times: Iterable[float], q: float = QUANTILE) -> float | None:
    """The ``q`` quantile of ``times`` (``None`` when fewer than ``MIN_SAMPLES``)."""
    ordered = sorted(times)
    if len(ordered) < MIN_SAMPLES:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@attrs.define(slots=True)
class StepTimes:
    """The engine's most recent model step durations, in seconds: over all steps, and
    apart for each batch size (rows in one step)."""

    window: int = WINDOW
    _times: deque[float] = attrs.field(init=False)
    _by_rows: dict[int, deque[float]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._times = deque(maxlen=self.window)

    def add(self, seconds: float, rows: int = 1) -> None:
        """One model step of ``rows`` rows took ``seconds``."""
        if rows < 1:
            raise ValueError(f"a step has at least one row, got {rows}")
        self._times.append(seconds)
        self._by_rows.setdefault(rows, deque(maxlen=self.window)).append(seconds)

    def __len__(self) -> int:
        return len(self._times)

    def quantile(self, q: float = QUANTILE) -> float | None:
        """The ``q`` quantile of the remembered steps of any size (``None`` before
        ``MIN_SAMPLES``)."""
        return quantile(self._times, q)

    def costs(self, q: float = QUANTILE) -> dict[int, float]:
        """The ``q`` quantile of each batch size's remembered steps, for the sizes with
        at least ``MIN_SAMPLES`` of them."""
        out = {}
        for rows, times in self._by_rows.items():
            value = quantile(times, q)
            if value is not None:
                out[rows] = value
        return dict(sorted(out.items()))


EXTRA_WINDOW_SECONDS: Final = 2.0
"""How far back the engine time of work that is not a frame is counted (a few
openings' slices; long enough that a churn of opens and closes shows)."""


@attrs.define(slots=True)
class ExtraWork:
    """The engine time of model work that is not a frame (an opening's slices, a tool
    result's steps, flushes, cancels, closes) over the last ``window`` seconds."""

    window: float = EXTRA_WINDOW_SECONDS
    _spent: deque[tuple[float, float]] = attrs.field(init=False, factory=deque)

    def add(self, now: float, seconds: float) -> None:
        """Work that ended at ``now`` held the engine for ``seconds``."""
        self._spent.append((now, seconds))
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - self.window:
            self._spent.popleft()

    def per_frame(self, now: float, frame_seconds: float) -> float:
        """Engine seconds that work took per ``frame_seconds`` of the last ``window``."""
        self._expire(now)
        return sum(seconds for _, seconds in self._spent) * frame_seconds / self.window


def batched_cost(costs: Mapping[int, float], rows: int) -> float | None:
    """The predicted time of one batched step of ``rows`` rows from the measured
    ``costs`` (batch size -> step seconds); ``None`` when nothing is measured.

    Measured at ``rows``: that. Else the least-squares line ``a + b x B`` over the sizes
    measured (one size ``B0`` alone: proportional above it, ``cost x rows / B0``, the
    time-sliced rule until a second size is measured; below it, its cost), bounded by
    the measured neighbours: never above the smallest measured size over ``rows``, and
    never below the largest one under it (a step does not get cheaper with more rows).
    """
    if rows in costs:
        return costs[rows]
    if not costs:
        return None
    sizes = sorted(costs)
    if len(sizes) == 1:
        (only,) = sizes
        estimate = costs[only] * rows / only if rows > only else costs[only]
    else:
        mean_b = sum(sizes) / len(sizes)
        mean_c = sum(costs[b] for b in sizes) / len(sizes)
        spread = sum((b - mean_b) ** 2 for b in sizes)
        slope = sum((b - mean_b) * (costs[b] - mean_c) for b in sizes) / spread
        estimate = mean_c + slope * (rows - mean_b)
    above = [b for b in sizes if b > rows]
    below = [b for b in sizes if b < rows]
    if above:
        estimate = min(estimate, costs[above[0]])
    if below:
        estimate = max(estimate, costs[below[-1]])
    return max(0.0, estimate)


def gather_cost(costs: Mapping[int, float], rows: int) -> float:
    """The step a batch of ``rows`` rows is expected to take, for how long it may wait
    for frames on their way (:func:`realtime.engine.scheduler.gather_until`): measured at
    ``rows``, else the line over two or more sizes (:func:`batched_cost`), else the
    largest measured size under ``rows`` (0 when nothing is measured).

    Optimistic where admission is conservative: with one size measured, admission's
    proportional rule would predict 2 rows at twice 1 row, so no second frame would
    ever seem to arrive in time, no batch of 2 would run and its cost would never be
    measured. A bigger batch is tried at the cost of a smaller one, then measured.
    """
    if rows in costs or len(costs) >= 2:
        return batched_cost(costs, rows) or 0.0
    below = [cost for size, cost in costs.items() if size <= rows]
    return max(below, default=0.0)


GATHER_MARGIN = 0.75
"""Below this share of a frame, one step per conversation would keep up: no batch then
makes a frame wait past the time its own step needs (:func:`gather_reserve`)."""


def gather_reserve(rows: int, costs: Mapping[int, float], frame_seconds: float) -> float:
    """How much of its first frame's slot a batch keeps for its own step while it waits
    for the frames on their way: ``rows``, the conversations streaming (those queued
    and those expected), each a row if it comes in time.

    With room to step every streaming conversation on its own within the frame
    (``rows x one-row step <= GATHER_MARGIN x frame``), a batch must still end by
    its first frame's deadline: it starts that step early (:func:`gather_cost`), and
    waits only for frames that arrive before then. Without that room, time-slicing would
    fall behind: the batch keeps nothing back, takes along every frame due before its
    first one is (the largest batch, so the fewest steps), and its first frame may end
    up to one step late (two frame times at most, the real-time bound, while the step
    fits in a frame). Depends only on the load and the measured costs, not on how the
    batches came out, so it does not flip with its own effect.
    """
    one = costs.get(1)
    if one is None or rows * one > GATHER_MARGIN * frame_seconds:
        return 0.0
    return gather_cost(costs, rows)


def frame_cost(sessions: int, costs: Mapping[int, float], *, batched: bool) -> float | None:
    """Engine time of one frame of each of ``sessions`` conversations, predicted from
    the measured ``costs`` (batch size -> step seconds; ``None``: not measured yet).

    Batched: one step of ``sessions`` rows (:func:`batched_cost`). Time-sliced: a step
    of one row each."""
    if sessions < 1:
        return 0.0
    if batched:
        return batched_cost(costs, sessions)
    step = costs.get(1)
    return None if step is None else sessions * step


def fits(open_sessions: int, cost: float | None, frame_seconds: float, margin: float) -> bool:
    """Whether one more conversation may join ``open_sessions``: ``cost`` is the
    predicted engine time of a frame of all of them, the new one included (``None``:
    not measured yet); ``margin`` 0: always."""
    if margin <= 0 or cost is None or open_sessions == 0:
        return True
    return cost <= margin * frame_seconds


def admits(open_sessions: int, step: float | None, frame_seconds: float, margin: float) -> bool:
    """The time-sliced rule: whether one more conversation keeps ``open_sessions`` (and
    itself) real time, with frame steps of ``step`` seconds (``None``: not measured
    yet), i.e. ``(open + 1) x step <= margin x frame``; ``margin`` 0: always."""
    cost = None if step is None else (open_sessions + 1) * step
    return fits(open_sessions, cost, frame_seconds, margin)


def sessions_within(step: float | None, frame_seconds: float, margin: float) -> int | None:
    """How many conversations the time-sliced rule admits at this step time (``None``:
    no bound)."""
    if margin <= 0 or step is None or step <= 0:
        return None
    return max(1, int(margin * frame_seconds / step))
