"""The prompt-state cache: a stored prompt opens bit for bit as mlx-vlm's constructor
opens it, whatever happened to the sessions opened before; the store's byte bound;
concurrent openings of one new prompt prefill once (demo checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from realtime.models.base import (
    InferenceError,
    PromptUse,
    SizedSlices,
    UsesPrompt,
    open_session,
)
from realtime.models.prompt_cache import CacheFigures, CachesPrompts, PromptCache
from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import VoiceChain, VoiceKey
from realtime.models.voicechat.reference import ReferenceSession
from realtime.models.voicechat.session import VoiceChatSession
from tests.engine.test_isolation import LONG_PROMPT, audio_for, digest, digest_mlx_vlm
from tests.models_fixtures import push_all

OTHER_PROMPT = (
    "You are a cheerful assistant for a flower shop. Answer in one or two short "
    "sentences and never invent opening hours."
)


# --- the store ----------------------------------------------------------------------


def test_the_store_keeps_at_most_its_bytes_least_recently_used_first() -> None:
    cache: PromptCache[str, int] = PromptCache(100)
    assert cache.put("a", 1, 40) and cache.put("b", 2, 40)
    assert cache.get("a") == 1  # now b is the least recently used
    assert cache.put("c", 3, 40)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert not cache.put("huge", 4, 101)  # larger than the bound: not kept
    assert cache.put("a", 5, 10)  # replaced, its bytes recounted
    cache.count(hit=True)
    cache.count(hit=False)
    cache.count(hit=False, shared=True)
    assert cache.figures() == CacheFigures(
        max_bytes=100, bytes=50, entries=2, hits=1, misses=2, shared=1, evictions=1
    )
    empty: PromptCache[str, int] = PromptCache(0)
    assert not empty.put("a", 1, 1) and len(empty) == 0
    with pytest.raises(ValueError):
        PromptCache(-1)


def test_pinned_entries_are_never_evicted() -> None:
    """The warmed prompts are pinned: openings of other prompts evict only what is not
    pinned, and one that fits only by evicting a pinned entry is not kept."""
    cache: PromptCache[str, int] = PromptCache(100)
    assert cache.put("warm", 1, 50)
    cache.pin()
    assert cache.put("a", 2, 30) and cache.put("b", 3, 30)  # a is evicted, not warm
    assert "a" not in cache and cache.get("warm") == 1 and cache.get("b") == 3
    assert not cache.put("c", 4, 60)  # only by evicting warm: refused, nothing changes
    assert cache.held() == ["warm", "b"]
    assert cache.put("warm", 5, 80)  # a pinned key replaced stays pinned (b evicted)
    assert cache.held() == ["warm"] and not cache.put("d", 6, 40)
    figures = cache.figures()
    assert (figures.bytes, figures.pinned_bytes, figures.evictions) == (80, 80, 2)


# --- on the model -------------------------------------------------------------------


@pytest.fixture
def model(demo_model: VoiceChatModel) -> Iterator[VoiceChatModel]:
    """The demo model with an empty prompt cache of the default size, emptied after."""
    demo_model.set_prompt_cache_bytes(1 << 30)
    yield demo_model
    demo_model.set_prompt_cache_bytes(1 << 30)


def theirs(model: VoiceChatModel, seed: int, prompt: str | None, frames: int = 6) -> Any:
    """mlx-vlm's own constructor and session on the same audio."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    session = VoiceChatStreamingSession(model.runtime, system_prompt=prompt, seed=seed)
    raw = session.push_audio(audio_for(seed, frames), sample_rate=16000)
    raw += session.flush(pad_partial=True)
    return digest_mlx_vlm(raw)


def ours(model: VoiceChatModel, seed: int, prompt: str | None, frames: int = 6) -> Any:
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    return digest(push_all(session, audio_for(seed, frames)))


def opened(model: VoiceChatModel, seed: int, prompt: str | None) -> VoiceChatSession:
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    assert isinstance(session, VoiceChatSession)
    return session


