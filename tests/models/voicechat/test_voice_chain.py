"""The voice chain: the TTS side of a prefill of any length, rebuilt from one run per
seed, is mlx-vlm's constructor's state bit for bit (buffers, order, zero tails,
counters, code, key), rotated sliding windows included (demo checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import VoiceChain, nbytes


def cold_state(model: VoiceChatModel, seed: int, steps: int) -> tuple[Any, Any]:
    """mlx-vlm's constructor with a prompt of ``steps`` prefill steps; its session key."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.keys import SessionKey, drawing_from, install_voicechat

    install_voicechat()
    runtime = model.runtime
    words = " ".join(["a"] * (steps - 2))
    assert model.count_tokens(words) == steps
    key = SessionKey(seed)
    with drawing_from(key):
        inner = VoiceChatStreamingSession(runtime, system_prompt=words, seed=seed)
    return inner, key


def bits(a: Any) -> np.ndarray[Any, Any]:
    import mlx.core as mx

    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def assert_equal_state(chain: VoiceChain, inner: Any, key: Any, steps: int) -> None:
    part = chain.voice(steps)
    assert part.timeline_index == inner._timeline_index == steps
    assert list(part.text_tokens) == inner._text_tokens
    assert list(part.function_tokens) == inner._function_tokens
    assert np.array_equal(np.array(part.previous_code), np.array(inner._previous_code))
    assert np.array_equal(np.array(part.key), np.array(key._key))
    assert len(part.tts_cache) == len(inner._tts_cache)
    for ours, theirs in zip(part.tts_cache, inner._tts_cache, strict=True):
        assert type(ours) is type(theirs)
        ours_meta = {k: v for k, v in vars(ours).items() if k not in ("keys", "values")}
        theirs_meta = {k: v for k, v in vars(theirs).items() if k not in ("keys", "values")}
        assert ours_meta == theirs_meta
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            assert a.dtype == b.dtype and a.shape == b.shape
            # Bit for bit, signed zeros and all.
            assert bits(a).tobytes() == bits(b).tobytes()


@pytest.fixture
def small_window(demo_model: VoiceChatModel) -> Iterator[int]:
    """The demo TTS's sliding window cut to 24 entries, so prefills rotate it."""
    config = demo_model.runtime.model.tts_model.tts_model.config
    before = config.sliding_window
    config.sliding_window = 24
    try:
        yield 24
    finally:
        config.sliding_window = before


@pytest.mark.parametrize("window", ["demo", "small"])
def test_a_chain_rebuilds_the_constructors_voice_state_at_any_length(
    demo_model: VoiceChatModel, request: pytest.FixtureRequest, window: str
) -> None:
    """One chain run to the longest length, read back at shorter and equal lengths
    (the small window rotates several times past the warm-up's entries)."""
    if window == "small":
        request.getfixturevalue("small_window")
    chain = VoiceChain(demo_model.runtime, 7)
    lengths = (3, 4, 9, 30, 61)
    chain.extend(max(lengths), most=max(lengths))
    for steps in lengths:
        inner, key = cold_state(demo_model, 7, steps)
        assert_equal_state(chain, inner, key, steps)


def test_a_chain_extended_slice_by_slice_equals_one_run(demo_model: VoiceChatModel) -> None:
    """Four steps a slice, its running cache dropped half way (as when it is stored)
    and rebuilt from its records: still one run."""
    chain = VoiceChain(demo_model.runtime, 2)
    chain.extend(6)
    settled = chain.nbytes
    chain.settle()
    assert chain.nbytes < settled
    while chain.steps < 13:
        chain.extend(13)
    for steps in (6, 13):
        inner, key = cold_state(demo_model, 2, steps)
        assert_equal_state(chain, inner, key, steps)
    with pytest.raises(ValueError):
        chain.voice(14)


def live_chains() -> list[VoiceChain]:
    """Every voice chain the process holds (in the store or not)."""
    import gc

    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, VoiceChain) and not o.failed]


