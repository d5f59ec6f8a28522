"""Checks against a real VoiceChat checkpoint; skipped unless one is named.

Set REALTIME_VOICECHAT_MODEL to a local folder holding one of
mlx-community/NemotronLabs-VoiceChat-11B-{bf16,8bit,4bit}. Nothing is downloaded.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from realtime.audio import load_input_wav, pcm16_to_float
from realtime.engine.facade import Engine
from realtime.models import check_model_path, load_model, model_id_for
from realtime.models.base import AudioDelta, Done, open_session
from realtime.models.voicechat.model import VoiceChatModel
from tests.helpers import append_msg, connect, running_server
from tests.models_fixtures import speechlike

ENV = "REALTIME_VOICECHAT_MODEL"
WAV_ENV = "REALTIME_VOICECHAT_WAV"

pytestmark = pytest.mark.real_checkpoint


CHECKS: dict[str, BaseException | None] = {}
"""Outcome of each check run on the engine thread while it loads (MLX streams belong
to that thread, so checks that drive the model directly run there, in the loader)."""


def _load_and_check(folder: str) -> VoiceChatModel:
    model = load_model(folder)
    assert isinstance(model, VoiceChatModel)
    checks: tuple[tuple[str, Callable[[], None]], ...] = (
        ("loads", lambda: _loads(model)),
        ("first_frame", lambda: first_frame_matches_offline(model, speechlike(6))),
    )
    for name, check in checks:
        try:
            check()
            CHECKS[name] = None
        except BaseException as exc:  # reported by the test of that name
            CHECKS[name] = exc
    return model


@pytest.fixture(scope="module")
def real_engine() -> Iterator[Engine]:
    """The real checkpoint, loaded (and checked) on an engine thread."""
    folder = os.environ.get(ENV)
    if not folder:
        pytest.skip(
            f"set {ENV} to a local VoiceChat checkpoint folder to run the real-model checks"
        )
    check_model_path(folder)
    engine = Engine(lambda: _load_and_check(folder))
    assert isinstance(engine.start(), VoiceChatModel)
    yield engine
    engine.shutdown()


def _outcome(name: str) -> None:
    error = CHECKS[name]
    if error is not None:
        raise error


def first_frame_matches_offline(model: VoiceChatModel, samples: np.ndarray) -> None:
    """The first streamed frame equals the offline frame: text id, function id, codes.

    With a system prompt, frame 0 of the audio is past timeline position 0, so both
    paths run the TTS for it (at position 0 the offline path leaves zero codes and
    the streaming path emits the codec's silence codes, by design).
    """
    import mlx.core as mx

    prompt = "You are a helpful assistant."
    session = open_session(model, system_prompt=prompt, seed=0, max_streaming_seconds=None)
    events = session.push_audio(samples[:1280], 16000)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert len(audio) == 1 and audio[0].frame_index == 0
    # mlx-vlm keeps each frame's argmax ids (pad included) on its streaming session.
    inner = session._inner  # type: ignore[attr-defined]
    stream_text, stream_function = inner._text_tokens[-1], inner._function_tokens[-1]
    session.cancel()

    result = model.runtime.generate(mx.array(samples), system_prompt=prompt, seed=0)
    assert int(np.array(result.text_tokens)[0]) == stream_text
    assert int(np.array(result.function_tokens)[0]) == stream_function
    assert tuple(int(c) for c in np.array(result.audio_codes)[0].tolist()) == audio[0].audio_codes


def test_first_frame_comparison_on_demo(demo_model: VoiceChatModel) -> None:
    """The comparison itself, exercised in CI on the demo checkpoint."""
    first_frame_matches_offline(demo_model, speechlike(6))


def _loads(real_model: Any) -> None:
    assert real_model.model_id == model_id_for(os.environ[ENV])
    session = open_session(real_model, system_prompt=None, seed=0, max_streaming_seconds=10.0)
    events = session.push_audio(speechlike(3), 16000) + session.flush(True)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert len(audio) == 3 and all(a.samples.shape == (1764,) for a in audio)
    assert all(len(a.audio_codes) == 31 for a in audio)
    assert isinstance(events[-1], Done)
    real_model.clear_cache()


def test_real_checkpoint_loads(real_engine: Engine) -> None:
    _outcome("loads")


def test_real_first_streamed_frame_equals_offline(real_engine: Engine) -> None:
    _outcome("first_frame")


async def test_real_wav_through_the_socket(real_engine: Engine) -> None:
    """A spoken question through /v1/realtime: transcript, text, audio, done.

    Needs REALTIME_VOICECHAT_WAV too: a WAV (any rate) of someone asking a question.
    """
    wav = os.environ.get(WAV_ENV)
    if not wav:
        pytest.skip(f"set {WAV_ENV} to a WAV of a spoken question to run the socket check")
    pcm = load_input_wav(wav, extra_seconds=4.0)
    async with running_server(real_engine) as server, connect(server.url) as client:
        await client.configure(system_prompt="Be concise and answer in one sentence.")
        for start in range(0, pcm.shape[0], 1280):
            await client.send(append_msg(pcm16_to_float(pcm[start : start + 1280])))
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.recv_until("response.done", timeout=600)
    types = {e["type"] for e in events}
    assert "conversation.item.input_audio_transcription.delta" in types
    assert "response.text.delta" in types
    audio = [e for e in events if e["type"] == "response.audio.delta"]
    indexes = [a["frame_index"] for a in audio]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    assert all(len(base64.b64decode(a["delta"])) == 1764 * 2 for a in audio)
