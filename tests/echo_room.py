"""The echo canceller on real PortAudio devices: plays a WAV through the client
library's output device and captures the room (the speaker looped back into the
microphone) through its input device, both with one :class:`EchoCanceller`; prints
one JSON line with the ERLE and the counts.

    python -m tests.echo_room SPEECH.wav SECONDS

Run by ``tests/client/test_microphone_pulseaudio.py`` in the environment of its private
PulseAudio daemon (PortAudio reads it when it starts, so in a process of its own).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from realtime.audio import read_wav, resample, to_mono
from realtime.client.devices import SoundDeviceInput, SoundDeviceOutput, load_sounddevice
from realtime.client.echo import EchoCanceller, erle_db
from realtime.models.base import Samples

SKIP_SECONDS = 2.0
"""The canceller's convergence, left out of the figure."""


class Recording(EchoCanceller):
    """The canceller, keeping what the microphone captured and what it sent on."""

    def __init__(self, rate: int) -> None:
        super().__init__(rate)
        self.captured: list[Samples] = []
        self.cleaned: list[Samples] = []

    def clean(self, block: Samples) -> Samples:
        out = super().clean(block)
        self.captured.append(np.array(block, np.float32))
        self.cleaned.append(out)
        return out


def main(wav: str, seconds: float) -> None:
    sd = load_sounddevice()
    source = SoundDeviceInput(sd, "pulse", 16_000)
    sink = SoundDeviceOutput(sd, "pulse", 22_050)
    echo = Recording(source.sample_rate)
    source.echo = sink.echo = echo
    audio, rate = read_wav(wav)
    sink.play(resample(to_mono(audio), rate, sink.sample_rate))
    sink.finish()
    sink.start()
    source.start(lambda block: None)
    time.sleep(seconds)
    source.stop()
    sink.stop()
    captured, cleaned = np.concatenate(echo.captured), np.concatenate(echo.cleaned)
    figures = {
        "erle_db": round(erle_db(captured, cleaned, skip_seconds=SKIP_SECONDS, rate=echo.rate), 1),
        "captured_dbfs": round(10 * float(np.log10(np.mean(captured**2) + 1e-12)), 1),
        "seconds": round(captured.size / echo.rate, 2),
        "pieces": echo.pieces,
        "far_pieces": echo.far_pieces,
        "output_latency_ms": round(echo.output_latency * 1000),
        "input_latency_ms": round(echo.input_latency * 1000),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