def test_a_cached_prompt_opens_as_mlx_vlms_constructor(model: VoiceChatModel) -> None:
    """Cold, then cached (in one slice), then the same prompt with another seed (its
    language part stored, its voice part not), then another prompt of the same length
    and seed (only the language model's steps run): each equals mlx-vlm's own."""
    assert isinstance(model, CachesPrompts)
    expected = theirs(model, 3, LONG_PROMPT)
    first = opened(model, 3, LONG_PROMPT)
    assert isinstance(first, UsesPrompt)
    tokens = model.count_tokens(LONG_PROMPT)
    assert first.prompt_use == PromptUse(tokens=tokens, cached=0)
    assert digest(push_all(first, audio_for(3, 6))) == expected
    opening = model.begin_session(system_prompt=LONG_PROMPT, seed=3, max_streaming_seconds=None)
    second = opening.advance()  # a hit opens in one slice
    assert second is not None and second.prompt_use == PromptUse(tokens=tokens, cached=tokens)
    assert digest(push_all(second, audio_for(3, 6))) == expected
    figures = model.prompt_cache_figures()
    assert (figures.hits, figures.misses, figures.entries) == (1, 1, 2)
    assert figures.bytes > 0

    assert ours(model, 4, LONG_PROMPT) == theirs(model, 4, LONG_PROMPT)  # another seed
    assert model.prompt_cache_figures().misses == 2

    same_length = _same_length(model, LONG_PROMPT)
    assert model.count_tokens(same_length) == tokens
    assert ours(model, 3, same_length) == theirs(model, 3, same_length)
    assert ours(model, 3, same_length) == theirs(model, 3, same_length)  # and cached


def _same_length(model: VoiceChatModel, prompt: str) -> str:
    """Another prompt that tokenizes to as many tokens as ``prompt``."""
    words = prompt.split()
    for i in range(len(words)):
        other = " ".join([*words[:i], "parrots", *words[i + 1 :]])
        if other != prompt and model.count_tokens(other) == model.count_tokens(prompt):
            return other
    raise AssertionError("no same-length prompt found")


@pytest.mark.parametrize("ending", ["frames", "cancelled", "closed", "failed"])
def test_what_a_session_does_never_changes_a_stored_prompt(
    model: VoiceChatModel, ending: str
) -> None:
    """However the sessions opened from an entry end (after frames, cancelled, flushed
    and closed, failed mid-frame), the next hit is still a cold open's session."""
    expected = theirs(model, 5, OTHER_PROMPT)
    for _ in range(2):  # the cold open's own session, then a hit's
        session = opened(model, 5, OTHER_PROMPT)
        session.push_audio(audio_for(6, 4), 16000)
        if ending == "cancelled":
            session.cancel()
        elif ending == "closed":
            session.flush(True)
            model.clear_cache()
        elif ending == "failed":
            # The next frame breaks at the codec, after its language and TTS caches
            # have grown in place.
            session._inner._codec_cache = None
            with pytest.raises(InferenceError):
                session.push_audio(audio_for(6, 1), 16000)
    assert model.prompt_cache_figures().hits == 1
    assert ours(model, 5, OTHER_PROMPT) == expected


def test_concurrent_openings_of_a_new_prompt_prefill_once(model: VoiceChatModel) -> None:
    """Two openings of one new prompt and seed advanced in turn share one prefill (each
    slice of either advances it); both equal mlx-vlm's; the one left alone still ends
    when the other is abandoned half way."""
    expected = theirs(model, 2, LONG_PROMPT)
    first = model.begin_session(system_prompt=LONG_PROMPT, seed=2, max_streaming_seconds=None)
    second = model.begin_session(system_prompt=LONG_PROMPT, seed=2, max_streaming_seconds=None)
    third = model.begin_session(system_prompt=LONG_PROMPT, seed=2, max_streaming_seconds=None)
    assert first.advance() is None and second.advance() is None and third.advance() is None
    third.abandon()
    sessions: dict[int, Any] = {}
    slices = 0
    while len(sessions) < 2:
        for i, opening in enumerate((first, second)):
            if i not in sessions:
                slices += 1
                if (session := opening.advance()) is not None:
                    sessions[i] = session
    steps = model.count_tokens(LONG_PROMPT)
    assert slices <= steps + 2  # one prefill between them, not one each
    figures = model.prompt_cache_figures()
    assert (figures.misses, figures.shared, figures.hits) == (3, 2, 0)
    for session in sessions.values():
        assert digest(push_all(session, audio_for(2, 6))) == expected


