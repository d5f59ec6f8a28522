"""A frame batch's state kept stacked between frames (realtime/models/voicechat/batch.py).

:class:`PaddedKV` gives each row's attention exactly what the row's own cache gives it
(its entries in their order, everything else masked), through joins, leaves,
write-backs and a rotating window that wraps; and conversations that join, leave, sit a
frame out, take a tool result or are cancelled between batched frames each get exactly
their solo run while the rest stay batched.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.models.cache import KVCache, RotatingKVCache

from realtime.models.base import ModelEvent, ModelSession, open_session
from realtime.models.voicechat.batch import FrameBatch, PaddedKV
from realtime.models.voicechat.model import VoiceChatModel, VoiceChatSession
from realtime.models.voicechat.perception import ConformerBatch
from tests.engine.test_isolation import digest
from tests.models_fixtures import noise, speechlike

WINDOW = 12
"""The rotating caches' window here: rows wrap it, one while batched."""


def _cache(rows: int, length: int, seed: int, rotating: bool) -> Any:
    cache = (
        RotatingKVCache(max_size=WINDOW, keep=0)  # type: ignore[no-untyped-call]
        if rotating
        else KVCache()  # type: ignore[no-untyped-call]
    )
    rng = np.random.default_rng(seed)
    for _ in range(length):
        k, v = (mx.array(rng.standard_normal((rows, 2, 1, 4)).astype(np.float32)) for _ in "kv")
        cache.update_and_fetch(k, v)  # type: ignore[no-untyped-call]
    return cache


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _step_both(batched: PaddedKV, own: list[Any], rows_each: int, seed: int) -> None:
    """One position through the batch and through each row's own cache: each row's
    unmasked keys and values are exactly what its own cache returns, in its order, and
    its RoPE offset its own."""
    mask = batched.make_mask(1)
    assert _same(batched.offset, mx.array([int(c.offset) for c in own] * rows_each))
    rng = np.random.default_rng(seed)
    shape = (rows_each * len(own), 2, 1, 4)
    k, v = (mx.array(rng.standard_normal(shape).astype(np.float32)) for _ in "kv")
    got = batched.update_and_fetch(k, v)
    for j, cache in enumerate(own):
        rows = [j + r * len(own) for r in range(rows_each)]
        want = cache.update_and_fetch(k[mx.array(rows)], v[mx.array(rows)])
        for r, row in enumerate(rows):
            keep = (
                np.ones(got[0].shape[2], dtype=np.bool_)
                if mask is None
                else np.asarray(mask)[row, 0, 0]
            )
            for mine, theirs in zip(got, want, strict=True):
                assert _same(np.asarray(mine)[row][:, keep], np.asarray(theirs)[r])


def _written_back(batched: PaddedKV, j: int, cache: Any, rows_each: int, rotating: bool) -> None:
    """Row ``j`` written back is its own cache: the same entries, offset and next step."""
    back = _cache(rows_each, 0, 0, rotating)
    batched.extract(j, back)
    assert back.offset == cache.offset
    assert _same(back.state[0], cache.state[0]) and _same(back.state[1], cache.state[1])
    k = mx.ones((rows_each, 2, 1, 4))
    assert _same(back.update_and_fetch(k, k)[0], copy.deepcopy(cache).update_and_fetch(k, k)[0])


