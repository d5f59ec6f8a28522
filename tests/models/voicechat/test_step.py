"""The project's own VoiceChat frame step (realtime/models/voicechat/step.py).

Alone it gives what mlx-vlm's ``VoiceChatStreamingSession`` gives, bit for bit; batched,
every conversation gives what it gives alone, whatever its age, prompt, chunking and
company; one row's bad input or context limit stays that row's.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from realtime.models import load_model
from realtime.models.base import (
    MAX_TOOL_OUTPUT_BYTES,
    ContextLimitReached,
    InferenceError,
    ModelSession,
    open_session,
)
from realtime.models.voicechat.keys import SessionKey, drawing_from, drawing_rows
from realtime.models.voicechat.model import VoiceChatModel, VoiceChatSession
from tests.engine.test_isolation import LONG_PROMPT, Digest, digest, digest_mlx_vlm
from tests.models_fixtures import noise, push_all, speechlike, step_rows


def _models(request: pytest.FixtureRequest, name: str) -> VoiceChatModel:
    model = request.getfixturevalue(name)
    assert isinstance(model, VoiceChatModel)
    return model


MODELS = [
    "demo_model",
    pytest.param("medium_model", marks=pytest.mark.slow),
    pytest.param("deep_model", marks=pytest.mark.slow),
]


def _audio(seed: int, frames: int) -> np.ndarray:
    """Noise and speech-like sound: the random weights answer noise with text."""
    return np.concatenate([noise(frames - 4, seed=3 + seed % 2, level=0.5), speechlike(4)])


def mlx_vlm_digest(
    model: VoiceChatModel, seed: int, prompt: str | None, x: Any, chunk: int
) -> Digest:
    """mlx-vlm's own streaming session on the same conversation, as a digest."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.keys import install_voicechat

    install_voicechat()
    raw: list[Any] = []
    with drawing_from(SessionKey(seed)):
        theirs = VoiceChatStreamingSession(model.runtime, system_prompt=prompt, seed=seed)
        for start in range(0, x.shape[0], chunk):
            raw += theirs.push_audio(x[start : start + chunk], sample_rate=16000)
        raw += theirs.flush(pad_partial=True)
    return digest_mlx_vlm(raw)


@pytest.mark.parametrize(
    ("name", "seed", "prompt", "chunk"),
    [
        ("demo_model", 0, "", 1280),
        ("demo_model", 3, None, 1000),
        ("demo_model", 5, "Be brief.", 3000),
        pytest.param("medium_model", 3, None, 1000, marks=pytest.mark.slow),
        pytest.param("deep_model", 5, "Be brief.", 1000, marks=pytest.mark.slow),
    ],
)
def test_alone_it_is_mlx_vlms_step_bit_for_bit(
    request: pytest.FixtureRequest, name: str, seed: int, prompt: str | None, chunk: int
) -> None:
    model = _models(request, name)
    x = _audio(seed, 12)
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    ours = digest(push_all(session, x, chunk))
    assert ours == mlx_vlm_digest(model, seed, prompt, x, chunk)
    assert sum(d[0] == "audio" for d in ours) == 12
    if name == "demo_model" and prompt == "":  # tiny answers this noise with text
        assert any(d[0] == "AssistantTextDelta" for d in ours)


def _solo(model: VoiceChatModel, seed: int, prompt: str | None, x: Any) -> Digest:
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    return digest(push_all(session, x, 1280))


