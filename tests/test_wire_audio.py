"""The wire's audio formats: G.711 against the standard's reference (stdlib ``audioop``,
while the test environment's Python still has it), the formats' codecs and bounds, and
the streaming resamplers at the phone's 8 kHz."""

from __future__ import annotations

import base64
import warnings
from types import ModuleType

import numpy as np
import pytest

from realtime.wire_audio import (
    PCM16K,
    PCM24,
    PCMA,
    PCMU,
    AudioFormatError,
    InputFramer,
    OutputResampler,
    WireFormat,
    alaw_decode,
    alaw_encode,
    parse_format,
    ulaw_decode,
    ulaw_encode,
)

ALL_PCM = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = np.arange(256, dtype=np.uint8)
DEFAULT_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
OPENAI_FORMATS = (PCM24, PCMU, PCMA)


def _audioop() -> ModuleType:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import audioop
    except ImportError:
        pytest.skip("stdlib audioop is gone (Python 3.13+): the reference G.711 is not here")
    return audioop


def test_ulaw_equals_audioop_for_every_input() -> None:
    audioop = _audioop()
    raw = ALL_PCM.astype("<i2").tobytes()
    expected = np.frombuffer(audioop.lin2ulaw(raw, 2), np.uint8)
    np.testing.assert_array_equal(ulaw_encode(ALL_PCM), expected)
    decoded = np.frombuffer(audioop.ulaw2lin(ALL_CODES.tobytes(), 2), "<i2")
    np.testing.assert_array_equal(ulaw_decode(ALL_CODES), decoded)


def test_alaw_equals_audioop_for_every_input() -> None:
    audioop = _audioop()
    raw = ALL_PCM.astype("<i2").tobytes()
    expected = np.frombuffer(audioop.lin2alaw(raw, 2), np.uint8)
    np.testing.assert_array_equal(alaw_encode(ALL_PCM), expected)
    decoded = np.frombuffer(audioop.alaw2lin(ALL_CODES.tobytes(), 2), "<i2")
    np.testing.assert_array_equal(alaw_decode(ALL_CODES), decoded)


def test_g711_codes_survive_a_round_trip() -> None:
    # A-law has no negative zero: every code decodes to its own value.
    np.testing.assert_array_equal(alaw_encode(alaw_decode(ALL_CODES)), ALL_CODES)
    # μ-law's 0x7F is -0, which encodes back as +0 (0xFF); every other code is its own.
    back = ulaw_encode(ulaw_decode(ALL_CODES))
    np.testing.assert_array_equal(np.delete(back, 0x7F), np.delete(ALL_CODES, 0x7F))
    assert back[0x7F] == 0xFF


def test_g711_encodes_only_int16() -> None:
    with pytest.raises(TypeError, match="int16"):
        ulaw_encode(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="int16"):
        alaw_encode(np.zeros(4, np.int32))


