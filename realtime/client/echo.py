"""Echo cancellation for a client that plays and captures at once (no headphones).

A full-duplex model hears everything the microphone hears, its own voice from the
speaker included: unless that echo is taken out, it answers itself or cuts itself
short. :class:`EchoCanceller` runs WebRTC's audio processing module (AEC3, and
optionally its noise suppressor) through LiveKit's Python SDK
(``livekit.rtc.AudioProcessingModule``): maintained, with wheels for Linux, macOS
and Windows, and already what LiveKit's agents run on. It is optional: install
``realtime[clients]``; without it :func:`echo_canceller` says why and the client
runs without.

The canceller works on 10 ms pieces at the capture rate. What the speaker plays is
handed to :meth:`EchoCanceller.played` from the output callback, resampled to the
capture rate and laid on a timeline at the time it will be heard (now plus the
output device's reported latency); each captured block is handed to
:meth:`EchoCanceller.clean` from the input callback and laid on the same timeline at
the time it was heard (now less the input latency and the block). Every 10 ms of
capture is then processed right after the 10 ms of far end played at the same time,
so the module only has the room's echo path left to find. Both sides run on
PortAudio's threads and meet under one short lock; the module itself is only called
from the capture side.

Limits: the two devices' clocks are assumed to run at the same rate (a long session
on two devices with different crystals drifts; WebRTC's delay estimator follows a
slow drift, not a jump), and a speaker loud enough to clip the microphone leaves an
echo no linear canceller removes.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from realtime.audio import float_to_pcm16
from realtime.client.devices import StreamResampler
from realtime.models.base import Samples

RATES: Final = (8000, 16000, 32000, 48000)
"""The capture rates WebRTC's module works at."""

PIECE_SECONDS: Final = 0.01
"""The module's frame: 10 ms."""

MAX_FAR_SECONDS: Final = 2.0
"""Far-end audio kept ahead of the capture side at most (the rest is old)."""

Clock = Callable[[], float]


class EchoUnavailable(Exception):
    """The canceller cannot run here (its library is missing, or the capture rate is
    one it does not take); the message says which."""


def load_apm() -> Any:
    """``livekit.rtc``; :class:`EchoUnavailable` when it is not installed."""
    try:
        return importlib.import_module("livekit.rtc")
    except ImportError:
        raise EchoUnavailable(
            "echo cancellation needs LiveKit's SDK (pip install 'realtime[clients]')"
        ) from None


