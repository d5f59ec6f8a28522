"""The frame step's compiled pieces are traced at start, for every batch size the
engine may step, and compiled or not the codes are the same
(tests/models/voicechat/test_codes.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from realtime.engine.first_start import compile_note, compile_off, kernel_cache
from realtime.launch.server import engine_for
from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from realtime.testing.fake import FakeModel


class CompilingModel(FakeModel):
    """The fake model with a compiled step: records what it was asked to trace."""

    def __init__(self, logged: list[logging.LogRecord] | None = None) -> None:
        super().__init__()
        self.compiled: list[list[int]] = []
        self.logged = logged
        self.logged_before: list[str] = []
        """What the engine had logged when it asked for the compile."""

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        self.compiled.append(list(batch_sizes))
        if self.logged is not None:
            self.logged_before = [record.getMessage() for record in self.logged]


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
    # Where the start's log line says MLX's CPU backend keeps the kernels it built.
    assert any(path.suffix == ".so" for path in kernel_cache().iterdir())


def test_the_engine_says_what_the_first_start_does_before_it_compiles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first start on a machine waited 25 s with nothing printed."""
    caplog.set_level(logging.INFO, logger="realtime.engine.thread")
    model = CompilingModel(caplog.records)
    engine = engine_for(lambda: model, Limits(max_sessions=2), batch_frames=True)
    engine.start()
    engine.shutdown()
    (note,) = [m for m in model.logged_before if m.startswith("compiling the model step")]
    assert note.startswith("compiling the model step for 2 batch size(s)")
    assert "--no-compile" in note or "reusing" in note
    assert str(kernel_cache()) in note
    assert not any(m.startswith("compiled the model step") for m in model.logged_before)
    assert any(r.getMessage().startswith("compiled the model step") for r in caplog.records)


def test_the_first_start_note_says_how_long_and_where(tmp_path: Path) -> None:
    cache = tmp_path / "mlx" / "0.32.4" / "cpu"
    first = compile_note(1, cache)
    assert "first start" in first and "about 25 s" in first and "--no-compile" in first
    assert f"caches them in {cache}" in first
    cache.mkdir(parents=True)
    (cache / "libCf4IBroadcast_contiguous.so").write_bytes(b"")
    (cache / "Cf4IBroadcast_contiguous.cpp").write_text("")
    assert f"reusing the 1 kernel(s) MLX's CPU backend cached in {cache}" in compile_note(1, cache)
    assert compile_note(3, cache, gpu=True) == (
        "compiling the model step for 3 batch size(s) on the GPU (--no-compile skips it)"
    )
    assert kernel_cache({"TMP": "/scratch", "TEMP": "/no"}, "1.2") == Path("/scratch/mlx/1.2/cpu")
    assert kernel_cache({}, "1.2") == Path("/tmp/mlx/1.2/cpu")
    off = compile_note(1, cache, off=True)
    assert off.startswith("tracing the model step") and "no kernel is built" in off
    assert compile_off({"MLX_DISABLE_COMPILE": "1"}) and not compile_off({})
    assert not compile_off({"MLX_DISABLE_COMPILE": "0"})
