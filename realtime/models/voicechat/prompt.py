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
zero tail and counters the cold run leaves (tests/models/test_prompt_cache.py holds the
rebuilt states to mlx-vlm's constructor, rotated windows included).

Copies are real copies (new array objects): mlx-vlm's caches grow by slice assignment
(``cache.keys[..., a:b, :] = ...``) on their own array objects, which never changes
another object's array (MLX updates a buffer in place only when nothing else holds
it), and nothing a session does after its open can reach a stored entry
(tests/models/test_prompt_cache.py runs hits after sessions that ran, were cancelled, closed
or failed).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs

from realtime.models.prompt_cache import (
    STEP_READ,
    AheadSlice,
    CacheFigures,
    PrefillRead,
    PromptCache,
)

if TYPE_CHECKING:
    from realtime.models.state_files import StateFiles
    from realtime.models.voicechat.keys import SessionKey

log = logging.getLogger(__name__)

STEPS_PER_SLICE: Final = 4
"""Prefill steps run as one graph per opening slice: the steps are chained through the
caches, so evaluating four at once computes exactly the same values with a quarter of
the waits."""


@attrs.frozen(slots=True)
class LanguageKey:
    ids: tuple[int, ...]
    scope: str | None = None
    """Whose entry it is (a tenant's name); None: the shared scope (warmed prompts, and
    every prompt when the server has no tenants)."""
    read: str | None = None
    """How it was read (:attr:`PrefillRead.tag`; None: the step read): a sequence read's
    state has other last bits, so it never stands in for a step read's, nor the reverse."""