@pytest.mark.parametrize(("rows_each", "rotating"), [(1, False), (2, True), (2, False)])
def test_padded_kv_is_each_rows_own_cache_through_joins_leaves_and_a_wrap(
    rows_each: int, rotating: bool
) -> None:
    lengths = [5, 2, 9]
    own = [_cache(rows_each, n, seed, rotating) for seed, n in enumerate(lengths)]
    batched = PaddedKV.merge(copy.deepcopy(own), rows_each)
    for step in range(3):
        _step_both(batched, own, rows_each, step)
    # The longest leaves (rotating: its window wrapped while batched): written back
    # exactly, the rest trimmed to what they use.
    _written_back(batched, 2, own[2], rows_each, rotating)
    batched.filter([0, 1])
    own = own[:2]
    _step_both(batched, own, rows_each, 10)
    # A young one and an old one (rotating: its window wrapped before) join.
    joining = [_cache(rows_each, 1, 7, rotating), _cache(rows_each, 20, 8, rotating)]
    batched.extend(PaddedKV.merge(copy.deepcopy(joining), rows_each))
    own += joining
    for step in range(260):  # past a growth step (256 positions)
        _step_both(batched, own, rows_each, 20 + step)
        if step == 5:  # one leaves mid-way, the others stay
            _written_back(batched, 1, own[1], rows_each, rotating)
            batched.filter([0, 2, 3])
            own = [own[0], own[2], own[3]]
    for j, cache in enumerate(own):
        _written_back(batched, j, cache, rows_each, rotating)


def test_wrapped_windows_do_not_hold_the_buffer_open_while_rows_come_and_go() -> None:
    """A wrapped window stays where it filled while younger rows grow the buffer; with
    rows joining, wrapping and leaving beside it for long, the buffer is compacted
    (each window moved whole, in its order) instead of growing, and every row is still
    its own cache."""
    from realtime.models.voicechat.batch import GROWTH

    own = [_cache(2, 30, 0, True)]  # wrapped
    batched = PaddedKV.merge(copy.deepcopy(own), 2)
    widest = 0
    for k in range(1, 60):
        young = _cache(2, 1, k, True)
        batched.extend(PaddedKV.merge([copy.deepcopy(young)], 2))
        own.append(young)
        for step in range(WINDOW + 3):
            _step_both(batched, own, 2, 1000 * k + step)
        widest = max(widest, batched.keys.shape[2])
        if len(own) == 3:  # the one before leaves; the old one and the newest stay
            _written_back(batched, 1, own[1], 2, True)
            batched.filter([0, 2])
            own = [own[0], own[2]]
    assert widest <= 2 * GROWTH
    for j, cache in enumerate(own):
        _written_back(batched, j, cache, 2, True)


def _audio(seed: int, frames: int) -> np.ndarray:
    return np.concatenate([noise(frames - 4, seed=3 + seed % 2, level=0.5), speechlike(4)])


TOOL = '{"temperature": 21, "unit": "C"}'

# (seed, prompt, first tick, frames per tick, tool result after tick, how it ends)
PLAN: list[tuple[int, str | None, int, list[int], int | None, str]] = [
    (1, None, 0, [1, 1, 1, 1, 0, 2, 1, 1, 1, 1], 3, "flush"),  # sits a tick out
    (2, "Be brief.", 1, [1, 1, 1, 1, 1, 1], None, "cancel"),  # cancelled mid-stream
    (4, None, 4, [1, 1, 1, 1, 1, 1], 1, "flush"),  # joins late
    (6, "", 2, [1, 1, 1, 1], None, "flush"),  # leaves early
]


def _batch(session: ModelSession) -> FrameBatch | None:
    """The frame batch holding ``session``'s state (None: its own caches are current)."""
    assert isinstance(session, VoiceChatSession)
    batch = session._seat.batch
    assert batch is None or isinstance(batch, FrameBatch)
    return batch


def _finish(model: VoiceChatModel, session: ModelSession, how: str) -> list[ModelEvent]:
    return list(session.flush(True) if how == "flush" else session.cancel())


def _feed(model: VoiceChatModel, session: ModelSession) -> None:
    assert isinstance(session, VoiceChatSession)
    feed = session.begin_tool_result(model.tool_input(TOOL))
    while not feed.advance():
        pass


def _solo(model: VoiceChatModel, k: int) -> list[Any]:
    seed, prompt, _, ticks, tool_at, how = PLAN[k]
    x = _audio(seed, sum(ticks))
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    events: list[ModelEvent] = []
    done = 0
    for tick, count in enumerate(ticks):
        events += session.push_audio(x[done * 1280 : (done + count) * 1280], 16000)
        done += count
        if tick == tool_at:
            _feed(model, session)
    return digest(events + _finish(model, session, how))


