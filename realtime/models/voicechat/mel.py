"""VoiceChat's log-mel front end for a batch of conversations, bit for bit each one's own.

Every conversation keeps mlx-audio's ``StreamingLogMelSpectrogram`` (its retained
samples, frame counters and buffer offset), which computes one conversation's new mel
frames per ``push``: some 25 small MLX nodes, a host wait for its retained tail, and
about a millisecond of Python and evaluation a conversation on a 2-core CPU.
:func:`push_frames` advances every row's front end exactly as
its own ``push`` would and computes the mel frames of the rows whose buffers are laid
out alike (conversations of equal age, and every conversation fed whole frames from
its third frame on) as one batch (a row alone as a batch of one), and submits the
retained tails without waiting for them (``mx.async_eval``: the same arrays evaluated,
no wait on the device; docs/performance.md, fifth pass: 3-10 % of a tiny eight-row
step).

Why the batch gives each row its own bits: the pre-emphasis, padding, window, power,
log and transposes are element by element; the real FFT runs each frame's transform on
its own (pocketfft, as MLX's CPU backend calls it, transforms every frame separately
whatever the batch); the mel filters multiply as a batched product, which MLX's CPU
backend runs as one BLAS call per row with the shapes of that row's own product, so
even an optimised BLAS (``--cpu-blas``) gets the same call. tests/models/voicechat/test_mel.py
holds every row to mlx-audio's own ``push``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Final

import mlx.core as mx
from mlx_audio.stt.models.nemotron_asr.audio import _padded_window
from mlx_audio.utils import mel_filters

MEL_STATE: Final = (
    "args",
    "lookahead_samples",
    "_lookbehind_frames",
    "_samples",
    "_buffer_start",
    "_total_samples",
    "_next_frame",
    "_closed",
)
"""The attributes of mlx-audio's ``StreamingLogMelSpectrogram`` :func:`push_frames`
reads and advances."""


class _Plan:
    """What one row's ``push`` of ``samples`` would do, worked out before it is done:
    the mel frames it emits (``first`` to ``last`` of its buffer), where it trims its
    buffer, and a key equal for rows whose mel frames one batch computes."""

    __slots__ = ("first", "frame_end", "keep_sample", "key", "last", "samples")

    def __init__(self, stream: Any, samples: Any) -> None:

        self.samples = samples = mx.array(samples)
        args = stream.args
        buffered = stream._samples
        if buffered.shape[0] > 0 and samples.shape[0] > 0 and samples.dtype != buffered.dtype:
            self.samples = samples = samples.astype(buffered.dtype)
        length = (
            samples.shape[0] if buffered.shape[0] == 0 else buffered.shape[0] + samples.shape[0]
        )
        dtype = samples.dtype if buffered.shape[0] == 0 else buffered.dtype
        total = stream._total_samples + samples.shape[0]
        center = total - stream.lookahead_samples
        self.frame_end = center // args.hop_length + 1 if center >= 0 else 0
        start_frame = stream._buffer_start // args.hop_length
        keep_frame = max(self.frame_end - stream._lookbehind_frames, 0)
        self.keep_sample = keep_frame * args.hop_length
        self.first = stream._next_frame - start_frame
        self.last = self.frame_end - start_frame
        self.key: Hashable = (length, str(dtype), self.first, self.last, id(args))


def _batchable(stream: Any, samples: Any) -> bool:
    """Whether ``push(samples)`` on ``stream`` is the plain case :func:`push_frames`
    batches: open, one mono frame that emits at least one mel frame."""
    shape = getattr(samples, "shape", None)
    return not stream._closed and shape is not None and len(shape) == 1 and shape[0] > 0


def push_frames(streams: Sequence[Any], frames: Sequence[Any]) -> list[Any]:
    """``[stream.push(frame) for ...]``, each row's new ``(1, T, features)`` mel frames
    and its front end advanced as that push advances it; rows laid out alike are
    computed as one batch (a row laid out unlike the others as a batch of one), any
    other row (a closed stream, an empty or multi-channel chunk, a chunk that emits no
    mel frame) by mlx-audio's own ``push``."""

    out: list[Any] = [None] * len(streams)
    plans: list[_Plan | None] = [
        _Plan(stream, frame) if _batchable(stream, frame) else None
        for stream, frame in zip(streams, frames, strict=True)
    ]
    retained: list[Any] = []
    for members in _batches(streams, plans).values():
        lead = plans[members[0]]
        assert lead is not None
        windows = [_advance(streams[i], plans[i], retained) for i in members]
        stacked = windows[0][None] if len(windows) == 1 else mx.stack(windows)
        mels = log_mel_frames(stacked, streams[members[0]].args, lead.first, lead.last)
        for position, i in enumerate(members):
            out[i] = mels if len(members) == 1 else mels[position : position + 1]
    if retained:
        # mlx-audio materializes each retained tail (so a long stream's lazy graph
        # cannot keep old audio alive); submitted here without waiting for it (the
        # same arrays evaluated, so the same bits; no wait on the device).
        mx.async_eval(*retained)  # type: ignore[no-untyped-call]
    for i, stream in enumerate(streams):
        if out[i] is None:
            out[i] = stream.push(frames[i])
    return out


