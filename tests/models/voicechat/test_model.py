"""The VoiceChat adapter: event mapping, determinism, limits, path checks."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from realtime.limits import PROMPT_CACHE_BYTES
from realtime.models import ModelLoadError, ModelPathError, check_model_path, load_model
from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    FunctionDelta,
    InferenceError,
    ModelEvent,
    SessionInitializationError,
    SessionStopped,
    StepControl,
    UserTranscriptDelta,
    open_session,
)
from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import STEPS_PER_SLICE
from tests.models_fixtures import noise, push_all, run_realtime, speechlike


def _signature(events: list[ModelEvent]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for e in events:
        if isinstance(e, AudioDelta):
            out.append(("audio", e.frame_index, e.audio_codes, e.samples.tobytes()))
        else:
            out.append((type(e).__name__, *(getattr(e, f) for f in e.__slots__)))
    return out


def test_adapter_maps_events(demo_model: VoiceChatModel) -> None:
    assert demo_model.model_id == "realtime-demo-voicechat"
    assert Path(demo_model.path).is_absolute()
    session = open_session(demo_model, system_prompt=None, seed=0, max_streaming_seconds=None)
    events = push_all(session, np.concatenate([noise(30), speechlike(20)])[: 50 * 1280 - 100])
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert len(audio) == 50
    assert [a.frame_index for a in audio] == list(range(50))
    for a in audio:
        assert a.samples.dtype == np.float32 and a.samples.shape == (1764,)
        assert a.sample_rate == 22050
        assert len(a.audio_codes) == 31 and all(type(c) is int for c in a.audio_codes)
    kinds = {type(e) for e in events}
    assert {AssistantTextDelta, UserTranscriptDelta, AudioDelta, Done} <= kinds
    for e in events:
        if isinstance(e, (AssistantTextDelta, FunctionDelta)):
            assert type(e.token_id) is int and e.text.endswith(e.delta)
        if isinstance(e, UserTranscriptDelta):
            assert e.delta and e.delta in e.transcript
    indexes = [e.frame_index for e in events]
    assert indexes == sorted(indexes)
    assert isinstance(events[-1], Done) and events[-1].frame_index == 50
    assert session.flush(True) == []
    assert session.cancel() == []


def test_cancel(demo_model: VoiceChatModel) -> None:
    session = open_session(
        demo_model, system_prompt="Be brief.", seed=1, max_streaming_seconds=None
    )
    session.push_audio(noise(2), 16000)
    assert session.cancel() == [Cancelled(frame_index=2)]
    assert session.cancel() == []
    with pytest.raises(InferenceError):
        session.push_audio(noise(1), 16000)


def test_seed_determinism_across_chunk_sizes(demo_model: VoiceChatModel) -> None:
    samples = np.concatenate([speechlike(12), noise(12)])[: 24 * 1280 - 333]
    runs = []
    for chunk in (1280, 700, 4096, samples.shape[0]):
        session = open_session(demo_model, system_prompt="hi", seed=7, max_streaming_seconds=None)
        runs.append(_signature(push_all(session, samples, chunk)))
    assert all(run == runs[0] for run in runs[1:])
    other = open_session(demo_model, system_prompt="hi", seed=8, max_streaming_seconds=None)
    assert _signature(push_all(other, samples)) != runs[0]


def test_max_streaming_seconds_limit_is_inference_error(demo_model: VoiceChatModel) -> None:
    session = open_session(demo_model, system_prompt=None, seed=0, max_streaming_seconds=0.4)
    for _ in range(5):
        session.push_audio(noise(1), 16000)
    with pytest.raises(InferenceError, match="context limit"):
        session.push_audio(noise(1), 16000)
    with pytest.raises(InferenceError, match="context limit"):
        session.push_audio(noise(1)[:100], 16000)
    assert session.flush(True) == [Done(frame_index=5)]


def test_wrong_sample_rate_is_inference_error(demo_model: VoiceChatModel) -> None:
    session = open_session(demo_model, system_prompt=None, seed=0, max_streaming_seconds=None)
    with pytest.raises(InferenceError, match="16000"):
        session.push_audio(noise(1), 44100)
    events = session.push_audio(noise(1), 16000)  # the session is still usable
    assert any(isinstance(e, AudioDelta) for e in events)
    with pytest.raises(InferenceError):
        session.push_audio(np.zeros((2, 640), dtype=np.float32), 16000)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"max_streaming_seconds": 0.0}, "max_streaming_seconds"),
        ({"max_streaming_seconds": float("nan")}, "max_streaming_seconds"),
    ],
)
def test_open_session_errors(
    demo_model: VoiceChatModel, kwargs: dict[str, object], match: str
) -> None:
    options: dict[str, object] = {"system_prompt": None, "seed": 0, "max_streaming_seconds": None}
    options.update(kwargs)
    with pytest.raises(SessionInitializationError, match=match):
        open_session(demo_model, **options)  # type: ignore[arg-type]


def test_clear_cache(demo_model: VoiceChatModel) -> None:
    demo_model.clear_cache()


# ---------------------------------------------------------------- bad model paths


def _bad_cases(root: Path, demo: Path) -> dict[str, tuple[Path, str]]:
    def copy(name: str) -> Path:
        target = root / name
        shutil.copytree(demo, target)
        return target

    cases: dict[str, tuple[Path, str]] = {}
    cases["missing"] = (root / "nope", "does not exist")
    afile = root / "a-file"
    afile.write_text("x")
    cases["not-a-directory"] = (afile, "not a directory")
    empty = root / "empty"
    empty.mkdir()
    cases["no-config"] = (empty, "no config.json")
    bad_json = copy("bad-json")
    (bad_json / "config.json").write_text("{not json")
    cases["unparseable-config"] = (bad_json, "not valid JSON")
    no_type = copy("no-type")
    (no_type / "config.json").write_text(json.dumps({"text_config": {}}))
    cases["missing-model-type"] = (no_type, "no model_type")
    llama = copy("llama")
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cases["unknown-model-type"] = (llama, "'llama'")
    no_shard = copy("no-shard")
    next(no_shard.glob("model-0000*.safetensors")).unlink()
    cases["missing-shard"] = (no_shard, "missing weight shard")
    truncated = copy("truncated")
    shard = next(truncated.glob("model-0000*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-10])
    cases["truncated-shard"] = (truncated, "truncated")
    no_weights = copy("no-weights")
    for p in no_weights.glob("*.safetensors*"):
        p.unlink()
    cases["no-weights"] = (no_weights, "no weights")
    no_tok = copy("no-tokenizer")
    (no_tok / "tokenizer.json").unlink()
    cases["missing-tokenizer"] = (no_tok, "tokenizer.json")
    return cases


def test_bad_model_path_exits_2(demo_path: Path, demo_cache_dir: Path, tmp_path: Path) -> None:
    wav = tmp_path / "in.wav"
    from realtime.audio import write_wav_pcm16

    write_wav_pcm16(wav, np.zeros(1600, dtype=np.int16), 16000)
    out = tmp_path / "out.wav"
    for name, (path, fragment) in _bad_cases(tmp_path, demo_path).items():
        with pytest.raises(ModelPathError, match=fragment) as info:
            check_model_path(path)
        assert "\n" not in str(info.value), name
        run = run_realtime(
            demo_cache_dir, "generate", "-m", str(path), "--input", str(wav), "--output", str(out)
        )
        assert run.returncode == 2, (name, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in run.stderr, (name, run.stderr)
        assert fragment in lines[0], (name, lines[0])
        assert not out.exists()


def test_load_failure_is_one_line_model_load_error(demo_path: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(demo_path, broken)
    config = json.loads((broken / "config.json").read_text())
    config["text_config"]["hidden_size"] = 96  # weights no longer fit
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as info:
        load_model(broken)
    assert "broken" in str(info.value) and "\n" not in str(info.value)


def test_prefill_runs_in_slices_and_stops_between_them(
    demo_model: VoiceChatModel,
) -> None:
    prompt = "You are a helpful voice assistant. Keep answers short."
    demo_model.set_prompt_cache_bytes(0)  # a cold open, whatever ran on this model before
    try:
        _prefill_in_slices(demo_model, prompt)
    finally:
        demo_model.set_prompt_cache_bytes(PROMPT_CACHE_BYTES)


def _prefill_in_slices(demo_model: VoiceChatModel, prompt: str) -> None:
    beats: list[int] = []
    control = StepControl(beat=lambda: beats.append(1))
    session = open_session(
        demo_model, system_prompt=prompt, seed=0, max_streaming_seconds=None, control=control
    )
    session.cancel()
    # One slice for the seed's voice chain and the language cache, then one slice per
    # STEPS_PER_SLICE prompt tokens, BOS and EOS included (what the limit counts), then
    # one that opens the session.
    tokens = demo_model.count_tokens(prompt)
    assert len(beats) == 2 + -(-tokens // STEPS_PER_SLICE) > 4
    assert demo_model.count_tokens("   ") == 0

    stop = threading.Event()

    def beat() -> None:
        beats.append(1)
        if len(beats) == 3:
            stop.set()

    beats.clear()
    demo_model.set_prompt_cache_bytes(demo_model.prompt_cache_figures().max_bytes)  # emptied
    with pytest.raises(SessionStopped):
        open_session(
            demo_model,
            system_prompt=prompt,
            seed=0,
            max_streaming_seconds=None,
            control=StepControl(stop, beat),
        )
    assert len(beats) == 3  # stopped before the fourth slice


def test_output_samples_are_a_read_only_view_of_a_float32_array_else_converted() -> None:
    import mlx.core as mx

    from realtime.models.voicechat.step import float_samples

    codec = mx.array(np.linspace(-1, 1, 2 * 1764, dtype=np.float32).reshape(1, 2, 1764))
    view = float_samples(codec[0, 1])
    assert view.dtype == np.float32 and view.shape == (1764,) and not view.flags.owndata
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, np.linspace(-1, 1, 2 * 1764, dtype=np.float32)[1764:])
    half = float_samples(mx.array([0.5, -0.25], dtype=mx.float16))
    assert half.dtype == np.float32 and half.tolist() == [0.5, -0.25] and half.flags.writeable
    assert float_samples([0.0, 1.0]).dtype == np.float32
