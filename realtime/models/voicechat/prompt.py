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

Each part is kept in the model's :class:`~realtime.models.prompt_cache.PromptCache`
under its own key. An opening whose parts are both there copies them into a freshly
constructed session (mlx-vlm's constructor with a blank prompt: seed and voice warm-up)
in one slice; one whose voice part is there runs only the language model's steps; a
new prompt of a new length runs the whole timeline steps and stores both parts.
Openings of the same prompt and seed under way at once share one :class:`Prefill`.

Copies are real copies (:func:`copy.deepcopy` of the cache objects, new array objects):
mlx-vlm's caches grow by slice assignment (``cache.keys[..., a:b, :] = ...``) on their
own array objects, which never changes another object's array (MLX updates a buffer in
place only when nothing else holds it), and nothing a session does after its open can
reach a stored entry (tests/test_prompt_cache.py runs hits after sessions that ran,
were cancelled, closed or failed).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
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


@attrs.frozen(slots=True)
class VoiceKey:
    seed: int
    tokens: int


PromptKey = LanguageKey | VoiceKey


@attrs.frozen(slots=True, eq=False)
class LanguagePart:
    """The Nemotron-H caches after the prompt (never handed out: copied)."""

    cache: Any


@attrs.frozen(slots=True, eq=False)
class VoicePart:
    """The TTS side of a prefill of ``tokens`` steps from ``seed`` (never handed out)."""

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


def _evaluated(value: Any) -> Any:
    import mlx.core as mx

    mx.eval(*arrays(value))
    return value


def take_language(inner: Any) -> LanguagePart:
    return LanguagePart(_evaluated(copy.deepcopy(inner._language_cache)))


def take_voice(inner: Any, key: SessionKey) -> VoicePart:
    return VoicePart(
        tts_cache=_evaluated(copy.deepcopy(inner._tts_cache)),
        previous_code=_evaluated(copy.deepcopy(inner._previous_code)),
        key=_evaluated(copy.deepcopy(key._key)),
        text_tokens=tuple(inner._text_tokens),
        function_tokens=tuple(inner._function_tokens),
        timeline_index=int(inner._timeline_index),
    )


def put_language(part: LanguagePart, inner: Any) -> None:
    inner._language_cache = copy.deepcopy(part.cache)


def put_voice(part: VoicePart, inner: Any, key: SessionKey) -> None:
    inner._tts_cache = copy.deepcopy(part.tts_cache)
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