def test_joins_leaves_and_inserted_steps_keep_each_conversation_its_solo_run(
    demo_model: VoiceChatModel,
) -> None:
    model = demo_model
    audio = [_audio(seed, sum(ticks)) for seed, _, _, ticks, _, _ in PLAN]
    sessions: list[ModelSession | None] = [None] * len(PLAN)
    done = [0] * len(PLAN)
    got: list[list[ModelEvent]] = [[] for _ in PLAN]
    resident_sizes: list[int] = []
    conformer_sizes: list[int] = []
    for t in range(max(start + len(ticks) for _, _, start, ticks, _, _ in PLAN)):
        batch = []
        for k, (seed, prompt, start, ticks, _, _) in enumerate(PLAN):
            if t == start:
                sessions[k] = open_session(
                    model, system_prompt=prompt, seed=seed, max_streaming_seconds=None
                )
            session, tick = sessions[k], t - start
            if session is not None and 0 <= tick < len(ticks) and ticks[tick]:
                piece = audio[k][done[k] * 1280 : (done[k] + ticks[tick]) * 1280]
                done[k] += ticks[tick]
                batch.append((k, session, piece))
        results = model.step([(s, piece, 16000) for _, s, piece in batch])
        for (k, _, _), result in zip(batch, results, strict=True):
            assert not isinstance(result, Exception), result
            got[k] += result
        batches = {id(b): b for s in sessions if s is not None and (b := _batch(s)) is not None}
        assert len(batches) <= 1  # one batch holds the rows stepping together
        resident = next(iter(batches.values()), FrameBatch())
        held = len(resident.seats)
        if resident.conformer is not None:
            assert len(resident.conformer.lengths) == held
            conformer_sizes.append(held)
        for k, (_, _, start, ticks, tool_at, how) in enumerate(PLAN):
            session = sessions[k]
            if session is None:
                continue
            if t - start == tool_at:
                _feed(model, session)
            if t - start == len(ticks) - 1:
                got[k] += _finish(model, session, how)
                assert _batch(session) is None
                assert all(inner is not session._inner for inner in resident.inners)  # type: ignore[attr-defined]
        resident_sizes.append(held)
    # every row written back once its session ended
    assert all(_batch(s) is None for s in sessions if s is not None)
    assert max(resident_sizes) == 3  # the batch did stay resident
    assert max(conformer_sizes) == 3  # its conformer caches too
    for k in range(len(PLAN)):
        assert digest(got[k]) == _solo(model, k), f"conversation {k}"