class EchoCanceller:
    """WebRTC's echo canceller between a speaker and a microphone at ``rate`` Hz.

    ``played(samples, rate)`` is called with what the speaker plays, ``clean(block)``
    with what the microphone captured; it returns the block with the speaker's echo
    taken out (float32 in [-1, 1], the same length). ``output_latency`` and
    ``input_latency`` are the devices' reported latencies in seconds.
    """

    def __init__(
        self,
        rate: int,
        *,
        noise_suppression: bool = False,
        output_latency: float = 0.0,
        input_latency: float = 0.0,
        clock: Clock = time.monotonic,
        rtc: Any = None,
    ) -> None:
        if rate not in RATES:
            raise EchoUnavailable(
                f"echo cancellation works at {', '.join(map(str, RATES))} Hz, not a "
                f"{rate} Hz microphone (choose one with --input-rate)"
            )
        self.rtc = rtc if rtc is not None else load_apm()
        self.rate = rate
        self.piece = int(rate * PIECE_SECONDS)
        self.output_latency = output_latency
        self.input_latency = input_latency
        self.noise_suppression = noise_suppression
        self._apm = self.rtc.AudioProcessingModule(
            echo_cancellation=True, noise_suppression=noise_suppression, high_pass_filter=True
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._resamplers: dict[int, StreamResampler] = {}
        self._far = np.zeros(0, np.float32)
        self._far_start: float | None = None
        """The time the first sample of ``_far`` is heard."""
        self._near_at: float | None = None
        """The time the next captured sample was heard (counted in samples since the
        first block, so the capture side's timeline does not jitter)."""
        self._near_pending = np.zeros(0, np.float32)
        self.pieces = 0
        """10 ms pieces of capture cleaned."""
        self.far_pieces = 0
        """10 ms pieces of far end given to the module (silence where none was played)."""

    # --- the output side ------------------------------------------------------------

    def played(self, samples: Samples, rate: int) -> None:
        """``samples`` (mono float) go to the speaker now, at ``rate`` Hz; on the output
        callback's thread."""
        resampler = self._resamplers.get(rate)
        if resampler is None:
            resampler = self._resamplers[rate] = StreamResampler(rate, self.rate)
        x = resampler.process(np.asarray(samples, np.float32).reshape(-1))
        heard_at = self._clock() + self.output_latency
        with self._lock:
            if self._far_start is None:
                self._far_start = heard_at
            self._far = np.concatenate([self._far, x])
            excess = self._far.size - int(MAX_FAR_SECONDS * self.rate)
            if excess > 0:
                self._far = self._far[excess:]
                self._far_start += excess / self.rate

    # --- the input side -------------------------------------------------------------

    def clean(self, block: Samples) -> Samples:
        """``block`` (mono float at :attr:`rate`, just captured) less the speaker's echo;
        on the input callback's thread. Whole 10 ms pieces are processed; a block that
        is not a multiple of 10 ms comes back delayed by its remainder."""
        x = np.asarray(block, np.float32).reshape(-1)
        if self._near_at is None:
            self._near_at = self._clock() - self.input_latency - x.size / self.rate
        data = np.concatenate([self._near_pending, x])
        whole = data.size // self.piece * self.piece
        out = np.empty(whole, np.float32)
        for start in range(0, whole, self.piece):
            far = self._far_at(self._near_at)
            out[start : start + self.piece] = self._process(data[start : start + self.piece], far)
            self._near_at += self.piece / self.rate
        self._near_pending = data[whole:]
        if out.size == x.size:
            return out
        return np.concatenate([np.zeros(x.size - out.size, np.float32), out])[-x.size :]

    def _far_at(self, heard_at: float) -> Samples | None:
        """The 10 ms of far end heard at ``heard_at``; what was played before it is let
        go. None while nothing was played then."""
        with self._lock:
            if self._far_start is None:
                return None
            skip = round((heard_at - self._far_start) * self.rate)
            if skip < 0:
                return None  # heard before the speaker's first sample
            if skip >= self._far.size:
                self._far_start += self._far.size / self.rate
                self._far = self._far[:0]
                return None
            piece = self._far[skip : skip + self.piece]
            self._far = self._far[skip + piece.size :]
            self._far_start += (skip + piece.size) / self.rate
        if piece.size < self.piece:
            piece = np.concatenate([piece, np.zeros(self.piece - piece.size, np.float32)])
        return piece

    def _process(self, near: Samples, far: Samples | None) -> Samples:
        rtc = self.rtc
        reverse = far if far is not None else np.zeros(self.piece, np.float32)
        frame = rtc.AudioFrame(_pcm(reverse), self.rate, 1, self.piece)
        self._apm.process_reverse_stream(frame)
        self.far_pieces += 1
        frame = rtc.AudioFrame(_pcm(near), self.rate, 1, self.piece)
        self._apm.set_stream_delay_ms(0)  # aligned on the timeline above
        self._apm.process_stream(frame)
        self.pieces += 1
        cleaned = np.frombuffer(bytes(frame.data), dtype=np.int16)
        return cleaned.astype(np.float32) / 32768.0


def _pcm(x: Samples) -> bytearray:
    return bytearray(float_to_pcm16(x).astype("<i2").tobytes())


def echo_canceller(
    rate: int,
    *,
    noise_suppression: bool = False,
    output_latency: float = 0.0,
    input_latency: float = 0.0,
) -> tuple[EchoCanceller | None, str | None]:
    """An :class:`EchoCanceller`, or None and the reason it cannot run here."""
    try:
        canceller = EchoCanceller(
            rate,
            noise_suppression=noise_suppression,
            output_latency=output_latency,
            input_latency=input_latency,
        )
    except EchoUnavailable as exc:
        return None, str(exc)
    return canceller, None


def erle_db(captured: Samples, cleaned: Samples, *, skip_seconds: float, rate: int) -> float:
    """Echo return loss enhancement: how far the canceller took the echo down, in dB
    (captured power over cleaned power), leaving out the first ``skip_seconds`` (the
    canceller's convergence). Measured over echo alone (no near-end speech)."""
    start = int(skip_seconds * rate)
    a = np.asarray(captured, np.float64)[start:]
    b = np.asarray(cleaned, np.float64)[start : start + a.size]
    power_in = float(np.mean(a * a)) if a.size else 0.0
    power_out = max(float(np.mean(b * b)) if b.size else 0.0, 1e-12)
    return 10.0 * float(np.log10(max(power_in, 1e-12) / power_out))