@pytest.mark.parametrize("name", MODELS)
def test_batched_each_conversation_is_what_it_is_alone(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Three conversations of different ages (one opened with no prompt joining late,
    one with a long prompt), stepped as one batch whenever they have frames, one of them
    sent two frames and a half at once: each equals its solo run."""
    model = _models(request, name)
    tiny = name == "demo_model"
    specs = [  # (seed, prompt, first frame, frames)
        (1, None, 0, 11 if tiny else 8),
        (2, LONG_PROMPT if tiny else "Answer briefly.", 2, 8 if tiny else 5),
        (4, "", 5 if tiny else 4, 6 if tiny else 4),
    ]
    audio = [_audio(seed, frames) for seed, _, _, frames in specs]
    sessions: list[ModelSession | None] = [None] * len(specs)
    got: list[list[Any]] = [[] for _ in specs]
    sizes: list[int] = []
    for t in range(max(start + frames for _, _, start, frames in specs) + 1):
        batch = []
        for k, (seed, prompt, start, frames) in enumerate(specs):
            if t == start:
                sessions[k] = open_session(
                    model, system_prompt=prompt, seed=seed, max_streaming_seconds=None
                )
            session, f = sessions[k], t - start
            if session is None or not 0 <= f < frames:
                continue
            piece = audio[k][f * 1280 : (f + 1) * 1280]
            if k == 0 and f == 4:  # two and a half frames at once, nothing, the rest
                piece = audio[k][4 * 1280 : 6 * 1280 + 640]
            elif k == 0 and f == 5:
                piece = audio[k][:0]
            elif k == 0 and f == 6:
                piece = audio[k][6 * 1280 + 640 : 7 * 1280]
            batch.append((k, session, piece))
        if batch:
            sizes.append(len(batch))
            step_rows(model, batch, got)
    for k, session in enumerate(sessions):
        assert session is not None
        got[k] += session.flush(True)
        seed, prompt, _, _ = specs[k]
        assert digest(got[k]) == _solo(model, seed, prompt, audio[k]), f"conversation {k}"
    assert max(sizes) == 3


def test_batched_rows_past_the_tts_window_are_what_they_are_alone(
    demo_path: Path, tmp_path: Path
) -> None:
    """The TTS's sliding-window layers keep 7500 frames (10 min) in a rotating cache; with
    the window cut to 6 frames, two conversations of different ages both run past it
    (their caches full and rotating, one joining while the other's already rotates),
    staying one batch, and each is still bit for bit its solo run and mlx-vlm's."""
    import json
    import shutil

    path = tmp_path / "window6"
    shutil.copytree(demo_path, path)
    config = json.loads((path / "config.json").read_text())
    assert config["tts_config"]["sliding_window"] == 7500
    config["tts_config"]["sliding_window"] = 6
    (path / "config.json").write_text(json.dumps(config))
    model = load_model(path)
    assert isinstance(model, VoiceChatModel)
    specs = [(1, 0, 16), (2, 4, 11)]  # (seed, first frame, frames)
    audio = [_audio(seed, frames) for seed, _, frames in specs]
    sessions: list[ModelSession | None] = [None, None]
    got: list[list[Any]] = [[], []]
    batched: list[int] = []
    for t in range(16):
        batch = []
        for k, (seed, start, frames) in enumerate(specs):
            if t == start:
                sessions[k] = open_session(
                    model, system_prompt=None, seed=seed, max_streaming_seconds=None
                )
            session = sessions[k]
            if session is not None and 0 <= t - start < frames:
                f = t - start
                batch.append((k, session, audio[k][f * 1280 : (f + 1) * 1280]))
        step_rows(model, batch, got)
        held = [s._seat.batch for s in sessions if s is not None and s._seat.batch]  # type: ignore[attr-defined]
        batched.append(len(held[0].seats) if held else 0)
    # Past the window they stayed one batch: one model pass a frame.
    assert batched[6:15] == [2] * 9
    for k, (seed, _, _) in enumerate(specs):
        session = sessions[k]
        assert session is not None
        got[k] += session.flush(True)
        assert digest(got[k]) == _solo(model, seed, None, audio[k]), f"conversation {k}"
        assert digest(got[k]) == mlx_vlm_digest(model, seed, None, audio[k], 1280)


def test_a_row_at_its_limit_or_with_bad_input_is_its_own(demo_model: VoiceChatModel) -> None:
    """The context limit and a wrong rate are the row's result; the other rows run."""
    limited = open_session(demo_model, system_prompt="", seed=1, max_streaming_seconds=0.4)
    other = open_session(demo_model, system_prompt="", seed=2, max_streaming_seconds=None)
    alone = open_session(demo_model, system_prompt="", seed=2, max_streaming_seconds=None)
    x = noise(8)
    for f in range(8):
        frame = x[f * 1280 : (f + 1) * 1280]
        results = demo_model.step(
            [(limited, frame, 16000), (other, frame, 16000), (other, frame, 8000)][: 2 + (f == 6)]
        )
        expected = digest(alone.push_audio(frame, 16000))
        if f < 5:
            assert not isinstance(results[0], Exception)
        else:
            assert isinstance(results[0], ContextLimitReached)
        second = results[1]
        assert not isinstance(second, Exception)
        assert digest(second) == expected
        if f == 6:
            assert isinstance(results[2], InferenceError)
            assert "Hz" in str(results[2])
    with pytest.raises(ContextLimitReached):
        limited.push_audio(x[:1280], 16000)


def test_a_failing_batch_fails_its_rows_not_the_model(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from realtime.models.voicechat import step as voicechat_step

    first = open_session(demo_model, system_prompt="", seed=1, max_streaming_seconds=None)
    second = open_session(demo_model, system_prompt="", seed=2, max_streaming_seconds=None)
    x = noise(2)

    def broken(*_: Any) -> Any:
        raise RuntimeError("injected")

    with monkeypatch.context() as patch:
        patch.setattr(voicechat_step, "_codec", broken)
        results = demo_model.step([(first, x[:1280], 16000), (second, x[:1280], 16000)])
    assert all(isinstance(r, InferenceError) and "injected" in str(r) for r in results)
    with pytest.raises(InferenceError):
        first.push_audio(x[1280:], 16000)
    fresh = open_session(demo_model, system_prompt="", seed=3, max_streaming_seconds=None)
    assert not isinstance(demo_model.step([(fresh, x[:1280], 16000)])[0], Exception)


def test_a_batched_draw_gives_each_row_its_own_keys_draw() -> None:
    import types

    import mlx.core as mx

    from realtime.models.voicechat.keys import install

    module: Any = types.ModuleType("tts_like")
    module.mx = mx
    install(module)
    # One vmapped split of every row's key and one vmapped draw (keys.RowKeys), plain
    # or bounded, even or odd sizes: each row's own, and each key moves on as alone.
    for shape in [(3, 1, 4), (3, 1, 5), (4, 1, 512), (2, 3, 6)]:
        keys = [SessionKey(11 + r) for r in range(shape[0])]
        alone = [SessionKey(11 + r) for r in range(shape[0])]
        with drawing_rows(keys):
            uniform = module.mx.random.uniform(shape=shape)
            normal = module.mx.random.normal(shape)
            bounded = module.mx.random.uniform(-1.0, 2.0, shape)
        row_shape = (1, *shape[1:])
        for row, key in enumerate(alone):
            with drawing_from(key):
                own_uniform = module.mx.random.uniform(shape=row_shape)
                own_normal = module.mx.random.normal(row_shape)
                own_bounded = module.mx.random.uniform(-1.0, 2.0, row_shape)
            assert own_uniform.dtype == uniform.dtype and own_normal.dtype == normal.dtype
            assert mx.array_equal(own_uniform, uniform[row : row + 1])
            assert mx.array_equal(own_normal, normal[row : row + 1])
            assert mx.array_equal(own_bounded, bounded[row : row + 1])
        for key, own in zip(keys, alone, strict=True):
            assert mx.array_equal(key.next(), own.next())
    keys = [SessionKey(11), SessionKey(12), SessionKey(13)]
    with drawing_rows(keys), pytest.raises(RuntimeError, match="batch of 3"):
        module.mx.random.normal((2, 1, 2))


def test_nested_drawing_contexts_advance_each_key_once_per_draw() -> None:
    """The step draws inside a batch that sits inside the whole frame's batch (and a
    tool result's step inside one row's): each key moves on by its own draws, at every
    level, as if drawn one after another alone."""
    import types

    import mlx.core as mx

    from realtime.models.voicechat.keys import install

    module: Any = types.ModuleType("tts_like")
    module.mx = mx
    install(module)
    keys = [SessionKey(21 + r) for r in range(3)]
    alone = [SessionKey(21 + r) for r in range(3)]
    with drawing_rows(keys):
        outer = module.mx.random.normal((3, 1, 4))
        with drawing_rows(keys[:2]):
            inner = module.mx.random.normal((2, 1, 4))
            with drawing_from(keys[0]):
                own = module.mx.random.normal((1, 1, 4))
            again = module.mx.random.normal((2, 1, 4))
        last = module.mx.random.normal((3, 1, 4))
    expected: list[list[Any]] = [[] for _ in alone]
    for row, key in enumerate(alone):
        with drawing_from(key):
            expected[row].append(module.mx.random.normal((1, 1, 4)))
            if row < 2:
                expected[row].append(module.mx.random.normal((1, 1, 4)))
            if row == 0:
                expected[row].append(module.mx.random.normal((1, 1, 4)))
            if row < 2:
                expected[row].append(module.mx.random.normal((1, 1, 4)))
            expected[row].append(module.mx.random.normal((1, 1, 4)))
    for row in range(3):
        got = [outer[row : row + 1]]
        if row < 2:
            got.append(inner[row : row + 1])
        if row == 0:
            got.append(own)
        if row < 2:
            got.append(again[row : row + 1])
        got.append(last[row : row + 1])
        assert len(got) == len(expected[row])
        assert all(mx.array_equal(a, b) for a, b in zip(got, expected[row], strict=True))
        assert mx.array_equal(keys[row].next(), alone[row].next())


def test_the_step_checks_mlx_vlms_session_state() -> None:
    from realtime.models.voicechat.step import check_state

    with pytest.raises(RuntimeError, match="not supported"):
        check_state(object())


def test_a_tool_result_goes_in_as_inserted_function_channel_steps(
    demo_model: VoiceChatModel,
) -> None:
    """NVIDIA's format: the result's tokens forced on the function channel one step
    each, then one step the model closes; no audio frame is consumed or heard."""
    from realtime.models.voicechat.step import tool_response_text

    session = open_session(demo_model, system_prompt="", seed=1, max_streaming_seconds=None)
    assert isinstance(session, VoiceChatSession)
    x = noise(4)
    session.push_audio(x[:2560], 16000)
    inner = session._inner
    before_frames, before_steps = session.frame_index, inner._timeline_index
    output = '{"temperature": 21, "unit": "C"}'
    assert (
        tool_response_text(output)
        == '<TOOL_RESPONSE>[{"temperature": 21, "unit": "C"}]</TOOL_RESPONSE>'
    )
    assert tool_response_text("sunny") == '<TOOL_RESPONSE>["sunny"]</TOOL_RESPONSE>'
    ids = inner.tokenizer.encode(tool_response_text(output), add_special_tokens=False)
    feed = session.begin_tool_result(demo_model.tool_input(output))
    steps = 1
    while not feed.advance():
        steps += 1
    assert steps == len(ids) + 1 == feed.steps
    assert inner._timeline_index == before_steps + steps
    assert session.frame_index == before_frames
    assert inner._function_tokens[-steps:-1] == ids
    assert inner._function_tokens[-1] == feed.closed_with
    assert set(inner._text_tokens[-steps:]) == {demo_model.figures.pad_token_id}
    events = session.push_audio(x[2560:3840], 16000)
    assert [type(e).__name__ for e in events][-1] == "AudioDelta"
    with pytest.raises(InferenceError, match="at most 512"):
        demo_model.tool_input("x " * 2000)
    with pytest.raises(InferenceError, match="bytes"):
        demo_model.tool_input("x" * (MAX_TOOL_OUTPUT_BYTES + 1))
    with pytest.raises(InferenceError, match="nests too deeply"):
        demo_model.tool_input("[" * 5000 + "]" * 5000)
    session.flush(True)
    with pytest.raises(InferenceError, match="closed"):
        session.begin_tool_result(demo_model.tool_input(output))


@pytest.mark.parametrize("speculative", [1, 2, 3])
def test_batched_transcript_steps_are_each_rows_own(
    demo_model: VoiceChatModel, speculative: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user transcript's greedy RNN-T, batched over rows (``_transcribe``): every
    row's tokens, text, last symbol and predictor state are bit for bit what mlx-vlm's
    own ``_RNNTState.step`` makes of the same encoder frames, also in frames where the
    rows emit different numbers of symbols, where a row without predictor state yet
    joins rows that have one, and whatever the number of rounds built speculatively
    into the final evaluation."""
    import copy

    from realtime.models.voicechat import step

    monkeypatch.setattr(step, "SPECULATIVE_ROUNDS", speculative)

    import mlx.core as mx

    from realtime.models.voicechat.row import StepRow
    from realtime.models.voicechat.step import _early_rounds, _transcribe

    rows = 4
    sessions = [
        open_session(demo_model, system_prompt=None, seed=k, max_streaming_seconds=None)
        for k in range(rows)
    ]
    ours = [StepRow(s._inner, s._key, None) for s in sessions]  # type: ignore[attr-defined]
    theirs = [copy.copy(row.inner._rnnt) for row in ours]
    for state in theirs:
        state.tokens = list(state.tokens)
    width = demo_model.runtime.model.config.audio_config.encoder.d_model
    gen = np.random.default_rng(7)
    counts_seen: set[tuple[int, ...]] = set()
    mixed = False
    for frame in range(40):
        scale = 0.0 if frame < 3 else 3.0  # blank first: the predictors start at different times
        encoded = [
            mx.array(gen.standard_normal((1, 1, width)).astype(np.float32) * scale * (k % 2 + 1))
            if frame >= 3 + 2 * k
            else mx.zeros((1, 1, width))
            for k in range(rows)
        ]
        mixed |= len({row.inner._rnnt.hidden is None for row in ours}) == 2
        before = [len(row.inner._rnnt.tokens) for row in ours]
        got = _transcribe(ours, encoded, _early_rounds(ours, encoded))
        want = [state.step(frame_k) for state, frame_k in zip(theirs, encoded, strict=True)]
        assert got == want, frame
        counts_seen.add(
            tuple(len(r.inner._rnnt.tokens) - b for r, b in zip(ours, before, strict=True))
        )
        for row, state in zip(ours, theirs, strict=True):
            mine = row.inner._rnnt
            assert (mine.tokens, mine.text, mine.last_token) == (
                state.tokens,
                state.text,
                state.last_token,
            )
            assert (mine.hidden is None) == (state.hidden is None)
            if mine.hidden is not None:
                for a, b in zip(mine.hidden, state.hidden, strict=True):
                    assert np.array_equal(np.array(a), np.array(b))
    assert mixed
    assert any(len(set(counts)) > 1 for counts in counts_seen)


def _perception_state(session: ModelSession) -> list[np.ndarray]:
    """A session's perception caches: a batched row's attention and convolution caches
    read from its frame batch's stacked ones (its own are stale), left in place."""
    inner = session._inner  # type: ignore[attr-defined]
    stream = inner._conformer_stream
    attn, conv = list(stream.attn_cache), list(stream.conv_cache)
    batch = session._seat.batch  # type: ignore[attr-defined]
    held = [] if batch is None else [j for j, mine in enumerate(batch.inners) if mine is inner]
    if held and batch.conformer is not None:
        view = SimpleNamespace(attn_cache=attn, conv_cache=conv)
        batch.conformer.extract(held[0], view)
    state = [stream.mel_cache, *attn, *conv]
    return [np.array(value) for value in state if value is not None]


@pytest.mark.parametrize("name", MODELS)
def test_young_rows_of_staggered_ages_run_the_conformer_as_one_batch(
    request: pytest.FixtureRequest, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conversations younger than the conformer's attention context (70 encoder frames),
    each a different age, so their attention caches differ in length (on tiny with one
    conversation past that context, its cache full): they run the conformer as one
    batch, padded and masked, and every frame each one's events and perception caches
    (mel tail, attention and convolution caches, each its own length) are bit for bit
    its solo run's."""
    from realtime.models.voicechat import perception

    model = _models(request, name)
    # (first frame, frames); ages 0 and 1 to 2 differ from older rows in their mel tails.
    specs = [(0, 9), (1, 9), (3, 9), (6, 9)]
    if name == "demo_model":
        specs = [(0, 81), *((start + 70, frames) for start, frames in specs)]
    batched_rows: list[int] = []
    masked = perception._masked_block

    def spy(block: Any, x: Any, *args: Any) -> Any:
        batched_rows.append(x.shape[0])
        return masked(block, x, *args)

    monkeypatch.setattr(perception, "_masked_block", spy)
    audio = [_audio(k, frames) for k, (_, frames) in enumerate(specs)]
    stacked_rows: list[int] = []
    ours: dict[int, ModelSession] = {}
    alone: dict[int, ModelSession] = {}
    got: list[list[Any]] = [[] for _ in specs]
    want: list[list[Any]] = [[] for _ in specs]
    for t in range(max(start + frames for start, frames in specs)):
        batch = []
        for k, (start, frames) in enumerate(specs):
            if t == start:
                ours[k], alone[k] = (
                    open_session(model, system_prompt=None, seed=k, max_streaming_seconds=None)
                    for _ in range(2)
                )
            if 0 <= (f := t - start) < frames:
                batch.append((k, audio[k][f * 1280 : (f + 1) * 1280]))
        results = model.step([(ours[k], piece, 16000) for k, piece in batch])
        held = ours[0]._seat.batch  # type: ignore[attr-defined]
        conformer = None if held is None else held.conformer
        stacked_rows.append(0 if conformer is None else len(conformer.lengths))
        for (k, piece), result in zip(batch, results, strict=True):
            assert not isinstance(result, Exception), result
            got[k] += result
            (single,) = model.step([(alone[k], piece, 16000)])
            assert not isinstance(single, Exception), single
            want[k] += single
            mine, theirs = _perception_state(ours[k]), _perception_state(alone[k])
            assert [a.shape for a in mine] == [b.shape for b in theirs], (t, k)
            assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True)), (t, k)
        assert [digest(g) for g in got] == [digest(w) for w in want], t
    assert max(batched_rows) == len(specs)
    # The young rows' padded caches stayed stacked in the frame batch between frames.
    assert max(stacked_rows) == len(specs)
