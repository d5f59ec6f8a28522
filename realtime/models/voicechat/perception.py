"""Perception for the batched frame step (realtime/models/voicechat/step.py): each
row's frame through the log-mel front end and the streaming conformer, batched where
the result stays bit for bit what each row gets alone.

The log-mel front end runs as one batch for the rows whose sample buffers are laid out
alike (:mod:`realtime.models.voicechat.mel`); the conformer runs once for each group of
rows whose streaming states are equally far, else per row as mlx-audio's own push.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import mlx.core as mx
from mlx_audio.stt.models.nemotron_asr import streaming as conformer

from realtime.models.voicechat.mel import push_frames

if TYPE_CHECKING:
    from realtime.models.voicechat.step import StepRow

T = TypeVar("T")


def groups(items: Iterable[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """``items`` grouped by ``key``, each group in order, groups by first appearance."""
    out: dict[Hashable, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return list(out.values())


def _chunk_plan(stream: Any, mel: Any) -> tuple[Any, ...] | None:
    """How the conformer state ``stream`` would encode ``mel`` (one frame's mel, after
    mlx-audio's ``push(mel, emit_partial=True)``), as a key that rows share exactly when
    one batched encode gives each what its own push would; None when this push is not
    the plain case (one chunk, emitted, closing the pending mel), which then runs as
    mlx-audio's own push."""
    if stream.closed or stream.pending is not None or mel.shape[1] == 0:
        return None
    chunk = stream.first_chunk_mel if stream.consumed == 0 else stream.chunk_mel
    if mel.shape[1] > chunk:
        return None
    factor = stream.subsampling_factor
    cache_len = 0 if stream.mel_cache is None else stream.mel_cache.shape[1]
    base = (stream.consumed - cache_len) // factor
    lo = stream.emitted - base
    attn = tuple(None if c is None else tuple(c.shape) for c in stream.attn_cache)
    conv = tuple(None if c is None else tuple(c.shape) for c in stream.conv_cache)
    return (tuple(mel.shape), cache_len, (stream.consumed - cache_len) % factor, lo, attn, conv)


def perceive(rows: Sequence[StepRow]) -> tuple[list[Any], list[Any]]:
    """Each row's encoder frame (for the RNN-T) and its projection (the language
    model's audio input). The log-mel front end runs as one batch for the rows whose
    buffers are laid out alike (:mod:`realtime.models.voicechat.mel`); the conformer
    runs once for each group of rows whose streaming states are equally far (a
    conversation older than its attention's left context, 70 encoder frames, shares
    its shapes with every other such one), else per row as mlx-audio's push."""

    proj = rows[0].inner.model.stt_model.perception.proj
    mels = push_frames([row.inner._mel_stream for row in rows], [row.frame for row in rows])
    plans = [
        _chunk_plan(row.inner._conformer_stream, mel) for row, mel in zip(rows, mels, strict=True)
    ]
    encoded: list[Any] = [None] * len(rows)
    for members in groups(
        range(len(rows)), lambda i: plans[i] if plans[i] is not None else ("own", i)
    ):
        if plans[members[0]] is None:  # a chunk this step does not cut: mlx-audio's push
            i = members[0]
            encoded[i] = _pushed(rows[i].inner._conformer_stream, mels[i])
            continue
        streams = [rows[i].inner._conformer_stream for i in members]
        h = _conformer_blocks(streams, _pre_encoded(streams, [mels[i] for i in members]))
        for position, i in enumerate(members):
            encoded[i] = _row(h, position, len(members))
    if len(rows) == 1:
        return encoded, [proj(encoded[0])]
    projected = proj(mx.concatenate(encoded, axis=0))
    return encoded, [projected[i : i + 1] for i in range(len(rows))]


def _pushed(stream: Any, mel: Any) -> Any:
    """One row's encoder frame through mlx-audio's own streaming ``push``."""
    chunks = stream.push(mel, emit_partial=True)
    if len(chunks) != 1 or chunks[0].shape[1] != 1:
        raise RuntimeError(
            "cached perception did not emit exactly one encoder frame: "
            f"mel={tuple(mel.shape)}, encoded={[tuple(c.shape) for c in chunks]}"
        )
    return chunks[0]


def _pre_encoded(streams: Sequence[Any], mels: Sequence[Any]) -> Any:
    """The conformer's subsampling for a group of equally far ``streams`` (each with
    its cached mel tail before its new ``mels``): the one new subsampled frame of each,
    stacked; each stream's mel tail and counters move on."""

    lead = streams[0]
    windows = [
        mel if s.mel_cache is None else mx.concatenate([s.mel_cache, mel], axis=1)
        for mel, s in zip(mels, streams, strict=True)
    ]
    win = _stacked(windows)
    width = win.shape[1]
    # The widths as a Python list: pre_encode reads each with int(), which on an MLX
    # array is an evaluation (a wait on the device) per row.
    sub = lead.encoder.pre_encode(win, [width] * len(streams))[0]
    factor = lead.subsampling_factor
    cache_len = 0 if lead.mel_cache is None else lead.mel_cache.shape[1]
    base = (lead.consumed - cache_len) // factor
    lo, hi = lead.emitted - base, sub.shape[1]
    end = lead.consumed + mels[0].shape[1]
    keep = conformer._PRE_ENCODE_MEL_CACHE + (end - conformer._PRE_ENCODE_MEL_CACHE) % factor
    if hi - lo != 1:
        raise RuntimeError(f"cached perception would emit {hi - lo} encoder frames, not one")
    for position, s in enumerate(streams):
        row_base = (s.consumed - cache_len) // factor
        s.consumed += mels[position].shape[1]
        s.mel_cache = windows[position][:, -keep:]
        s.emitted = row_base + hi
    return sub[:, lo:hi]


def _conformer_blocks(streams: Sequence[Any], h: Any) -> Any:
    """The conformer's blocks over a group's subsampled frames ``h``, each stream's
    attention and convolution caches read stacked and written back per row."""

    lead = streams[0]
    for layer, block in enumerate(lead.encoder.layers):
        attn = [s.attn_cache[layer] for s in streams]
        conv = [s.conv_cache[layer] for s in streams]
        h, attn_next, conv_next = conformer._stream_block(
            block,
            h,
            lead.encoder.pos_enc,
            None if attn[0] is None else _stacked(attn),
            None if conv[0] is None else _stacked(conv),
            lead.left_cache,
            lead.conv_left,
        )
        for position, s in enumerate(streams):
            s.attn_cache[layer] = _row(attn_next, position, len(streams))
            s.conv_cache[layer] = _row(conv_next, position, len(streams))
    return h


def _stacked(parts: Sequence[Any]) -> Any:
    """``parts`` as one batch (one part as it is: no copy in the graph)."""

    return parts[0] if len(parts) == 1 else mx.concatenate(list(parts), axis=0)


def _row(batch: Any, position: int, rows: int) -> Any:
    """Row ``position`` of a batch of ``rows`` (a batch of one as it is)."""
    return batch if rows == 1 else batch[position : position + 1]
