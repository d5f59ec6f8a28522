"""Checks against a real VoiceChat checkpoint; skipped unless one is named.

Set REALTIME_VOICECHAT_MODEL to a local folder holding one of
mlx-community/NemotronLabs-VoiceChat-11B-{bf16,8bit,4bit}. Nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from realtime.models import check_model_path, load_model, model_id_for
from realtime.models.base import AudioDelta, Done
from realtime.models.voicechat import VoiceChatModel
from tests.models_fixtures import speechlike

ENV = "REALTIME_VOICECHAT_MODEL"

pytestmark = pytest.mark.real_checkpoint


@pytest.fixture(scope="module")
def real_model() -> VoiceChatModel:
    folder = os.environ.get(ENV)
    if not folder:
        pytest.skip(
            f"set {ENV} to a local VoiceChat checkpoint folder to run the real-model checks"
        )
    check_model_path(folder)
    model = load_model(folder)
    assert isinstance(model, VoiceChatModel)
    return model


def first_frame_matches_offline(model: VoiceChatModel, samples: np.ndarray) -> None:
    """The first streamed frame equals the offline frame: text id, function id, codes.

    With a system prompt, frame 0 of the audio is past timeline position 0, so both
    paths run the TTS for it (at position 0 the offline path leaves zero codes and
    the streaming path emits the codec's silence codes, by design).
    """
    import mlx.core as mx

    prompt = "You are a helpful assistant."
    session = model.open_session(system_prompt=prompt, seed=0, max_streaming_seconds=None)
    events = session.push_audio(samples[:1280], 16000)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert len(audio) == 1 and audio[0].frame_index == 0
    # mlx-vlm keeps each frame's argmax ids (pad included) on its streaming session.
    inner = session._inner
    stream_text, stream_function = inner._text_tokens[-1], inner._function_tokens[-1]
    session.cancel()

    result = model.runtime.generate(mx.array(samples), system_prompt=prompt, seed=0)
    assert int(np.array(result.text_tokens)[0]) == stream_text
    assert int(np.array(result.function_tokens)[0]) == stream_function
    assert tuple(int(c) for c in np.array(result.audio_codes)[0].tolist()) == audio[0].audio_codes


def test_first_frame_comparison_on_demo(demo_model: VoiceChatModel) -> None:
    """The comparison itself, exercised in CI on the demo checkpoint."""
    first_frame_matches_offline(demo_model, speechlike(6))


def test_real_checkpoint_loads(real_model: VoiceChatModel) -> None:
    assert real_model.model_id == model_id_for(os.environ[ENV])
    session = real_model.open_session(system_prompt=None, seed=0, max_streaming_seconds=10.0)
    events = session.push_audio(speechlike(3), 16000) + session.flush(True)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert len(audio) == 3 and all(a.samples.shape == (1764,) for a in audio)
    assert all(len(a.audio_codes) == 31 for a in audio)
    assert isinstance(events[-1], Done)
    real_model.clear_cache()


def test_real_first_streamed_frame_equals_offline(real_model: VoiceChatModel) -> None:
    first_frame_matches_offline(real_model, speechlike(6))
