"""A batch's per-layer state kept stacked between frame steps.

Without it every batched frame stacks each row's state for the step and splits it
back after (the language model's Mamba states, the attention caches of the language
model and of the TTS backbone left-padded and concatenated for every layer, the
codec's convolution caches). :class:`Resident` keeps, for the ordered rows of a
model's last batched frame, that state as the batched model computes with it: stacked
Mamba states, one :class:`BatchedKV` per attention layer (rows left-padded to the
longest, right-aligned on one write position, preallocated past it), stacked codec
caches and the conformer's caches (:class:`ConformerBatch`, stacked by the first
frame whose chunks all take the batched path). A next frame of the same rows reuses
it as it is; a row that joins is extended in, one that leaves is written back to its
own caches and filtered out (``extend`` / ``filter``, as mlx-lm's batch generation
does).

While a conversation is resident its own caches (``_language_cache``, ``_tts_cache``,
``_codec_cache`` on mlx-vlm's session, the attention and convolution caches of its
``_conformer_stream``) are stale: every path that reads them alone
(a solo frame, an inserted tool-response step, flush, cancel) calls :func:`release`
first, which writes its rows back exactly and drops them from the batch.

The layout is the one the per-step path builds (each row's entries in its own order,
zeros on the left, the same mask), so each row's output stays bit for bit its solo
run. A row that is not steady steps beside the batch, on its own caches, through the
per-step path (written back first if it was resident): its timeline has not started
(its first frame reads pad and speaks silence), its codec has not decoded yet (its
cache holds no layers), or the TTS's sliding window would wrap (``RotatingKVCache``
then reads its buffer in rotated order, which the left-padded layout does not keep:
past 7,500 steps, 10 minutes, a conversation steps beside the batch).

Memory: resident attention buffers hold every row at the longest row's length (plus
growth room of :data:`GROWTH` positions), so while batched a young conversation pays
for an old one's length in each attention layer; a row that leaves is written back at
its own length and the batch trimmed to its new longest row.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final

import attrs
import mlx.core as mx
from mlx_audio.codec.models.nemotron_voicechat import CausalConv1dCache
from mlx_vlm.models.cache import ArraysCache, KVCache

from realtime.models.voicechat.codes import PerModel
from realtime.models.voicechat.perception import ConformerBatch, stackable

GROWTH: Final = 256
"""Positions a resident attention buffer grows by when full (mlx-vlm's cache step)."""


@attrs.define(slots=True, eq=False)
class BatchedKV:
    """One attention layer's keys and values for a batch's rows, stacked.

    Rows are laid out as the batched model expects them: ``rows_each`` rows per
    conversation (the TTS: conditional, unconditional), all conversations' first rows,
    then all their second ones. Each conversation's entries end at ``width`` (one
    write position for all) and start ``width - lengths[j]`` in, zeros before them;
    ``make_mask`` masks those (None when no row is padded). ``offset`` is each row's
    own position (the TTS's RoPE).
    """

    keys: Any
    values: Any
    lengths: list[int]
    rows_each: int
    max_size: int | None
    width: int = attrs.field(init=False)
    _offset: Any = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.width = max(self.lengths)

    @classmethod
    def of(cls, caches: Sequence[Any], rows_each: int) -> BatchedKV:
        """Stacked from each conversation's own cache of this layer (entries in order:
        a plain cache, or a rotating one that has not wrapped)."""
        lengths = [int(cache.offset) for cache in caches]
        width = max(lengths)
        room = _room(width)
        parts_k: list[Any] = []
        parts_v: list[Any] = []
        for r in range(rows_each):
            for cache, n in zip(caches, lengths, strict=True):
                pad = [(0, 0), (0, 0), (width - n, room - width), (0, 0)]
                parts_k.append(mx.pad(cache.keys[r : r + 1, :, :n, :], pad))
                parts_v.append(mx.pad(cache.values[r : r + 1, :, :n, :], pad))
        return cls(
            mx.concatenate(parts_k, axis=0),
            mx.concatenate(parts_v, axis=0),
            lengths,
            rows_each,
            getattr(caches[0], "max_size", None),
        )

    @property
    def offset(self) -> Any:
        if self._offset is None:
            self._offset = mx.array(self.lengths * self.rows_each, dtype=mx.int32)
        return self._offset

    def fits(self, j: int) -> bool:
        """Conversation ``j``'s next position fits without a rotating cache wrapping."""
        return self.max_size is None or self.lengths[j] + 1 <= self.max_size

    def make_mask(self, n: int, **_: Any) -> Any:
        if n != 1:
            raise ValueError("batched frames step one position at a time")
        starts = [self.width - length for length in self.lengths]
        if not any(starts):
            return None
        positions = mx.arange(self.width + n)[None, :]
        first = mx.array(starts * self.rows_each)
        return (positions >= first[:, None])[:, None, None, :]

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        n = keys.shape[2]
        end = self.width + n
        if end > self.keys.shape[2]:
            grow = _room(end) - self.keys.shape[2]
            pad = [(0, 0), (0, 0), (0, grow), (0, 0)]
            self.keys = mx.pad(self.keys, pad)
            self.values = mx.pad(self.values, pad)
        self.keys[..., self.width : end, :] = keys
        self.values[..., self.width : end, :] = values
        self.width = end
        self.lengths = [length + n for length in self.lengths]
        self._offset = None
        return self.keys[..., :end, :], self.values[..., :end, :]

    def _rows(self, members: Sequence[int]) -> Any:
        count = len(self.lengths)
        return mx.array([j + r * count for r in range(self.rows_each) for j in members])

    def put(self, j: int, cache: Any) -> list[Any]:
        """Write conversation ``j``'s entries back to its own ``cache`` (as its own
        updates would have left them: entries in order, its offset); the new arrays."""
        n = self.lengths[j]
        start = self.width - n
        rows = self._rows([j])
        cache.keys = mx.contiguous(self.keys[rows, :, start : self.width, :])
        cache.values = mx.contiguous(self.values[rows, :, start : self.width, :])
        cache.offset = n
        if not isinstance(cache, KVCache):  # a rotating cache: its write index
            cache._idx = n
        return [cache.keys, cache.values]

    def filter(self, keep: Sequence[int]) -> None:
        """Keep conversations ``keep`` (in that order), trimmed to the longest of them."""
        rows = self._rows(keep)
        self.lengths = [self.lengths[j] for j in keep]
        trim = self.width - max(self.lengths)
        self.keys = self.keys[rows, :, trim:, :]
        self.values = self.values[rows, :, trim:, :]
        self.width -= trim
        self._offset = None

    def extend(self, other: BatchedKV) -> None:
        """Append ``other``'s conversations after these."""
        width = max(self.width, other.width)
        room = max(
            width + self.keys.shape[2] - self.width, width + other.keys.shape[2] - other.width
        )
        count, added = len(self.lengths), len(other.lengths)

        def laid(batch: BatchedKV, array: Any) -> Any:
            left = width - batch.width
            return mx.pad(array, [(0, 0), (0, 0), (left, room - left - array.shape[2]), (0, 0)])

        def merged(mine: Any, theirs: Any) -> Any:
            parts = []
            for r in range(self.rows_each):
                parts.append(mine[r * count : (r + 1) * count])
                parts.append(theirs[r * added : (r + 1) * added])
            return mx.concatenate(parts, axis=0)

        self.keys = merged(laid(self, self.keys), laid(other, other.keys))
        self.values = merged(laid(self, self.values), laid(other, other.values))
        self.lengths = self.lengths + other.lengths
        self.width = width
        self._offset = None


def _room(width: int) -> int:
    """A buffer length holding ``width`` positions and the next one, in GROWTH steps."""
    return (width // GROWTH + 1) * GROWTH


def stacked_states(caches: Sequence[Any]) -> Any:
    """One ArraysCache (a Mamba layer's conv and SSM states) with every row's (None
    for a slot no row has started yet: the layer starts it, for rows equally far)."""
    batch = ArraysCache(size=len(caches[0].cache))
    for slot in range(len(caches[0].cache)):
        states = [cache[slot] for cache in caches]
        batch[slot] = None if states[0] is None else mx.concatenate(states, axis=0)
    return batch


def stacked_codec(caches: Sequence[Any]) -> Any:
    """One codec cache with every row's entries (caches of one :func:`codec_layout`)."""
    batch = CausalConv1dCache()
    for name in caches[0].cache:
        batch.cache[name] = mx.concatenate([cache.cache[name] for cache in caches], axis=0)
    return batch


def codec_layout(cache: Any) -> tuple[Any, ...]:
    """Which layers a codec cache holds, with each entry's per-row shape (rows decode
    as one batch exactly when theirs are equal)."""
    return tuple(sorted((str(k), tuple(v.shape[1:])) for k, v in cache.cache.items()))


class Resident:
    """The rows of a model's last batched frame (mlx-vlm sessions, in batch order) with
    their language-model, TTS and codec state stacked (empty: no batch), and their
    conformer caches (``conformer``: stacked by the first frame whose chunks all take
    the batched path, None while they are each row's own)."""

    __slots__ = ("codec", "conformer", "inners", "language", "thread", "tts")

    def __init__(self) -> None:
        self.thread: int | None = None
        """The thread that steps it (:func:`residents`)."""
        self.inners: list[Any] = []
        self.language: list[Any] = []
        self.tts: list[BatchedKV] = []
        self.codec: Any = None
        self.conformer: ConformerBatch | None = None

    def arrange(self, inners: Sequence[Any]) -> tuple[list[int], int]:
        """Make the batch hold exactly the steady rows of ``inners`` (rows that left
        written back and filtered out, rows that joined extended in). Returns the order
        to step ``inners`` in (indices into it: the batch's rows first, in its order,
        then the rest, which step on their own caches) and how many lead it (0: none
        of ``inners`` is resident; a lone steady row is not a batch)."""
        layout = None if self.codec is None else codec_layout(self.codec)
        steady: list[Any] = []
        for inner in inners:
            held = [j for j, mine in enumerate(self.inners) if mine is inner]
            if held:
                if all(kv.fits(held[0]) for kv in self.tts):
                    steady.append(inner)
            elif self._steady(inner):
                own = codec_layout(inner._codec_cache)
                if layout is None:
                    layout = own
                if own == layout:
                    steady.append(inner)
        if len(steady) < 2:
            self.release(inners)
            return list(range(len(inners))), 0
        wanted = {id(inner) for inner in steady}
        self.release([inner for inner in self.inners if id(inner) not in wanted])
        resident = {id(inner) for inner in self.inners}
        joining = [inner for inner in steady if id(inner) not in resident]
        if joining:
            self._extend(joining)
        position = {id(inner): i for i, inner in enumerate(inners)}
        order = [position[id(inner)] for inner in self.inners]
        return order + [i for i in range(len(inners)) if id(inners[i]) not in wanted], len(order)

    def _steady(self, inner: Any) -> bool:
        """A row not resident can join: its timeline started, its codec decoded, its
        attention caches in order with room for the next position."""
        if inner._timeline_index == 0 or not inner._codec_cache.cache:
            return False
        language = inner._language_cache
        if any(
            any(state is None for state in layer.cache)
            for layer in language
            if isinstance(layer, ArraysCache)
        ):
            return False
        attention = [c for c in language if not isinstance(c, ArraysCache)]
        return all(
            int(layer.offset) > 0
            and (getattr(layer, "max_size", None) is None or layer.offset + 1 <= layer.max_size)
            for layer in [*inner._tts_cache, *attention]
        )

    def _extend(self, joining: Sequence[Any]) -> None:
        language: list[Any] = []
        for layer in range(len(joining[0]._language_cache)):
            caches = [inner._language_cache[layer] for inner in joining]
            if isinstance(caches[0], ArraysCache):
                language.append(stacked_states(caches))
            else:
                language.append(BatchedKV.of(caches, 1))
        tts = [
            BatchedKV.of([inner._tts_cache[layer] for inner in joining], 2)
            for layer in range(len(joining[0]._tts_cache))
        ]
        codec = stacked_codec([inner._codec_cache for inner in joining])
        streams = [inner._conformer_stream for inner in joining]
        if self.conformer is not None:
            if all(stackable(s) for s in streams):
                self.conformer.extend(ConformerBatch.of(streams))
            else:
                self.release_conformer()
        if not self.inners:
            self.inners, self.language, self.tts, self.codec = list(joining), language, tts, codec
            return
        for i, (mine, theirs) in enumerate(zip(self.language, language, strict=True)):
            if isinstance(mine, BatchedKV):
                mine.extend(theirs)
            else:
                self.language[i] = stacked_states([mine, theirs])
        for kv, added in zip(self.tts, tts, strict=True):
            kv.extend(added)
        self.codec = stacked_codec([self.codec, codec])
        self.inners.extend(joining)

    def release(self, inners: Sequence[Any]) -> None:
        """Write ``inners``' rows (those resident) back to their own caches and drop
        them from the batch (a batch left with one row is dropped whole)."""
        leaving = [j for j, held in enumerate(self.inners) if any(held is i for i in inners)]
        if not leaving:
            return
        if len(self.inners) - len(leaving) < 2:
            leaving = list(range(len(self.inners)))
        written: list[Any] = []
        for j in leaving:
            inner = self.inners[j]
            row = mx.array([j])  # a gather: a copy, not a view of the batch's buffer
            for mine, own in zip(self.language, inner._language_cache, strict=True):
                if isinstance(mine, BatchedKV):
                    written += mine.put(j, own)
                else:
                    for slot in range(len(mine.cache)):
                        own[slot] = mine[slot][row]
                        written.append(own[slot])
            for kv, own in zip(self.tts, inner._tts_cache, strict=True):
                written += kv.put(j, own)
            inner._codec_cache.cache = {
                name: value[row] for name, value in self.codec.cache.items()
            }
            written += list(inner._codec_cache.cache.values())
            if self.conformer is not None:
                written += self.conformer.put(j, inner._conformer_stream)
        # Computed now, off the host: a written-back row holds no view of the batch.
        mx.async_eval(written)  # type: ignore[no-untyped-call]
        if len(leaving) == len(self.inners):
            self.drop()
            return
        keep = [j for j in range(len(self.inners)) if j not in leaving]
        rows = mx.array(keep)
        for mine in self.language:
            if isinstance(mine, BatchedKV):
                mine.filter(keep)
            else:
                for slot in range(len(mine.cache)):
                    mine[slot] = mine[slot][rows]
        for kv in self.tts:
            kv.filter(keep)
        self.codec.cache = {name: value[rows] for name, value in self.codec.cache.items()}
        if self.conformer is not None:
            self.conformer.filter(keep)
        self.inners = [self.inners[j] for j in keep]

    def release_conformer(self) -> None:
        """Write every row's conformer caches back to its own streaming state (the rest
        of the batch stays stacked): a frame whose chunks cannot all take the batched
        path steps them per row."""
        if self.conformer is None:
            return
        written: list[Any] = []
        for j, inner in enumerate(self.inners):
            written += self.conformer.put(j, inner._conformer_stream)
        mx.async_eval(written)  # type: ignore[no-untyped-call]
        self.conformer = None

    def drop(self) -> None:
        """Forget the batch (its rows' own caches are whatever was last written)."""
        self.inners, self.language, self.tts, self.codec = [], [], [], None
        self.conformer = None


_residents: Final = PerModel(lambda _model: Resident())


def residents(model: Any) -> Resident:
    """``model``'s resident batch. One engine thread steps a model; a batch another
    thread left (an engine that stopped: tests start many on one loaded model) is
    forgotten, not written back: MLX evaluates an array only on a thread with the
    stream it was made on, and that engine's sessions are gone with it."""
    resident = _residents(model)
    thread = threading.get_ident()
    if resident.thread != thread:
        resident.drop()
        resident.thread = thread
    return resident


def release(inner: Any) -> None:
    """Before a path reads ``inner``'s own caches alone: its rows written back."""
    residents(inner.model).release([inner])
