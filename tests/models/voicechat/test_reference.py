"""The reference session (realtime/models/voicechat/reference.py): a session opened with
``profile=True`` runs mlx-vlm's own streaming step, with its per-stage timings, as a class
of its own; what it says is what mlx-vlm says, and what the project's own step says."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.models.base import (
    ContextLimitReached,
    Done,
    InferenceError,
    ModelSession,
    TakesToolResults,
    open_now,
    open_session,
)
from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.reference import ReferenceSession
from realtime.models.voicechat.session import VoiceChatSession
from tests.engine.test_isolation import digest
from tests.models.voicechat.test_step import mlx_vlm_digest
from tests.models_fixtures import noise, push_all, speechlike


def _reference(
    model: VoiceChatModel, seed: int, prompt: str | None, seconds: float | None = None
) -> ReferenceSession:
    opening = model.begin_session(
        system_prompt=prompt, seed=seed, max_streaming_seconds=seconds, profile=True
    )
    session = open_now(opening)
    assert isinstance(session, ReferenceSession)
    return session


def _audio(frames: int) -> np.ndarray:
    return np.concatenate([noise(frames - 4, seed=3, level=0.5), speechlike(4)])


def test_a_profiled_session_is_mlx_vlms_own_step_and_the_projects(
    demo_model: VoiceChatModel,
) -> None:
    x = _audio(8)
    reference = _reference(demo_model, 4, "Be brief.")
    assert not isinstance(reference, VoiceChatSession)
    theirs = digest(push_all(reference, x, 1000))
    assert theirs == mlx_vlm_digest(demo_model, 4, "Be brief.", x, 1000)
    ours: ModelSession = open_session(
        demo_model, system_prompt="Be brief.", seed=4, max_streaming_seconds=None
    )
    assert isinstance(ours, VoiceChatSession)
    assert digest(push_all(ours, x, 1000)) == theirs
    summary = reference.profile_summary(drop_first=1)
    assert summary["frames"] == 7
    assert isinstance(summary["stages"], dict) and summary["stages"]


def test_the_model_steps_a_reference_session_on_its_own(demo_model: VoiceChatModel) -> None:
    frame = _audio(5)[:1280]
    alone = _reference(demo_model, 2, None).push_audio(frame, 16000)
    stepped = demo_model.step([(_reference(demo_model, 2, None), frame, 16000)])
    assert len(stepped) == 1 and not isinstance(stepped[0], Exception)
    assert digest(stepped[0]) == digest(alone)


def test_a_reference_session_takes_no_tool_results(demo_model: VoiceChatModel) -> None:
    assert not isinstance(_reference(demo_model, 1, None), TakesToolResults)


def test_bad_input_and_the_context_limit_are_the_sessions_own(
    demo_model: VoiceChatModel,
) -> None:
    session = _reference(demo_model, 3, None, seconds=0.16)
    with pytest.raises(InferenceError, match="mono 1-D"):
        session.push_audio(np.zeros((2, 1280), np.float32), 16000)
    with pytest.raises(InferenceError):
        session.push_audio(np.zeros(1280, np.float32), 24000)
    x = _audio(5)
    session.push_audio(x[:2560], 16000)
    with pytest.raises(ContextLimitReached):
        session.push_audio(x[2560:3840], 16000)
    with pytest.raises(ContextLimitReached):  # every later push says so too
        session.push_audio(x[2560:3840], 16000)
    assert isinstance(session.flush(pad_partial=True)[-1], Done)
    assert session.flush(pad_partial=True) == []