def test_g711_error_stays_within_its_segment() -> None:
    """Companding keeps about 12 bits of relative precision: the decoded value of
    every int16 lies within 1/16 of its magnitude (plus the bottom segment's step)."""
    x = ALL_PCM.astype(np.int64)
    for encode, decode in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        err = np.abs(decode(encode(ALL_PCM)).astype(np.int64) - x)
        assert (err <= np.abs(x) // 16 + 16).all()


@pytest.mark.parametrize("fmt", [PCM24, PCM16K, PCMU, PCMA], ids=lambda f: f.type + str(f.rate))
def test_a_format_round_trips_a_tone(fmt: WireFormat) -> None:
    t = np.arange(fmt.rate // 10) / fmt.rate
    samples = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    data = fmt.encode(samples)
    raw = base64.b64decode(data)
    assert len(raw) == samples.size * fmt.bytes_per_sample
    assert fmt.seconds(len(raw)) == pytest.approx(0.1)
    back = fmt.decode(data)
    assert back.dtype == np.float32 and back.shape == samples.shape
    noise = float(np.mean((back - samples) ** 2))
    snr = 10 * np.log10(float(np.mean(samples**2)) / noise)
    assert snr > (80 if fmt.type == "audio/pcm" else 30)
    if fmt.bytes_per_sample == 1:  # G.711's decoded values lie mid-step: encoded back as they were
        assert fmt.encode(back) == data


def test_decode_scales_as_pcm16_does() -> None:
    """G.711 is expanded to 16-bit and then divided by 32768, as PCM16 is."""
    pcm = ulaw_decode(ALL_CODES)
    assert PCMU.decode(base64.b64encode(ALL_CODES.tobytes()).decode()).tolist() == (
        (pcm.astype(np.float32) / 32768).tolist()
    )
    pcm = alaw_decode(ALL_CODES)
    assert PCMA.decode(base64.b64encode(ALL_CODES.tobytes()).decode()).tolist() == (
        (pcm.astype(np.float32) / 32768).tolist()
    )
    assert PCM24.decode(base64.b64encode(b"\x00\x80\xff\x7f").decode()).tolist() == [
        -1.0,
        32767 / 32768,
    ]


def test_encode_clips_and_rounds_as_the_wire_does() -> None:
    loud = np.array([2.0, -2.0, 0.5, 0.0], np.float32)
    pcm = np.array([32767, -32767, 16384, 0], np.int16)  # round(clip(x) * 32767)
    assert base64.b64decode(PCM24.encode(loud)) == pcm.astype("<i2").tobytes()
    assert base64.b64decode(PCMU.encode(loud)) == ulaw_encode(pcm).tobytes()
    assert base64.b64decode(PCMA.encode(loud)) == alaw_encode(pcm).tobytes()
    assert ulaw_encode(pcm[:2]).tolist() == [0x80, 0x00]  # the loudest codes
    assert alaw_encode(pcm[:2]).tolist() == [0xAA, 0x2A]


@pytest.mark.parametrize("fmt", OPENAI_FORMATS, ids=lambda f: f.type)
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "base64 string"),
        (12, "base64 string"),
        ("not base64!", "not valid base64"),
        ("AAA", "not valid base64"),
    ],
)
def test_bad_payloads_are_one_line_errors(fmt: WireFormat, data: object, reason: str) -> None:
    with pytest.raises(AudioFormatError, match=reason) as info:
        fmt.decode(data)
    assert "\n" not in str(info.value)


def test_odd_bytes_are_refused_only_for_pcm() -> None:
    three = base64.b64encode(b"\x01\x02\x03").decode()
    with pytest.raises(AudioFormatError, match="odd number of bytes"):
        PCM24.decode(three)
    assert PCMU.decode(three).shape == (3,)
    assert PCMA.decode(three).shape == (3,)
    assert PCMU.decode("").shape == (0,)


