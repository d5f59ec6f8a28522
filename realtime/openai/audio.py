"""Streaming resampling between the OpenAI dialect's 24 kHz PCM16 and the model's rates.

Both directions keep soxr's filter state across chunks (``ResampleStream``), so
a continuous signal stays continuous whatever the chunk sizes: resampling each
chunk on its own would click at every boundary and, for 22.05 → 24 kHz, lose the
fractional sample that keeps a tone's pitch right.
"""

from __future__ import annotations

import base64
from typing import Final

import numpy as np
import soxr

from realtime.audio import float_to_pcm16, pcm16_from_base64, pcm16_to_float
from realtime.models.base import VOICECHAT_FIGURES, ModelFigures, Samples

WIRE_RATE: Final = 24_000
"""The only PCM rate the GA dialect speaks, both ways."""

_QUALITY: Final = "HQ"


class AudioFormatError(ValueError):
    """The client's audio payload is not base64 PCM16."""


def decode_pcm16(data: object) -> Samples:
    """Strict base64 of little-endian PCM16 mono, as float32 in [-1, 1)."""
    try:
        return pcm16_to_float(pcm16_from_base64(data))
    except ValueError as exc:
        raise AudioFormatError(str(exc)) from None


def encode_pcm16(samples: Samples) -> str:
    """float32 as base64 little-endian PCM16 (``round(clip(x) * 32767)``)."""
    return base64.b64encode(float_to_pcm16(samples).astype("<i2").tobytes()).decode("ascii")


class InputFramer:
    """24 kHz client audio → whole model frames at the model's rate (``figures``:
    1280 samples at 16 kHz for VoiceChat).

    Clients send any chunk size (20 ms from a microphone, whole seconds from a
    file); the resampler's state carries across them and the output is regrouped
    so the model always gets whole frames, in order.
    """

    def __init__(self, in_rate: int = WIRE_RATE, figures: ModelFigures = VOICECHAT_FIGURES) -> None:
        self._frame = figures.frame_samples
        self._stream = soxr.ResampleStream(
            in_rate, figures.input_sample_rate, 1, "float32", _QUALITY
        )
        self._pending = np.zeros(0, np.float32)
        self.samples_in = 0
        """Client samples received (at ``in_rate``)."""

    def push(self, samples: Samples) -> list[Samples]:
        """Resample a chunk; return every frame it completes."""
        self.samples_in += int(samples.shape[0])
        out = self._stream.resample_chunk(np.asarray(samples, np.float32))
        if out.shape[0]:
            self._pending = np.concatenate([self._pending, out.astype(np.float32, copy=False)])
        size = self._frame
        n = self._pending.shape[0] // size
        if not n:
            return []
        frames = [self._pending[i * size : (i + 1) * size].copy() for i in range(n)]
        self._pending = self._pending[n * size :]
        return frames

    @property
    def partial(self) -> int:
        """Model-rate samples waiting for the rest of their frame."""
        return int(self._pending.shape[0])

    def drop_partial(self) -> None:
        """Forget the incomplete frame (``input_audio_buffer.clear``)."""
        self._pending = np.zeros(0, np.float32)


class OutputResampler:
    """Model audio (at each frame's own rate: 22.05 kHz from VoiceChat) → 24 kHz, one
    stateful stream for the whole session.

    Every model frame goes through it, spoken or not, so the stream never jumps;
    the dialect decides afterwards which frames reach the client.
    """

    def __init__(self, out_rate: int = WIRE_RATE) -> None:
        self._out_rate = out_rate
        self._in_rate: int | None = None
        self._stream: soxr.ResampleStream | None = None

    def push(self, samples: Samples, sample_rate: int) -> Samples:
        if self._stream is None or sample_rate != self._in_rate:
            self._in_rate = sample_rate
            self._stream = soxr.ResampleStream(sample_rate, self._out_rate, 1, "float32", _QUALITY)
        out = self._stream.resample_chunk(np.asarray(samples, np.float32))
        return np.asarray(out, np.float32)
