"""Weights cast once at load (realtime/models/voicechat/cast.py): each module group cast
alone gives the bits the stored weights give, at B=1 and batched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from realtime.demo.checkpoint import SMALL, write_demo_checkpoint
from realtime.models.base import ModelSession, open_session
from realtime.models.voicechat.cast import CAST_ONCE, cast_once
from realtime.models.voicechat.model import VoiceChatModel, load_voicechat
from tests.engine.test_isolation import Digest, digest
from tests.models_fixtures import noise, push_all, speechlike, step_rows

FRAMES = 14


@pytest.fixture(scope="module")
def stored_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny widths stored as the real upload: 4-bit language model, bfloat16 rest."""
    size = attrs.evolve(SMALL, name="cast-check", weight_dtype="bfloat16")
    return write_demo_checkpoint(tmp_path_factory.mktemp("cast") / "bf16", quantize=4, size=size)


def _audio(seed: int) -> Any:
    return np.concatenate([noise(FRAMES - 4, seed=seed, level=0.5), speechlike(4, seed=seed)])


def _run(model: VoiceChatModel, seed: int) -> Digest:
    session = open_session(model, system_prompt=None, seed=seed, max_streaming_seconds=None)
    return digest(push_all(session, _audio(seed)))


@pytest.fixture(scope="module")
def stored(stored_path: Path) -> VoiceChatModel:
    return load_voicechat(stored_path, cast_weights=False)


@pytest.fixture(scope="module")
def reference(stored: VoiceChatModel) -> dict[int, Digest]:
    return {seed: _run(stored, seed) for seed in (3, 4, 5)}


@pytest.mark.parametrize("prefix", CAST_ONCE)
def test_each_cast_group_gives_the_stored_weights_bits(
    stored_path: Path, reference: dict[int, Digest], prefix: str
) -> None:
    model = load_voicechat(stored_path, cast_weights=False)
    assert cast_once(model.runtime.model, (prefix,)) > 0  # it had bfloat16 to cast
    assert _run(model, 3) == reference[3]


def test_cast_at_load_batched_rows_are_the_stored_weights_solo_runs(
    stored_path: Path, reference: dict[int, Digest]
) -> None:
    """Every group cast (the default load), three rows of different ages as one batch:
    each is its solo run on the weights as stored."""
    model = load_voicechat(stored_path)
    import mlx.core as mx

    assert model.runtime.model.stt_model.lm_head.scales.dtype == mx.float32
    assert model.runtime.model.stt_model.embed_tokens.scales.dtype == mx.bfloat16
    seeds, starts = (3, 4, 5), (0, 2, 5)
    sessions: list[ModelSession | None] = [None, None, None]
    got: list[list[Any]] = [[], [], []]
    audio = [_audio(seed) for seed in seeds]
    for t in range(max(starts) + FRAMES):
        batch = []
        for k, start in enumerate(starts):
            if t == start:
                sessions[k] = open_session(
                    model, system_prompt=None, seed=seeds[k], max_streaming_seconds=None
                )
            session, f = sessions[k], t - start
            if session is not None and 0 <= f < FRAMES:
                batch.append((k, session, audio[k][f * 1280 : (f + 1) * 1280]))
        step_rows(model, batch, got)
    for k, session in enumerate(sessions):
        assert session is not None
        assert digest(got[k] + session.flush(True)) == reference[seeds[k]], f"row {k}"
