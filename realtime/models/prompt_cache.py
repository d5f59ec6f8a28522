"""A byte-bounded, least-recently-used store of prompt states (no MLX, no I/O).

Opening a conversation reads its system prompt through the model one timeline step per
token. What that leaves behind is a pure function of the checkpoint, the prompt's
tokens and the seed, so a model keeps it here and a later opening with the same key
starts from a copy (:mod:`realtime.models.voicechat.prompt` holds the VoiceChat
state). The store only counts: what an entry is and how it is copied are the model's.

Every method runs on the engine thread but :meth:`PromptCache.figures`, which
``/health`` and ``/metrics`` read from the server's thread (a lock keeps the figures
consistent).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar, runtime_checkable

import attrs


@attrs.frozen(slots=True)
class CacheFigures:
    """What the cache holds and how it was used, since the model loaded."""

    max_bytes: int
    bytes: int
    entries: int
    hits: int
    """Openings that started from a stored prompt state."""
    misses: int
    """Openings that prefilled their prompt (or shared a prefill under way)."""
    shared: int
    """Of the misses, openings that joined another opening's prefill of the same prompt
    instead of running their own."""
    evictions: int
    """Entries dropped to stay within ``max_bytes`` (least recently used first)."""
    pinned_bytes: int = 0
    """Of ``bytes``, what :meth:`PromptCache.pin` keeps whatever later openings need
    (the warmed prompts)."""


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@attrs.define(slots=True)
class _Entry(Generic[V]):
    value: V
    nbytes: int
    pinned: bool = False


class PromptCache(Generic[K, V]):
    """Entries by key, at most ``max_bytes`` in all (0: nothing is kept). A new entry
    pushes out the least recently used ones until it fits; one larger than the whole
    bound is not kept. Pinned entries (:meth:`pin`) are never pushed out: an entry that
    fits only by evicting one is not kept, so no client's openings can evict the
    prompts an operator warmed for everyone."""

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self._max_bytes = max_bytes
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._shared = self._evictions = 0
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def get(self, key: K) -> V | None:
        """The entry for ``key`` (now the most recently used), or ``None``; not counted
        (:meth:`count` says how an opening went)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def count(self, *, hit: bool, shared: bool = False) -> None:
        """Count one opening: a hit, or a miss (``shared``: it joined a prefill)."""
        with self._lock:
            if hit:
                self._hits += 1
            else:
                self._misses += 1
                self._shared += int(shared)

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Keep ``value`` (``nbytes`` of memory) under ``key``, evicting the least
        recently used unpinned entries as needed (a pinned key stays pinned); False
        when it cannot fit beside the pinned entries, and then nothing changes."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            old = self._entries.get(key)
            pinned = old is not None and old.pinned
            kept = sum(e.nbytes for k, e in self._entries.items() if e.pinned and k != key)
            if kept + nbytes > self._max_bytes:
                return False
            if old is not None:
                del self._entries[key]
                self._bytes -= old.nbytes
            while self._bytes + nbytes > self._max_bytes:
                victim = next(k for k, e in self._entries.items() if not e.pinned)
                self._bytes -= self._entries.pop(victim).nbytes
                self._evictions += 1
            self._entries[key] = _Entry(value, nbytes, pinned)
            self._bytes += nbytes
            return True

    def pin(self) -> None:
        """Pin every entry held now (:class:`PromptCache`)."""
        with self._lock:
            for entry in self._entries.values():
                entry.pinned = True

    def held(self) -> list[K]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def figures(self) -> CacheFigures:
        with self._lock:
            return CacheFigures(
                max_bytes=self._max_bytes,
                bytes=self._bytes,
                entries=len(self._entries),
                hits=self._hits,
                misses=self._misses,
                shared=self._shared,
                evictions=self._evictions,
                pinned_bytes=sum(e.nbytes for e in self._entries.values() if e.pinned),
            )


@runtime_checkable
class CachesPrompts(Protocol):
    """A model that keeps prompt states (VoiceChat); ``/health`` and ``/metrics`` show
    its figures, and the server warms prompts into it before it says ready."""

    def prompt_cache_figures(self) -> CacheFigures: ...

    def set_prompt_cache_bytes(self, max_bytes: int) -> None:
        """Bound the cache (dropping what it holds); called before any session opens."""
        ...

    def pin_prompt_cache(self) -> None:
        """Keep what the cache holds now (the warmed prompts) whatever later openings
        need; called once warming is done, before any session opens."""
        ...


__all__ = ["CacheFigures", "CachesPrompts", "PromptCache"]