@attrs.frozen(slots=True)
class VoiceKey:
    seed: int
    warmed: bool = False
    """Stored while the prompts were warmed (pinned once they are): such a chain is
    never extended in place afterwards, a longer one is a fork of it
    (:meth:`VoiceChain.fork`) stored beside it, unpinned."""
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

    def __init__(self, runtime: Any, seed: int, scope: str | None = None) -> None:
        import mlx.core as mx

        inner, key = construct(runtime, seed, None, False)
        self.seed = seed
        self.scope = scope
        """Whose chain it is (:class:`VoiceKey`): only its scope's prefills extend it."""
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
        self.stored_steps = 0
        """Steps of it in the state files (:class:`PromptStates`)."""
        inner.cancel()

    @classmethod
    def restored(
        cls,
        runtime: Any,
        seed: int,
        arrays: dict[str, Any],
        meta: Any,
        scope: str | None = None,
    ) -> VoiceChain:
        """A chain as :meth:`to_arrays` stored it (read from a state file): the same
        records, so the same voice parts and the same further steps, bit for bit."""
        import mlx.core as mx

        from realtime.models.voicechat.keys import SessionKey

        steps, layers = int(meta["steps"]), int(meta["layers"])
        tts = runtime.model.tts_model.tts_model
        blank = tts.make_cache()
        pad = int(runtime.model.config.pad_token_id)
        if meta["seed"] != seed or steps < 1 or layers != len(blank) or meta["pad"] != pad:
            raise ValueError("the stored chain is not this seed's or this model's")
        chain = cls.__new__(cls)
        chain.seed, chain.steps, chain.failed = seed, steps, False
        chain.scope = scope
        chain._tts, chain._pad = tts, pad
        chain._warm = int(meta["warm"])
        chain._start = [
            (arrays[f"start.{i}.keys"], arrays[f"start.{i}.values"]) for i in range(layers)
        ]
        if any(k.shape[2] != chain._warm for k, _ in chain._start):
            raise ValueError("the stored warm-up entries do not match their count")
        chain._written = []
        for i in range(layers):
            if steps == 1:
                chain._written.append(([], []))
                continue
            keys, values = arrays[f"steps.{i}.keys"], arrays[f"steps.{i}.values"]
            if keys.shape[2] != steps - 1 or values.shape[2] != steps - 1:
                raise ValueError("the stored steps do not match their count")
            chain._written.append(([keys], [values]))
        codes, draws = arrays["codes"], arrays["keys"]
        if codes.shape[0] != steps + 1 or draws.shape[0] != steps + 1:
            raise ValueError("the stored codes do not match their count")
        chain._codes = [codes[i] for i in range(steps + 1)]
        chain._keys = [draws[i] for i in range(steps + 1)]
        mx.eval(*chain._codes, *chain._keys)
        chain._kinds = [_kind(blank, index) for index in range(layers)]
        chain._cache = None
        chain._layouts = {}
        chain._key = SessionKey(seed)
        chain._key._key = chain._keys[-1]
        chain._bytes = sum(int(a.nbytes) for a in arrays.values())
        chain.stored_steps = steps
        return chain

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a state file holds of it: the warm-up entries, each layer's recorded
        entries concatenated (one per step after the first), every code and key."""
        import mlx.core as mx

        if self.failed or self.steps < 1:
            raise ValueError("only a chain of at least one step is stored")
        arrays: dict[str, Any] = {}
        for i, (keys, values) in enumerate(self._start):
            arrays[f"start.{i}.keys"], arrays[f"start.{i}.values"] = keys, values
        for i, (keys, values) in enumerate(self._written):
            if self.steps > 1:
                for name, chunks in (("keys", keys), ("values", values)):
                    run = mx.concatenate(chunks, axis=2) if len(chunks) > 1 else chunks[0]
                    arrays[f"steps.{i}.{name}"] = run[:, :, : self.steps - 1]
        arrays["codes"] = mx.stack(self._codes[: self.steps + 1])
        arrays["keys"] = mx.stack(self._keys[: self.steps + 1])
        meta = {
            "seed": self.seed,
            "steps": self.steps,
            "layers": len(self._start),
            "warm": self._warm,
            "pad": self._pad,
        }
        return arrays, meta

    def fork(self) -> VoiceChain:
        """A chain of its own that starts where this one is (sharing the recorded
        arrays, which nothing changes): extending it leaves this one as it is."""
        from realtime.models.voicechat.keys import SessionKey

        if self.failed or self.steps < 1:
            raise ValueError("only a chain of at least one step is forked")
        other = type(self).__new__(type(self))
        other.seed, other.steps, other.failed = self.seed, self.steps, False
        other.scope = self.scope
        other._tts, other._pad, other._warm = self._tts, self._pad, self._warm
        other._start, other._kinds = self._start, self._kinds
        other._written = [(list(keys), list(values)) for keys, values in self._written]
        other._codes, other._keys = list(self._codes), list(self._keys)
        other._cache = None
        other._layouts = {}
        other._key = SessionKey(self.seed)
        other._key._key = self._keys[-1]
        other._bytes = self._bytes
        other.stored_steps = self.stored_steps
        return other

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
            covering = _covering(rest, entries)
            run = mx.concatenate([mx.zeros_like(first[..., :1, :]), first, *covering], axis=2)
            gathered.append(mx.take(run, positions, axis=2))
        layer.keys, layer.values = gathered
        return layer


def _covering(chunks: list[Any], entries: int) -> list[Any]:
    """The first of ``chunks`` (recorded entries along axis 2: one a step, or many read
    from a file) that hold at least ``entries`` entries (the gather takes only those)."""
    held = 0
    for count, chunk in enumerate(chunks):
        if held >= entries:
            return chunks[:count]
        held += int(chunk.shape[2])
    return chunks


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
    of its own, and its seed's :class:`VoiceChain` extended as far as it needs (counted
    in the cache's bytes as it grows, :meth:`PromptStates.keep`). When it ends both are
    stored and every opening starts from copies of them."""

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

    @property
    def steps_left(self) -> int:
        """Prefill steps left to run (the language model's or the chain's, whichever is
        further behind); all of them before its first slice."""
        if self.done:
            return 0
        chain = 0 if self.chain is None else self.chain.steps
        return max(len(self.ids) - self._next, len(self.ids) - chain)

    def parts(self) -> tuple[LanguagePart, VoicePart]:
        """The finished prefill's parts for one opening (its own voice part)."""
        assert self.language is not None and self.chain is not None
        return self.language, self.chain.voice(len(self.ids))

    def advance(self, most: int = STEPS_PER_SLICE) -> int:
        """Run the next slice: the chain and the language cache first, then up to
        ``most`` (1 to :data:`STEPS_PER_SLICE`) language-model steps (and as many chain
        steps while the chain is shorter than the prompt) a slice; the steps it ran (0:
        the first slice). The steps are chained through the caches, so how many run in
        one graph changes no value."""
        if self.error is not None:
            raise self.error
        if self.done:
            return 0
        most = max(1, min(STEPS_PER_SLICE, most))
        ran = 0
        try:
            if self.chain is None:
                self.chain = self._begin()
            else:
                before, language = self.chain.steps, self._next
                self.chain.extend(len(self.ids), most)
                if self.chain.steps != before:
                    self._states.keep(self.chain)
                self._language_steps(most)
                ran = max(self.chain.steps - before, self._next - language)
            if self._next == len(self.ids) and self.chain.steps >= len(self.ids):
                self._finish()
        except Exception as exc:
            self.error = exc
            self.abandon()
            raise
        return ran

    def _begin(self) -> VoiceChain:
        import mlx.core as mx

        stt = self._runtime.model.stt_model
        self._cache = stt.make_cache()
        self._embeds = stt.embed_tokens(mx.array([list(self.ids)], dtype=mx.int32))
        chain = self._states.chain(self._runtime, self.seed, len(self.ids), self.scope)
        self._states.keep(chain)  # a new chain (or fork) is counted from its first slice
        return chain

    def _language_steps(self, most: int = STEPS_PER_SLICE) -> None:
        """Up to ``most`` of the language model's prefill steps as one
        graph: ``embed(pad) + prompt[i] + w * embed(pad)`` through the cache, as
        ``_run_timeline_step`` runs them (the heads' outputs are never evaluated: no
        later step reads them); the sequence read runs one chunk in one pass instead
        (:mod:`realtime.models.voicechat.sequence`)."""
        import mlx.core as mx

        model = self._runtime.model
        stt = model.stt_model
        pad = mx.array([[model.config.pad_token_id]], dtype=mx.int32)
        read = self._states.read
        if read.sequence:  # a chunk is one pass: its size (--prefill sequence:N) is the knob
            from realtime.models.voicechat.sequence import read_chunk

            end = min(self._next + read.chunk, len(self.ids))
            if end > self._next:
                read_chunk(self._runtime, self._embeds, self._cache, self._next, end)
                mx.eval(*arrays(self._cache))
            self._next = end
            return
        end = min(self._next + most, len(self.ids))
        for index in range(self._next, end):
            fused = stt.embed_tokens(pad) + self._embeds[:, index : index + 1]
            fused = fused + model.config.function_channel_weight * stt.embed_tokens(pad)
            stt(fused, cache=self._cache)
        mx.eval(*arrays(self._cache))
        self._next = end

    def _finish(self) -> None:
        assert self.chain is not None
        self.language = LanguagePart(self._cache)
        self._states.keep_language(self.ids, self.language, self.scope)
        self.chain.settle()
        self._states.keep(self.chain)
        self.abandon()

    def abandon(self) -> None:
        """Drop its embeddings and unfinished cache (done, failed, or unwanted); its
        chain keeps what it ran, without its running cache, counted again."""
        self._embeds = None
        self._cache = None
        chain = self.chain
        if chain is not None and not chain.failed and chain.steps > 0 and not self.done:
            chain.settle()
            self._states.keep(chain)