def _batches(streams: Sequence[Any], plans: Sequence[_Plan | None]) -> dict[Hashable, list[int]]:
    """The rows that emit a mel frame, grouped by layout (rows of one group run as one
    batch), in row order."""
    batches: dict[Hashable, list[int]] = {}
    for i, plan in enumerate(plans):
        if plan is None or plan.frame_end <= streams[i]._next_frame:
            continue
        batches.setdefault(plan.key, []).append(i)
    return batches


def _advance(stream: Any, plan: _Plan | None, retained: list[Any]) -> Any:
    """Append ``plan``'s samples to ``stream``'s buffer as mlx-audio's ``push`` does and
    return the buffer the new mel frames are read from; a trimmed buffer's tail joins
    ``retained``."""
    assert plan is not None
    buffered = stream._samples
    stream._samples = (
        plan.samples if buffered.shape[0] == 0 else mx.concatenate([buffered, plan.samples])
    )
    stream._total_samples += plan.samples.shape[0]
    stream._next_frame = plan.frame_end
    window = stream._samples
    trim = plan.keep_sample - stream._buffer_start
    if trim > 0:
        stream._samples = stream._samples[trim:]
        stream._buffer_start = plan.keep_sample
        retained.append(stream._samples)
    return window


def log_mel_frames(x: Any, args: Any, frame_start: int, frame_end: int) -> Any:
    """mlx-audio's ``log_mel_spectrogram_frames`` over a batch: ``x`` is (rows,
    samples), each row a buffer as that function reads it; returns (rows, frames,
    features). The same operations in the same order on every row; ``pad_to`` and
    normalisation are never set for a streaming front end (mlx-audio refuses them)."""

    dtype = x.dtype
    rows, total = x.shape
    hop, n_fft = args.hop_length, args.n_fft
    frames = frame_end - frame_start
    sample_start = frame_start * hop - n_fft // 2
    sample_end = (frame_end - 1) * hop - n_fft // 2 + n_fft
    raw_start, raw_end = max(sample_start, 0), min(sample_end, total)
    raw = x[:, raw_start:raw_end]
    if args.preemph and args.preemph > 0 and raw.shape[1] > 0:
        if raw_start > 0:
            head = raw[:, :1] - args.preemph * x[:, raw_start - 1 : raw_start]
        else:
            head = raw[:, :1]
        raw = mx.concat([head, raw[:, 1:] - args.preemph * raw[:, :-1]], axis=1)
    left_pad, right_pad = max(-sample_start, 0), max(sample_end - total, 0)
    pieces = []
    if left_pad:
        pieces.append(_edge(raw[:, 1 : left_pad + 1], left_pad, args.pad_mode))
    pieces.append(raw.astype(dtype))
    if right_pad:
        pieces.append(_edge(raw[:, -(right_pad + 1) : -1], right_pad, args.pad_mode))
    segment = mx.concatenate(pieces, axis=1) if len(pieces) > 1 else pieces[0]
    expected = (frames - 1) * hop + n_fft
    if segment.shape[1] < expected:
        segment = mx.pad(segment, [(0, 0), (0, expected - segment.shape[1])], constant_values=0.0)
    width = segment.shape[1]
    framed = mx.as_strided(segment, shape=(rows, frames, n_fft), strides=(width, hop, 1))
    window = _padded_window(args)
    power = mx.square(mx.abs(mx.fft.rfft(framed * window))).astype(dtype)
    filters = mel_filters(
        args.sample_rate, args.n_fft, args.features, norm="slaney", mel_scale="slaney"
    )
    mel = filters.astype(power.dtype) @ power.transpose(0, 2, 1)
    mel = mx.log(mel + mx.array(args.log_zero_guard_value, dtype=mel.dtype))
    return mel.transpose(0, 2, 1).astype(dtype)


def _edge(inner: Any, width: int, mode: str) -> Any:
    """The padding beside a buffer's edge: ``inner`` (the samples next to the edge,
    ``width`` of them) mirrored for ``reflect``, zeros for ``constant``."""

    if mode == "reflect":
        return inner[:, ::-1]
    if mode == "constant":
        return mx.zeros((inner.shape[0], width), dtype=inner.dtype)
    raise ValueError(f"Unsupported Nemotron STFT pad mode: {mode}")