def test_a_steady_batch_is_stacked_once_then_reused_as_it_is(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three conversations stepping together: their first frame stacks their language
    model's state (nothing started yet: the batch's Mamba states start as the layer
    starts them), the second their TTS's (a first frame has no TTS step) and the
    conformer's caches (a first frame has none), each once, and every later frame
    reuses it: nothing is stacked, filtered or written back again, and the conformer's
    per-step stacking is not run, until a session ends."""
    from realtime.models.voicechat import perception
    from realtime.models.voicechat.batch import StackedStates

    calls: list[str] = []
    inside: list[bool] = []  # the frame batch's own calls (a step beside it merges too)
    for kind in (PaddedKV, StackedStates, ConformerBatch, FrameBatch):
        for name in ("merge", "extend", "filter", "extract", "arrange", "release"):
            original = getattr(kind, name, None)
            if original is None:
                continue

            def counted(
                *args: Any, _name: str = f"{kind.__name__}.{name}", _call: Any = original, **kw: Any
            ) -> Any:
                batch_call = _name.startswith("FrameBatch")
                if not batch_call and (inside or _name.startswith("ConformerBatch")):
                    calls.append(_name)
                inside.append(True) if batch_call else None
                try:
                    return _call(*args, **kw)
                finally:
                    inside.pop() if batch_call else None

            monkeypatch.setattr(kind, name, counted)
    per_step = perception._conformer_blocks

    def blocks(*args: Any) -> Any:
        calls.append("_conformer_blocks")
        return per_step(*args)

    monkeypatch.setattr(perception, "_conformer_blocks", blocks)
    sessions = [
        open_session(demo_model, system_prompt=None, seed=seed, max_streaming_seconds=None)
        for seed in range(3)
    ]
    x = noise(6)
    per_frame: list[list[str]] = []
    for f in range(6):
        calls.clear()
        piece = x[f * 1280 : (f + 1) * 1280]
        results = demo_model.step([(s, piece, 16000) for s in sessions])
        assert not any(isinstance(r, Exception) for r in results)
        per_frame.append(list(calls))
    assert set(per_frame[0]) == {"PaddedKV.merge", "StackedStates.merge", "_conformer_blocks"}
    assert per_frame[0].count("_conformer_blocks") == 1
    assert set(per_frame[1]) == {"PaddedKV.merge", "ConformerBatch.merge"}
    assert per_frame[1].count("ConformerBatch.merge") == 1
    assert all(frame == [] for frame in per_frame[2:])
    calls.clear()
    for session in sessions:
        session.flush(True)
    assert "PaddedKV.extract" in calls and "ConformerBatch.extract" in calls
    assert all(_batch(session) is None for session in sessions)


def test_a_frame_the_stacked_conformer_cannot_take_writes_it_back_exactly(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame in which one resident row's chunk is not the plain, batched case (here
    forced: mlx-audio's own push for it, which leaves it off the batched path while it
    lives) writes the stacked conformer caches back to every row and steps them per
    row; once it has left, the others are stacked again. Each conversation stays its
    solo run, the young one (joining later, its attention cache shorter and padded in
    the stack) included."""
    from realtime.models.voicechat import perception

    starts, lengths = [0, 0, 3], [8, 11, 8]
    audio = [_audio(seed, frames) for seed, frames in enumerate(lengths)]
    odd: list[Any] = []
    plan = perception._chunk_plan

    def forced(stream: Any, mel: Any) -> Any:
        return None if any(stream is s for s in odd) else plan(stream, mel)

    monkeypatch.setattr(perception, "_chunk_plan", forced)
    sessions: dict[int, ModelSession] = {}
    got: list[list[ModelEvent]] = [[] for _ in starts]
    stacked: list[int] = []
    for t in range(max(s + n for s, n in zip(starts, lengths, strict=True))):
        for k, start in enumerate(starts):
            if t == start:
                sessions[k] = open_session(
                    demo_model, system_prompt=None, seed=k, max_streaming_seconds=None
                )
        live = [k for k, start in enumerate(starts) if 0 <= t - start < lengths[k]]
        odd[:] = []
        if t == 6:  # the first row's chunk is not cut by the step this frame
            first = sessions[0]
            assert isinstance(first, VoiceChatSession)
            odd.append(first._inner._conformer_stream)
        pieces = [audio[k][(t - starts[k]) * 1280 : (t - starts[k] + 1) * 1280] for k in live]
        results = demo_model.step(
            [(sessions[k], piece, 16000) for k, piece in zip(live, pieces, strict=True)]
        )
        for k, result in zip(live, results, strict=True):
            assert not isinstance(result, Exception), result
            got[k] += result
        held = [b for s in sessions.values() if (b := _batch(s)) is not None]
        conformer = held[0].conformer if held else None
        stacked.append(0 if conformer is None else len(conformer.lengths))
    for k, session in sessions.items():
        got[k] += session.flush(True)
    assert stacked[5:9] == [3, 0, 0, 2]  # written back, then stacked again
    odd[:] = []
    for k in range(len(starts)):
        alone = open_session(demo_model, system_prompt=None, seed=k, max_streaming_seconds=None)
        want: list[ModelEvent] = []
        for f in range(lengths[k]):
            want += alone.push_audio(audio[k][f * 1280 : (f + 1) * 1280], 16000)
        want += alone.flush(True)
        assert digest(got[k]) == digest(want), f"conversation {k}"


