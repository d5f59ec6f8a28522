"""The frame batch: the state of the rows a batched frame step runs, kept stacked.

Every stage of the frame step computes over all its rows at once, so their state must
be laid out as one batch: the language model's Mamba states stacked, each attention
layer's keys and values (language model: B rows; TTS: 2B, conditional then
unconditional) with rows of different lengths left-padded to one write position and
masked, the codec's convolution caches stacked, and the conformer's caches
(:class:`~realtime.models.voicechat.perception.ConformerBatch`). A :class:`FrameBatch`
holds that layout for its rows between frames, so a next frame of the same rows reuses
it as it is.

Each part of it has one small protocol (:class:`Part`, as mlx-lm's batch caches have):
it is built from the rows' own caches (``merge``), writes one row back to its own cache
as that row's own steps would have left it (``extract``), keeps some rows
(``filter``) and takes more after its own (``extend``). :meth:`FrameBatch.arrange`
makes the batch hold a frame's rows with exactly those four.

The batch's owner is its rows: each conversation's :class:`Seat` (one per session,
:mod:`realtime.models.voicechat.row`) says which batch holds it, and no one else can
reach the batch (a batch whose rows are gone is garbage). While a conversation is in a
batch its own caches (``_language_cache``, ``_tts_cache``, ``_codec_cache`` on
mlx-vlm's session, the caches of its ``_conformer_stream``) are stale: every path that
reads them alone (a solo frame, an inserted tool-response step, flush, cancel) calls
:meth:`Seat.release` first, which writes its rows back exactly and drops them.

Every row of a batched frame is a row of its batch, whatever its age, so each stage
runs once a frame. The layout is the one each row's own caches give it, entries in the
same order, zeros masked where the row has none, so each row's output stays bit for
bit its solo run (tests/models/voicechat/test_batch.py, tests/models/voicechat/test_step.py). A
conversation's first frame joins with the states it has before anything ran: no
attention entry, zero Mamba and codec states (:func:`_stack`: read as not started),
the conformer's as :func:`~realtime.models.voicechat.perception.fresh` says; its TTS
state joins on its second frame (``FrameBatch.voices``: a first frame has no TTS step).
A row whose TTS window (a ``RotatingKVCache`` of 7,500 steps, 10 minutes) has wrapped
keeps its window in the batch as its own cache keeps it (rotated, written in place at
its own index), masked around: a long conversation stays batched.

Memory: attention buffers hold every row at the longest row's length (plus growth room
of :data:`GROWTH` positions), so while batched a young conversation pays for an old
one's length in each attention layer; a row that leaves is written back at its own
length and the batch trimmed to what its other rows use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import mlx.core as mx
import numpy as np
from mlx_audio.codec.models.nemotron_voicechat import CausalConv1dCache
from mlx_vlm.models.cache import ArraysCache, KVCache

from realtime.models.voicechat.perception import ConformerBatch, fresh, stackable, taken

if TYPE_CHECKING:
    from realtime.models.voicechat.row import Seat

GROWTH: Final = 256
"""Positions an attention buffer grows by when full (mlx-vlm's cache step)."""


class Part(Protocol):
    """One piece of a batch's state (an attention layer, a Mamba layer, the codec's
    caches, the conformer's), rows in batch order; the model reads its ``view``."""

    @property
    def view(self) -> Any:
        """The cache object the model's layer reads and advances."""
        ...

    def extract(self, j: int, own: Any) -> list[Any]:
        """Write row ``j`` back to its own cache ``own``, as its own steps would have
        left it; the arrays written (gathers: copies, no view of the batch's buffer)."""
        ...

    def filter(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep``, in that order."""
        ...

    def extend(self, other: Any) -> None:
        """Append ``other``'s rows (a part of the same kind) after these."""
        ...


@attrs.define(slots=True, eq=False)
class PaddedKV:
    """One attention layer's keys and values for several rows, left-padded and masked.

    Rows are laid out as the batched model expects them: ``rows_each`` rows per
    conversation (the TTS: conditional, unconditional), all conversations' first rows,
    then all their second ones. A conversation's entries are in the order its own
    cache returns them: up to the window, in time order, ending at ``width`` (one write
    position for all such rows); once a rotating window has wrapped, its ``window``
    entries rotated as its own buffer holds them, from column ``starts[j]``, the next
    written in place at ``cursors[j]`` into it. :meth:`make_mask` masks every other
    column (None when no row has one). ``offset`` is each row's own position (the
    TTS's RoPE).
    """

    keys: Any
    values: Any
    offsets: list[int]
    """Each conversation's position (its own cache's ``offset``)."""
    starts: list[int]
    """The column of each conversation's first entry."""
    cursors: list[int]
    """Where each wrapped conversation writes next, into its window (0 otherwise)."""
    rows_each: int
    window: int | None
    """A rotating cache's size (None: a plain cache, never wraps)."""
    width: int
    _offset: Any = attrs.field(default=None, init=False)

    @property
    def view(self) -> PaddedKV:
        """The attention layer reads this object itself (``make_mask``,
        ``update_and_fetch``, ``offset``)."""
        return self

    @classmethod
    def merge(cls, caches: Sequence[Any], rows_each: int) -> PaddedKV:
        """Stacked from each conversation's own cache of this layer."""
        window = getattr(caches[0], "max_size", None)
        if any(getattr(cache, "keep", 0) for cache in caches):
            raise ValueError("a rotating cache that keeps its first entries cannot be batched")
        kept = [_entries(cache, window) for cache in caches]
        width = max(len_ for _, _, len_, _ in kept)
        return cls(
            _stacked([k for k, _, _, _ in kept], width, rows_each),
            _stacked([v for _, v, _, _ in kept], width, rows_each),
            [int(cache.offset) for cache in caches],
            [width - n for _, _, n, _ in kept],
            [cursor for _, _, _, cursor in kept],
            rows_each,
            window,
            width,
        )

    def _wrapped(self, j: int) -> bool:
        return self.window is not None and self.offsets[j] >= self.window

    def _end(self, j: int) -> int:
        """The column after conversation ``j``'s last entry."""
        return self.starts[j] + self._size if self._wrapped(j) else self.width

    @property
    def _size(self) -> int:
        """The window's size (0: a plain cache)."""
        return self.window or 0

    @property
    def offset(self) -> Any:
        if self._offset is None:
            self._offset = mx.array(self.offsets * self.rows_each, dtype=mx.int32)
        return self._offset

    def make_mask(self, n: int, **_: Any) -> Any:
        if n != 1:
            raise ValueError("batched frames step one position at a time")
        count = len(self.offsets)
        growing = not all(self._wrapped(j) for j in range(count))
        after = self.width + growing
        spans = [(self.starts[j], self._end(j) + (not self._wrapped(j))) for j in range(count)]
        if all(span == (0, after) for span in spans):
            return None
        mask = np.zeros((count, after), dtype=np.bool_)
        for j, (first, end) in enumerate(spans):
            mask[j, first:end] = True
        return mx.array(np.tile(mask, (self.rows_each, 1)))[:, None, None, :]

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        count = len(self.offsets)
        wrapped = [self._wrapped(j) for j in range(count)]
        end = self.width + (not all(wrapped))
        if self.keys is None:  # no row has an entry yet: shaped by the first
            self.keys = mx.zeros((*keys.shape[:2], _room(0), keys.shape[3]), keys.dtype)
            self.values = mx.zeros((*values.shape[:2], _room(0), values.shape[3]), values.dtype)
        if end > self.keys.shape[2]:
            self._compact()
            end = self.width + (not all(wrapped))
        if end > self.keys.shape[2]:
            grow = _room(end) - self.keys.shape[2]
            pad = [(0, 0), (0, 0), (0, grow), (0, 0)]
            self.keys = mx.pad(self.keys, pad)
            self.values = mx.pad(self.values, pad)
        if not any(wrapped):
            self.keys[..., self.width : end, :] = keys
            self.values[..., self.width : end, :] = values
        else:
            self._write_each(keys, values, wrapped)
        for j in range(count):
            self.offsets[j] += 1
            if not wrapped[j]:
                continue
            self.cursors[j] = self.cursors[j] % self._size + 1
        self.width = end
        for j in range(count):  # a conversation whose window just filled
            if self._wrapped(j) and not wrapped[j]:
                self.starts[j], self.cursors[j] = end - self._size, self._size
        self._offset = None
        return self.keys[..., :end, :], self.values[..., :end, :]

    def _compact(self) -> None:
        """Every conversation's entries moved right-aligned on the longest's (a wrapped
        window whole, in its order): the columns that wrapped windows left behind them
        (a window stays where it was when it filled, while younger rows grow the
        buffer) go. Run when the buffer would grow or rows join, and only when that frees
        columns (never for a plain cache, whose rows all end at ``width``)."""
        if self.keys is None:
            return
        count = len(self.offsets)
        spans = [(self.starts[j], self._end(j)) for j in range(count)]
        width = max(end - start for start, end in spans)
        if width >= self.width:
            return
        room = _room(width)

        def laid(array: Any) -> Any:
            parts = []
            for r in range(self.rows_each):
                for j, (start, end) in enumerate(spans):
                    row = array[j + r * count : j + r * count + 1, :, start:end, :]
                    pad = [(0, 0), (0, 0), (width - (end - start), room - width), (0, 0)]
                    parts.append(mx.pad(row, pad))
            return mx.concatenate(parts, axis=0)

        self.keys, self.values = laid(self.keys), laid(self.values)
        self.starts = [width - (end - start) for start, end in spans]
        self.width = width

    def _write_each(self, keys: Any, values: Any, wrapped: list[bool]) -> None:
        """Each row's new entry at its own column (one scatter): a wrapped window's in
        place at its cursor (the next after its last, rotating), the others' at the
        write position."""
        columns = [
            self.starts[j] + self.cursors[j] % self._size if wrapped[j] else self.width
            for j in range(len(self.offsets))
        ]
        at = mx.array(np.array(columns * self.rows_each, dtype=np.int32).reshape(-1, 1, 1, 1))
        self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(at, keys.shape), keys, axis=2)
        self.values = mx.put_along_axis(
            self.values, mx.broadcast_to(at, values.shape), values, axis=2
        )

    def _rows(self, members: Sequence[int]) -> Any:
        count = len(self.offsets)
        return mx.array([j + r * count for r in range(self.rows_each) for j in members])

    def extract(self, j: int, own: Any) -> list[Any]:
        if self.keys is None:  # no entry yet: its own cache is as empty
            return []
        start, end = self.starts[j], self._end(j)
        rows = self._rows([j])
        own.keys = mx.contiguous(self.keys[rows, :, start:end, :])
        own.values = mx.contiguous(self.values[rows, :, start:end, :])
        own.offset = self.offsets[j]
        if not isinstance(own, KVCache):  # a rotating cache: its write index
            own._idx = self.cursors[j] if self._wrapped(j) else end - start
        return [own.keys, own.values]

    def filter(self, keep: Sequence[int]) -> None:
        """Keep conversations ``keep`` (in that order), trimmed to the columns they use."""
        if self.keys is None:  # no entry yet
            self.offsets = [self.offsets[j] for j in keep]
            self.cursors, self.starts = [0] * len(keep), [0] * len(keep)
            return
        count = len(self.offsets)
        rows = [j + r * count for r in range(self.rows_each) for j in keep]
        ends = [self._end(j) for j in keep]
        self.offsets = [self.offsets[j] for j in keep]
        self.cursors = [self.cursors[j] for j in keep]
        self.starts = [self.starts[j] for j in keep]
        first, last = min(self.starts), max(ends)
        self.keys = taken(self.keys, rows)[:, :, first:, :]
        self.values = taken(self.values, rows)[:, :, first:, :]
        self.starts = [start - first for start in self.starts]
        self.width = last - first
        self._offset = None

    def _shape_by(self, keys: Any, values: Any) -> None:
        """Give a part whose rows have no entry yet an empty buffer shaped as another's."""
        if self.keys is not None or keys is None:
            return
        rows = self.rows_each * len(self.offsets)
        self.keys = mx.zeros((rows, keys.shape[1], _room(self.width), keys.shape[3]), keys.dtype)
        self.values = mx.zeros(
            (rows, values.shape[1], _room(self.width), values.shape[3]), values.dtype
        )

    def extend(self, other: PaddedKV) -> None:
        """Append ``other``'s conversations after these."""
        if other.keys is None and self.keys is not None and self.rows_each == 1:
            self._extend_empty(other)
            return
        self._shape_by(other.keys, other.values)
        other._shape_by(self.keys, self.values)
        if self.keys is None:  # no row of either has an entry yet
            self.offsets, self.cursors = self.offsets + other.offsets, self.cursors + other.cursors
            self.starts = [0] * len(self.offsets)
            return
        self._compact()
        width = max(self.width, other.width)
        room = max(
            width + self.keys.shape[2] - self.width, width + other.keys.shape[2] - other.width
        )
        count, added = len(self.offsets), len(other.offsets)

        def laid(batch: PaddedKV, array: Any) -> Any:
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
        self.starts = [s + width - self.width for s in self.starts] + [
            s + width - other.width for s in other.starts
        ]
        self.offsets = self.offsets + other.offsets
        self.cursors = self.cursors + other.cursors
        self.width = width
        self._offset = None

    def _extend_empty(self, other: PaddedKV) -> None:
        """Append conversations with no entry yet: rows of zeros (one pad per array, as
        :meth:`extend` would lay them out), their first entry at the write position."""
        self._compact()
        added = len(other.offsets)
        pad = [(0, added), (0, 0), (0, 0), (0, 0)]
        self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)
        self.starts = self.starts + [self.width] * added
        self.offsets = self.offsets + other.offsets
        self.cursors = self.cursors + other.cursors
        self._offset = None