class Prefill:
    """One prompt's prefill for one seed, run on a session of its own and shared by every
    opening of that prompt and seed under way (each opening's slice advances it). When
    it ends both parts are stored and every opening starts from copies of them."""

    def __init__(
        self,
        runtime: Any,
        ids: tuple[int, ...],
        seed: int,
        store: PromptCache[PromptKey, LanguagePart | VoicePart],
    ) -> None:
        self.ids = ids
        self.seed = seed
        self.users = 0
        self.language: LanguagePart | None = None
        self.voice: VoicePart | None = None
        self.error: Exception | None = None
        self._runtime = runtime
        self._store = store
        self._inner: Any = None
        self._key: SessionKey | None = None
        self._embeds: Any = None
        self._next = 0
        self._voice_from = 0
        self._known_voice: VoicePart | None = None

    @property
    def done(self) -> bool:
        return self.language is not None and self.voice is not None

    @property
    def voice_from(self) -> int:
        """Steps whose voice part came stored (a prefill of as many or fewer tokens from
        the same seed): only their language-model steps run."""
        return self._voice_from

    def advance(self) -> None:
        """Run the next slice: the session first, then up to
        :data:`STEPS_PER_SLICE` language-model steps while the voice part is
        stored, then one whole timeline step a slice."""
        if self.error is not None:
            raise self.error
        if self.done:
            return
        try:
            if self._inner is None:
                self._begin()
            elif self._next < self._voice_from:
                self._language_steps()
            else:
                self._timeline_steps()
            if self._next == len(self.ids):
                self._finish()
        except Exception as exc:
            self.error = exc
            self.abandon()
            raise

    def _begin(self) -> None:
        """The session, carrying on from the longest voice part stored for this seed
        (its TTS steps depend on nothing but the seed and their count)."""
        import mlx.core as mx

        self._inner, self._key = construct(self._runtime, self.seed, None, False)
        self._embeds = self._inner.model.stt_model.embed_tokens(
            mx.array([list(self.ids)], dtype=mx.int32)
        )
        stored = [
            key.tokens
            for key in self._store.held()
            if isinstance(key, VoiceKey) and key.seed == self.seed and key.tokens <= len(self.ids)
        ]
        if stored:
            voice = self._store.get(VoiceKey(self.seed, max(stored)))
            if isinstance(voice, VoicePart):
                put_voice(voice, self._inner, self._key)
                self._voice_from = len(voice.text_tokens)
                if self._voice_from == len(self.ids):
                    self._known_voice = voice

    def _timeline_steps(self) -> None:
        """Up to :data:`STEPS_PER_SLICE` of ``_run_timeline_step``'s prefill steps
        (nothing generated, no audio decoded) as one graph: the language model's part
        (:meth:`_language_steps`), then the TTS's step with the pad token and its own
        previous code (none on the timeline's first step), the same operations in the
        same order, evaluated once at the end instead of after every step."""
        import mlx.core as mx

        from realtime.models.voicechat.keys import drawing_from

        assert self._key is not None
        inner = self._inner
        config = inner.config
        tts = inner.model.tts_model.tts_model
        end = min(self._next + STEPS_PER_SLICE, len(self.ids))
        with drawing_from(self._key):
            for index in range(self._next, end):
                self._language_step(index)
                inner._text_tokens.append(config.pad_token_id)
                inner._function_tokens.append(config.pad_token_id)
                if inner._timeline_index > 0:
                    current = mx.array([[config.pad_token_id]], dtype=mx.int32)
                    inner._previous_code = tts.step(
                        inner._previous_code,
                        current,
                        mx.ones(current.shape, dtype=mx.bool_),
                        inner._tts_cache,
                        guidance=True,
                    ).codes
                inner._timeline_index += 1
            mx.eval(
                *arrays(inner._language_cache),
                *arrays(inner._tts_cache),
                inner._previous_code,
                self._key._key,
            )
        self._next = end

    def _language_step(self, index: int) -> None:
        """The language model's part of a prefill step: ``embed(pad) + prompt[index] +
        w * embed(pad)`` through the session's cache (the heads' outputs are never
        evaluated: no later step reads them)."""
        import mlx.core as mx

        inner = self._inner
        stt = inner.model.stt_model
        pad = mx.array([[inner.config.pad_token_id]], dtype=mx.int32)
        fused = stt.embed_tokens(pad) + self._embeds[:, index : index + 1]
        fused = fused + inner.config.function_channel_weight * stt.embed_tokens(pad)
        inner._language_step(fused)

    def _language_steps(self) -> None:
        """Up to :data:`STEPS_PER_SLICE` language-model steps as one graph (their voice
        part is stored)."""
        import mlx.core as mx

        end = min(self._next + STEPS_PER_SLICE, self._voice_from)
        for index in range(self._next, end):
            self._language_step(index)
        mx.eval(*arrays(self._inner._language_cache))
        self._next = end

    def _finish(self) -> None:
        assert self._key is not None
        self.language = take_language(self._inner)
        self._store.put(LanguageKey(self.ids), self.language, nbytes(self.language))
        if self._known_voice is not None:
            self.voice = self._known_voice
        else:
            self.voice = take_voice(self._inner, self._key)
            self._store.put(VoiceKey(self.seed, len(self.ids)), self.voice, nbytes(self.voice))
        self.abandon()

    def abandon(self) -> None:
        """Drop its session and embeddings (done, failed, or no opening wants it)."""
        self._embeds = None
        inner, self._inner = self._inner, None
        if inner is not None and not inner.closed:
            inner.cancel()


class PromptStates:
    """A VoiceChat model's prompt parts (one byte-bounded LRU for both kinds) and the
    prefills under way, by prompt and seed."""

    def __init__(self, max_bytes: int) -> None:
        self.store: PromptCache[PromptKey, LanguagePart | VoicePart] = PromptCache(max_bytes)
        self.pending: dict[tuple[tuple[int, ...], int], Prefill] = {}

    def parts(self, ids: tuple[int, ...], seed: int) -> tuple[LanguagePart, VoicePart] | None:
        """Both stored parts of this prompt and seed (a hit), else ``None``."""
        language = self.store.get(LanguageKey(ids))
        voice = self.store.get(VoiceKey(seed, len(ids)))
        if isinstance(language, LanguagePart) and isinstance(voice, VoicePart):
            return language, voice
        return None

    def join(self, runtime: Any, ids: tuple[int, ...], seed: int) -> Prefill:
        """The prefill of this prompt and seed under way, or a new one; counted."""
        prefill = self.pending.get((ids, seed))
        shared = prefill is not None and prefill.error is None and not prefill.done
        if prefill is None or not shared:
            prefill = Prefill(runtime, ids, seed, self.store)
            self.pending[(ids, seed)] = prefill
        self.store.count(hit=False, shared=shared)
        prefill.users += 1
        return prefill

    def leave(self, prefill: Prefill) -> None:
        """An opening no longer waits on ``prefill``; the last one out drops it."""
        prefill.users -= 1
        finished = prefill.users <= 0 or prefill.done or prefill.error is not None
        if finished and self.pending.get((prefill.ids, prefill.seed)) is prefill:
            del self.pending[(prefill.ids, prefill.seed)]
        if prefill.users <= 0:
            prefill.abandon()


__all__ = [
    "LanguagePart",
    "Prefill",
    "PromptStates",
    "VoicePart",
    "construct",
    "prompt_ids",
]