def test_a_prompt_read_one_step_a_slice_opens_as_mlx_vlms_constructor(
    model: VoiceChatModel,
) -> None:
    """Beside streaming conversations the engine cuts an opening's slices down to one
    prefill step (one language-model step and one voice-chain step) to fit the gap
    between their frames: the slicing is only where the read pauses, so a cold prompt
    read in the smallest slices, or in slices of every size, opens bit for bit as
    mlx-vlm's constructor does."""
    for seed, sizes in ((11, [1]), (12, [1, 3, 2, 4, 1])):
        opening = model.begin_session(
            system_prompt=LONG_PROMPT, seed=seed, max_streaming_seconds=None
        )
        assert isinstance(opening, SizedSlices) and opening.most_steps == 4
        ran: list[tuple[int, int]] = []
        session: VoiceChatSession | ReferenceSession | None = None
        while session is None:
            asked = sizes[len(ran) % len(sizes)]
            session = opening.advance_steps(asked)
            ran.append((asked, opening.steps_run))
        assert ran[0][1] == 0 and ran[-1][1] == 0  # it begins the read; it opens
        assert all(steps == asked for asked, steps in ran[1:-2])
        assert 0 < ran[-2][1] <= ran[-2][0]
        assert sum(steps for _, steps in ran) == session.prompt_use.tokens
        assert digest(push_all(session, audio_for(seed, 6))) == theirs(model, seed, LONG_PROMPT)


def test_the_byte_bound_evicts_and_an_evicted_prompt_opens_cold(model: VoiceChatModel) -> None:
    opened(model, 1, LONG_PROMPT)
    one = model.prompt_cache_figures().bytes
    model.set_prompt_cache_bytes(one)  # room for one prompt's parts (the seed's chain
    opened(model, 1, LONG_PROMPT)  # and one language part)
    opened(model, 1, OTHER_PROMPT)
    figures = model.prompt_cache_figures()
    assert figures.bytes <= one and figures.evictions >= 1
    assert ours(model, 1, LONG_PROMPT) == theirs(model, 1, LONG_PROMPT)
    model.set_prompt_cache_bytes(0)  # nothing kept: every open is cold, still exact
    assert ours(model, 1, LONG_PROMPT) == theirs(model, 1, LONG_PROMPT)
    assert model.prompt_cache_figures().entries == 0


def test_no_prompt_and_a_blank_prompt_are_not_cached(model: VoiceChatModel) -> None:
    session = opened(model, 0, "  ")
    assert session.prompt_use == PromptUse(0, 0)
    assert model.prompt_cache_figures().entries == 0
    assert np.isfinite(model.prompt_cache_figures().max_bytes)


def test_a_longer_prompt_carries_on_from_a_shorter_ones_voice_part(
    model: VoiceChatModel,
) -> None:
    """The TTS steps of a prefill depend only on the seed and their count: a new prompt
    runs the stored shorter prefill's steps as language-model steps alone and the
    whole timeline steps only past it, and still equals mlx-vlm's constructor."""
    opened(model, 6, "Be brief.")
    assert ours(model, 6, LONG_PROMPT) == theirs(model, 6, LONG_PROMPT)


def test_a_chain_is_counted_as_it_grows_even_when_its_prefill_is_abandoned(
    model: VoiceChatModel,
) -> None:
    """A prefill left half way has extended its seed's chain; the
    cache's bytes count what the chain holds, and the bound evicts it like any entry."""
    opening = model.begin_session(system_prompt=LONG_PROMPT, seed=9, max_streaming_seconds=None)
    for _ in range(4):
        assert opening.advance() is None
    opening.abandon()
    chain = model._prompts._held_chain(9)
    assert chain is not None and chain.steps > 0
    figures = model.prompt_cache_figures()
    assert figures.entries == 1 and figures.bytes == chain.nbytes > 0
    model.set_prompt_cache_bytes(chain.nbytes)
    opened(model, 9, "Be brief.")
    assert model.prompt_cache_figures().bytes <= chain.nbytes


def test_a_clients_longer_prompt_never_grows_pinned_memory(model: VoiceChatModel) -> None:
    """The warmed prompt's chain is pinned as far as it needs; a
    longer prompt of the same seed extends a fork of it, stored unpinned, and opens
    exactly as mlx-vlm's constructor does."""
    from realtime.launch.warm import WarmPrompt, prepare_model
    from realtime.limits import Limits

    prepare_model(model, Limits(prompt_cache_bytes=1 << 30), [WarmPrompt("w", text="Be brief.")])
    pinned = model.prompt_cache_figures().pinned_bytes
    assert pinned > 0
    assert ours(model, 0, LONG_PROMPT) == theirs(model, 0, LONG_PROMPT)
    figures = model.prompt_cache_figures()
    assert figures.pinned_bytes == pinned and figures.bytes > pinned
    warmed = model._prompts.store.peek(VoiceKey(0, True))
    assert isinstance(warmed, VoiceChain) and warmed.steps == model.count_tokens("Be brief.")
    assert ours(model, 0, "Be brief.") == theirs(model, 0, "Be brief.")  # still a hit
