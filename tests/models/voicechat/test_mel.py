"""The batched log-mel front end (realtime/models/voicechat/mel.py): every row's mel
frames and front-end state are bit for bit what mlx-audio's own ``push`` gives it,
whatever the rows' ages, chunk sizes and company."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.models.voicechat.mel import push_frames

FRAME = 1280


def _args(**changes: Any) -> Any:
    """mlx-audio's front-end settings (the real model's), with ``changes``."""
    from mlx_audio.stt.models.nemotron_asr.config import PreprocessArgs

    return dataclasses.replace(PreprocessArgs(), **changes)


def _stream(args: Any) -> Any:
    from mlx_audio.stt.models.nemotron_asr.audio import StreamingLogMelSpectrogram

    # As mlx-vlm's streaming session makes it: a frame of look-ahead.
    return StreamingLogMelSpectrogram(args, lookahead_samples=FRAME)


def _state(stream: Any) -> tuple[Any, ...]:
    return (
        np.array(stream._samples).tobytes(),
        str(stream._samples.dtype),
        stream._buffer_start,
        stream._total_samples,
        stream._next_frame,
    )


def _same(a: Any, b: Any) -> bool:
    return (
        tuple(a.shape) == tuple(b.shape)
        and a.dtype == b.dtype
        and np.array_equal(np.array(a), np.array(b))
    )


def _run(chunks: list[list[np.ndarray]], args: Any, starts: list[int] | None = None) -> int:
    """Feed ``chunks[row]`` from step ``starts[row]`` on to two front ends per row, one
    through :func:`push_frames` with every live row at once, one through mlx-audio's
    own ``push``; every output and state equal. Returns how many steps had rows laid
    out alike (so the batched path ran)."""
    rows = len(chunks)
    starts = starts or [0] * rows
    ours = [_stream(args) for _ in range(rows)]
    theirs = [_stream(args) for _ in range(rows)]
    batched = 0
    for step in range(max(len(c) + s for c, s in zip(chunks, starts, strict=True))):
        live = [r for r in range(rows) if 0 <= step - starts[r] < len(chunks[r])]
        frames = [chunks[r][step - starts[r]] for r in live]
        layouts = [
            (ours[r]._samples.shape[0], ours[r]._next_frame, ours[r]._buffer_start, f.shape[0])
            for r, f in zip(live, frames, strict=True)
        ]
        batched += len(set(layouts)) < len(layouts)
        got = push_frames([ours[r] for r in live], frames)
        for r, frame, mel in zip(live, frames, got, strict=True):
            expected = theirs[r].push(frame)
            assert _same(mel, expected), (step, r)
            assert _state(ours[r]) == _state(theirs[r]), (step, r)
    return batched


def _noise(samples: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(samples) * 0.3).astype(np.float32)


def test_rows_of_every_age_in_one_batch_are_each_their_own_push() -> None:
    """Rows that start at different frames (so some are at their first frame, some at
    their second, some steady) share steps; each equal group runs as one batch."""
    starts = [0, 0, 0, 1, 1, 2, 4, 4]
    chunks = [
        [_noise(FRAME, 10 * r + s) for s in range(9 - start)] for r, start in enumerate(starts)
    ]
    assert _run(chunks, _args(), starts) == 9


def test_odd_chunks_and_dtypes_run_as_their_own_push() -> None:
    """A row fed 1000 or 3000 samples, an empty chunk, or another dtype is laid out
    unlike the rest; it runs alone and still matches, beside rows that batch."""
    chunks = [
        [_noise(FRAME, s) for s in range(6)],
        [_noise(FRAME, 100 + s) for s in range(6)],
        [_noise(1000, 200 + s) for s in range(6)],
        [_noise(3000, 300), np.zeros(0, np.float32), *[_noise(FRAME, 300 + s) for s in range(4)]],
        [_noise(FRAME, 400 + s).astype(np.float64) for s in range(6)],
    ]
    assert _run(chunks, _args()) >= 5


@pytest.mark.parametrize(
    "changes",
    [{"pad_mode": "constant"}, {"preemph": 0.0}, {"pad_mode": "constant", "preemph": 0.5}],
)
def test_other_front_end_settings_batch_bit_for_bit(changes: dict[str, Any]) -> None:
    chunks = [[_noise(FRAME, 7 * r + s) for s in range(5)] for r in range(3)]
    assert _run(chunks, _args(**changes)) >= 4


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(
        st.lists(st.sampled_from([FRAME, FRAME, FRAME, 640, 1000, 2560, 0]), max_size=6),
        min_size=1,
        max_size=5,
    )
)
def test_any_chunking_of_any_rows_is_each_rows_own_push(sizes: list[list[int]]) -> None:
    chunks = [[_noise(n, 31 * r + s) for s, n in enumerate(row)] for r, row in enumerate(sizes)]
    _run(chunks, _args())


def test_a_closed_or_stereo_row_fails_as_its_own_push_does() -> None:
    args = _args()
    closed, stereo = _stream(args), _stream(args)
    closed.flush()
    with pytest.raises(RuntimeError, match="closed"):
        push_frames([_stream(args), closed], [_noise(FRAME, 1), _noise(FRAME, 2)])
    with pytest.raises(ValueError, match="mono"):
        push_frames([stereo], [np.zeros((2, FRAME), np.float32)])


def test_the_step_checks_the_front_end_state_it_advances() -> None:
    """An mlx-audio whose streaming mel lacks an attribute push_frames reads or
    advances fails when a session opens, naming it, not in the middle of a step."""
    import types

    from realtime.models.voicechat.mel import MEL_STATE
    from realtime.models.voicechat.step import check_state

    stream = _stream(_args())
    assert all(hasattr(stream, name) for name in MEL_STATE)
    inner = types.SimpleNamespace(_mel_stream=types.SimpleNamespace(args=stream.args))
    with pytest.raises(RuntimeError, match=r"_mel_stream\._samples"):
        check_state(inner)
