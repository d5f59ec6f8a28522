"""The GA dialect's audio formats on the pure state machine: 24 kHz PCM16 and 8 kHz
G.711 (``audio/pcmu``, ``audio/pcma``), chosen for input and output independently,
and what a change of format in the middle of a session does."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from realtime.limits import Limits
from realtime.openai import session as sess
from realtime.openai.dialect import Dialect, Output
from realtime.session.work import RunAudio
from realtime.wire_audio import PCM24, PCMA, PCMU, WireFormat, alaw_decode, ulaw_decode
from tests.openai.test_dialect import (
    TONE,
    Model,
    dialect,
    events,
    pad,
    peak_hz,
    run,
    send,
    types,
)

G711 = {"audio/pcmu": ulaw_decode, "audio/pcma": alaw_decode}


def update(d: Dialect, **audio: Any) -> list[dict[str, Any]]:
    return events(
        send(d, {"type": "session.update", "session": {"type": "realtime", "audio": audio}})
    )


def tone_in(fmt: WireFormat, seconds: float, hz: float = TONE) -> np.ndarray[Any, Any]:
    t = np.arange(int(seconds * fmt.rate)) / fmt.rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def append(fmt: WireFormat, samples: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": fmt.encode(samples)}


def open_model(d: Dialect) -> None:
    """The model opened (an empty append asks for it): frames go on at once, not held
    as they are while it opens."""
    send(d, {"type": "input_audio_buffer.append", "audio": ""})
    d.opened(None, now=0.0)


def frames_of(outputs: list[Output]) -> list[RunAudio]:
    return [o for o in outputs if isinstance(o, RunAudio)]


def wire_pcm(delta: str, fmt: WireFormat) -> np.ndarray[Any, Any]:
    raw = base64.b64decode(delta)
    if fmt.type == "audio/pcm":
        return np.frombuffer(raw, "<i2")
    return G711[fmt.type](np.frombuffer(raw, np.uint8))


def audio_deltas(outputs: list[Output]) -> list[str]:
    return [e["delta"] for e in events(outputs) if e["type"] == "response.output_audio.delta"]


# --- the session ---------------------------------------------------------------------------


def test_g711_is_served_both_ways_and_echoed_as_the_ga_types_spell_it() -> None:
    d = dialect()
    (updated,) = update(
        d, input={"format": {"type": "audio/pcmu"}}, output={"format": {"type": "audio/pcma"}}
    )
    audio = updated["session"]["audio"]
    # AudioPCMU / AudioPCMA declare no rate (8 kHz is implied); validate_ga refuses extras.
    assert audio["input"]["format"] == {"type": "audio/pcmu"}
    assert audio["output"]["format"] == {"type": "audio/pcma"}
    assert (d.input_format, d.output_format) == (PCMU, PCMA)
    assert sess.audio_format(d.session, "input") is PCMU
    # A rate of 8000 may be spelled out; each side changes alone.
    (updated,) = update(d, output={"format": {"type": "audio/pcmu", "rate": 8000}})
    assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    (updated,) = update(d, input={"format": {"type": "audio/pcm"}})
    assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert (d.input_format, d.output_format) == (PCM24, PCMU)


@pytest.mark.parametrize(
    ("fmt", "why"),
    [
        ({"type": "audio/pcmu", "rate": 16000}, "audio/pcmu at 16000 Hz is not served"),
        ({"type": "audio/pcm", "rate": 8000}, "audio/pcm at 8000 Hz is not served"),
        ({"type": "g711_ulaw"}, "type 'g711_ulaw' is not served"),
        ("audio/pcmu", "an audio format is an object"),
    ],
)
def test_an_unserved_format_is_refused_and_nothing_changes(fmt: object, why: str) -> None:
    d = dialect()
    update(d, input={"format": {"type": "audio/pcma"}})
    for side in ("input", "output"):
        (error,) = update(d, **{side: {"format": fmt}})
        assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
        assert error["error"]["param"] == f"session.audio.{side}.format"
        message = error["error"]["message"]
        assert why in message and "served: {'type': 'audio/pcm', 'rate': 24000}" in message
    assert d.input_format is PCMA and d.output_format is PCM24


# --- input -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [PCMU, PCMA], ids=lambda f: f.type)
def test_g711_input_in_20ms_frames_reaches_the_model_as_16khz_frames(fmt: WireFormat) -> None:
    d = dialect()
    update(d, input={"format": {"type": fmt.type}})
    open_model(d)
    signal = tone_in(fmt, 2.0)
    frames: list[RunAudio] = []
    for i in range(0, signal.size, 160):  # a phone's 20 ms: 160 bytes of G.711
        message = append(fmt, signal[i : i + 160])
        assert len(base64.b64decode(message["audio"])) == 160
        frames += frames_of(send(d, message))
    assert all(f.samples.shape == (1280,) and f.sample_rate == 16000 for f in frames)
    # 2 s at 16 kHz is 25 frames; the resampler holds back a few ms.
    assert len(frames) == 24
    heard = np.concatenate([f.samples for f in frames])
    assert abs(peak_hz(heard[2000:], 16000) - TONE) < 5
    assert 0.2 < float(np.max(np.abs(heard[2000:]))) < 0.35  # G.711 keeps the level


def test_a_bad_g711_payload_is_refused_naming_the_format() -> None:
    d = dialect()
    update(d, input={"format": {"type": "audio/pcmu"}})
    (error,) = events(send(d, {"type": "input_audio_buffer.append", "audio": "not base64!"}))
    assert error["error"]["param"] == "audio"
    assert "not valid base64" in error["error"]["message"]
    assert "audio/pcmu" in error["error"]["message"]
    # An odd number of bytes is fine in G.711 (one byte a sample).
    assert types(send(d, {"type": "input_audio_buffer.append", "audio": "AAAA"})) == []
    (error,) = events(send(d, {"type": "input_audio_buffer.append", "sample_rate": 8000}))
    assert "here audio is audio/pcmu at 8000 Hz" in error["error"]["message"]


@pytest.mark.parametrize("fmt", [PCM24, PCMU], ids=lambda f: f.type)
def test_an_append_is_bounded_in_seconds_whatever_its_format(fmt: WireFormat) -> None:
    d = Dialect("sess_test", "scripted", Limits(max_pending_audio_seconds=1.0), now=0.0)
    update(d, input={"format": {"type": fmt.type}})
    open_model(d)
    (error,) = events(send(d, append(fmt, tone_in(fmt, 1.5))))
    assert error["error"]["code"] == "input_audio_buffer_full"
    assert "this append of 1.50 s is larger than the 1 s limit" in error["error"]["message"]
    assert frames_of(send(d, append(fmt, tone_in(fmt, 0.9)))) != []


def test_a_new_input_rate_rebuilds_the_framer_and_drops_the_partial_frame() -> None:
    d = dialect()
    open_model(d)
    sent = frames_of(send(d, append(PCM24, tone_in(PCM24, 0.5))))
    assert d._framer.partial > 0  # part of a frame waits for the rest
    update(d, input={"format": {"type": "audio/pcmu"}})
    assert d._framer.partial == 0 and d._framer.in_rate == 8000
    # Later appends are read as μ-law at 8 kHz and keep the frames whole.
    after = frames_of(send(d, append(PCMU, tone_in(PCMU, 1.0))))
    assert after and all(f.samples.shape == (1280,) for f in after)
    heard = np.concatenate([f.samples for f in after])
    assert abs(peak_hz(heard[2000:], 16000) - TONE) < 10
    assert len(sent) + len(after) <= 18  # 1.5 s is under 19 frames: nothing counted twice


def test_a_new_encoding_at_the_same_rate_keeps_the_stream() -> None:
    d = dialect()
    update(d, input={"format": {"type": "audio/pcmu"}})
    open_model(d)
    signal = tone_in(PCMU, 1.0)
    frames = frames_of(send(d, append(PCMU, signal[:4000])))
    partial, framer = d._framer.partial, d._framer
    update(d, input={"format": {"type": "audio/pcma"}})
    assert d._framer is framer and d._framer.partial == partial
    frames += frames_of(send(d, append(PCMA, signal[4000:])))
    whole = Dialect("sess_b", "scripted", Limits(), now=0.0)
    update(whole, input={"format": {"type": "audio/pcmu"}})
    open_model(whole)
    reference = frames_of(send(whole, append(PCMU, signal)))
    assert len(frames) == len(reference)
    # Continuous across the switch: only the two laws' quantisation differs.
    diff = np.concatenate([f.samples for f in frames]) - np.concatenate(
        [f.samples for f in reference]
    )
    assert float(np.max(np.abs(diff))) < 0.02


# --- output ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [PCMU, PCMA], ids=lambda f: f.type)
def test_g711_output_is_8khz_and_keeps_the_tone(fmt: WireFormat) -> None:
    d, m = dialect(), Model()
    update(d, output={"format": {"type": fmt.type}})
    out = run(d, m, *({"text": "a"} for _ in range(30)))
    deltas = audio_deltas(out)
    assert len(deltas) == 30
    sizes = [len(base64.b64decode(x)) for x in deltas]
    # 1764 samples at 22.05 kHz are 640 at 8 kHz: one byte each.
    assert sum(sizes) <= 30 * 640 and sum(sizes) > 30 * 640 - 400
    pcm = np.concatenate([wire_pcm(x, fmt) for x in deltas]).astype(np.float64)
    assert abs(peak_hz(pcm[800:], 8000) - TONE) < 5
    created = next(e for e in events(out) if e["type"] == "response.created")
    assert created["response"]["audio"]["output"]["format"] == {"type": fmt.type}


def test_a_new_output_format_applies_from_the_next_frame() -> None:
    d, m = dialect(), Model()
    first = audio_deltas(run(d, m, *({"text": "a"} for _ in range(10))))
    update(d, output={"format": {"type": "audio/pcmu"}})
    assert d._resampler.out_rate == 8000
    out = run(d, m, *({"text": "b"} for _ in range(10)), {"end": True}, *pad(3))
    later = audio_deltas(out)
    assert len(first) == 10 and len(later) >= 10
    # 24 kHz PCM16 before (about 3840 bytes a frame), μ-law at 8 kHz after (640 a
    # frame on average; soxr hands its output on in blocks).
    assert all(len(base64.b64decode(x)) > 3000 for x in first[2:])
    sizes = [len(base64.b64decode(x)) for x in later]
    assert max(sizes) <= 2 * 640 and len(later) * 640 - 1000 < sum(sizes) <= len(later) * 640
    pcm = np.concatenate([wire_pcm(x, PCMU) for x in later]).astype(np.float64)
    assert abs(peak_hz(pcm[800:], 8000) - TONE) < 10
    done = next(e for e in events(out) if e["type"] == "response.done")
    assert done["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
