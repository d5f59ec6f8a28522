"""VoiceChat's system-prompt prefill, kept and shared: the prompt-state cache.

mlx-vlm's streaming constructor (``VoiceChatStreamingSession._prefill_prompt``, mlx-vlm
0.7.10) embeds ``[bos, *prompt, eos]`` and runs one timeline step per token with
``generate_channels=False``: the language model reads
``embed(pad) + prompt[i] + w * embed(pad)`` (the previous text and function tokens are
pad throughout, since nothing is generated), and the TTS steps with the pad token and
its own previous code, drawing from the session's key. So the prefill leaves two parts
that depend on different things:

- the language part (the Nemotron-H caches) on the prompt's tokens alone;
- the voice part (the TTS caches and previous code, the key, the pad token histories,
  the timeline index) on the seed and the number of tokens alone.

The language part is kept per prompt. The voice part is kept per seed as one chain
(:class:`VoiceChain`): the TTS steps of the longest prefill run from that seed, every
key and value each step wrote, and each step's code and key, from which the voice part
of a prefill of any length up to the chain's is rebuilt exactly. A new prompt of a seed
whose chain is long enough runs only its language model's steps; a longer one also
extends the chain. Both kinds live in the model's
:class:`~realtime.models.prompt_cache.PromptCache`. Openings of the same prompt and
seed under way at once share one :class:`Prefill`.

Rebuilding a TTS cache exactly: mlx-vlm's TTS has plain ``KVCache`` layers (a prefix
of a longer run is the first entries of its buffer) and ``RotatingKVCache`` layers
(``sliding_window``; once full, a write lands over the oldest entry, and attention
reads the buffer in that rotated order). Rather than re-deriving either rule, a blank
cache of each kind is run through the same updates with each entry's position as its
value (:func:`layout`); the real keys and values are then gathered into those
positions (``mx.take``, an exact copy), which gives every buffer the shape, order,
zero tail and counters the cold run leaves (tests/test_prompt_cache.py holds the
rebuilt states to mlx-vlm's constructor, rotated windows included).

Copies are real copies (new array objects): mlx-vlm's caches grow by slice assignment
(``cache.keys[..., a:b, :] = ...``) on their own array objects, which never changes
another object's array (MLX updates a buffer in place only when nothing else holds
it), and nothing a session does after its open can reach a stored entry
(tests/test_prompt_cache.py runs hits after sessions that ran, were cancelled, closed
or failed).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs

from realtime.models.prompt_cache import PromptCache

if TYPE_CHECKING:
    from realtime.models.voicechat.keys import SessionKey

log = logging.getLogger("realtime.models.voicechat.model")

STEPS_PER_SLICE: Final = 4
"""Prefill steps run as one graph per opening slice: the steps are chained through the
caches, so evaluating four at once computes exactly the same values with a quarter of
the waits."""


@attrs.frozen(slots=True)
class LanguageKey:
    ids: tuple[int, ...]
    scope: str | None = None
    """Whose entry it is (a tenant's name); None: the shared scope (warmed prompts)."""


@attrs.frozen(slots=True)
class VoiceKey:
    seed: int
    scope: str | None = None


def scopes(scope: str | None) -> tuple[str | None, ...]:
    """Where an opening in ``scope`` may find stored parts: its own scope, then the
    shared one; never another tenant's, so no tenant learns from its openings' speed
    which prompts another one used."""
    return (scope, None) if scope is not None else (None,)


PromptKey = LanguageKey | VoiceKey


@attrs.frozen(slots=True, eq=False)
class LanguagePart:
    """The Nemotron-H caches after the prompt (never handed out: copied)."""

    cache: Any


@attrs.frozen(slots=True, eq=False)
class VoicePart:
    """The TTS side of a prefill of ``timeline_index`` steps, rebuilt for one opening
    (:meth:`VoiceChain.voice`): its cache is the opening's own."""

    tts_cache: Any
    previous_code: Any
    key: Any
    text_tokens: tuple[int, ...]
    function_tokens: tuple[int, ...]
    timeline_index: int


def arrays(value: Any) -> Iterator[Any]:
    """Every MLX array held in ``value`` (lists, tuples, dicts, cache objects)."""
    import mlx.core as mx

    if isinstance(value, mx.array):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from arrays(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from arrays(item)
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            yield from arrays(getattr(value, field.name))
    elif hasattr(value, "__dict__"):
        for item in vars(value).values():
            yield from arrays(item)


def nbytes(value: Any) -> int:
    return sum(int(a.nbytes) for a in arrays(value))


def put_language(part: LanguagePart, inner: Any) -> None:
    inner._language_cache = copy.deepcopy(part.cache)


def put_voice(part: VoicePart, inner: Any, key: SessionKey) -> None:
    """Hand a rebuilt voice part to a session (its cache is already the session's own;
    the code and key are the chain's immutable arrays, copied all the same)."""
    inner._tts_cache = part.tts_cache
    inner._previous_code = copy.deepcopy(part.previous_code)
    key._key = copy.deepcopy(part.key)
    inner._text_tokens = list(part.text_tokens)
    inner._function_tokens = list(part.function_tokens)
    inner._timeline_index = part.timeline_index


def construct(
    runtime: Any, seed: int, max_streaming_seconds: float | None, profile: bool
) -> tuple[Any, SessionKey]:
    """mlx-vlm's streaming session with a blank prompt (seed, voice warm-up), drawing
    from a new key of its own (:mod:`realtime.models.voicechat.keys`)."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.keys import SessionKey, drawing_from, install_voicechat

    install_voicechat()
    key = SessionKey(seed)
    with drawing_from(key):
        inner = VoiceChatStreamingSession(
            runtime,
            system_prompt="",
            seed=seed,
            max_streaming_seconds=max_streaming_seconds,
            profile=profile,
        )
    return inner, key


def prompt_ids(runtime: Any, text: str) -> list[int]:
    """The prefill's tokens, as ``_prefill_prompt`` builds them; empty for a blank text."""
    if not text.strip():
        return []
    config = runtime.model.config
    return [
        config.bos_token_id,
        *runtime.tokenizer.encode(text, add_special_tokens=False),
        config.eos_token_id,
    ]


def layout(blank: Any, warm: int, steps: int) -> Any:
    """``blank`` (a new cache layer of mlx-vlm's) after the warm-up's one update of
    ``warm`` entries and ``steps`` one-entry updates, each entry's value its position
    in the run counted from 1: its buffer says where each entry sits (0: a zero)."""
    import mlx.core as mx

    run = mx.arange(1, warm + 1, dtype=mx.int32).reshape(1, 1, warm, 1)
    blank.update_and_fetch(run, run)
    for step in range(steps):
        entry = mx.full((1, 1, 1, 1), warm + 1 + step, dtype=mx.int32)
        blank.update_and_fetch(entry, entry)
        if step % 256 == 255:
            mx.eval(blank.keys)
    mx.eval(blank.keys)
    return blank


class VoiceChain:
    """The TTS side of the prefill from one seed, run once as far as its longest prompt
    and read back at any length (:meth:`voice`).

    A prefill's TTS step is the same whatever the prompt says: the pad token, the
    previous code, the session's key. The chain records what each step wrote into each
    cache layer (by wrapping its own layers' ``update_and_fetch``) and each step's code
    and key, so a prefill of ``n`` steps is rebuilt from the warm-up's entries plus the
    first ``n - 1`` steps' (the timeline's first step has no TTS step)."""

    def __init__(self, runtime: Any, seed: int) -> None:
        import mlx.core as mx

        inner, key = construct(runtime, seed, None, False)
        self.seed = seed
        self.steps = 0
        """Prefill steps run (the longest prompt it can rebuild)."""
        self.failed = False
        self._tts = inner.model.tts_model.tts_model
        self._pad: int = inner.config.pad_token_id
        self._key = key
        cache = list(inner._tts_cache)
        (self._warm,) = {int(layer.offset) for layer in cache}  # one warm-up run
        self._start = [tuple(layer.state) for layer in cache]
        mx.eval(*arrays(self._start))
        self._written: list[tuple[list[Any], list[Any]]] = [([], []) for _ in cache]
        self._kinds = [_kind(cache, index) for index in range(len(cache))]
        self._cache: list[Any] | None = None
        self._running(cache)
        self._codes = [inner._previous_code]
        self._keys = [key._key]
        self._layouts: dict[tuple[int, int], Any] = {}
        self._bytes = nbytes(self._start) + nbytes(self._codes) + nbytes(self._keys)
        inner.cancel()

    @property
    def nbytes(self) -> int:
        """What it holds: warm-up entries, every step's entries, codes and keys (and its
        running cache until :meth:`settle`)."""
        return self._bytes + nbytes(self._cache)

    def settle(self) -> None:
        """Drop the running cache (it repeats the entries recorded): a later
        :meth:`extend` rebuilds it from them, exactly."""
        if self.steps > 0:
            self._cache = None

    def _running(self, cache: list[Any]) -> list[Any]:
        """``cache`` made the chain's running cache, each layer's writes recorded."""
        for layer, written in zip(cache, self._written, strict=True):
            layer.update_and_fetch = _recording(layer.update_and_fetch, written)
        self._cache = cache
        return cache

    def extend(self, steps: int, most: int = STEPS_PER_SLICE) -> None:
        """Run up to ``most`` more steps towards ``steps`` as one graph."""
        import mlx.core as mx

        from realtime.models.voicechat.keys import drawing_from

        if self.failed:
            raise RuntimeError("this voice chain failed part way and is not used again")
        first, end = self.steps, min(steps, self.steps + most)
        if end <= first:
            return
        cache = self._cache
        if cache is None:
            cache = self._running(list(self.voice(first).tts_cache))
        before = [len(keys) for keys, _ in self._written]
        try:
            with drawing_from(self._key):
                for step in range(first, end):
                    code = self._codes[-1]
                    if step > 0:
                        current = mx.array([[self._pad]], dtype=mx.int32)
                        code = self._tts.step(
                            code,
                            current,
                            mx.ones(current.shape, dtype=mx.bool_),
                            cache,
                            guidance=True,
                        ).codes
                    self._codes.append(code)
                    self._keys.append(self._key._key)
            new = [
                array
                for (keys, values), start in zip(self._written, before, strict=True)
                for array in (*keys[start:], *values[start:])
            ]
            mx.eval(*new, *arrays(cache), self._codes[-1], self._keys[-1])
        except BaseException:
            self.failed = True  # its records may have run ahead of its counters
            raise
        self.steps = end
        self._bytes += sum(int(a.nbytes) for a in new)
        self._bytes += int(self._codes[-1].nbytes + self._keys[-1].nbytes) * (end - first)

    def voice(self, steps: int) -> VoicePart:
        """The voice part of a prefill of ``steps`` (1 to :attr:`steps`) tokens, exactly
        as mlx-vlm's constructor leaves it, in new arrays."""
        if self.failed or not 0 < steps <= self.steps:
            raise ValueError(f"the chain holds {self.steps} steps, not {steps}")
        entries = steps - 1
        return VoicePart(
            tts_cache=[self._layer(index, entries) for index in range(len(self._start))],
            previous_code=self._codes[steps],
            key=self._keys[steps],
            text_tokens=(self._pad,) * steps,
            function_tokens=(self._pad,) * steps,
            timeline_index=steps,
        )

    def _layer(self, index: int, entries: int) -> Any:
        import mlx.core as mx

        kind = self._kinds[index]
        placed = self._layouts.get((kind, entries))
        if placed is None:
            if len(self._layouts) >= 16:
                self._layouts.clear()
            placed = layout(self._tts.make_cache()[kind], self._warm, entries)
            self._layouts[(kind, entries)] = placed
        positions = placed.keys.reshape(-1)
        layer = copy.copy(placed)
        start_keys, start_values = self._start[index]
        keys, values = self._written[index]
        gathered = []
        for first, rest in ((start_keys, keys), (start_values, values)):
            run = mx.concatenate([mx.zeros_like(first[..., :1, :]), first, *rest[:entries]], axis=2)
            gathered.append(mx.take(run, positions, axis=2))
        layer.keys, layer.values = gathered
        return layer


def _kind(cache: list[Any], index: int) -> int:
    """The first layer of the same class and window as layer ``index`` (the layout of
    a kind is the same for all its layers)."""

    def shape(layer: Any) -> tuple[type, Any, Any]:
        return (type(layer), getattr(layer, "max_size", None), getattr(layer, "keep", None))

    return next(i for i, layer in enumerate(cache) if shape(layer) == shape(cache[index]))


def _recording(update: Callable[[Any, Any], Any], written: tuple[list[Any], list[Any]]) -> Any:
    def update_and_fetch(keys: Any, values: Any) -> Any:
        written[0].append(keys)
        written[1].append(values)
        return update(keys, values)

    return update_and_fetch


class Prefill:
    """One prompt's prefill for one seed, shared by every opening of that prompt and seed
    under way (each opening's slice advances it): its language model's steps on a cache
    of its own, and its seed's :class:`VoiceChain` extended as far as it needs. When it
    ends both are stored and every opening starts from copies of them."""

    def __init__(
        self,
        runtime: Any,
        ids: tuple[int, ...],
        seed: int,
        states: PromptStates,
        scope: str | None = None,
    ) -> None:
        self.ids = ids
        self.seed = seed
        self.scope = scope
        self.users = 0
        self.language: LanguagePart | None = None
        self.chain: VoiceChain | None = None
        self.error: Exception | None = None
        self._runtime = runtime
        self._states = states
        self._cache: Any = None
        self._embeds: Any = None
        self._next = 0

    @property
    def done(self) -> bool:
        return self.language is not None

    def parts(self) -> tuple[LanguagePart, VoicePart]:
        """The finished prefill's parts for one opening (its own voice part)."""
        assert self.language is not None and self.chain is not None
        return self.language, self.chain.voice(len(self.ids))

    def advance(self) -> None:
        """Run the next slice: the chain and the language cache first, then up to
        :data:`STEPS_PER_SLICE` language-model steps (and as many chain steps while the
        chain is shorter than the prompt) a slice."""
        if self.error is not None:
            raise self.error
        if self.done:
            return
        try:
            if self.chain is None:
                self.chain = self._begin()
            else:
                self.chain.extend(len(self.ids))
                self._language_steps()
            if self._next == len(self.ids) and self.chain.steps >= len(self.ids):
                self._finish()
        except Exception as exc:
            self.error = exc
            self.abandon()
            raise

    def _begin(self) -> VoiceChain:
        import mlx.core as mx

        stt = self._runtime.model.stt_model
        self._cache = stt.make_cache()
        self._embeds = stt.embed_tokens(mx.array([list(self.ids)], dtype=mx.int32))
        return self._states.chain(self._runtime, self.seed, self.scope)

    def _language_steps(self) -> None:
        """Up to :data:`STEPS_PER_SLICE` of the language model's prefill steps as one
        graph: ``embed(pad) + prompt[i] + w * embed(pad)`` through the cache, as
        ``_run_timeline_step`` runs them (the heads' outputs are never evaluated: no
        later step reads them)."""
        import mlx.core as mx

        model = self._runtime.model
        stt = model.stt_model
        pad = mx.array([[model.config.pad_token_id]], dtype=mx.int32)
        end = min(self._next + STEPS_PER_SLICE, len(self.ids))
        for index in range(self._next, end):
            fused = stt.embed_tokens(pad) + self._embeds[:, index : index + 1]
            fused = fused + model.config.function_channel_weight * stt.embed_tokens(pad)
            stt(fused, cache=self._cache)
        mx.eval(*arrays(self._cache))
        self._next = end

    def _finish(self) -> None:
        assert self.chain is not None
        self.language = LanguagePart(self._cache)
        store = self._states.store
        store.put(LanguageKey(self.ids, self.scope), self.language, nbytes(self.language))
        self.chain.settle()
        store.put(VoiceKey(self.seed, self.scope), self.chain, self.chain.nbytes)
        self.abandon()

    def abandon(self) -> None:
        """Drop its embeddings and unfinished cache (done, failed, or unwanted)."""
        self._embeds = None
        self._cache = None


class PromptStates:
    """A VoiceChat model's prompt parts (one byte-bounded LRU for both kinds) and the
    prefills under way, by prompt and seed."""

    def __init__(self, max_bytes: int) -> None:
        self.store: PromptCache[PromptKey, LanguagePart | VoiceChain] = PromptCache(max_bytes)
        self.pending: dict[tuple[tuple[int, ...], int, str | None], Prefill] = {}

    def chain(self, runtime: Any, seed: int, scope: str | None = None) -> VoiceChain:
        """The seed's stored chain in ``scope`` (only there: a prefill extends it), or a
        new one (stored when a prefill ends)."""
        chain = self.store.get(VoiceKey(seed, scope))
        if isinstance(chain, VoiceChain) and not chain.failed:
            return chain
        return VoiceChain(runtime, seed)

    def parts(
        self, ids: tuple[int, ...], seed: int, scope: str | None = None
    ) -> tuple[LanguagePart, VoicePart] | None:
        """This prompt's stored language part and its voice part rebuilt from the seed's
        stored chain (a hit), else ``None``; each from ``scope`` or the shared scope
        (:func:`scopes`)."""
        language = next(
            (
                part
                for where in scopes(scope)
                if isinstance(part := self.store.get(LanguageKey(ids, where)), LanguagePart)
            ),
            None,
        )
        if language is None:
            return None
        for where in scopes(scope):
            chain = self.store.get(VoiceKey(seed, where))
            if isinstance(chain, VoiceChain) and not chain.failed and chain.steps >= len(ids):
                return language, chain.voice(len(ids))
        return None

    def join(
        self, runtime: Any, ids: tuple[int, ...], seed: int, scope: str | None = None
    ) -> Prefill:
        """The prefill of this prompt and seed under way in ``scope``, or a new one;
        counted."""
        prefill = self.pending.get((ids, seed, scope))
        shared = prefill is not None and prefill.error is None and not prefill.done
        if prefill is None or not shared:
            prefill = Prefill(runtime, ids, seed, self, scope)
            self.pending[(ids, seed, scope)] = prefill
        self.store.count(hit=False, shared=shared)
        prefill.users += 1
        return prefill

    def leave(self, prefill: Prefill) -> None:
        """An opening no longer waits on ``prefill``; the last one out drops it."""
        prefill.users -= 1
        finished = prefill.users <= 0 or prefill.done or prefill.error is not None
        key = (prefill.ids, prefill.seed, prefill.scope)
        if finished and self.pending.get(key) is prefill:
            del self.pending[key]
        if prefill.users <= 0:
            prefill.abandon()


__all__ = [
    "LanguagePart",
    "Prefill",
    "PromptStates",
    "VoiceChain",
    "VoicePart",
    "construct",
    "prompt_ids",
]
