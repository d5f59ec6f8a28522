"""Prompts warmed at start (``--warm-prompt``) and the prompt cache through the socket:
a warmed prompt is a hit for the first conversation on either endpoint, alone and
batched, and its frames equal a cold open's (demo checkpoint)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from realtime.launch.server import engine_for
from realtime.launch.warm import WarmPrompt, prepare_model, read_warm_prompt
from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from tests.engine.test_isolation import LONG_PROMPT, audio_for, reference, wire_digest
from tests.helpers import ahttp, append_msg, connect, running_server
from tests.models_fixtures import run_realtime

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SESSION = {"type": "realtime", "instructions": "Be brief.", "tools": [TOOL]}


def test_warm_prompt_files(tmp_path: Path) -> None:
    text = tmp_path / "agent.txt"
    text.write_text(LONG_PROMPT + "\n", "utf-8")
    assert read_warm_prompt(text) == WarmPrompt(str(text), text=LONG_PROMPT)
    update = tmp_path / "agent.json"
    update.write_text(json.dumps({"type": "session.update", "session": SESSION}), "utf-8")
    assert read_warm_prompt(update).session == SESSION
    for name, content, why in [
        ("blank.txt", "  \n", "blank"),
        ("bad.json", "{", "not valid JSON"),
        ("list.json", "[]", "session object"),
    ]:
        (tmp_path / name).write_text(content, "utf-8")
        with pytest.raises(ValueError, match=why):
            read_warm_prompt(tmp_path / name)
    with pytest.raises(ValueError, match="cannot read"):
        read_warm_prompt(tmp_path / "missing.txt")


def test_a_bad_warm_prompt_exits_2_before_the_model_loads(tmp_path: Path) -> None:
    done = run_realtime(tmp_path, "serve", "--port", "0", "--warm-prompt", str(tmp_path / "no"))
    assert done.returncode == 2, done.stderr
    assert "cannot read the warm prompt" in done.stderr


def test_a_warm_prompt_the_server_would_refuse_is_refused(demo_model: VoiceChatModel) -> None:
    with pytest.raises(ValueError, match="over the 8-token limit"):
        prepare_model(
            demo_model, Limits(max_system_prompt_tokens=8), [WarmPrompt("a", text=LONG_PROMPT)]
        )
    with pytest.raises(ValueError, match="tools"):
        prepare_model(demo_model, Limits(), [WarmPrompt("b", session={"tools": "none"})])


async def test_warmed_prompts_are_hits_on_both_endpoints_alone_and_batched(
    demo_model: VoiceChatModel,
) -> None:
    """Warmed at start (a native text, an OpenAI session with a tool): the first
    conversations with them are hits; two native ones at once run batched; each native
    one's frames equal a cold open's."""
    warm = (WarmPrompt("native", text=LONG_PROMPT), WarmPrompt("openai", session=SESSION))
    engine = engine_for(
        lambda: demo_model, Limits(max_sessions=2, admission_margin=0), batch_frames=True, warm=warm
    )
    engine.start()
    results: dict[int, list[dict[str, Any]]] = {}
    try:
        figures = demo_model.prompt_cache_figures()
        assert (figures.hits, figures.misses) == (0, 2)
        assert figures.pinned_bytes == figures.bytes > 0  # no opening can evict them
        async with running_server(engine) as server:

            async def native(i: int) -> None:
                async with connect(server.url) as client:
                    assert (await client.recv())["type"] == "session.created"
                    session = {"seed": 0, "system_prompt": LONG_PROMPT}
                    await client.send({"type": "session.update", "session": session})
                    assert (await client.recv(timeout=60))["type"] == "session.updated"
                    audio = audio_for(i)
                    for start in range(0, audio.shape[0], 2560):
                        await client.send(append_msg(audio[start : start + 2560]))
                        await trio.sleep(0.02)
                    await client.send({"type": "input_audio_buffer.commit"})
                    results[i] = await client.recv_until("response.done", timeout=120)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(native, 1)
                nursery.start_soon(native, 2)

            url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
            async with open_websocket_url(url) as ws:
                update = {"type": "session.update", "session": SESSION}
                await ws.send_message(json.dumps(update))
                with trio.fail_after(60):
                    while json.loads(await ws.get_message())["type"] != "session.updated":
                        pass
                    silence = base64.b64encode(bytes(4800)).decode()  # the model opens
                    append = {"type": "input_audio_buffer.append", "audio": silence}
                    await ws.send_message(json.dumps(append))
                    while demo_model.prompt_cache_figures().hits < 3:  # opened after
                        await trio.sleep(0.05)
            _, health = await ahttp("GET", server.http + "/health")
            _, metrics_raw = await ahttp("GET", server.http + "/metrics")
            metrics = metrics_raw.decode()
    finally:
        engine.shutdown()
    cache = health["prompt_cache"]
    assert (cache["hits"], cache["misses"]) == (3, 2) and cache["bytes"] > 0
    assert "realtime_prompt_cache_hits_total 3.0" in metrics
    demo_model.set_prompt_cache_bytes(0)  # the reference opens cold
    try:
        for i in (1, 2):
            expected = reference(demo_model, 0, LONG_PROMPT, audio_for(i))
            assert wire_digest(results[i]) == expected
    finally:
        demo_model.set_prompt_cache_bytes(1 << 30)


AGENT_PROMPT = (
    "You are the voice agent of a bicycle repair shop. Greet the caller, ask what is "
    "wrong with the bicycle, offer the earliest free slot and never invent prices. "
) * 25
"""About 4,000 characters: some 3,000 demo tokens, an agent's instructions and tools."""