def _stacked(entries: Sequence[Any], width: int, rows_each: int) -> Any:
    """Conversations' ``entries`` (rows_each, heads, length, dim) as one buffer: each
    right-aligned on ``width`` (zeros before it, room after it), conversations' first
    rows, then their second ones; None when none has an entry (an empty row: None)."""
    shaped = next((e for e in entries if e is not None), None)
    if shaped is None:
        return None
    room = _room(width)
    empty = mx.zeros((rows_each, shaped.shape[1], 0, shaped.shape[3]), shaped.dtype)
    parts = []
    for r in range(rows_each):
        for e in entries:
            e = empty if e is None else e
            pad = [(0, 0), (0, 0), (width - e.shape[2], room - width), (0, 0)]
            parts.append(mx.pad(e[r : r + 1], pad))
    return mx.concatenate(parts, axis=0)


def _entries(cache: Any, window: int | None) -> tuple[Any, Any, int, int]:
    """A cache's entries as its next single-position step reads them (its keys, its
    values, how many, and a wrapped window's cursor, else 0): a plain cache's or an
    unwrapped window's in time order; a wrapped window's as its buffer holds them (a
    buffer a longer update left past the window trimmed to its last ``window``, in
    time order, as that step trims it)."""
    n = int(cache.offset)
    if cache.keys is None:
        return None, None, 0, 0
    if window is None or n < window:
        return cache.keys[..., :n, :], cache.values[..., :n, :], n, 0
    keys, values, cursor = cache.keys, cache.values, int(cache._idx)
    if keys.shape[2] > window:
        keys, values, cursor = keys[..., -window:, :], values[..., -window:, :], window
    return keys, values, window, cursor