async def test_many_seeds_chains_stay_within_the_cache_bound_through_a_server(
    demo_model: VoiceChatModel,
) -> None:
    """Voice chains are one bounded resource of the server, not one per seed: clients
    of four new seeds open a prompt each (every other one leaves half way through its
    read), beside the chain the server builds ahead at idle and a warmed prompt's
    pinned chain; another opens a longer prompt of the warmed seed. After each,
    ``/health``'s bytes are within ``--prompt-cache-bytes`` and equal what the store
    holds, every chain the process still holds is one the store counts, the pinned
    bytes never grow, and older seeds' chains were evicted."""
    import trio

    from realtime.launch.server import engine_for
    from realtime.launch.warm import Keeping, WarmPrompt
    from realtime.limits import Limits
    from tests.engine.test_isolation import LONG_PROMPT
    from tests.helpers import ahttp, connect, running_server
    from tests.models.test_prompt_cache import OTHER_PROMPT

    # Chains other tests' models still hold (this worker's fixtures) are not this
    # server's: kept alive here, so their ids stay theirs while it runs.
    others = live_chains()
    theirs = {id(c) for c in others}
    demo_model.set_prompt_cache_bytes(1 << 30)
    opening = demo_model.begin_session(
        system_prompt=OTHER_PROMPT, seed=99, max_streaming_seconds=None
    )
    while opening.advance() is None:
        pass
    del opening  # it holds the store it opened in (replaced below)
    one = demo_model.prompt_cache_figures().bytes  # one seed's chain and one prompt
    bound = 3 * one
    limits = Limits(prompt_cache_bytes=bound, max_system_prompt_tokens=96)
    engine = engine_for(
        lambda: demo_model,
        limits,
        warm=[WarmPrompt("warm", text="Be brief.")],
        keeping=Keeping(None, build_ahead=True),
    )
    engine.start()
    store = demo_model._prompts.store

    async def health() -> dict[str, int]:
        """/health once no work runs at idle (the chain built ahead, reads whose client
        left), so the store and the chains hold still."""
        with trio.fail_after(120):
            while True:
                status, body = await ahttp("GET", server.http + "/health")
                assert status == 200
                cache: dict[str, int] = body["prompt_cache"]
                assert cache["max_bytes"] == bound and cache["bytes"] <= bound, cache
                if not cache["building"] and not cache["orphans"]:
                    break
                await trio.sleep(0.05)
        await trio.sleep(0.05)
        status, body = await ahttp("GET", server.http + "/health")
        cache = body["prompt_cache"]
        assert cache["max_bytes"] == bound and cache["bytes"] <= bound, cache
        held = [store.peek(key) for key in store.held()]
        assert cache["bytes"] == sum(
            c.nbytes if isinstance(c, VoiceChain) else nbytes(c) for c in held
        )
        counted = {id(c) for c in held} | theirs
        outside = [(c.seed, c.steps, c.nbytes) for c in live_chains() if id(c) not in counted]
        assert not outside, outside
        return cache

    try:
        async with running_server(engine, limits=limits) as server:
            pinned = (await health())["pinned_bytes"]
            assert pinned > 0
            for seed in range(1, 5):
                async with connect(server.url) as client:
                    if seed % 2:
                        await client.configure(seed=seed, system_prompt=OTHER_PROMPT)
                    else:  # leaves as soon as its read begins
                        assert (await client.recv())["type"] == "session.created"
                        session = {"seed": seed, "system_prompt": LONG_PROMPT}
                        await client.send({"type": "session.update", "session": session})
                        await trio.sleep(0.05)
                with trio.fail_after(60):
                    while engine.reserved:  # until its session is closed
                        await trio.sleep(0.01)
                cache = await health()
                assert cache["pinned_bytes"] == pinned
            async with connect(server.url) as client:  # longer than the warmed prompt
                await client.configure(seed=0, system_prompt=LONG_PROMPT)
            cache = await health()
            assert cache["pinned_bytes"] == pinned and cache["evictions"] > 0
    finally:
        engine.shutdown()
        demo_model.keep_states(None, 0, ahead_seed=0, ahead_tokens=0)
        demo_model.set_prompt_cache_bytes(1 << 30)
