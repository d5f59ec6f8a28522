"""Echo cancellation for a client that plays and captures at once (no headphones).

A full-duplex model hears everything the microphone hears, its own voice from the
speaker included: unless that echo is taken out, it answers itself or cuts itself
short. :class:`EchoCanceller` runs WebRTC's audio processing module (AEC3, and
optionally its noise suppressor) through LiveKit's Python SDK
(``livekit.rtc.AudioProcessingModule``): maintained, with wheels for Linux, macOS
and Windows, and already what LiveKit's agents run on. It is optional: install
``realtime[clients]``; without it :func:`echo_canceller` says why and the client
runs without.

The canceller works on 10 ms pieces at the capture rate, as WebRTC's module is meant
to be driven: what the speaker plays goes to :meth:`EchoCanceller.played` from the
output callback (which runs every 10 ms while a canceller listens), resampled to the
capture rate and handed to the module at once as the far end; each captured block
goes to :meth:`EchoCanceller.clean` from the input callback, 10 ms at a time, with
the devices' reported latencies (output plus input) as the module's delay hint.
The module's own delay estimator finds the rest of the echo path. Its two sides run
on PortAudio's two threads and take turns under one short lock. The streams ask for
PortAudio's low latency while a canceller listens: a deep output buffer (PulseAudio's
default is over a second) is a delay the hint does not know.

Limits: the two devices' clocks are assumed to run at the same rate (a long session
on two devices with different crystals drifts; WebRTC's delay estimator follows a
slow drift, not a jump), and a speaker loud enough to clip the microphone leaves an
echo no linear canceller removes.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from realtime.audio import float_to_pcm16
from realtime.client.devices import StreamResampler
from realtime.models.base import Samples

RATES: Final = (8000, 16000, 32000, 48000)
"""The capture rates WebRTC's module works at."""

PIECE_SECONDS: Final = 0.01
"""The module's frame: 10 ms."""


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

    ``played(samples, rate)`` is called with what the speaker plays, as it is handed
    to the device; ``clean(block)`` with what the microphone captured, as it arrives;
    it returns the block with the speaker's echo taken out (float32 in [-1, 1], the
    same length). ``output_latency`` and ``input_latency`` are the devices' reported
    latencies in seconds: their sum is the module's delay hint.
    """

    def __init__(
        self,
        rate: int,
        *,
        noise_suppression: bool = False,
        output_latency: float = 0.0,
        input_latency: float = 0.0,
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
        self._lock = threading.Lock()
        """One call into the module at a time (the two sides run on two threads)."""
        self._resamplers: dict[int, StreamResampler] = {}
        self._far_pending = np.zeros(0, np.float32)
        self._near_pending = np.zeros(0, np.float32)
        self.pieces = 0
        """10 ms pieces of capture cleaned."""
        self.far_pieces = 0
        """10 ms pieces of far end given to the module."""

    @property
    def delay_ms(self) -> int:
        """The module's delay hint: from a sample handed to the speaker to its echo
        handed back by the microphone, as the devices report their latencies."""
        return round((self.output_latency + self.input_latency) * 1000)

    def _frame(self, piece: Samples) -> Any:
        """10 ms as LiveKit's PCM16 frame (the module cleans it in place)."""
        return self.rtc.AudioFrame(_pcm(piece), self.rate, 1, self.piece)

    # --- the output side ------------------------------------------------------------

    def played(self, samples: Samples, rate: int) -> None:
        """``samples`` (mono float at ``rate`` Hz) go to the speaker now; on the output
        callback's thread. Each whole 10 ms goes to the module at once."""
        resampler = self._resamplers.get(rate)
        if resampler is None:
            resampler = self._resamplers[rate] = StreamResampler(rate, self.rate)
        x = resampler.process(np.asarray(samples, np.float32).reshape(-1))
        data = np.concatenate([self._far_pending, x])
        whole = data.size // self.piece * self.piece
        for start in range(0, whole, self.piece):
            frame = self.rtc.AudioFrame(
                _pcm(data[start : start + self.piece]), self.rate, 1, self.piece
            )
            with self._lock:
                self._apm.process_reverse_stream(frame)
                self.far_pieces += 1
        self._far_pending = data[whole:]

    # --- the input side -------------------------------------------------------------

    def clean(self, block: Samples) -> Samples:
        """``block`` (mono float at :attr:`rate`, just captured) less the speaker's echo;
        on the input callback's thread. Whole 10 ms pieces are processed; a block that
        is not a multiple of 10 ms comes back delayed by its remainder."""
        x = np.asarray(block, np.float32).reshape(-1)
        data = np.concatenate([self._near_pending, x])
        whole = data.size // self.piece * self.piece
        out = np.empty(whole, np.float32)
        for start in range(0, whole, self.piece):
            frame = self.rtc.AudioFrame(
                _pcm(data[start : start + self.piece]), self.rate, 1, self.piece
            )
            with self._lock:
                self._apm.set_stream_delay_ms(self.delay_ms)
                self._apm.process_stream(frame)
                self.pieces += 1
            cleaned = np.frombuffer(bytes(frame.data), dtype=np.int16)
            out[start : start + self.piece] = cleaned.astype(np.float32) / 32768.0
        self._near_pending = data[whole:]
        if out.size == x.size:
            return out
        return np.concatenate([np.zeros(x.size, np.float32), out])[-x.size :]


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


def erle_db(
    captured: npt.ArrayLike, cleaned: npt.ArrayLike, *, skip_seconds: float, rate: int
) -> float:
    """Echo return loss enhancement: how far the canceller took the echo down, in dB
    (captured power over cleaned power), leaving out the first ``skip_seconds`` (the
    canceller's convergence). Measured over echo alone (no near-end speech)."""
    start = int(skip_seconds * rate)
    a = np.asarray(captured, np.float64)[start:]
    b = np.asarray(cleaned, np.float64)[start : start + a.size]
    power_in = float(np.mean(a * a)) if a.size else 0.0
    power_out = max(float(np.mean(b * b)) if b.size else 0.0, 1e-12)
    return 10.0 * float(np.log10(max(power_in, 1e-12) / power_out))
