"""The model's figures: VoiceChat's from its checkpoint, refused when unusable, and code
driven by a fake model with other figures (24 kHz in, 1920-sample frames, 8 codebooks)
that reads them from the model or from ``session.updated``, never assumes VoiceChat's."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import numpy as np
import pytest
import trio
import trio_websocket

from benchmarks.wire import figures_for, frame_messages
from realtime import client as rc
from realtime.audio import prepare_input
from realtime.client import files as fc
from realtime.client.cli import AudioDeltaChecker, FrameFramer
from realtime.demo.checkpoint.config import demo_config
from realtime.launch.offline import generate_command, stream_session, stream_slices
from realtime.models import ModelLoadError, load_model
from realtime.models import base as model_base
from realtime.models.base import VOICECHAT_FIGURES, AudioDelta, ModelFigures, open_session
from realtime.models.voicechat.figures import checkpoint_figures, figures_of
from realtime.models.voicechat.model import VoiceChatModel
from realtime.native import wire as protocol
from realtime.testing.fake import FakeModel, FakeOptions, FakeSession, NullModel, tone
from realtime.wire_audio import InputFramer

OTHER = attrs.evolve(
    VOICECHAT_FIGURES,
    input_sample_rate=24_000,
    output_sample_rate=24_000,
    frame_samples=1920,
    output_frame_samples=1920,
    codebooks=8,
)
"""Another family's figures: 24 kHz both ways, 80 ms frames of 1920 samples, 8 codebooks."""
SHORT = attrs.evolve(OTHER, frame_samples=960, output_frame_samples=960)
"""40 ms frames: the shortest max_streaming_seconds follows."""


# --- the value --------------------------------------------------------------------------