async def test_an_agent_sized_prompt_is_accepted_at_the_default_limit(
    demo_model: VoiceChatModel,
) -> None:
    """A 4,000-character prompt fits the default --max-system-prompt-tokens on both
    endpoints (the connection leaves before its prefill ends: it is dropped unstored)."""
    assert 3900 <= len(AGENT_PROMPT) <= 4100
    tokens = demo_model.count_tokens(AGENT_PROMPT)
    assert 2500 < tokens <= Limits().max_system_prompt_tokens
    engine = engine_for(lambda: demo_model, Limits())
    engine.start()
    try:
        async with running_server(engine) as server:
            url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
            async with open_websocket_url(url) as ws:
                update = {"type": "session.update", "session": {"instructions": AGENT_PROMPT}}
                await ws.send_message(json.dumps(update))
                with trio.fail_after(30):
                    while (event := json.loads(await ws.get_message()))["type"] not in (
                        "session.updated",
                        "error",
                    ):
                        pass
                assert event["type"] == "session.updated", event
                assert event["session"]["instructions"] == AGENT_PROMPT
    finally:
        engine.shutdown()
    assert demo_model.prompt_cache_figures().entries == 0


def state_digest(inner: Any, key: Any) -> str:
    """Every bit of an opened session's state (language and TTS caches, previous code,
    key, token histories, timeline index), as one hash."""
    import hashlib

    import mlx.core as mx
    import numpy as np

    from realtime.models.voicechat.prompt import arrays

    digest = hashlib.sha256()
    state = (inner._language_cache, inner._tts_cache, inner._previous_code, key._key)
    for array in arrays(state):
        digest.update(str((array.dtype, array.shape)).encode())
        digest.update(np.array(array.view(mx.uint8) if array.size else array).tobytes())
    for layer in inner._tts_cache:
        digest.update(
            str(sorted((k, v) for k, v in vars(layer).items() if isinstance(v, int))).encode()
        )
    digest.update(str((inner._text_tokens, inner._function_tokens, inner._timeline_index)).encode())
    return digest.hexdigest()


async def test_an_openai_cached_open_equals_a_cold_open_through_the_socket(
    demo_model: VoiceChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two OpenAI conversations with instructions and a tool, one after the other: the
    first opens cold, the second from the prompt cache; each opened state is, bit for
    bit, mlx-vlm's constructor's with the prompt the endpoint renders."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.launch.warm import system_prompt_of
    from realtime.models.voicechat.keys import SessionKey, drawing_from
    from realtime.models.voicechat.opening import VoiceChatOpening

    opened: list[str] = []
    open_ = VoiceChatOpening._open

    def recording(self: VoiceChatOpening) -> Any:
        session = open_(self)
        opened.append(state_digest(session._inner, session._key))
        return session

    monkeypatch.setattr(VoiceChatOpening, "_open", recording)
    demo_model.set_prompt_cache_bytes(1 << 30)
    engine = engine_for(lambda: demo_model, Limits())
    engine.start()
    try:
        async with running_server(engine) as server:
            url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
            for n in (1, 2):
                async with open_websocket_url(url) as ws:
                    update = {"type": "session.update", "session": SESSION}
                    await ws.send_message(json.dumps(update))
                    silence = base64.b64encode(bytes(4800)).decode()  # the model opens
                    append = {"type": "input_audio_buffer.append", "audio": silence}
                    await ws.send_message(json.dumps(append))
                    with trio.fail_after(120):
                        while len(opened) < n:
                            await trio.sleep(0.05)
    finally:
        engine.shutdown()
    figures = demo_model.prompt_cache_figures()
    assert (figures.misses, figures.hits) == (1, 1)
    prompt = system_prompt_of(WarmPrompt("openai", session=SESSION), demo_model, Limits())
    assert prompt is not None and "get_weather" in prompt
    key = SessionKey(0)
    with drawing_from(key):
        theirs = VoiceChatStreamingSession(demo_model.runtime, system_prompt=prompt, seed=0)
    assert opened == [state_digest(theirs, key)] * 2
    demo_model.set_prompt_cache_bytes(1 << 30)


async def test_an_agent_sized_prompt_is_served(demo_model: VoiceChatModel) -> None:
    """A 4,000-character prompt read whole (native: ``session.updated`` once it is),
    then a turn answered after it: the conversation runs on that prompt."""
    demo_model.set_prompt_cache_bytes(1 << 30)
    engine = engine_for(lambda: demo_model, Limits())
    engine.start()
    try:
        async with running_server(engine) as server:
            async with connect(server.url) as client:
                assert (await client.recv())["type"] == "session.created"
                session = {"seed": 0, "system_prompt": AGENT_PROMPT}
                await client.send({"type": "session.update", "session": session})
                assert (await client.recv(timeout=600))["type"] == "session.updated"
                audio = audio_for(1)
                for start in range(0, audio.shape[0], 2560):
                    await client.send(append_msg(audio[start : start + 2560]))
                await client.send({"type": "input_audio_buffer.commit"})
                events = await client.recv_until("response.done", timeout=300)
    finally:
        engine.shutdown()
    assert events[-1]["type"] == "response.done"
    assert any(e["type"] == "response.audio.delta" for e in events)
    tokens = demo_model.count_tokens(AGENT_PROMPT)
    figures = demo_model.prompt_cache_figures()
    assert figures.entries == 2 and figures.misses >= 1  # read whole and stored
    assert demo_model.prompt_cache_figures().bytes > tokens
