"""The voice chain: the TTS side of a prefill of any length, rebuilt from one run per
seed, is mlx-vlm's constructor's state bit for bit (buffers, order, zero tails,
counters, code, key), rotated sliding windows included (demo checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import VoiceChain


def cold_state(model: VoiceChatModel, seed: int, steps: int) -> tuple[Any, Any]:
    """mlx-vlm's constructor with a prompt of ``steps`` prefill steps; its session key."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.keys import SessionKey, drawing_from, install_voicechat

    install_voicechat()
    runtime = model.runtime
    words = " ".join(["a"] * (steps - 2))
    assert model.count_tokens(words) == steps
    key = SessionKey(seed)
    with drawing_from(key):
        inner = VoiceChatStreamingSession(runtime, system_prompt=words, seed=seed)
    return inner, key


def bits(a: Any) -> np.ndarray[Any, Any]:
    import mlx.core as mx

    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def assert_equal_state(chain: VoiceChain, inner: Any, key: Any, steps: int) -> None:
    part = chain.voice(steps)
    assert part.timeline_index == inner._timeline_index == steps
    assert list(part.text_tokens) == inner._text_tokens
    assert list(part.function_tokens) == inner._function_tokens
    assert np.array_equal(np.array(part.previous_code), np.array(inner._previous_code))
    assert np.array_equal(np.array(part.key), np.array(key._key))
    assert len(part.tts_cache) == len(inner._tts_cache)
    for ours, theirs in zip(part.tts_cache, inner._tts_cache, strict=True):
        assert type(ours) is type(theirs)
        ours_meta = {k: v for k, v in vars(ours).items() if k not in ("keys", "values")}
        theirs_meta = {k: v for k, v in vars(theirs).items() if k not in ("keys", "values")}
        assert ours_meta == theirs_meta
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            assert a.dtype == b.dtype and a.shape == b.shape
            # Bit for bit, signed zeros and all.
            assert bits(a).tobytes() == bits(b).tobytes()


@pytest.fixture
def small_window(demo_model: VoiceChatModel) -> Iterator[int]:
    """The demo TTS's sliding window cut to 24 entries, so prefills rotate it."""
    config = demo_model.runtime.model.tts_model.tts_model.config
    before = config.sliding_window
    config.sliding_window = 24
    try:
        yield 24
    finally:
        config.sliding_window = before


@pytest.mark.parametrize("window", ["demo", "small"])
def test_a_chain_rebuilds_the_constructors_voice_state_at_any_length(
    demo_model: VoiceChatModel, request: pytest.FixtureRequest, window: str
) -> None:
    """One chain run to the longest length, read back at shorter and equal lengths
    (the small window rotates several times past the warm-up's entries)."""
    if window == "small":
        request.getfixturevalue("small_window")
    chain = VoiceChain(demo_model.runtime, 7)
    lengths = (3, 4, 9, 30, 61)
    chain.extend(max(lengths), most=max(lengths))
    for steps in lengths:
        inner, key = cold_state(demo_model, 7, steps)
        assert_equal_state(chain, inner, key, steps)


def test_a_chain_extended_slice_by_slice_equals_one_run(demo_model: VoiceChatModel) -> None:
    """Four steps a slice, its running cache dropped half way (as when it is stored)
    and rebuilt from its records: still one run."""
    chain = VoiceChain(demo_model.runtime, 2)
    chain.extend(6)
    settled = chain.nbytes
    chain.settle()
    assert chain.nbytes < settled
    while chain.steps < 13:
        chain.extend(13)
    for steps in (6, 13):
        inner, key = cold_state(demo_model, 2, steps)
        assert_equal_state(chain, inner, key, steps)
    with pytest.raises(ValueError):
        chain.voice(14)
