"""Audio on the wire: the formats the OpenAI-compatible endpoints speak, their codecs
(PCM16 and G.711 μ-law / A-law) and the streaming resamplers between a wire rate and
the model's rates.

Every endpoint that carries base64 audio reads and writes it through a
:class:`WireFormat`, so a format means one thing everywhere: its encoding, its rate,
how many bytes a sample takes. G.711 is computed here with numpy tables (Python 3.13
removed ``audioop``); the tables reproduce ``audioop``'s ``lin2ulaw``/``ulaw2lin``/
``lin2alaw``/``alaw2lin`` for every input, which ``tests/test_wire_audio.py`` checks.

The resamplers keep soxr's filter state across chunks (``ResampleStream``), so a
continuous signal stays continuous whatever the chunk sizes: resampling each chunk on
its own would click at every boundary and, for 22.05 → 24 kHz, lose the fractional
sample that keeps a tone's pitch right.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping
from typing import Any, Final, Literal, get_args

import attrs
import numpy as np
import numpy.typing as npt
import soxr

from realtime.audio import (
    PCM16,
    base64_bytes,
    float_to_pcm16,
    pcm16_from_base64,
    pcm16_to_float,
)
from realtime.models.base import VOICECHAT_FIGURES, ModelFigures, Samples

Encoding = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
ENCODINGS: Final[tuple[Encoding, ...]] = get_args(Encoding)

Codes = npt.NDArray[np.uint8]
"""G.711 code words, one byte a sample."""

_QUALITY: Final = "HQ"


class AudioFormatError(ValueError):
    """The client's audio payload is not base64 audio of the session's format (the
    message is one line, for an ``error`` event)."""


# --- G.711 -------------------------------------------------------------------------
# Built once at import from the ITU-T G.711 segment rules, vectorised over every
# input: a 65536-entry encode table indexed by the int16's bit pattern, and a
# 256-entry decode table indexed by the code.

_ULAW_SEG_END: Final = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
"""Top of each μ-law segment, on the 14-bit magnitude plus its bias."""
_ALAW_SEG_END: Final = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
"""Top of each A-law segment, on the 13-bit magnitude."""
_ULAW_BIAS: Final = 0x84


def _all_int16() -> npt.NDArray[np.int64]:
    """Every int16 value, in the order of its bit pattern as uint16 (0, 1, ... -1)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.int16).astype(np.int64)