WRITE_EVERY: Final = 1024
"""A chain built ahead is written again after this many more steps (so a restart
keeps most of a long build), and when it reaches its length."""

MAX_ORPHANS: Final = 2
"""Reads whose clients left that are finished at idle priority at once, at most."""

ORPHAN_SECONDS: Final = 120.0
"""Engine seconds one such read may take at idle priority before it is dropped."""

MAX_UNWRITTEN: Final = 64
"""Entries waiting to be written at most; older ones are dropped from the queue."""


class PromptStates:
    """A VoiceChat model's prompt parts (one byte-bounded LRU for both kinds), the
    prefills under way by prompt and seed, and, with ``files``, the same parts on disk
    (:mod:`realtime.models.state_files`): a part missing in memory is read from its
    file (and kept in memory again), and each new part is written at idle priority
    (:meth:`ahead`, with the voice chain built ahead of need)."""

    def __init__(
        self, max_bytes: int, files: StateFiles | None = None, read: PrefillRead = STEP_READ
    ) -> None:
        self.read = read
        """How prompts are read (``--prefill``): language parts are keyed by it."""
        self.store: PromptCache[PromptKey, LanguagePart | VoiceChain] = PromptCache(max_bytes)
        self.pending: dict[tuple[tuple[int, ...], int, str | None], Prefill] = {}
        self.files = files
        self.sealed = False
        """The warmed prompts are pinned (:meth:`pin`): chains are stored unpinned
        from now on, and a warmed chain is never extended in place."""
        self.ahead_seed = 0
        self.ahead_tokens = 0
        """The chain built ahead of need: this seed's, to this many steps (0: none)."""
        self.ahead_seconds = 0.0
        """Engine time spent on work no opening waited for (building, writing)."""
        self._ahead_stopped = False
        self._orphans: dict[Prefill, float] = {}
        """Reads whose clients left, finished at idle priority, with the engine
        seconds each has had since."""
        self.orphans_finished = 0
        self.orphans_dropped = 0
        self._unwritten: dict[PromptKey, tuple[int, ...] | None] = {}
        """Entries to write (a language part's prompt ids; ``None``: a chain)."""

    # --- lookups ---------------------------------------------------------------------

    def _held_chain(self, seed: int, scope: str | None = None) -> VoiceChain | None:
        """The longest usable chain of ``seed`` in ``scope`` in memory (an unpinned one on
        a tie)."""
        best: VoiceChain | None = None
        for warmed in (False, True):
            chain = self.store.peek(VoiceKey(seed, warmed, scope))
            if not isinstance(chain, VoiceChain) or chain.failed:
                continue
            if best is None or chain.steps > best.steps:
                best = chain
        return best

    def _touch_chain(self, runtime: Any, seed: int, scope: str | None = None) -> VoiceChain | None:
        """:meth:`_held_chain`, from the files when memory holds none (kept in memory
        again, never pinned), now the most recently used."""
        chain = self._held_chain(seed, scope)
        if chain is None:
            chain = self._read_chain(runtime, seed, scope)
            if chain is not None:
                self.keep(chain, warmed=False)
        if chain is not None:
            for warmed in (False, True):
                if self.store.peek(VoiceKey(seed, warmed, scope)) is chain:
                    self.store.get(VoiceKey(seed, warmed, scope))
        return chain

    def chain(self, runtime: Any, seed: int, steps: int, scope: str | None = None) -> VoiceChain:
        """The seed's chain in ``scope`` to extend to ``steps``: the stored one (forked
        when it is a warmed chain that is too short), else a fork of the shared scope's
        (a tenant extends only its own: the shared one is the operator's, warmed or built
        ahead), else a new one."""
        chain = self._touch_chain(runtime, seed, scope)
        if chain is None and scope is not None:
            shared = self._touch_chain(runtime, seed, None)
            if shared is not None and shared.steps >= 1:
                mine = shared.fork()
                mine.scope, mine.stored_steps = scope, 0
                return mine
        if chain is None:
            return VoiceChain(runtime, seed, scope)
        if chain.steps < steps and self._warmed(chain):
            return chain.fork()
        return chain

    def _counts(self, chain: VoiceChain | None) -> bool:
        """Whether ``chain`` is held in the store (counted in its bytes)."""
        return chain is not None and any(
            self.store.peek(VoiceKey(chain.seed, warmed, chain.scope)) is chain
            for warmed in (False, True)
        )

    def _warmed(self, chain: VoiceChain) -> bool:
        return self.sealed and self.store.peek(VoiceKey(chain.seed, True, chain.scope)) is chain

    def parts(
        self, runtime: Any, ids: tuple[int, ...], seed: int, scope: str | None = None
    ) -> tuple[LanguagePart, VoicePart] | None:
        """This prompt's stored language part and its voice part rebuilt from the seed's
        stored chain (a hit; either may be read from its file), else ``None``; each from
        ``scope`` or the shared scope (:func:`scopes`), never another tenant's."""
        language: LanguagePart | None = None
        for where in scopes(scope):
            key = LanguageKey(ids, where, self.read.tag)
            found = self.store.get(key)
            if not isinstance(found, LanguagePart):
                found = self._read_language(runtime, ids, where)
                if found is not None:
                    self.store.put(key, found, nbytes(found))
            if isinstance(found, LanguagePart):
                language = found
                break
        if language is None:
            return None
        for where in scopes(scope):
            chain = self._touch_chain(runtime, seed, where)
            if chain is not None and chain.steps >= len(ids):
                return language, chain.voice(len(ids))
        return None

    # --- keeping -----------------------------------------------------------------------

    def keep(self, chain: VoiceChain, warmed: bool | None = None) -> bool:
        """Store ``chain`` (or count what it holds now, when it is stored): under its
        seed, as warmed (pinned by :meth:`pin`) only while prompts are warmed (or as
        ``warmed`` says: a chain read from a file is never pinned); a chain that no
        longer fits is dropped from the store (its users keep it). Whether it is held."""
        if self._warmed(chain):
            return True  # pinned as warmed: never grown in place (see chain)
        if warmed is None:
            held = self.store.peek(VoiceKey(chain.seed, False, chain.scope)) is chain
            warmed = not self.sealed and not held
        key = VoiceKey(chain.seed, warmed, chain.scope)
        if self.store.put(key, chain, chain.nbytes):
            if self.files is not None and chain.steps > chain.stored_steps:
                self._queue(VoiceKey(chain.seed, scope=chain.scope), None)
            return True
        if self.store.peek(key) is chain:
            self.store.discard(key)
        return False

    def keep_language(
        self, ids: tuple[int, ...], part: LanguagePart, scope: str | None = None
    ) -> None:
        key = LanguageKey(ids, scope, self.read.tag)
        if self.store.put(key, part, nbytes(part)) and self.files is not None:
            self._queue(key, ids)

    def _queue(self, key: PromptKey, ids: tuple[int, ...] | None) -> None:
        self._unwritten.pop(key, None)
        self._unwritten[key] = ids
        while len(self._unwritten) > MAX_UNWRITTEN:
            del self._unwritten[next(iter(self._unwritten))]

    def pin(self) -> None:
        """Pin what is held (the warmed prompts) and seal the warmed chains."""
        self.store.pin(lambda key: not (isinstance(key, VoiceKey) and not key.warmed))
        self.sealed = True

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
        """An opening no longer waits on ``prefill``; the last one out drops it, or,
        when it is worth finishing (:meth:`_adopt`), leaves it to idle time, still
        joinable, so the client's retry finds it read or under way."""
        prefill.users -= 1
        if prefill.users <= 0 and self._adopt(prefill):
            return
        finished = prefill.users <= 0 or prefill.done or prefill.error is not None
        if finished and self.pending.get((prefill.ids, prefill.seed, prefill.scope)) is prefill:
            del self.pending[(prefill.ids, prefill.seed, prefill.scope)]
        if prefill.users <= 0:
            prefill.abandon()

    def _adopt(self, prefill: Prefill) -> bool:
        """Keep a read whose last client left to finish at idle priority (with work
        ahead of need on, ``ahead_tokens``): one that began, has not failed, is not
        done, and fits the count (:data:`MAX_ORPHANS`)."""
        if prefill in self._orphans:
            return True  # adopted before, joined by a retry that left again
        if (
            self.ahead_tokens <= 0  # no work ahead of need (--no-build-ahead)
            or prefill.done
            or prefill.error is not None
            or prefill.chain is None
            or self.store.max_bytes == 0
            or len(self._orphans) >= MAX_ORPHANS
            or self.pending.get((prefill.ids, prefill.seed, prefill.scope)) is not prefill
        ):
            return False
        self._orphans[prefill] = 0.0
        return True

    def _drop_orphan(self, prefill: Prefill, finished: bool) -> None:
        del self._orphans[prefill]
        if finished:
            self.orphans_finished += 1
        else:
            self.orphans_dropped += 1
        if self.pending.get((prefill.ids, prefill.seed, prefill.scope)) is prefill:
            del self.pending[(prefill.ids, prefill.seed, prefill.scope)]
        prefill.abandon()

    def figures(self) -> CacheFigures:
        """The store's figures with the chain built ahead and the files' counts."""
        files = self.files
        return attrs.evolve(
            self.store.figures(),
            voice_chain_tokens=self.voice_chain_tokens(),
            building=self.building,
            ahead_seconds=self.ahead_seconds,
            disk_max_bytes=0 if files is None else files.max_bytes,
            disk_reads=0 if files is None else files.reads,
            disk_writes=0 if files is None else files.writes,
            disk_ignored=0 if files is None else files.ignored,
            orphans=len(self._orphans),
            orphans_finished=self.orphans_finished,
            orphans_dropped=self.orphans_dropped,
        )

    # --- ahead of need -----------------------------------------------------------------

    @property
    def building(self) -> bool:
        """The chain built ahead has not reached its length yet."""
        if self.ahead_tokens <= 0 or self._ahead_stopped:
            return False
        chain = self._held_chain(self.ahead_seed)
        return chain is None or chain.steps < self.ahead_tokens

    def voice_chain_tokens(self) -> int:
        """Steps of the longest chain held for the seed built ahead."""
        chain = self._held_chain(self.ahead_seed)
        return 0 if chain is None else chain.steps

    def ahead(self, runtime: Any, steps: int, quiet: bool) -> AheadSlice:
        """One slice of work no opening waits for, first of these that is left: (``quiet``:
        no conversation is open, so nothing it takes delays a frame) one state file
        written; a slice of a read whose clients left (up to ``steps`` steps, at most
        :data:`STEPS_PER_SLICE`; that many when ``quiet``); up to ``steps`` steps of the
        chain built ahead."""
        import time

        began = time.perf_counter()
        for prefill in list(self._orphans):  # pushed out of the bound by later entries
            chain = prefill.chain
            if prefill.users <= 0 and chain is not None and not self._counts(chain):
                self._drop_orphan(prefill, finished=False)
        try:
            if quiet and self._unwritten:
                self._write_one()
                return AheadSlice(0, True)
            if steps > 0 or quiet:
                ran = self._finish_orphan(began, STEPS_PER_SLICE if quiet else steps)
                if ran is not None:
                    return AheadSlice(ran, True)
            if steps > 0 and self.building:
                return AheadSlice(self._build(runtime, steps), True)
            return AheadSlice(0, bool(self._unwritten) or self.building or bool(self._orphans))
        finally:
            self.ahead_seconds += time.perf_counter() - began

    def _finish_orphan(self, began: float, most: int) -> int | None:
        """One slice (at most ``most`` steps) of the oldest read whose clients left; the
        steps it ran, None when none is left. A read
        that a retry joined is its client's again; one past :data:`ORPHAN_SECONDS` of
        engine time, or that fails, is dropped."""
        import time

        for prefill in list(self._orphans):
            if prefill.users > 0:
                del self._orphans[prefill]  # a retry joined it: its opening drives it
                continue
            try:
                ran = prefill.advance(most)
            except Exception:
                log.debug("finishing an abandoned prompt read failed", exc_info=True)
                self._drop_orphan(prefill, finished=False)
                return 0
            self._orphans[prefill] += time.perf_counter() - began
            if prefill.done:
                self._drop_orphan(prefill, finished=True)
            elif self._orphans[prefill] > ORPHAN_SECONDS or not self._counts(prefill.chain):
                # Over its time, or its chain no longer fits the bound (no client holds
                # it: it would only grow outside the count, and never be kept).
                self._drop_orphan(prefill, finished=False)
            return ran
        return None

    def _build(self, runtime: Any, steps: int) -> int:
        chain = self.chain(runtime, self.ahead_seed, self.ahead_tokens)
        before = chain.steps
        chain.extend(self.ahead_tokens, most=steps)
        if not self.keep(chain):
            self._ahead_stopped = True
            log.warning(
                "the voice chain built ahead (seed %d) does not fit --prompt-cache-bytes "
                "at %d steps; stopped building it",
                self.ahead_seed,
                chain.steps,
            )
        elif chain.steps >= self.ahead_tokens and chain.steps > before:
            chain.settle()
            self.keep(chain)
            log.info("voice chain of seed %d built ahead to %d steps", self.ahead_seed, chain.steps)
        if chain.steps < self.ahead_tokens and chain.steps - chain.stored_steps < WRITE_EVERY:
            self._unwritten.pop(VoiceKey(chain.seed), None)  # not yet: written by the thousand
        return chain.steps - before

    # --- files -------------------------------------------------------------------------

    def _write_one(self) -> None:
        key, ids = next(iter(self._unwritten.items()))
        del self._unwritten[key]
        files = self.files
        if files is None:
            return
        if isinstance(key, LanguageKey):
            part = self.store.peek(key)
            if isinstance(part, LanguagePart) and ids is not None:
                _write_language(files, ids, part, key.scope, key.read)
            return
        chain = self._held_chain(key.seed, key.scope)
        if chain is None or chain.steps <= chain.stored_steps:
            return
        if _stored_steps(files, chain.seed, chain.scope) >= chain.steps:
            chain.stored_steps = chain.steps  # another process wrote a chain as long
            return
        steps = chain.steps
        if _write_chain(files, chain):
            chain.stored_steps = steps

    def _read_chain(self, runtime: Any, seed: int, scope: str | None = None) -> VoiceChain | None:
        files = self.files
        if files is None:
            return None

        def load(path: Any) -> tuple[VoiceChain, Any]:
            from realtime.models.voicechat import stored

            arrays, meta, header = stored.load(path)
            return VoiceChain.restored(runtime, seed, arrays, meta, scope), header

        chain = files.read(_chain_name(seed, scope), load)
        if chain is not None:
            log.info(
                "voice chain of seed %d read from the state files: %d steps", seed, chain.steps
            )
        return chain

    def _read_language(
        self, runtime: Any, ids: tuple[int, ...], scope: str | None = None
    ) -> LanguagePart | None:
        files = self.files
        if files is None:
            return None

        def load(path: Any) -> tuple[LanguagePart, Any]:
            from realtime.models.voicechat import stored

            arrays, meta, header = stored.load(path)
            if tuple(meta["ids"]) != ids:
                raise ValueError("it holds another prompt")
            blank = runtime.model.stt_model.make_cache()
            cache = stored.layers_from_arrays(blank, arrays, meta["layers"])
            return LanguagePart(cache), header

        return files.read(_language_name(ids, scope, self.read.tag), load)