def test_voicechat_figures_and_what_follows_from_them() -> None:
    f = VOICECHAT_FIGURES
    assert (f.input_sample_rate, f.output_sample_rate) == (16_000, 22_050)
    assert (f.frame_samples, f.output_frame_samples, f.codebooks) == (1280, 1764, 31)
    assert f.frame_seconds == pytest.approx(0.08) and f.frame_ms == pytest.approx(80.0)
    assert f.frames_per_second == pytest.approx(12.5)
    assert f.hidden_token_ids == {1, 2, 11, 12} and f.eos_token_id == 2
    # No module constant stands in for them any more: code reads model.figures.
    assert not hasattr(model_base, "FRAME_SAMPLES")
    assert OTHER.frame_seconds == pytest.approx(0.08) and SHORT.frame_seconds == 0.04


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"input_sample_rate": 0}, "input_sample_rate must be an integer >= 1"),
        ({"output_sample_rate": 22050.0}, "output_sample_rate must be an integer"),
        ({"frame_samples": True}, "frame_samples must be an integer"),
        ({"codebooks": -1}, "codebooks must be an integer >= 1"),
        ({"pad_token_id": -1}, "pad_token_id must be an integer >= 0"),
        ({"frame_samples": 1281}, "must last equally long"),
        ({"output_sample_rate": 24_000}, "must last equally long"),
        ({"silence_token_id": 12}, "must differ"),
        ({"eos_token_id": 1}, "must differ"),
        ({"tool_call_start": ()}, "tool_call_start must be a non-empty tuple"),
        ({"tool_call_end": ("",)}, "tool_call_end must hold non-empty strings"),
        ({"tool_call_end": ["</TOOLCALL>"]}, "tool_call_end must be a non-empty tuple"),
        ({"marker_pattern": "(<SPECIAL"}, "not a regular expression"),
        ({"marker_pattern": r"<SPECIAL_\d+>"}, "does not match the tool-call markers"),
    ],
)
def test_unusable_figures_are_refused(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        attrs.evolve(VOICECHAT_FIGURES, **change)


# --- from the checkpoint ---------------------------------------------------------------


def _config(**changes: Any) -> Any:
    """mlx-vlm's ModelConfig of the demo checkpoint's config.json, changed."""
    from mlx_vlm.models.nemotron_voicechat.config import ModelConfig

    config = demo_config(None)
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        target = config
        for part in section.split(".") if section else ():
            target = target[part]
        target[name] = value
    return ModelConfig.from_dict(config)


def test_demo_checkpoint_figures_are_voicechats(
    demo_path: Path, demo_model: VoiceChatModel
) -> None:
    assert demo_model.figures == VOICECHAT_FIGURES
    assert checkpoint_figures(demo_path) == VOICECHAT_FIGURES
    assert figures_for(demo_path) == VOICECHAT_FIGURES
    assert figures_of(demo_model.runtime.model.config) == VOICECHAT_FIGURES


def test_figures_follow_the_config() -> None:
    figures = figures_of(
        _config(
            input_sample_rate=24_000,
            output_sample_rate=24_000,
            **{
                "audio_config.preprocessor.sample_rate": 24_000,
                "codec_config.sample_rate": 24_000,
                "codec_config.downsample_rates": [8, 6, 10],  # x hop 4: 1920 a frame
                "codec_config.num_quantizers": 8,
                "tts_config.num_quantizers": 8,
            },
        )
    )
    assert figures == OTHER


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"codec_config.sample_rate": 24_000}, "the codec speaks 24000 Hz"),
        ({"audio_config.preprocessor.sample_rate": 8000}, "the mel front end expects 8000"),
        ({"tts_config.num_quantizers": 30}, "the codec has 31 codebooks, the TTS 30"),
        ({"frame_duration": 0.1}, "must last equally long"),
        ({"eos_token_id": 12}, "must differ"),
    ],
)
def test_a_config_that_disagrees_with_itself_is_refused(
    changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        figures_of(_config(**changes))


def test_a_checkpoint_with_unusable_figures_does_not_load(demo_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken-voicechat"
    shutil.copytree(demo_path, broken)
    config = json.loads((broken / "config.json").read_text())
    config["codec_config"]["sample_rate"] = 24_000
    (broken / "config.json").write_text(json.dumps(config))
    for load in (checkpoint_figures, load_model):
        with pytest.raises(ModelLoadError, match="broken-voicechat has unusable figures") as caught:
            load(broken)
        assert "\n" not in str(caught.value) and "24000" in str(caught.value)


# --- a fake model with other figures --------------------------------------------------


def test_fake_model_runs_on_its_figures() -> None:
    model = FakeModel(FakeOptions(figures=OTHER))
    assert model.figures == OTHER
    session = open_session(model, system_prompt=None, seed=0, max_streaming_seconds=0.4)
    assert isinstance(session, FakeSession) and session.max_frames == 5
    events = session.push_audio(np.zeros(2 * 1920 + 100, np.float32), 24_000)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert [a.samples.shape for a in audio] == [(1920,), (1920,)]
    assert {a.sample_rate for a in audio} == {24_000} and {len(a.audio_codes) for a in audio} == {8}
    with pytest.raises(model_base.InferenceError, match="expected 24000 Hz PCM"):
        session.push_audio(np.zeros(1920, np.float32), 16_000)
    assert tone(440.0, figures=OTHER)(3, np.zeros(1920, np.float32)).shape == (1920,)
    null = open_session(NullModel(OTHER), system_prompt=None, seed=0, max_streaming_seconds=None)
    frames = [
        e for e in null.push_audio(np.zeros(3840, np.float32), 24_000) if isinstance(e, AudioDelta)
    ]
    assert (
        len(frames) == 2 and frames[0].samples.shape == (1920,) and len(frames[0].audio_codes) == 8
    )


# --- protocol -------------------------------------------------------------------------


def test_session_events_state_the_models_figures() -> None:
    created = protocol.session_created("sess_x", OTHER)["session"]
    assert created["input_audio_format"] == {"type": "pcm16", "sample_rate": 24_000}
    assert created["output_audio_format"] == {"type": "pcm16", "sample_rate": 24_000}
    updated = protocol.session_updated("sess_x", "other", protocol.SessionUpdate(), OTHER)
    session = updated["session"]
    assert session["frame_samples"] == 1920 and session["output_frame_samples"] == 1920
    assert session["input_audio_format"]["sample_rate"] == 24_000
    assert session["output_audio_format"]["sample_rate"] == 24_000


def test_parsing_follows_the_models_figures() -> None:
    audio = protocol.audio_to_base64(np.zeros(4, np.float32))
    append = protocol.parse_client_message(
        json.dumps({"type": "input_audio_buffer.append", "audio": audio}), OTHER
    )
    assert isinstance(append, protocol.AudioAppend) and append.sample_rate == 24_000
    update = json.dumps({"type": "session.update", "session": {"max_streaming_seconds": 0.05}})
    parsed = protocol.parse_client_message(update, SHORT)  # one 40 ms frame is enough
    assert isinstance(parsed, protocol.SessionUpdate) and parsed.max_streaming_seconds == 0.05
    with pytest.raises(protocol.ProtocolError, match=r"between 0\.08 \(one frame\)"):
        protocol.parse_client_message(update)


def test_wire_audio_carries_the_models_codebooks_and_rate() -> None:
    event = AudioDelta(0, np.zeros(1920, np.float32), tuple(range(8)), 24_000)
    wire = protocol.wire_event(event, OTHER)
    assert wire["sample_rate"] == 24_000 and wire["audio_codes"] == list(range(8))
    with pytest.raises(ValueError, match="expected 31"):
        protocol.wire_event(event)


# --- client ---------------------------------------------------------------------------


def _updated_text(figures: ModelFigures) -> str:
    return protocol.serialize(
        protocol.session_updated("sess_x", "other", protocol.SessionUpdate(), figures)
    )


def test_client_takes_the_figures_from_session_updated() -> None:
    conn = rc.RealtimeClient(cast(trio_websocket.WebSocketConnection, None))
    before = (conn.input_sample_rate, conn.output_sample_rate, conn.frame_samples)
    assert before == (16_000, 22_050, 1280) and conn.output_frame_samples == 1764
    updated = rc.parse_event(_updated_text(OTHER))
    assert isinstance(updated, rc.SessionUpdated)
    assert (updated.frame_samples, updated.output_frame_samples) == (1920, 1920)
    assert (updated.input_sample_rate, updated.output_sample_rate) == (24_000, 24_000)
    conn.updated = updated
    assert (conn.input_sample_rate, conn.output_sample_rate) == (24_000, 24_000)
    assert (conn.frame_samples, conn.output_frame_samples) == (1920, 1920)
    assert conn.frame_seconds == pytest.approx(0.08)
    # A server that leaves figures out (an older one): VoiceChat's.
    bare = rc.parse_event(json.dumps({"type": "session.updated", "session": {"id": "s"}}))
    assert isinstance(bare, rc.SessionUpdated) and bare.input_sample_rate is None
    conn.updated = bare
    assert (conn.input_sample_rate, conn.frame_samples, conn.output_frame_samples) == (
        16_000,
        1280,
        1764,
    )
    bad = {"type": "session.updated", "session": {"frame_samples": "1280"}}
    with pytest.raises(rc.ProtocolViolation, match="frame_samples"):
        rc.parse_event(json.dumps(bad))
    assert json.loads(rc.append_message(np.zeros(2, np.int16), 24_000))["sample_rate"] == 24_000


# --- a server on the fake model, the client and the file client -------------------------


@attrs.define
class _Seen:
    appends: list[tuple[int, int]] = attrs.Factory(list)
    """(samples, sample_rate) of each append the server received."""


@asynccontextmanager
async def _serve(model: FakeModel) -> AsyncIterator[tuple[str, _Seen]]:
    """A minimal /v1/realtime on ``model``, its events built by :mod:`realtime.native.wire`
    from the model's figures (the real server's plumbing is not what is tested here)."""
    seen = _Seen()
    figures = model.figures

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()

        async def send(events: list[protocol.Event]) -> None:
            for event in events:
                await ws.send_message(protocol.serialize(event))

        await send([protocol.session_created("sess_x", figures)])
        update = protocol.parse_client_message(await ws.get_message(), figures)
        assert isinstance(update, protocol.SessionUpdate)
        session = open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
        await send([protocol.session_updated("sess_x", model.model_id, update, figures)])
        while True:
            message = protocol.parse_client_message(await ws.get_message(), figures)
            if isinstance(message, protocol.AudioAppend):
                seen.appends.append((message.samples.shape[0], message.sample_rate))
                events = session.push_audio(message.samples, message.sample_rate)
            elif isinstance(message, protocol.AudioCommit):
                await send([protocol.input_audio_committed()])
                events = session.flush(message.pad_partial)
            else:
                continue
            await send([protocol.wire_event(e, figures) for e in events])
            if not isinstance(message, protocol.AudioAppend):
                await ws.aclose()
                return

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
        yield f"ws://127.0.0.1:{server.port}/v1/realtime", seen
        nursery.cancel_scope.cancel()


async def test_client_appends_at_the_servers_rate() -> None:
    async with _serve(FakeModel(FakeOptions(figures=OTHER))) as (url, seen):
        async with rc.connect(url) as conn:
            await conn.configure()
            await conn.append(np.zeros(conn.frame_samples, np.int16))
            await conn.commit()
            events = [e async for e in conn]
    assert seen.appends == [(1920, 24_000)]
    audio = [e for e in events if isinstance(e, rc.AudioDelta)]
    assert len(audio) == 1 and audio[0].pcm().shape == (1920,) and audio[0].sample_rate == 24_000


async def test_file_client_frames_paces_and_checks_by_the_servers_figures() -> None:
    rate = 16_000
    source = fc.InputAudio(np.full(rate // 2, 0.1, np.float32), rate, extra_seconds=0.1)
    sent = prepare_input(source.samples, rate, extra_seconds=0.1, to_rate=24_000).size
    async with _serve(FakeModel(FakeOptions(figures=OTHER))) as (url, seen):
        result = await fc.run_file_client(url, source, realtime=True, printer=None)
    frames = -(-sent // 1920)
    assert [n for n, _ in seen.appends[:-1]] == [1920] * (frames - 1)
    assert {r for _, r in seen.appends} == {24_000}
    assert result.frames == frames and result.pcm.size == frames * 1920
    assert result.sample_rate == 24_000 and result.frame_seconds == pytest.approx(0.08)
    # Bare 16 kHz PCM16 is resampled to the server's rate once it is known.
    async with _serve(FakeModel(FakeOptions(figures=OTHER))) as (url, seen):
        await fc.run_file_client(url, np.zeros(rate, np.int16), printer=None)
    assert sum(n for n, _ in seen.appends) == 24_000


def test_example_helpers_take_the_figures() -> None:
    framer = FrameFramer(1920)
    assert [f.size for f in framer.push(np.zeros(4000, np.int16))] == [1920, 1920]
    assert framer.flush().size == 160
    checker = AudioDeltaChecker(1920, 24_000)
    frame = protocol.wire_event(AudioDelta(0, np.zeros(1920, np.float32), (0,) * 8, 24_000), OTHER)
    event = rc.parse_event(protocol.serialize(frame))
    assert isinstance(event, rc.AudioDelta) and checker.check(event).size == 1920
    with pytest.raises(rc.ClientError, match="expected 1764"):
        AudioDeltaChecker().check(event)


# --- offline, the OpenAI framer, the benchmarks -----------------------------------------


def test_offline_streaming_uses_the_models_figures() -> None:
    model = FakeModel(FakeOptions(figures=OTHER))
    samples = np.zeros(3 * 1920 + 7, np.float32)
    assert [s.size for s in stream_slices(samples, 1920)] == [1920, 1920, 1920, 7]
    session = open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    out = io.StringIO()
    audio, status = stream_session(model, session, samples, out)
    assert status == 0 and [a.size for a in audio] == [1920] * 4
    assert model.calls_named("push") == [1920, 1920, 1920, 7]
    assert "[assistant] t0 " in out.getvalue()


def test_generate_writes_the_models_rate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import soundfile

    import realtime.launch.offline
    import realtime.models

    wav = tmp_path / "in.wav"
    soundfile.write(str(wav), np.full(8000, 0.1, np.float32), 16_000, subtype="PCM_16")
    model = FakeModel(FakeOptions(figures=OTHER))
    monkeypatch.setattr(realtime.launch.offline, "_resolve_model", lambda name: tmp_path)
    monkeypatch.setattr(realtime.models, "load_model", lambda path: model)
    out = tmp_path / "out.wav"
    args = argparse.Namespace(
        input=str(wav),
        output=str(out),
        model="fake",
        stream=True,
        profile=False,
        system_prompt=None,
        seed=0,
        max_seconds=None,
        extra_seconds=0.5,
    )
    assert generate_command(args) == 0
    info = soundfile.info(str(out))
    fed = 12_000 + 12_000  # 0.5 s of input and 0.5 s of silence, at 24 kHz
    assert info.samplerate == 24_000 and info.frames == -(-fed // 1920) * 1920
    assert model.calls_named("push") == [1920] * 12 + [960]  # the server's slices


def test_openai_input_framer_cuts_the_models_frames() -> None:
    framer = InputFramer(24_000, SHORT)
    frames = framer.push(np.zeros(24_000, np.float32))
    assert frames and {f.size for f in frames} == {960} and framer.partial < 960


def test_benchmark_audio_is_cut_by_the_figures() -> None:
    assert figures_for(None) == NullModel().figures == VOICECHAT_FIGURES
    messages = frame_messages(np.zeros(2 * 1920 + 10, np.int16), OTHER)
    decoded = [json.loads(m) for m in messages]
    assert [len(protocol.pcm16_from_base64(m["audio"])) for m in decoded] == [1920, 1920, 10]
    assert {m["sample_rate"] for m in decoded} == {24_000}
