"""The frame step's EAR-TTS code generation (realtime/models/voicechat/codes.py): bit
for bit mlx-vlm's ``generate_codes`` and ``depthsum_embedding``, in a smaller graph."""

from __future__ import annotations

from typing import Any

import pytest

from realtime.models.voicechat.codes import (
    codebooks,
    generate_codes,
    previous_sums,
    remember,
    rounds,
)
from realtime.models.voicechat.keys import SessionKey, drawing_from, drawing_rows
from realtime.models.voicechat.model import VoiceChatModel


def _tts(model: VoiceChatModel) -> Any:
    from realtime.models.voicechat.keys import install_voicechat

    install_voicechat()  # mlx-vlm's draws from the running key, as a session's are
    return model.runtime.model.tts_model.tts_model


def _hidden(tts: Any, rows: int, seed: int) -> Any:
    import mlx.core as mx

    hidden = mx.random.normal((2 * rows, 1, tts.config.hidden_size), key=mx.random.key(seed))
    mx.eval(hidden)
    return hidden


def _same(a: Any, b: Any) -> bool:
    import mlx.core as mx

    return a.dtype == b.dtype and a.shape == b.shape and bool(mx.array_equal(a, b))


def test_the_rounds_are_ear_tts_masking_schedule() -> None:
    # 31 codebooks, 8 iterations, exponent 3 (the VoiceChat TTS's): three empty rounds.
    assert rounds(31, 8, 3.0) == [(0, 1), (1, 1), (2, 3), (5, 4), (9, 22)]
    assert rounds(4, 1, 3.0) == [(0, 4)]
    for quantizers, iterations in [(31, 8), (8, 4), (1, 3), (64, 16)]:
        plan = rounds(quantizers, iterations, 3.0)
        assert sum(count for _, count in plan) == quantizers
        assert [start for start, _ in plan] == [
            sum(c for _, c in plan[:i]) for i in range(len(plan))
        ]


@pytest.mark.parametrize(
    "name", ["demo_model", pytest.param("medium_model", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "no-compile"])
def test_codes_are_mlx_vlms_bit_for_bit(
    request: pytest.FixtureRequest, name: str, rows: int, compiled: bool
) -> None:
    tts = _tts(request.getfixturevalue(name))
    import mlx.core as mx

    if not compiled:
        mx.disable_compile()
        request.addfinalizer(mx.enable_compile)
    for seed in range(3):
        hidden = _hidden(tts, rows, seed)
        theirs_keys = [SessionKey(seed * 10 + r) for r in range(rows)]
        ours_keys = [SessionKey(seed * 10 + r) for r in range(rows)]
        with drawing_rows(theirs_keys):
            expected = tts.generate_codes(hidden)
        with drawing_rows(ours_keys):
            codes, total = generate_codes(tts, hidden)
        assert _same(codes, expected)
        assert _same(total, tts.depthsum_embedding(expected))
        # The keys moved on exactly as far: the next draws agree too.
        for theirs, ours in zip(theirs_keys, ours_keys, strict=True):
            assert _same(theirs.next(), ours.next())


def test_an_odd_batch_is_refused(demo_model: VoiceChatModel) -> None:
    import mlx.core as mx

    tts = _tts(demo_model)
    with pytest.raises(ValueError, match="conditional and unconditional"):
        generate_codes(tts, mx.zeros((3, 1, tts.config.hidden_size)))


def test_previous_sums_are_depthsum_embeddings(demo_model: VoiceChatModel) -> None:
    import mlx.core as mx

    tts = _tts(demo_model)
    config = tts.config
    with drawing_from(SessionKey(7)):
        codes, total = generate_codes(tts, _hidden(tts, 1, 7))
    # Silence tokens that are not all zero, as a real codec's are.
    silence = mx.arange(config.num_quantizers, dtype=mx.int32) % config.codebook_size
    kept, fresh = object(), object()

    class Inner:  # stands for mlx-vlm's streaming session (a weak key)
        pass

    a, b, c = Inner(), Inner(), Inner()
    remember(a, codes, total)
    remember(c, codes, total)
    other = mx.full(codes.shape, 3, dtype=mx.int32)
    # a: its remembered codes; b: none remembered; c: its code changed since (by
    # identity: an equal but different array is summed afresh).
    got = previous_sums(tts, [a, b, c, a], [codes, other, other, None], silence)
    expected = mx.concatenate(
        [
            tts.depthsum_embedding(codes),
            tts.depthsum_embedding(other),
            tts.depthsum_embedding(other),
            tts.depthsum_embedding(mx.broadcast_to(silence[None, None, :], codes.shape)),
        ],
        axis=0,
    )
    assert _same(got, expected)
    assert kept is not fresh
    # One row alone is its own sum (no concatenation).
    assert _same(previous_sums(tts, [a], [None], silence), expected[3:])
    assert codebooks(tts) is codebooks(tts)


@pytest.mark.parametrize(
    "name", ["demo_model", pytest.param("medium_model", marks=pytest.mark.slow)]
)
def test_codec_latents_are_its_quantizers_decode(request: pytest.FixtureRequest, name: str) -> None:
    import mlx.core as mx

    from realtime.models.voicechat.codes import codec_latents

    model = request.getfixturevalue(name)
    prvq = model.runtime.model.tts_model.audio_codec.prvq
    quantizers, size = len(prvq.mus_list), prvq.mus_list[0].shape[0]
    for seed, rows, frames in [(0, 1, 1), (1, 4, 1), (2, 2, 3)]:
        codes = mx.random.randint(0, size, (rows, quantizers, frames), key=mx.random.key(seed))
        assert _same(codec_latents(prvq, codes), prvq.decode(codes))
    # Codebooks of another dtype are the quantizer's own decode.
    bf16 = type("Quantizer", (), {})()
    bf16.mus_list = [m.astype(mx.bfloat16) for m in prvq.mus_list]
    bf16.decode = lambda codes: ("own decode", codes)
    assert codec_latents(bf16, codes)[0] == "own decode"
