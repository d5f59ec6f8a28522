"""Perception for the batched frame step (realtime/models/voicechat/step.py): each
row's frame through the log-mel front end and the streaming conformer, batched where
the result stays bit for bit what each row gets alone.

The log-mel front end runs as one batch for the rows whose sample buffers are laid out
alike (:mod:`realtime.models.voicechat.mel`). The conformer's subsampling runs once for
each group of rows whose mel tails and counters line up, its blocks once for all rows
whose caches exist. A conversation younger than the attention's left context (70
encoder frames) has a shorter attention cache than an older one: for the step, each
row's cache is left-padded with zeros to the longest and the padded keys are masked
(minus infinity on their position scores) in our own streaming block. Left padding
keeps each real key's distance to the new frame, so the relative positions a row's
keys get are those it gets alone; a padded key's weight is exactly zero, and exact
zeros change none of the sums on MLX's CPU, whose reductions run in order
(tests/models/voicechat/test_step.py checks every row's caches and events against its solo
run; a GPU's attention kernels split the keys into blocks, so padding may move the
last bits there). A chunk the step does not cut runs as mlx-audio's own push.

The frame batch's rows (:mod:`realtime.models.voicechat.batch`) keep that padded
layout between frames (:class:`ConformerBatch`): their caches are stacked once, not
per step, and written back to each row's streaming state when it leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
import mlx.core as mx
import numpy as np
from mlx.nn.layers.activations import glu
from mlx_audio.stt.models.nemotron_asr import streaming as conformer

from realtime.models.voicechat.mel import push_frames

if TYPE_CHECKING:
    from realtime.models.voicechat.row import StepRow

T = TypeVar("T")


class HoldsConformer(Protocol):
    """What perception reads and sets of the frame batch
    (:class:`realtime.models.voicechat.batch.FrameBatch`, which imports this module)."""

    @property
    def inners(self) -> list[Any]: ...

    conformer: ConformerBatch | None

    def release_conformer(self) -> None: ...


def groups(items: Iterable[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """``items`` grouped by ``key``, each group in order, groups by first appearance."""
    out: dict[Hashable, list[T]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return list(out.values())


@attrs.frozen(slots=True)
class _ChunkPlan:
    """How a conformer state encodes one frame's mel, in two keys: rows with equal
    ``mel`` keys run the subsampling as one batch (their mel windows and emitted
    frame line up), rows with equal ``blocks`` keys the conformer blocks (their caches
    exist and are alike but for the attention caches' lengths, which are padded)."""

    mel: tuple[Any, ...]
    blocks: tuple[Any, ...]


def _chunk_plan(stream: Any, mel: Any) -> _ChunkPlan | None:
    """How the conformer state ``stream`` would encode ``mel`` (one frame's mel, after
    mlx-audio's ``push(mel, emit_partial=True)``), as keys that rows share exactly when
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
    attn = tuple(None if c is None else (c.shape[0], c.shape[2]) for c in stream.attn_cache)
    conv = tuple(None if c is None else tuple(c.shape) for c in stream.conv_cache)
    return _ChunkPlan(
        mel=(tuple(mel.shape), cache_len, (stream.consumed - cache_len) % factor, lo),
        blocks=(attn, conv),
    )


def perceive(
    rows: Sequence[StepRow], resident: HoldsConformer | None = None
) -> tuple[list[Any], list[Any]]:
    """Each row's encoder frame (for the RNN-T) and its projection (the language
    model's audio input). The log-mel front end runs as one batch for the rows whose
    buffers are laid out alike (:mod:`realtime.models.voicechat.mel`); the conformer's
    subsampling once for each group of rows whose mel windows line up, its blocks once
    for the rows of a frame batch (``resident``: all of ``rows``, on its stacked
    conformer caches, :class:`ConformerBatch`, when this frame allows it; a first frame
    with an empty attention cache, a younger row than the attention's left context, 70
    encoder frames, with its attention cache padded and masked), else once per group
    of rows whose caches are alike; a chunk this step does not cut runs as mlx-audio's
    push."""

    proj = rows[0].inner.model.stt_model.perception.proj
    mels = push_frames([row.inner._mel_stream for row in rows], [row.frame for row in rows])
    plans = [
        _chunk_plan(row.inner._conformer_stream, mel) for row, mel in zip(rows, mels, strict=True)
    ]
    planned = {i: plan for i, plan in enumerate(plans) if plan is not None}
    encoded: list[Any] = [None] * len(rows)
    held = 0 if resident is None else len(resident.inners)
    batch = None if resident is None or not held else _resident_batch(resident, plans[:held])
    if batch is not None:
        order, h = _subsampled(rows, range(held), planned, mels)
        if order != list(range(held)):  # the batch's row order (one gather)
            h = h[mx.array(np.argsort(order))]
        h = batch.step(rows[0].inner._conformer_stream, h)
        for i in range(held):
            encoded[i] = _row(h, i, held)
    for members in groups(
        range(0 if batch is None else held, len(rows)),
        lambda i: planned[i].blocks if i in planned else ("own", i),
    ):
        if members[0] not in planned:  # a chunk this step does not cut: mlx-audio's push
            i = members[0]
            encoded[i] = _pushed(rows[i].inner._conformer_stream, mels[i])
            continue
        order, h = _subsampled(rows, members, planned, mels)
        h = _conformer_blocks([rows[i].inner._conformer_stream for i in order], h)
        for position, i in enumerate(order):
            encoded[i] = _row(h, position, len(order))
    if len(rows) == 1:
        return encoded, [proj(encoded[0])]
    projected = proj(mx.concatenate(encoded, axis=0))
    return encoded, [projected[i : i + 1] for i in range(len(rows))]


def _subsampled(
    rows: Sequence[StepRow], members: Iterable[int], planned: dict[int, _ChunkPlan], mels: Any
) -> tuple[list[int], Any]:
    """The subsampled frames of rows ``members`` (one subsampling per group of rows
    whose mel windows line up), stacked, and the order of the rows in the stack."""
    order: list[int] = []
    frames: list[Any] = []
    for part in groups(members, lambda i: planned[i].mel):
        streams = [rows[i].inner._conformer_stream for i in part]
        frames.append(_pre_encoded(streams, [mels[i] for i in part]))
        order += part
    return order, stacked(frames)


def _resident_batch(
    resident: HoldsConformer, plans: Sequence[_ChunkPlan | None]
) -> ConformerBatch | None:
    """The resident rows' stacked conformer caches for this frame (stacked now if
    they were not and the rows' own caches allow it), or None when this frame's
    chunks do not all take the plain, batched path (the caches written back first)."""
    shapes = {p.blocks for p in plans if p and not _fresh_plan(p)}
    plain = all(plan is not None for plan in plans) and len(shapes) <= 1
    if resident.conformer is not None:
        if plain:
            return resident.conformer
        resident.release_conformer()
        return None
    streams = [inner._conformer_stream for inner in resident.inners]
    if plain and shapes and all(stackable(s) for s in streams):
        resident.conformer = ConformerBatch.merge(streams)
    return resident.conformer


def _fresh_plan(plan: _ChunkPlan) -> bool:
    """A plan of a :func:`fresh` stream (its caches' shapes all None)."""
    attn, conv = plan.blocks
    return all(shape is None for shape in (*attn, *conv))


def stackable(stream: Any) -> bool:
    """A conformer state's caches can join a :class:`ConformerBatch`: every layer's
    exists and its attention caches are equally long (as every push leaves them), or
    none exists yet (:func:`fresh`)."""
    attn, conv = stream.attn_cache, stream.conv_cache
    if fresh(stream):
        return True
    if any(c is None for c in (*attn, *conv)):
        return False
    return len({c.shape[1] for c in attn}) == 1


def fresh(stream: Any) -> bool:
    """A conformer state before its first chunk: no cache yet. mlx-audio's streaming
    block reads a missing attention cache as none (the window is the new frames) and a
    missing convolution cache as zeros, so an empty attention cache and a zero
    convolution cache are the same state, and such a row joins a batch as that."""
    return all(c is None for c in (*stream.attn_cache, *stream.conv_cache))


def taken(array: Any, keep: Sequence[int]) -> Any:
    """Rows ``keep`` of ``array`` (first axis), in that order: a slice (a view, no
    kernel) when they are one run in order, as a row leaving from the end leaves them,
    else a gather."""
    first = keep[0] if keep else 0
    if list(keep) == list(range(first, first + len(keep))):
        return array[first : first + len(keep)]
    return array[mx.array(list(keep))]


@attrs.define(slots=True, eq=False)
class ConformerBatch:
    """The resident batch's conformer caches, stacked between frames: per layer the
    rows' attention caches (rows, width, features), each left-padded with zeros to the
    longest (``lengths[j]`` real keys at the right, the layout :func:`_conformer_blocks`
    builds per step; the padding masked while lengths differ), and their convolution
    caches (rows, kernel - 1, features). Rows join with :meth:`extend`, leave with
    :meth:`extract` and :meth:`filter` (a frame batch's
    :class:`~realtime.models.voicechat.batch.Part`)."""

    attn: list[Any]
    conv: list[Any]
    lengths: list[int]

    @property
    def width(self) -> int:
        return max(self.lengths)

    @property
    def view(self) -> ConformerBatch:
        """What the conformer's step reads: this object (:meth:`step`)."""
        return self

    @classmethod
    def merge(cls, streams: Sequence[Any], like: ConformerBatch | None = None) -> ConformerBatch:
        """Stacked from each :func:`stackable` stream's own caches (a fresh one's as
        empty attention and zero convolution caches, shaped as another stream's or as
        ``like``'s: :func:`shaped` says whether one can be)."""
        lead = next((s for s in streams if not fresh(s)), None)
        if lead is not None:
            attn, conv = lead.attn_cache, lead.conv_cache
        elif like is not None:
            attn, conv = like.attn, like.conv
        else:
            raise ValueError("no conformer caches to shape a fresh stream's by")
        lengths = [0 if fresh(s) else s.attn_cache[0].shape[1] for s in streams]
        layers = range(len(streams[0].attn_cache))

        def own(s: Any, n: int) -> tuple[Any, Any]:
            if not fresh(s):
                return s.attn_cache[n], s.conv_cache[n]
            keys = mx.zeros((1, 0, attn[n].shape[2]), attn[n].dtype)
            return keys, mx.zeros((1, *conv[n].shape[1:]), conv[n].dtype)

        caches = [[own(s, n) for s in streams] for n in layers]
        return cls(
            [_left_padded([a for a, _ in caches[n]], max(lengths)) for n in layers],
            [stacked([c for _, c in caches[n]]) for n in layers],
            lengths,
        )

    def step(self, lead: Any, h: Any) -> Any:
        """The conformer's blocks over the rows' subsampled frames ``h`` (``lead``: a
        row's streaming state, for the encoder and its context sizes); the caches move
        on in place, in the same layout."""
        encoder, left, chunk = lead.encoder, lead.left_cache, h.shape[1]
        equal = len(set(self.lengths)) == 1 or left <= 0
        mask = None if equal else _key_mask(self.lengths, chunk, h.dtype)
        lengths = [max(0, min(n + chunk, left)) for n in self.lengths]
        for layer, block in enumerate(encoder.layers):
            if mask is None:
                h, self.attn[layer], self.conv[layer] = conformer._stream_block(
                    block,
                    h,
                    encoder.pos_enc,
                    self.attn[layer],
                    self.conv[layer],
                    left,
                    lead.conv_left,
                )
                continue
            h, keys, self.conv[layer] = _masked_block(
                block, h, encoder.pos_enc, self.attn[layer], mask, self.conv[layer], lead.conv_left
            )
            self.attn[layer] = keys[:, -max(lengths) :]
        self.lengths = lengths
        return h

    def arrays(self) -> list[Any]:
        return [*self.attn, *self.conv]

    def extract(self, j: int, stream: Any) -> list[Any]:
        """Write row ``j``'s caches back to its own ``stream`` (as its own pushes would
        have left them); the new arrays."""
        row, start = mx.array([j]), self.width - self.lengths[j]
        for layer in range(len(self.attn)):
            # Gathers: copies, not views of the batch's buffers.
            stream.attn_cache[layer] = mx.contiguous(self.attn[layer][row, start:])
            stream.conv_cache[layer] = self.conv[layer][row]
        return [*stream.attn_cache, *stream.conv_cache]

    def filter(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep`` (in that order), trimmed to the longest of them."""
        trim = self.width - max(self.lengths[j] for j in keep)
        self.attn = [taken(a, keep)[:, trim:] for a in self.attn]
        self.conv = [taken(c, keep) for c in self.conv]
        self.lengths = [self.lengths[j] for j in keep]

    def extend_fresh(self, count: int) -> None:
        """Append ``count`` :func:`fresh` rows: what :meth:`merge` then :meth:`extend`
        would lay out (no key, a zero convolution cache), as one pad per array."""
        self.attn = [mx.pad(a, [(0, count), (0, 0), (0, 0)]) for a in self.attn]
        self.conv = [mx.pad(c, [(0, count), (0, 0), (0, 0)]) for c in self.conv]
        self.lengths = self.lengths + [0] * count

    def extend(self, other: ConformerBatch) -> None:
        """Append ``other``'s rows after these."""
        width = max(self.width, other.width)

        def laid(batch: ConformerBatch, attn: Any) -> Any:
            left = width - batch.width
            return attn if not left else mx.pad(attn, [(0, 0), (left, 0), (0, 0)])

        self.attn = [
            mx.concatenate([laid(self, mine), laid(other, theirs)], axis=0)
            for mine, theirs in zip(self.attn, other.attn, strict=True)
        ]
        self.conv = [
            mx.concatenate([mine, theirs], axis=0)
            for mine, theirs in zip(self.conv, other.conv, strict=True)
        ]
        self.lengths = self.lengths + other.lengths


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
    win = stacked(windows)
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
    attention and convolution caches read stacked and written back per row: through
    mlx-audio's streaming block when the rows' attention caches are equally long, else
    through :func:`_masked_block` (rows younger than the attention's left context)."""

    lead = streams[0]
    masks: dict[tuple[int, ...], Any] = {}
    for layer, block in enumerate(lead.encoder.layers):
        attn = [s.attn_cache[layer] for s in streams]
        conv = [s.conv_cache[layer] for s in streams]
        lengths = tuple(0 if a is None else a.shape[1] for a in attn)
        if len(set(lengths)) == 1 or lead.left_cache <= 0:
            h, attn_next, conv_next = conformer._stream_block(
                block,
                h,
                lead.encoder.pos_enc,
                None if attn[0] is None else stacked(attn),
                None if conv[0] is None else stacked(conv),
                lead.left_cache,
                lead.conv_left,
            )
            for position, s in enumerate(streams):
                s.attn_cache[layer] = _row(attn_next, position, len(streams))
                s.conv_cache[layer] = _row(conv_next, position, len(streams))
            continue
        if lengths not in masks:
            masks[lengths] = _key_mask(lengths, h.shape[1], h.dtype)
        h, keys, conv_next = _masked_block(
            block,
            h,
            lead.encoder.pos_enc,
            _left_padded(attn, max(lengths)),
            masks[lengths],
            stacked(conv),
            lead.conv_left,
        )
        for position, s in enumerate(streams):
            # Each row keeps its own cache, as long as alone: its real keys, the last.
            keep = min(lengths[position] + h.shape[1], lead.left_cache)
            s.attn_cache[layer] = keys[position : position + 1, -keep:]
            s.conv_cache[layer] = conv_next[position : position + 1]
    return h


def _left_padded(caches: Sequence[Any], longest: int) -> Any:
    """Rows' attention caches (1, length, width) stacked, each left-padded with zeros to
    ``longest``: a row's real keys keep their distance from the new frame, so the
    relative positions each one sees are those it sees alone."""

    return mx.concatenate(
        [
            c if c.shape[1] == longest else mx.pad(c, [(0, 0), (longest - c.shape[1], 0), (0, 0)])
            for c in caches
        ],
        axis=0,
    )


def _key_mask(lengths: Sequence[int], chunk: int, dtype: Any) -> Any:
    """The additive key mask (rows, 1, 1, longest + chunk) of left-padded caches of
    ``lengths``: minus infinity on each row's padding, zero elsewhere. Built from host
    data (no wait on the device), in the scores' dtype (a float32 mask would promote
    the attention's arithmetic)."""

    longest = max(lengths)
    mask = np.zeros((len(lengths), 1, 1, longest + chunk), dtype=np.float32)
    for row, length in enumerate(lengths):
        mask[row, ..., : longest - length] = -np.inf
    return mx.array(mask, dtype=dtype)


def _masked_block(
    block: Any, x: Any, pos_enc: Any, cache: Any, mask: Any, conv_cache: Any, conv_left: int
) -> tuple[Any, Any, Any]:
    """One conformer block's streaming step over rows whose attention caches were
    left-padded to one length (``cache``; ``mask`` hides the padding): the order of
    operations of mlx-audio's streaming block (so every real value is computed as it
    is alone), with a key mask in its self-attention. Returns the block's output, the
    padded keys window (cache and new frames) and the new convolution caches."""

    residual = x + 0.5 * block.feed_forward1(block.norm_feed_forward1(x))
    normed = block.norm_self_att(residual)
    window = mx.concatenate([cache, normed], axis=1)
    pos_emb = pos_enc.pos_emb_for(window.shape[1], x.dtype)
    residual = residual + _masked_attention(block.self_attn, normed, window, pos_emb, mask)
    conv = block.conv
    gated = glu(conv.pointwise_conv1(block.norm_conv(residual)), axis=-1)
    conv_in = mx.concatenate([conv_cache, gated], axis=1)
    y = conv.activation(conv.batch_norm(conv.depthwise_conv(conv_in)))
    residual = residual + conv.pointwise_conv2(y)
    residual = residual + 0.5 * block.feed_forward2(block.norm_feed_forward2(residual))
    return block.norm_out(residual), window, conv_in[:, -conv_left:]


def _masked_attention(attn: Any, x: Any, window: Any, pos_emb: Any, mask: Any) -> Any:
    """The conformer's relative-position self-attention of the new frames ``x`` over
    ``window`` (padded cache and new frames), its position scores plus ``mask``: the
    streaming attention's arithmetic, with padded keys weighted exactly zero."""

    rows, chunk, _ = x.shape
    keys = window.shape[1]
    heads, width = attn.n_head, attn.head_dim
    q = attn.linear_q(x).reshape(rows, chunk, heads, width)
    k = attn.linear_k(window).reshape(rows, keys, heads, width).transpose(0, 2, 1, 3)
    v = attn.linear_v(window).reshape(rows, keys, heads, width).transpose(0, 2, 1, 3)
    p = attn.linear_pos(pos_emb)
    p = p.reshape(1, p.shape[1], heads, width).transpose(0, 2, 1, 3)
    q_u = (q + attn.pos_bias_u).transpose(0, 2, 1, 3)
    q_v = (q + attn.pos_bias_v).transpose(0, 2, 1, 3)
    position = attn.rel_shift(mx.matmul(q_v, p.swapaxes(-2, -1)))[:, :, :, :keys] * attn.scale
    out = mx.fast.scaled_dot_product_attention(q_u, k, v, scale=attn.scale, mask=position + mask)
    return attn.linear_out(out.transpose(0, 2, 1, 3).reshape(rows, chunk, -1))


def stacked(parts: Sequence[Any], axis: int = 0) -> Any:
    """``parts`` as one batch (one part as it is: no copy in the graph)."""

    return parts[0] if len(parts) == 1 else mx.concatenate(list(parts), axis=axis)


def _row(batch: Any, position: int, rows: int) -> Any:
    """Row ``position`` of a batch of ``rows`` (a batch of one as it is)."""
    return batch if rows == 1 else batch[position : position + 1]