def test_format_figures() -> None:
    assert PCM24.as_json() == {"type": "audio/pcm", "rate": 24000}
    assert PCMU.as_json() == {"type": "audio/pcmu", "rate": 8000}
    assert (PCM24.bytes_per_sample, PCMU.bytes_per_sample, PCMA.bytes_per_sample) == (2, 1, 1)
    assert PCM24.seconds(48_000) == 1.0 and PCMU.seconds(160) == 0.02
    assert PCM16K.seconds(32_000) == 1.0
    with pytest.raises(ValueError, match="type"):
        WireFormat("audio/opus", 48000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate"):
        WireFormat("audio/pcm", 0)
    with pytest.raises(ValueError, match="rate"):
        WireFormat("audio/pcm", True)


def test_parse_format_finds_the_served_format() -> None:
    def parse(value: object) -> WireFormat | str:
        return parse_format(value, OPENAI_FORMATS, default_rates=DEFAULT_RATES)

    assert parse({"type": "audio/pcmu"}) is PCMU
    assert parse({"type": "audio/pcma", "rate": 8000}) is PCMA
    assert parse({"type": "audio/pcm"}) is PCM24
    assert parse({"type": "audio/pcm", "rate": 24000}) is PCM24
    for bad, why in [
        ({"type": "audio/pcm", "rate": 16000}, "audio/pcm at 16000 Hz is not served"),
        ({"type": "audio/pcmu", "rate": 16000}, "audio/pcmu at 16000 Hz is not served"),
        ({"type": "audio/opus"}, "type 'audio/opus' is not served"),
        ({"type": "g711_ulaw"}, "type 'g711_ulaw' is not served"),
        ({"rate": 8000}, "type None is not served"),
        ({"type": "audio/pcm", "rate": "24000"}, "rate must be an integer"),
        ({"type": "audio/pcm", "rate": True}, "rate must be an integer"),
        ("audio/pcmu", "an audio format is an object"),
        (None, "an audio format is an object"),
    ]:
        message = parse(bad)
        assert isinstance(message, str) and why in message, (bad, message)
        assert "served: {'type': 'audio/pcm', 'rate': 24000}; {'type': 'audio/pcmu'" in message
        assert "\n" not in message
    no_default = parse_format({"type": "audio/pcm"}, [PCM16K], default_rates={})
    assert isinstance(no_default, str) and "needs a rate" in no_default
    assert parse_format({"type": "audio/pcm", "rate": 16000}, [PCM16K, PCM24], default_rates={})
    long = parse({"type": "x" * 500})
    assert isinstance(long, str) and len(long) < 300


def _tone(rate: int, seconds: float, hz: float = 300.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _chunks(samples: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    out, at, i = [], 0, 0
    while at < samples.size:
        out.append(samples[at : at + sizes[i % len(sizes)]])
        at += sizes[i % len(sizes)]
        i += 1
    return out


@pytest.mark.parametrize("sizes", [[160], [8000], [1, 159, 333, 7], [2400]])
def test_the_framer_at_8khz_is_continuous_across_chunk_sizes(sizes: list[int]) -> None:
    signal = _tone(8000, 1.0)
    whole = InputFramer(8000).push(signal)
    framer = InputFramer(8000)
    frames = [f for chunk in _chunks(signal, sizes) for f in framer.push(chunk)]
    assert framer.in_rate == 8000 and framer.samples_in == 8000
    assert len(frames) == len(whole) and {f.size for f in frames} == {1280}
    np.testing.assert_allclose(np.concatenate(frames), np.concatenate(whole), atol=1e-6)
    # 1 s at 8 kHz is 16000 model samples: 12 whole frames, less the filter's delay.
    assert len(frames) * 1280 + framer.partial <= 16_000
    assert len(frames) * 1280 + framer.partial >= 16_000 - 1280
    # The 300 Hz tone arrives at 16 kHz at the same pitch, with no click at boundaries.
    model = np.concatenate(frames)[800:]
    expected_step = 2 * np.pi * 300 / 16_000
    phase = np.unwrap(np.angle(_analytic(model)))
    assert np.median(np.diff(phase)) == pytest.approx(expected_step, rel=1e-3)
    assert np.max(np.abs(np.diff(model))) < 2 * 0.5 * expected_step * 1.05


def _analytic(x: np.ndarray) -> np.ndarray:
    spectrum = np.fft.fft(x)
    h = np.zeros(x.size)
    h[0] = 1
    h[1 : (x.size + 1) // 2] = 2
    if x.size % 2 == 0:
        h[x.size // 2] = 1
    return np.fft.ifft(spectrum * h)


def test_the_framer_drops_its_partial_frame() -> None:
    framer = InputFramer(8000)
    framer.push(_tone(8000, 0.2))
    assert 0 < framer.partial < 1280
    framer.drop_partial()
    assert framer.partial == 0


@pytest.mark.parametrize("out_rate", [8000, 24000])
def test_the_output_resampler_streams_model_frames_to_the_wire_rate(out_rate: int) -> None:
    frame = 1764  # VoiceChat's 80 ms at 22.05 kHz
    signal = _tone(22050, 2.0)[: 25 * frame]
    resampler = OutputResampler(out_rate)
    pieces = [resampler.push(signal[i * frame : (i + 1) * frame], 22050) for i in range(25)]
    out = np.concatenate(pieces)
    assert resampler.out_rate == out_rate
    expected = 25 * frame * out_rate / 22050  # 2 s
    assert expected - out_rate * 0.06 <= out.size <= expected  # less the filter's delay
    once = OutputResampler(out_rate).push(signal, 22050)
    np.testing.assert_allclose(out, once[: out.size], atol=1e-6)
    body = out[out_rate // 10 :]
    step = 2 * np.pi * 300 / out_rate
    assert np.max(np.abs(np.diff(body))) < 0.5 * step * 1.05