def _room(width: int) -> int:
    """A buffer length holding ``width`` positions and the next one, in GROWTH steps."""
    return (width // GROWTH + 1) * GROWTH


def _stack(groups: Sequence[tuple[Any, int]]) -> Any:
    """Groups of rows' arrays (array, rows) stacked on the first axis; a group with
    none (its state not started yet) as zeros, which every state stacked here reads as
    not started (mlx-vlm's Mamba layer starts its convolution state as zeros and adds
    its SSM state's exact zero terms; mlx-audio's codec starts a cache as zeros); None
    when no group has one."""
    like = next((array for array, _ in groups if array is not None), None)
    if like is None:
        return None
    if len(groups) == 2 and groups[0][0] is not None and groups[1][0] is None:
        # Rows not started after the others: one pad (zeros) instead of zeros + concat.
        return mx.pad(like, [(0, groups[1][1])] + [(0, 0)] * (like.ndim - 1))
    return mx.concatenate(
        [
            mx.zeros((rows, *like.shape[1:]), like.dtype) if array is None else array
            for array, rows in groups
        ],
        axis=0,
    )


class StackedStates:
    """A Mamba layer's conv and SSM states for ``count`` rows, stacked in ``view`` (an
    ``ArraysCache``; a slot no row has started yet is None: the layer starts it)."""

    __slots__ = ("count", "view")

    def __init__(self, view: Any, count: int) -> None:
        self.view = view
        self.count = count

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> StackedStates:
        view = ArraysCache(size=len(caches[0].cache))
        for slot in range(len(caches[0].cache)):
            view[slot] = _stack([(cache[slot], 1) for cache in caches])
        return cls(view, len(caches))

    def extract(self, j: int, own: Any) -> list[Any]:
        row = mx.array([j])
        written: list[Any] = []
        for slot, state in enumerate(self.view.cache):
            own[slot] = None if state is None else state[row]
            written += [] if state is None else [own[slot]]
        return written

    def filter(self, keep: Sequence[int]) -> None:
        self.view.cache = [
            None if state is None else taken(state, keep) for state in self.view.cache
        ]
        self.count = len(keep)

    def extend(self, other: StackedStates) -> None:
        self.view.cache = [
            _stack([(mine, self.count), (theirs, other.count)])
            for mine, theirs in zip(self.view.cache, other.view.cache, strict=True)
        ]
        self.count += other.count


class StackedCodec:
    """The codec's streaming caches for ``count`` rows, stacked layer by layer in
    ``view`` (a ``CausalConv1dCache``; a row whose codec has not decoded yet holds no
    layer, and joins as zeros)."""

    __slots__ = ("count", "view")

    def __init__(self, view: Any, count: int) -> None:
        self.view = view
        self.count = count

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> StackedCodec:
        view = CausalConv1dCache()
        for name in {name: None for cache in caches for name in cache.cache}:
            view.cache[name] = _stack([(cache.cache.get(name), 1) for cache in caches])
        return cls(view, len(caches))

    def extract(self, j: int, own: Any) -> list[Any]:
        row = mx.array([j])
        own.cache = {name: value[row] for name, value in self.view.cache.items()}
        return list(own.cache.values())

    def filter(self, keep: Sequence[int]) -> None:
        self.view.cache = {name: taken(value, keep) for name, value in self.view.cache.items()}
        self.count = len(keep)

    def extend(self, other: StackedCodec) -> None:
        mine, theirs = self.view.cache, other.view.cache
        self.view.cache = {
            name: _stack([(mine.get(name), self.count), (theirs.get(name), other.count)])
            for name in {**mine, **theirs}
        }
        self.count += other.count


def language_part(caches: Sequence[Any]) -> Part:
    """One language-model layer's part: Mamba states stacked, attention padded."""
    if isinstance(caches[0], ArraysCache):
        return StackedStates.merge(caches)
    return PaddedKV.merge(caches, 1)


def owned(inner: Any) -> list[Any]:
    """A conversation's own caches, in the order of :meth:`FrameBatch.parts`: the
    language model's layers, then the codec's."""
    return [*inner._language_cache, inner._codec_cache]


class FrameBatch:
    """The rows of a batched frame (their :class:`Seat` s, in batch order) with their
    language-model and codec state stacked (empty: no row), the TTS state of those whose
    timeline has started (``voices``, in the TTS's own order: a conversation's first
    frame has no TTS step, so it joins the TTS on its second), and their conformer
    caches (``conformer``: stacked by the first frame whose chunks all take the
    batched path, None while they are each row's own)."""

    __slots__ = ("codec", "conformer", "language", "seats", "tts", "voices")

    def __init__(self) -> None:
        self.seats: list[Seat] = []
        self.language: list[Part] = []
        self.codec: StackedCodec | None = None
        self.voices: list[Seat] = []
        self.tts: list[PaddedKV] = []
        self.conformer: ConformerBatch | None = None

    def views(self, parts: Sequence[Part]) -> list[Any]:
        """What the model reads of ``parts`` (one of this batch's lists)."""
        return [part.view for part in parts]

    @property
    def codec_view(self) -> Any:
        """What the codec reads (its stacked caches)."""
        assert self.codec is not None
        return self.codec.view

    @property
    def inners(self) -> list[Any]:
        """The rows' mlx-vlm sessions, in batch order."""
        return [seat.inner for seat in self.seats]

    def parts(self) -> list[Part]:
        """The parts over every row, in the order of :func:`owned`."""
        return [*self.language, *([] if self.codec is None else [self.codec])]

    def arrange(self, seats: Sequence[Seat]) -> list[int] | None:
        """Make the batch hold exactly the rows of ``seats`` (rows that left written
        back and filtered out, rows that joined extended in, rows whose timeline has
        started in the TTS). Returns the order to step ``seats`` in (indices into it,
        the batch's order), or None when they are not a batch (one row, which then
        steps on its own caches)."""
        for seat in seats:
            if seat.batch is not None and seat.batch is not self:
                seat.release()
        self.release(self._leaving(seats))
        joining = [seat for seat in seats if seat.batch is not self]
        if len(self.seats) + len(joining) < 2:
            self.release(self.seats)
            return None
        if joining:
            self._join(joining)
        self._voice()
        position = {id(seat): i for i, seat in enumerate(seats)}
        return [position[id(seat)] for seat in self.seats]

    def _leaving(self, seats: Sequence[Seat]) -> list[Seat]:
        stepping = {id(seat) for seat in seats}
        return [seat for seat in self.seats if id(seat) not in stepping]

    def _join(self, joining: Sequence[Seat]) -> None:
        inners = [seat.inner for seat in joining]
        owns = [owned(inner) for inner in inners]
        language = [language_part([own[k] for own in owns]) for k in range(len(owns[0]) - 1)]
        codec = StackedCodec.merge([own[-1] for own in owns])
        self._join_conformer([inner._conformer_stream for inner in inners])
        if self.codec is None:
            self.language, self.codec = language, codec
        else:
            for mine, theirs in zip(self.parts(), [*language, codec], strict=True):
                mine.extend(theirs)
        self.seats.extend(joining)
        for seat in joining:
            seat.batch = self

    def _join_conformer(self, streams: Sequence[Any]) -> None:
        if self.conformer is None:
            return
        if all(fresh(s) for s in streams):
            self.conformer.extend_fresh(len(streams))
        elif all(stackable(s) for s in streams):
            self.conformer.extend(ConformerBatch.merge(streams, like=self.conformer))
        else:
            self.release_conformer()

    def _voice(self) -> None:
        """Rows whose timeline has started and whose TTS state is not held join the
        TTS's parts."""
        voiced = {id(seat) for seat in self.voices}
        joining = [
            seat for seat in self.seats if id(seat) not in voiced and seat.inner._timeline_index > 0
        ]
        if not joining:
            return
        owns = [seat.inner._tts_cache for seat in joining]
        added = [PaddedKV.merge([own[k] for own in owns], 2) for k in range(len(owns[0]))]
        if self.voices:
            for mine, theirs in zip(self.tts, added, strict=True):
                mine.extend(theirs)
        else:
            self.tts = added
        self.voices.extend(joining)

    def release(self, seats: Sequence[Seat]) -> None:
        """Write ``seats``' rows (those held) back to their own caches and drop them
        from the batch (a batch left with one row is dropped whole)."""
        leaving = [j for j, held in enumerate(self.seats) if any(held is s for s in seats)]
        if not leaving:
            return
        if len(self.seats) - len(leaving) < 2:
            leaving = list(range(len(self.seats)))
        gone = [self.seats[j] for j in leaving]
        written = [array for j in leaving for array in self._extract(j)]
        # Computed now, off the host: a written-back row holds no view of the batch.
        mx.async_eval(written)  # type: ignore[no-untyped-call]
        for seat in gone:
            seat.batch = None
        if len(leaving) == len(self.seats):
            self.drop()
            return
        keep = [j for j in range(len(self.seats)) if j not in leaving]
        for part in self.parts():
            part.filter(keep)
        if self.conformer is not None:
            self.conformer.filter(keep)
        self.seats = [self.seats[j] for j in keep]
        voices = [v for v, seat in enumerate(self.voices) if all(seat is not g for g in gone)]
        for kv in self.tts:
            kv.filter(voices)
        self.voices = [self.voices[v] for v in voices]

    def _extract(self, j: int) -> list[Any]:
        """Row ``j``'s state written back to its own caches; the arrays written."""
        seat = self.seats[j]
        inner = seat.inner
        written: list[Any] = []
        for part, own in zip(self.parts(), owned(inner), strict=True):
            written += part.extract(j, own)
        if self.conformer is not None:
            written += self.conformer.extract(j, inner._conformer_stream)
        voice = [v for v, held in enumerate(self.voices) if held is seat]
        for v in voice:
            for kv, own in zip(self.tts, inner._tts_cache, strict=True):
                written += kv.extract(v, own)
        return written

    def release_conformer(self) -> None:
        """Write every row's conformer caches back to its own streaming state (the rest
        of the batch stays stacked): a frame whose chunks cannot all take the batched
        path steps them per row."""
        if self.conformer is None:
            return
        written: list[Any] = []
        for j, inner in enumerate(self.inners):
            written += self.conformer.extract(j, inner._conformer_stream)
        mx.async_eval(written)  # type: ignore[no-untyped-call]
        self.conformer = None

    def drop(self) -> None:
        """Forget the batch (its rows' own caches are whatever was last written; a
        failed step's rows are failed with it)."""
        for seat in self.seats:
            seat.batch = None
        self.seats, self.language, self.codec = [], [], None
        self.voices, self.tts = [], []
        self.conformer = None
