"""PCM conversions and WAV input preparation shared by the server, the CLI and clients.

One function prepares every input (``prepare_input``), so that
``realtime generate --stream`` and a WAV sent through ``/v1/realtime`` feed the
model the very same samples and so produce the same bytes.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

import numpy as np
import numpy.typing as npt

from realtime.models.base import VOICECHAT_FIGURES, Samples

PCM16 = npt.NDArray[np.int16]

_ONE = np.float32(1.0)
_MINUS_ONE = np.float32(-1.0)
_PCM_SCALE = np.float32(32767.0)
_INV_32768 = np.float32(1.0 / 32768.0)
"""2**-15: multiplying by it is exact, so it equals dividing by 32768."""


def float_to_pcm16(samples: npt.ArrayLike) -> PCM16:
    """``round(clip(x, -1, 1) * 32767)`` as int16: the wire's float-to-PCM rule.

    The clip is ``minimum(maximum(x, -1), 1)`` (what ``np.clip`` computes, NaN
    included) in place on one scratch array: this runs for every output frame.
    """
    x = np.maximum(np.asarray(samples, dtype=np.float32), _MINUS_ONE)
    np.minimum(x, _ONE, out=x)
    np.multiply(x, _PCM_SCALE, out=x)
    np.rint(x, out=x)
    pcm: PCM16 = x.astype(np.int16)
    return pcm


def base64_bytes(data: object) -> bytes:
    """The bytes of a strict base64 string; ValueError with a one-line reason for
    anything else (not a string, not base64)."""
    if not isinstance(data, str):
        raise ValueError("audio must be a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"audio is not valid base64: {exc}") from None


def pcm16_from_base64(data: object) -> PCM16:
    """Strict base64 of little-endian PCM16 mono, as int16 (a view of the decoded
    bytes). ValueError with a one-line reason for anything else; the protocols turn
    it into their own error."""
    raw = base64_bytes(data)
    if len(raw) % 2:
        raise ValueError(
            f"audio has an odd number of bytes ({len(raw)}); PCM16 needs 2 bytes per sample"
        )
    pcm: PCM16 = np.frombuffer(raw, dtype="<i2")
    return pcm


def pcm16_to_float(pcm: PCM16) -> Samples:
    """int16 / 32768 as float32, so values lie in [-1, 1) (one multiply by 2**-15,
    straight from int16: this runs for every input frame)."""
    samples: Samples = np.multiply(pcm, _INV_32768, dtype=np.float32)
    return samples


def to_mono(samples: npt.ArrayLike) -> Samples:
    """Downmix by averaging channels; accepts (n,) or (n, channels)."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 1:
        return x
    if x.ndim == 2:
        mono: Samples = x.mean(axis=1, dtype=np.float32)
        return mono
    raise ValueError(f"audio must be 1-D or (samples, channels), got shape {x.shape}")


def resample(samples: Samples, from_rate: int, to_rate: int) -> Samples:
    """High-quality resampling with soxr; a no-op when the rates match."""
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} and {to_rate}")
    if from_rate == to_rate:
        return np.asarray(samples, dtype=np.float32)
    import soxr

    out = soxr.resample(np.asarray(samples, dtype=np.float32), from_rate, to_rate, quality="HQ")
    return np.asarray(out, dtype=np.float32)


def prepare_input(
    samples: npt.ArrayLike,
    sample_rate: int,
    *,
    extra_seconds: float = 0.0,
    to_rate: int = VOICECHAT_FIGURES.input_sample_rate,
) -> PCM16:
    """Any-rate mono/stereo audio to the mono PCM16 the model is fed, at ``to_rate``
    (the model's ``figures.input_sample_rate``; VoiceChat's 16 kHz by default).

    Appends ``extra_seconds`` of silence so the model can finish answering
    (it only produces output while it is fed input).
    """
    if extra_seconds < 0:
        raise ValueError(f"extra_seconds must be >= 0, got {extra_seconds}")
    mono = resample(to_mono(samples), sample_rate, to_rate)
    pcm = float_to_pcm16(mono)
    pad = round(extra_seconds * to_rate)
    if pad:
        pcm = np.concatenate([pcm, np.zeros(pad, dtype=np.int16)])
    return pcm


def read_wav(path: str | Path) -> tuple[Samples, int]:
    """Read any WAV (or other libsndfile format) as float32 (n,) or (n, ch)."""
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    return np.asarray(data, dtype=np.float32), int(rate)


def load_input_wav(
    path: str | Path,
    *,
    extra_seconds: float = 0.0,
    to_rate: int = VOICECHAT_FIGURES.input_sample_rate,
) -> PCM16:
    samples, rate = read_wav(path)
    return prepare_input(samples, rate, extra_seconds=extra_seconds, to_rate=to_rate)


def write_wav_pcm16(path: str | Path, pcm: PCM16, sample_rate: int) -> None:
    import soundfile

    soundfile.write(str(path), np.asarray(pcm, dtype=np.int16), sample_rate, subtype="PCM_16")