def _ulaw_encode_table() -> Codes:
    pcm = _all_int16() >> 2  # the 14-bit sample
    negative = pcm < 0
    magnitude = np.where(negative, -pcm, pcm) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, magnitude, side="left")
    code = (np.minimum(seg, 7) << 4) | ((magnitude >> (np.minimum(seg, 7) + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    mask = np.where(negative, 0x7F, 0xFF)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode_table() -> PCM16:
    u = ~np.arange(256, dtype=np.int64) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _alaw_encode_table() -> Codes:
    pcm = _all_int16() >> 3  # the 13-bit sample
    negative = pcm < 0
    magnitude = np.where(negative, -pcm - 1, pcm)
    seg = np.searchsorted(_ALAW_SEG_END, magnitude, side="left")
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    code = (np.minimum(seg, 7) << 4) | ((magnitude >> shift) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    mask = np.where(negative, 0x55, 0xD5)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode_table() -> PCM16:
    a = np.arange(256, dtype=np.int64) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENCODE: Final = _ulaw_encode_table()
_ULAW_DECODE: Final = _ulaw_decode_table()
_ALAW_ENCODE: Final = _alaw_encode_table()
_ALAW_DECODE: Final = _alaw_decode_table()


def _as_int16(pcm: npt.ArrayLike) -> PCM16:
    array = np.asarray(pcm)
    if array.dtype != np.int16:
        raise TypeError(f"G.711 encodes int16 samples, got {array.dtype}")
    return array


def ulaw_encode(pcm: npt.ArrayLike) -> Codes:
    """int16 samples → G.711 μ-law codes (as ``audioop.lin2ulaw(pcm, 2)``)."""
    codes: Codes = _ULAW_ENCODE[_as_int16(pcm).view(np.uint16)]
    return codes


def ulaw_decode(codes: npt.ArrayLike) -> PCM16:
    """G.711 μ-law codes → int16 samples (as ``audioop.ulaw2lin(codes, 2)``)."""
    pcm: PCM16 = _ULAW_DECODE[np.asarray(codes, dtype=np.uint8)]
    return pcm


def alaw_encode(pcm: npt.ArrayLike) -> Codes:
    """int16 samples → G.711 A-law codes (as ``audioop.lin2alaw(pcm, 2)``)."""
    codes: Codes = _ALAW_ENCODE[_as_int16(pcm).view(np.uint16)]
    return codes


def alaw_decode(codes: npt.ArrayLike) -> PCM16:
    """G.711 A-law codes → int16 samples (as ``audioop.alaw2lin(codes, 2)``)."""
    pcm: PCM16 = _ALAW_DECODE[np.asarray(codes, dtype=np.uint8)]
    return pcm


# --- formats -----------------------------------------------------------------------


def _encoding(_: Any, attribute: attrs.Attribute[str], value: Any) -> None:
    if value not in ENCODINGS:
        raise ValueError(f"{attribute.name} must be one of {', '.join(ENCODINGS)}, got {value!r}")


def _rate(_: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen(slots=True)
class WireFormat:
    """One audio format of the wire: base64 of mono ``type`` samples at ``rate`` Hz."""

    type: Encoding = attrs.field(validator=_encoding)
    rate: int = attrs.field(validator=_rate)

    @property
    def bytes_per_sample(self) -> int:
        """2 for PCM16, 1 for G.711."""
        return 2 if self.type == "audio/pcm" else 1

    def decode(self, data: object) -> Samples:
        """Strict base64 of this format's audio → float32 mono at ``self.rate`` in
        [-1, 1) (G.711 expanded to 16-bit first, then /32768, as PCM16 is)."""
        try:
            if self.type == "audio/pcm":
                return pcm16_to_float(pcm16_from_base64(data))
            codes = np.frombuffer(base64_bytes(data), dtype=np.uint8)
        except ValueError as exc:
            raise AudioFormatError(str(exc)) from None
        decode = ulaw_decode if self.type == "audio/pcmu" else alaw_decode
        return pcm16_to_float(decode(codes))

    def encode(self, samples: Samples) -> str:
        """float32 at ``self.rate`` → base64 of this format (``float_to_pcm16``'s
        rule, then G.711-compressed for ``audio/pcmu`` and ``audio/pcma``)."""
        pcm = float_to_pcm16(samples)
        if self.type == "audio/pcm":
            raw = pcm.astype("<i2").tobytes()
        elif self.type == "audio/pcmu":
            raw = ulaw_encode(pcm).tobytes()
        else:
            raw = alaw_encode(pcm).tobytes()
        return base64.b64encode(raw).decode("ascii")

    def as_json(self) -> dict[str, Any]:
        """The format as OpenAI's session objects spell it."""
        return {"type": self.type, "rate": self.rate}

    def seconds(self, nbytes: int) -> float:
        """How much audio ``nbytes`` of raw (decoded) payload hold."""
        return nbytes / (self.bytes_per_sample * self.rate)


PCM24: Final = WireFormat("audio/pcm", 24_000)
PCM16K: Final = WireFormat("audio/pcm", 16_000)
PCMU: Final = WireFormat("audio/pcmu", 8_000)
PCMA: Final = WireFormat("audio/pcma", 8_000)


def parse_format(
    value: object, allowed: Collection[WireFormat], *, default_rates: Mapping[str, int]
) -> WireFormat | str:
    """An OpenAI-style format object (``{"type": ..., "rate": ...}``; ``rate`` may be
    left out, ``default_rates`` gives it per type) → the :class:`WireFormat` among
    ``allowed``, or a one-line message that says what is served."""
    served = "; ".join(
        f"{{'type': '{f.type}', 'rate': {f.rate}}}"
        for f in sorted(allowed, key=lambda f: (ENCODINGS.index(f.type), -f.rate))
    )

    def refused(why: str) -> str:
        return f"{why}; served: {served}"

    if not isinstance(value, dict):
        return refused(f"an audio format is an object, got {_short(value)}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in ENCODINGS:
        return refused(f"audio format type {_short(kind)} is not served")
    rate = value.get("rate", default_rates.get(kind))
    if rate is None:
        return refused(f"audio format {kind} needs a rate")
    if isinstance(rate, bool) or not isinstance(rate, int):
        return refused(f"audio format rate must be an integer, got {_short(rate)}")
    for fmt in allowed:
        if fmt.type == kind and fmt.rate == rate:
            return fmt
    return refused(f"{kind} at {rate} Hz is not served")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- streaming resamplers ----------------------------------------------------------


class InputFramer:
    """Client audio at ``in_rate`` → whole model frames at the model's rate
    (``figures``: 1280 samples at 16 kHz for VoiceChat).

    Clients send any chunk size (20 ms from a phone or a microphone, whole seconds
    from a file); the resampler's state carries across them and the output is
    regrouped so the model always gets whole frames, in order.
    """

    def __init__(self, in_rate: int = 24_000, figures: ModelFigures = VOICECHAT_FIGURES) -> None:
        self.in_rate = in_rate
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
    """Model audio (at each frame's own rate: 22.05 kHz from VoiceChat) → ``out_rate``,
    one stateful stream for the whole session.

    Every model frame goes through it, spoken or not, so the stream never jumps;
    the dialect decides afterwards which frames reach the client.
    """

    def __init__(self, out_rate: int = 24_000) -> None:
        self.out_rate = out_rate
        self._in_rate: int | None = None
        self._stream: soxr.ResampleStream | None = None

    def push(self, samples: Samples, sample_rate: int) -> Samples:
        if self._stream is None or sample_rate != self._in_rate:
            self._in_rate = sample_rate
            self._stream = soxr.ResampleStream(sample_rate, self.out_rate, 1, "float32", _QUALITY)
        out = self._stream.resample_chunk(np.asarray(samples, np.float32))
        return np.asarray(out, np.float32)