def _scoped(name: str, scope: str | None) -> str:
    """A file's name in ``scope``: the shared scope's as it is, a tenant's under a folder
    named by a digest of the tenant's name (any text is a name; no file names it)."""
    if scope is None:
        return name
    import hashlib

    return f"tenant-{hashlib.sha256(scope.encode()).hexdigest()[:32]}/{name}"


def _chain_name(seed: int, scope: str | None = None) -> str:
    return _scoped(f"voice-chain/seed-{seed}", scope)


def _language_name(ids: tuple[int, ...], scope: str | None = None, read: str | None = None) -> str:
    """A language part's file (a sequence read's under a folder of its own)."""
    import hashlib

    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    folder = "language" if read is None else f"language-{read}"
    return _scoped(f"{folder}/{len(ids)}-{digest}", scope)


def _stored_steps(files: StateFiles, seed: int, scope: str | None = None) -> int:
    """Steps of the seed's chain file as its header says (0: none, or not this key's)."""
    import json

    from realtime.models.state_files import KEY_FIELD, read_header
    from realtime.models.voicechat.stored import META_FIELD

    name = _chain_name(seed, scope)
    try:
        metadata = read_header(files.path(name)).get("__metadata__")
        if not isinstance(metadata, dict) or metadata.get(KEY_FIELD) != files.key(name):
            return 0
        return int(json.loads(metadata[META_FIELD])["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _write_chain(files: StateFiles, chain: VoiceChain) -> bool:
    from realtime.models.voicechat import stored

    arrays, meta = chain.to_arrays()
    return files.write(
        _chain_name(chain.seed, chain.scope),
        lambda path, header: stored.save(path, arrays, header, meta),
    )


def _write_language(
    files: StateFiles,
    ids: tuple[int, ...],
    part: LanguagePart,
    scope: str | None = None,
    read: str | None = None,
) -> bool:
    from realtime.models.voicechat import stored

    arrays, layers = stored.layers_to_arrays(list(part.cache))
    meta = {"ids": list(ids), "layers": layers}
    return files.write(
        _language_name(ids, scope, read),
        lambda path, header: stored.save(path, arrays, header, meta),
    )


__all__ = [
    "LanguagePart",
    "Prefill",
    "PromptStates",
    "VoiceChain",
    "VoicePart",
    "construct",
    "prompt_ids",
]
