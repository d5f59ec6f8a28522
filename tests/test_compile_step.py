"""The frame step's compiled pieces are traced at start, for every batch size the
engine may step (issue 34 item 7), and compiled or not the codes are the same
(tests/test_voicechat_codes.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from realtime.server import engine_for
from realtime.testing.fake import FakeModel


class CompilingModel(FakeModel):
    """The fake model with a compiled step: records what it was asked to trace."""

    def __init__(self) -> None:
        super().__init__()
        self.compiled: list[list[int]] = []

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        self.compiled.append(list(batch_sizes))


@pytest.mark.parametrize(
    ("limits", "batch_frames", "sizes"),
    [(Limits(), None, [1]), (Limits(max_sessions=3), True, [1, 2, 3])],
    ids=["default", "batched"],
)
def test_the_step_is_compiled_at_start_for_each_batch_size(
    limits: Limits, batch_frames: bool | None, sizes: list[int]
) -> None:
    model = CompilingModel()
    engine = engine_for(lambda: model, limits, batch_frames=batch_frames)
    engine.start()
    try:
        assert model.compiled == [sizes]
    finally:
        engine.shutdown()


def test_the_voicechat_model_compiles_its_rounds(demo_model: VoiceChatModel) -> None:
    from realtime.models.voicechat.codes import compiled

    demo_model.compile_step([1, 2])
    tts = demo_model.runtime.model.tts_model.tts_model
    assert len(compiled(tts).rounds) == 5
