"""The microphone client's playback buffer: an adaptive jitter buffer.

The network delivers the model's speech in 80 ms frames at uneven times; the sound
card pulls small blocks at a steady pace. Between them this buffer keeps a *target*
latency: enough audio queued to ride out the usual jitter, no more.

- Playback starts once ``target`` samples are queued; when the queue runs dry
  while playing (an underrun) it waits again, and the target rises by one frame
  (up to ``max_target``), since delivery has proved less steady than assumed.
- While delivery is steady (no underrun for ``steady_seconds``) the target decays
  back towards its base by ``decay_per_second``.
- When more is queued than the target (after a stall, the late frames arrive in
  a burst), the buffer catches up a little at a time: each pull drops at most
  ``max_catch_up`` of what it plays, spliced with a short crossfade, in proportion
  to the excess. Latency returns to the target within a few seconds instead of
  staying high for the rest of the session.

Latency here is the buffer's level as a frame lands: how long that frame's newest
sample waits before it is heard. The excess is measured on its lowest value over
the last ``window_seconds``, so a burst alone does not trigger a catch-up.
Without ``sample_rate`` the buffer is a plain FIFO with a fixed prebuffer (no
adaptation), which is what tests that count every sample want.

Thread-safe: the network side pushes from trio, the audio callback pulls on
PortAudio's thread; both only take a short lock.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from realtime.models.base import Samples

FRAME_SECONDS_OUT = 0.08
"""The model's output frame: 1764 samples at 22 050 Hz."""


class JitterBuffer:
    """A bounded FIFO between the network (push) and the audio callback (pull)."""

    def __init__(
        self,
        capacity: int,
        prebuffer: int,
        *,
        sample_rate: int | None = None,
        max_target_seconds: float = 0.6,
        steady_seconds: float = 2.0,
        decay_per_second: float = 0.04,
        window_seconds: float = 0.4,
        tolerance_seconds: float = 0.01,
        max_catch_up: float = 0.25,
        crossfade: int = 32,
    ) -> None:
        if capacity <= 0 or not 0 <= prebuffer <= capacity:
            raise ValueError("need capacity > 0 and 0 <= prebuffer <= capacity")
        self.capacity = capacity
        self.prebuffer = prebuffer
        self.sample_rate = sample_rate
        self.adaptive = sample_rate is not None
        rate = sample_rate or 1
        self.base_target = prebuffer
        self.target = prebuffer
        self.max_target = min(capacity, max(prebuffer, int(max_target_seconds * rate)))
        self._step = int(FRAME_SECONDS_OUT * rate)
        self._steady = int(steady_seconds * rate)
        self._decay = decay_per_second
        self._window = int(window_seconds * rate)
        self._tolerance = int(tolerance_seconds * rate)
        self._max_catch_up = max_catch_up
        self._crossfade = crossfade
        self._chunks: deque[Samples] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._playing = False
        self._finished = False
        self._since_underrun = 0
        self._lows: deque[tuple[int, int]] = deque()  # (played position, level on arrival)
        self.dropped = 0
        """Samples dropped because the buffer was full (the oldest go)."""
        self.skipped = 0
        """Samples left out to catch up with the target."""
        self.underruns = 0
        self.played = 0
        self.max_level = 0

    # --- the network side ---------------------------------------------------------

    def push(self, samples: Samples) -> int:
        """Append; returns how many of the oldest samples were dropped to make room."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        dropped = 0
        with self._lock:
            if x.size > self.capacity:
                dropped += x.size - self.capacity
                x = x[-self.capacity :]
            self._chunks.append(x)
            self._size += x.size
            while self._size > self.capacity:
                dropped += self._take_front(self._size - self.capacity).size
            self.dropped += dropped
            self.max_level = max(self.max_level, self._size)
            if self.adaptive and self._playing:
                self._note_level()
        return dropped

    def finish(self) -> None:
        """No more audio will come: play out what is queued, even below the target."""
        with self._lock:
            self._finished = True

    # --- the device side ----------------------------------------------------------

    def pull(self, n: int) -> Samples:
        """Exactly ``n`` samples for the device; silence where there is nothing to play."""
        out = np.zeros(n, dtype=np.float32)
        with self._lock:
            if not self._playing:
                if self._size == 0 or (self._size < self.target and not self._finished):
                    return out
                self._playing = True
                self._lows.clear()
            skip = self._catch_up_amount(n) if self.adaptive and not self._finished else 0
            if skip:
                data = self._take_front(n + skip)
                data = self._splice(data, skip)
                self.skipped += skip
            else:
                data = self._take_front(n)
            out[: data.size] = data
            self.played += data.size
            self._since_underrun += data.size
            if data.size < n:
                self._playing = False
                if not self._finished:
                    self._underrun()
            elif self.adaptive:
                self._decay_target(n)
        return out

    def _take_front(self, n: int) -> Samples:
        parts: list[Samples] = []
        need = n
        while need > 0 and self._chunks:
            head = self._chunks[0]
            if head.size <= need:
                parts.append(self._chunks.popleft())
                need -= head.size
            else:
                parts.append(head[:need])
                self._chunks[0] = head[need:]
                need = 0
        taken = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        self._size -= taken.size
        return taken

    def _splice(self, data: Samples, skip: int) -> Samples:
        """``data`` less ``skip`` samples from its middle, crossfaded so it does not click."""
        if data.size <= skip:
            return data[:0]
        keep = data.size - skip
        cut = keep // 2
        fade = min(self._crossfade, cut, data.size - (cut + skip))
        head, tail = data[:cut].copy(), data[cut + skip :]
        if fade > 0:
            ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
            dropped = data[cut : cut + fade]
            tail = tail.copy()
            tail[:fade] = tail[:fade] * ramp + dropped * (1.0 - ramp)
        return np.concatenate([head, tail])

    def _catch_up_amount(self, n: int) -> int:
        """How much to leave out of the next ``n`` played: in proportion to the excess of
        the recent low point over the target, at most ``max_catch_up`` of ``n``."""
        if len(self._lows) == 0:
            return 0
        low = min(level for _, level in self._lows)
        excess = low - self.target - self._tolerance
        if excess <= 0:
            return 0
        # Proportional: about half a second to remove the excess, never faster than allowed.
        rate = self.sample_rate or 1
        want = int(np.ceil(excess * n / (0.5 * rate)))
        return max(0, min(want, int(n * self._max_catch_up), excess, self._size - n))

    def _note_level(self) -> None:
        self._lows.append((self.played, self._size))
        while self._lows and self._lows[0][0] < self.played - self._window:
            self._lows.popleft()

    def _underrun(self) -> None:
        self.underruns += 1
        self._since_underrun = 0
        self._lows.clear()
        if self.adaptive:
            self.target = min(self.max_target, self.target + self._step)

    def _decay_target(self, n: int) -> None:
        if self._since_underrun < self._steady or self.target <= self.base_target:
            return
        self.target = max(self.base_target, self.target - max(1, round(self._decay * n)))

    # --- figures ------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        with self._lock:
            return self._size

    def latency_seconds(self) -> float:
        """Audio queued ahead of the device now."""
        return self.buffered / (self.sample_rate or 1)

    def arrival_latency_seconds(self) -> float:
        """The playback latency: the lowest level a frame found on landing (its wait
        before being heard) over the last ``window_seconds``; the level now when none."""
        with self._lock:
            level = min((lv for _, lv in self._lows), default=self._size)
        return level / (self.sample_rate or 1)

    def target_seconds(self) -> float:
        return self.target / (self.sample_rate or 1)
