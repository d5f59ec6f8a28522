"""The frame step's compiled norms and rotary embeddings (realtime/models/voicechat/fused.py):
each gives the bits of its op-by-op call on the CPU, at every batch size a frame step
feeds it, and a whole conversation is the same with them or without."""

from __future__ import annotations

import io
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from realtime.models.base import open_session
from realtime.models.voicechat.fused import (
    FUSED,
    TRACES,
    FusedRoPE,
    frame_inputs,
    trace,
    unfused,
)
from realtime.models.voicechat.model import VoiceChatModel
from tests.engine.test_isolation import digest
from tests.models_fixtures import noise, push_all, speechlike


def _kernels(x: Any) -> list[str]:
    """The primitives of ``x``'s graph."""
    buffer = io.StringIO()
    mx.export_to_dot(buffer, x)
    return [line.split('"')[1] for line in buffer.getvalue().splitlines() if "label" in line]


def _random_like(inputs: list[Any], seed: int) -> list[Any]:
    keys = mx.random.split(mx.random.key(seed), len(inputs))
    return [3.0 * mx.random.normal(x.shape, key=keys[k]) for k, x in enumerate(inputs)]


def test_the_fused_modules_are_installed_under_the_float32_parts(
    demo_model: VoiceChatModel,
) -> None:
    root = demo_model.runtime.model
    fused = {name for name, m in root.named_modules() if type(m) in FUSED.values()}
    assert any(name.startswith("stt_model.llm.") for name in fused)
    assert any(name.startswith("stt_model.perception.") for name in fused)
    assert any(name.startswith("tts_model.tts_model.backbone.") for name in fused)
    # The bfloat16 parts (character encoder, codec) and the MoG head are left alone.
    assert not any(
        name.startswith(
            (
                "tts_model.audio_codec.",
                "tts_model.tts_model.embed_subword.",
                "tts_model.tts_model.mog_head.",
            )
        )
        for name in fused
    )
    flat: Any = tree_flatten(root.parameters())
    names = [name for name, _ in flat]
    assert len(names) == len(set(names)) and all("." in name for name in names)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_each_fused_piece_gives_its_op_by_op_bits(demo_model: VoiceChatModel, batch: int) -> None:
    calls = frame_inputs(demo_model.runtime.model, batch)
    assert len(calls) >= 5
    for k, (module, zeros) in enumerate(calls):
        rope = isinstance(module, FusedRoPE)
        inputs = _random_like(zeros[:1] if rope else zeros, seed=100 * batch + k)
        # A rotary embedding at several positions, and per row (a batch's offsets).
        rows = zeros[0].shape[0]
        per_row = mx.arange(rows, dtype=mx.int32) * 5 + 2
        offsets = (0, 7, 1234, per_row) if rope else (None,)
        for offset in offsets:
            extra = () if offset is None else (offset,)
            fused = module(*inputs, *extra)
            assert any(op.startswith("Compiled") for op in _kernels(fused)), type(module)
            with unfused():
                plain = module(*inputs, *extra)
            assert len(_kernels(fused)) < len(_kernels(plain)), type(module)
            assert mx.array_equal(fused, plain).item(), (type(module).__name__, offset)


def test_a_prefill_shape_runs_op_by_op(demo_model: VoiceChatModel) -> None:
    module, inputs = frame_inputs(demo_model.runtime.model, 1)[0]
    zeros = inputs[0]
    longer = mx.zeros((1, 5, zeros.shape[-1]))
    assert not any(op.startswith("Compiled") for op in _kernels(module(longer)))


def test_a_conversation_is_the_same_fused_unfused_or_uncompiled(demo_model: VoiceChatModel) -> None:
    trace(demo_model.runtime.model, [1])
    samples = np.concatenate([noise(8, seed=6, level=0.5), speechlike(4, seed=6)])

    def run() -> Any:
        session = open_session(demo_model, system_prompt=None, seed=6, max_streaming_seconds=None)
        return digest(push_all(session, samples))

    fused = run()
    with unfused():
        plain = run()
    mx.disable_compile()  # --no-compile: every compiled function op by op
    try:
        uncompiled = run()
    finally:
        mx.enable_compile()
    assert fused == plain == uncompiled


def test_compile_step_traces_the_fused_pieces(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import realtime.models.voicechat.model as voicechat

    traced: list[list[int]] = []
    monkeypatch.setattr(voicechat, "trace", lambda model, sizes: traced.append(list(sizes)))
    demo_model.compile_step([1, 2, 3])
    assert traced == [[1, 2, 3]]


def test_frame_steps_trace_nothing_after_start(demo_model: VoiceChatModel) -> None:
    """What ``compile_step`` traces is what frame steps meet: B=1 (scalar positions)
    and B=3 (per-row positions), young rows and the first frames included."""
    demo_model.compile_step([1, 2, 3])
    before = sum(TRACES.values())
    sessions = [
        open_session(demo_model, system_prompt=None, seed=seed, max_streaming_seconds=None)
        for seed in (7, 8, 9)
    ]
    audio = [noise(4, seed=seed, level=0.5) for seed in (7, 8, 9)]
    for f in range(4):
        rows = sessions if f >= 2 else sessions[:1]  # B=1, then B=3 with younger rows
        results = demo_model.step(
            [(s, audio[k][f * 1280 : (f + 1) * 1280], 16000) for k, s in enumerate(rows)]
        )
        assert not any(isinstance(r, Exception) for r in results)
    assert sum(TRACES.values()) == before
