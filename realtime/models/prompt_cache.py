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
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Final, Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs

PREFILL_ENV: Final = "REALTIME_PREFILL"
"""``--prefill`` as an environment setting (``step``, or ``sequence`` with an optional
``:N``, the chunk's tokens)."""

SEQUENCE_CHUNK_TOKENS: Final = 64
"""Prompt tokens one sequence-read slice reads in one forward pass, by default."""


@attrs.frozen(slots=True)
class PrefillRead:
    """How an opening reads its system prompt's language-model part (``--prefill``).

    ``step`` (the default): one language-model step a token, as mlx-vlm's constructor
    runs them, bit for bit. ``sequence``: ``chunk`` tokens in one forward pass a slice,
    as LLM servers read prompts (the prefill's language-model inputs never depend on its
    outputs, so nothing is lost but the last bits a different summation order leaves)."""

    mode: Literal["step", "sequence"] = "step"
    chunk: int = SEQUENCE_CHUNK_TOKENS
    """Tokens a slice reads in one pass (``sequence`` only)."""

    def __attrs_post_init__(self) -> None:
        if self.mode not in ("step", "sequence"):
            raise ValueError(f"the prefill read is 'step' or 'sequence', not {self.mode!r}")
        if not 1 <= self.chunk <= 4096:
            raise ValueError(f"the sequence read's chunk is 1..4096 tokens, not {self.chunk}")

    @property
    def sequence(self) -> bool:
        return self.mode == "sequence"

    @property
    def tag(self) -> str | None:
        """What its states are keyed by besides the prompt (``None``: the step read,
        whose keys and file names are as they always were); the chunk is part of it,
        since a state's last bits depend on where the chunks are cut."""
        return f"sequence-{self.chunk}" if self.sequence else None

    def describe(self) -> str:
        return f"sequence, {self.chunk} tokens a pass" if self.sequence else "step"


STEP_READ: Final = PrefillRead()
"""Today's read, a language-model step a token (the default)."""


def prefill_read_from(text: str | None) -> PrefillRead:
    """``step``, ``sequence`` or ``sequence:N`` (``None`` or blank: the default);
    ValueError (one line) otherwise."""
    value = (text or "").strip().lower()
    if not value or value == "step":
        return STEP_READ
    mode, _, chunk = value.partition(":")
    if mode != "sequence":
        raise ValueError(f"--prefill is 'step', 'sequence' or 'sequence:N', not {text!r}")
    if not chunk:
        return PrefillRead("sequence")
    try:
        tokens = int(chunk)
    except ValueError:
        raise ValueError(f"--prefill sequence:N needs a whole number N, not {chunk!r}") from None
    return PrefillRead("sequence", tokens)


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
    voice_chain_tokens: int = 0
    """Steps of the voice chain built ahead of need (the default seed's), held now."""
    building: bool = False
    """That chain is still being built, at idle priority, towards
    ``--max-system-prompt-tokens``."""
    ahead_seconds: float = 0.0
    """Engine time spent on work no opening waited for (building ahead, writing files)."""
    disk_max_bytes: int = 0
    """The state files' bound (``--state-cache-bytes``; 0: nothing on disk)."""
    disk_reads: int = 0
    """States read from their files and used."""
    disk_writes: int = 0
    disk_ignored: int = 0
    """State files found but not trusted (corrupt, or another checkpoint's or
    version's): each logged once and never used."""
    orphans: int = 0
    """Reads whose clients left, being finished at idle priority (so a retry hits)."""
    orphans_finished: int = 0
    orphans_dropped: int = 0
    """Of those, dropped: failed, or over their engine-time bound."""


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

    def pin(self, where: Callable[[K], bool] | None = None) -> None:
        """Pin every entry held now (:class:`PromptCache`), or those whose key ``where``
        accepts."""
        with self._lock:
            for key, entry in self._entries.items():
                if where is None or where(key):
                    entry.pinned = True

    def peek(self, key: K) -> V | None:
        """The entry for ``key`` without making it the most recently used."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.value

    def discard(self, key: K) -> None:
        """Drop ``key``'s entry, pinned or not (its holder could not keep it counted)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes

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


@runtime_checkable
class KeepsStates(Protocol):
    """A model whose prompt states outlive it (files) and are built ahead of need (the
    engine runs :meth:`ahead` when it has nothing else to do)."""

    def keep_states(
        self, directory: Path | None, max_bytes: int, *, ahead_seed: int, ahead_tokens: int
    ) -> None:
        """Keep prompt states in ``directory`` (``None``: not on disk), at most
        ``max_bytes``, and build ``ahead_seed``'s voice chain to ``ahead_tokens`` steps
        (0: none); called on the engine thread before any session opens."""
        ...

    def ahead(self, steps: int, quiet: bool) -> AheadSlice:
        """One slice of work no opening waits for: at most ``steps`` model steps, or,
        ``quiet`` (no conversation open), one state file written."""
        ...


@attrs.frozen(slots=True)
class AheadSlice:
    """What one slice of :meth:`KeepsStates.ahead` did."""

    steps: int
    """Model steps run (the engine's measure of what a step costs)."""
    more: bool
    """Whether work is left."""


__all__ = [
    "PREFILL_ENV",
    "STEP_READ",
    "AheadSlice",
    "CacheFigures",
    "CachesPrompts",
    "KeepsStates",
    "PrefillRead",
    "PromptCache",
    "prefill_read_from",
]