def test_a_batch_another_thread_left_is_forgotten(demo_model: VoiceChatModel) -> None:
    """An engine thread that stopped with rows resident (tests run many engines on one
    loaded model) leaves nothing the next thread's batches trip over: MLX evaluates an
    array only on a thread with the stream it was made on, so that batch is forgotten
    and the next thread's conversations each still equal their solo run."""
    import threading

    def batched(seeds: tuple[int, ...], frames: int) -> list[list[ModelEvent]]:
        sessions = [
            open_session(demo_model, system_prompt=None, seed=s, max_streaming_seconds=None)
            for s in seeds
        ]
        audio = [noise(frames, seed=s) for s in seeds]
        got: list[list[ModelEvent]] = [[] for _ in seeds]
        for f in range(frames):
            chunk = [
                (s, audio[k][f * 1280 : (f + 1) * 1280], 16000) for k, s in enumerate(sessions)
            ]
            for k, result in enumerate(demo_model.step(chunk)):
                assert not isinstance(result, Exception), result
                got[k] += result
        return got

    failures: list[BaseException] = []

    def other_engine() -> None:
        try:
            batched((1, 2), 4)  # left resident: never flushed or cancelled
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    thread = threading.Thread(target=other_engine)
    thread.start()
    thread.join()
    assert not failures
    together = batched((3, 4), 4)
    for k, seed in enumerate((3, 4)):
        alone = batched((seed,), 4)[0]
        assert digest(together[k]) == digest(alone)


def test_every_frame_is_one_model_pass_whatever_its_rows_ages(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three conversations batched and a fourth opening among them: every frame runs the
    language model, the TTS backbone and the codec once for all its rows (the TTS not
    on the first frame, when every row speaks the codec's silence; the opening row's
    first frame in the same pass as the others'), and each conversation is still its
    solo run."""
    from collections import Counter

    network = demo_model.runtime.model
    passes: Counter[str] = Counter()
    for stage, kind, method in (
        ("language", type(network.stt_model), "__call__"),
        ("tts", type(network.tts_model.tts_model.backbone), "__call__"),
        ("codec", type(network.tts_model.audio_codec), "decode_latents"),
    ):
        original = getattr(kind, method)

        def counted(*args: Any, _stage: str = stage, _call: Any = original, **kw: Any) -> Any:
            passes[_stage] += 1
            return _call(*args, **kw)

        monkeypatch.setattr(kind, method, counted)
    starts, frames = [0, 0, 0, 3], 7
    audio = [_audio(seed, frames) for seed in range(len(starts))]
    sessions: dict[int, ModelSession] = {}
    got: list[list[ModelEvent]] = [[] for _ in starts]
    per_frame: list[dict[str, int]] = []
    for t in range(frames):
        for k, start in enumerate(starts):
            if t == start:
                sessions[k] = open_session(
                    demo_model, system_prompt=None, seed=k, max_streaming_seconds=None
                )
        live = [k for k, start in enumerate(starts) if start <= t < start + frames]
        passes.clear()
        pieces = [audio[k][(t - starts[k]) * 1280 : (t - starts[k] + 1) * 1280] for k in live]
        results = demo_model.step(
            [(sessions[k], piece, 16000) for k, piece in zip(live, pieces, strict=True)]
        )
        per_frame.append(dict(passes))
        for k, result in zip(live, results, strict=True):
            assert not isinstance(result, Exception), result
            got[k] += result
    assert per_frame[0] == {"language": 1, "codec": 1}
    assert all(frame == {"language": 1, "tts": 1, "codec": 1} for frame in per_frame[1:])
    for k, session in sessions.items():
        got[k] += session.flush(True)
    for k in range(len(starts)):
        alone = open_session(demo_model, system_prompt=None, seed=k, max_streaming_seconds=None)
        want: list[ModelEvent] = []
        for f in range(min(frames, frames - starts[k])):
            want += alone.push_audio(audio[k][f * 1280 : (f + 1) * 1280], 16000)
        want += alone.flush(True)
        assert digest(got[k]) == digest(want), f"conversation {k}"
