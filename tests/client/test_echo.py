"""realtime.client.echo: WebRTC's echo canceller (LiveKit's SDK) between what a client
plays and what it captures, on a synthetic room (no sound card)."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.client.echo import EchoCanceller, EchoUnavailable, echo_canceller, erle_db
from tests.models_fixtures import speechlike

RATE = 16_000
OUT_RATE = 22_050
BLOCK = 1280  # the microphone's 80 ms blocks


def room(far: np.ndarray, delay: int) -> np.ndarray:
    """The echo a microphone hears: the speaker ``delay`` samples late, with three
    reflections, quieter."""
    echo = np.zeros(far.size + delay + 400, np.float32)
    for lag, gain in ((0, 0.5), (97, 0.2), (211, -0.1), (389, 0.05)):
        echo[delay + lag : delay + lag + far.size] += gain * far
    return echo[: far.size]


def run(
    seconds: float, *, output_latency: float, delay_seconds: float
) -> tuple[np.ndarray, np.ndarray, EchoCanceller]:
    """Play speech through the canceller's output side and capture its echo, 10 ms
    callbacks out and 80 ms blocks in, on one clock."""
    pytest.importorskip("livekit.rtc", reason="livekit is not installed (realtime[clients])")
    canceller = EchoCanceller(RATE, output_latency=output_latency)
    frames = int(seconds / 0.08)
    far16 = speechlike(frames, seed=5)
    from realtime.audio import resample

    far_out = resample(far16, RATE, OUT_RATE).astype(np.float32)
    heard = room(far16, int((output_latency + delay_seconds) * RATE))
    captured, cleaned = [], []
    out_step, played = OUT_RATE // 100, 0
    for block in range(frames):
        # The output callback runs every 10 ms, a little ahead of the input one.
        for _ in range(8):
            canceller.played(far_out[played : played + out_step], OUT_RATE)
            played += out_step
        piece = heard[block * BLOCK : (block + 1) * BLOCK]
        captured.append(piece)
        cleaned.append(canceller.clean(piece))
    return np.concatenate(captured), np.concatenate(cleaned), canceller


def test_the_echo_of_what_is_played_is_taken_out() -> None:
    captured, cleaned, canceller = run(8.0, output_latency=0.05, delay_seconds=0.01)
    erle = erle_db(captured, cleaned, skip_seconds=2.0, rate=RATE)
    print(f"ERLE after the first 2 s: {erle:.1f} dB (synthetic room)")
    assert erle >= 15.0
    assert canceller.pieces == captured.size // 160
    assert (
        canceller.pieces - 10 <= canceller.far_pieces <= canceller.pieces
    )  # the resampler's delay


def test_the_canceller_refuses_what_it_cannot_do() -> None:
    pytest.importorskip("livekit.rtc", reason="livekit is not installed")
    with pytest.raises(EchoUnavailable, match="44100 Hz"):
        EchoCanceller(44_100)
    canceller, why = echo_canceller(22_050)
    assert canceller is None and why is not None and "--input-rate" in why


def test_erle() -> None:
    x = np.ones(RATE * 3, np.float32)
    assert erle_db(x, x / 10, skip_seconds=2.0, rate=RATE) == pytest.approx(20.0)
