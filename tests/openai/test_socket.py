"""``/openai/v1/realtime`` on a real Hypercorn server: auth, cancel, tools, the demo model."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import trio
from trio_websocket import ConnectionRejected, WebSocketConnection, open_websocket_url

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from realtime.testing.fake import say
from tests.helpers import running_server
from tests.openai.scripted import call_then_say, scripted
from tests.openai.sdk_exchange import voice
from tests.openai.validate import validate_ga


class Peer:
    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps(message))

    async def recv(self) -> dict[str, Any]:
        with trio.fail_after(20):
            event: dict[str, Any] = json.loads(await self.ws.get_message())
        validate_ga(event)
        self.seen.append(event)
        return event

    async def until(self, type_: str) -> dict[str, Any]:
        while True:
            event = await self.recv()
            if event["type"] == type_:
                return event

    async def speak(self, seconds: float) -> None:
        pcm = voice(seconds)
        for i in range(0, len(pcm), 9600):
            audio = base64.b64encode(pcm[i : i + 9600]).decode()
            await self.send({"type": "input_audio_buffer.append", "audio": audio})


@asynccontextmanager
async def peer(engine: Engine, **kwargs: Any) -> AsyncIterator[Peer]:
    api_key = kwargs.pop("api_key", None)
    limits = kwargs.pop("limits", None)
    async with running_server(engine, api_key=api_key, limits=limits) as server:
        url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
        async with open_websocket_url(url, **kwargs) as ws:
            yield Peer(ws)


async def rejected(engine: Engine, **kwargs: Any) -> int | None:
    """The HTTP status that refused the upgrade (None: it was accepted)."""
    try:
        async with peer(engine, **kwargs):
            return None
    except BaseException as exc:
        found: list[BaseException] = [exc]
        while found:
            error = found.pop()
            if isinstance(error, ConnectionRejected):
                return error.status_code
            found += getattr(error, "exceptions", [])
        raise


def engine_for(model: Any) -> Engine:
    eng = Engine(lambda: model)
    eng.start()
    return eng


async def test_browser_subprotocol_key_selects_realtime() -> None:
    eng = engine_for(scripted())
    try:
        protocols = ["realtime", "openai-insecure-api-key.sk-1"]
        async with peer(eng, api_key="sk-1", subprotocols=protocols) as p:
            assert p.ws.subprotocol == "realtime"
            assert (await p.recv())["type"] == "session.created"
        assert await rejected(eng, api_key="sk-1", subprotocols=["realtime"]) == 401
        # The native key subprotocol does not open the OpenAI path.
        native = ["realtime", "realtime-key.sk-1"]
        assert await rejected(eng, api_key="sk-1", subprotocols=native) == 401
    finally:
        eng.shutdown()


async def test_cancel_mid_turn_and_when_idle() -> None:
    eng = engine_for(scripted(say(*["word "] * 20), say("again")))
    try:
        async with peer(eng) as p:
            await p.until("session.created")
            await p.send({"type": "response.cancel"})
            error = await p.until("error")
            assert error["error"]["code"] == "response_cancel_not_active"
            await p.speak(0.6)
            created = await p.until("response.output_audio.delta")
            await p.send({"type": "response.cancel"})
            done = await p.until("response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["id"] == created["response_id"]
            await p.speak(0.6)  # the socket is still open and the next turn comes
            second = await p.until("response.done")
            assert second["response"]["status"] == "completed"
            assert second["response"]["id"] != created["response_id"]
            later = p.seen[p.seen.index(done) :]
            assert not any(e.get("response_id") == created["response_id"] for e in later)
    finally:
        eng.shutdown()


async def test_tool_call_over_the_socket() -> None:
    model = scripted(call_then_say("Sunny."))
    eng = engine_for(model)
    try:
        async with peer(eng) as p:
            await p.until("session.created")
            tool = {"type": "function", "name": "get_weather", "description": "Weather."}
            await p.send(
                {"type": "session.update", "session": {"type": "realtime", "tools": [tool]}}
            )
            await p.until("session.updated")
            await p.speak(0.6)
            args = await p.until("response.function_call_arguments.done")
            assert (args["name"], json.loads(args["arguments"])) == (
                "get_weather",
                {"city": "Paris"},
            )
            output = {
                "type": "function_call_output",
                "call_id": args["call_id"],
                "output": '{"sky": "clear"}',
            }
            await p.send({"type": "conversation.item.create", "item": output})
            added = await p.until("conversation.item.added")
            assert added["item"]["call_id"] == args["call_id"]
            spoken = await p.until("response.done")
            while spoken["response"]["output"][0]["type"] != "message":
                spoken = await p.until("response.done")
            assert spoken["response"]["output"][0]["content"][0]["transcript"] == "Sunny."
        ((prompt, _, _),) = model.calls_named("open")
        assert "<AVAILABLE_TOOLS>" in (prompt or "")
    finally:
        eng.shutdown()


async def test_long_instructions_are_refused_by_the_models_tokenizer() -> None:
    model = scripted()  # one token per character
    eng = engine_for(model)
    try:
        async with peer(eng, limits=Limits(max_system_prompt_tokens=8)) as p:
            await p.until("session.created")
            update = {"type": "realtime", "instructions": "Be brief!"}
            await p.send({"type": "session.update", "session": update})
            error = await p.until("error")
            assert "is 9 tokens, over the 8-token limit" in error["error"]["message"]
            await p.send({"type": "session.update", "session": {"instructions": "Be brief"}})
            assert (await p.recv())["type"] == "session.updated"
        assert model.calls_named("open") == []
    finally:
        eng.shutdown()


async def test_absurd_client_json_gets_errors_and_the_session_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each of these ended the session with 1011 and a logged traceback (RecursionError,
    a lone surrogate failing the echo's write, a list as a dict key), or cost seconds
    and about 100 MB (1.3 M ``{}``). Now each is one error and the socket stays open."""
    deep = "[" * 3000 + "]" * 3000
    frames = {
        '{"type":"response.create","response":{"metadata":' + deep + "}}": "invalid_json",
        '{"type":"conversation.item.create","item":{"type":"message","content":'
        '[{"type":"input_text","text":"\\ud800"}]}}': "invalid_json",
        '{"type":"conversation.item.create","item":{"type":"message","id":[1]}}': ("invalid_value"),
        '{"type":"conversation.item.create","item":{"type":"message","content":['
        + ",".join(["{}"] * 1_300_000)
        + "]}}": "message_too_large",
    }
    eng = engine_for(scripted())
    try:
        with trio.fail_after(30):
            async with peer(eng) as p:
                await p.until("session.created")
                for frame, code in frames.items():
                    await p.ws.send_message(frame)
                    error = await p.recv()
                    assert error["type"] == "error", error
                    assert error["error"]["type"] == "invalid_request_error"
                    assert error["error"]["code"] == code
                await p.send({"type": "output_audio_buffer.clear"})
                assert (await p.recv())["type"] == "output_audio_buffer.cleared"
    finally:
        eng.shutdown()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_native_path_is_unchanged() -> None:
    eng = engine_for(scripted())
    try:
        async with running_server(eng) as server, open_websocket_url(server.url) as ws:
            created = json.loads(await ws.get_message())
            assert created["session"]["input_audio_format"]["sample_rate"] == 16000
    finally:
        eng.shutdown()


@pytest.mark.slow
async def test_demo_checkpoint_through_the_endpoint(demo_model: VoiceChatModel) -> None:
    eng = engine_for(demo_model)
    try:
        async with peer(eng) as p:
            await p.until("session.created")
            await p.send({"type": "session.update", "session": {"type": "realtime"}})
            await p.until("session.updated")
            noise = np.random.default_rng(1).standard_normal(24000 * 2) * 0.1 * 32767
            pcm = noise.astype("<i2").tobytes()
            for i in range(0, len(pcm), 9600):
                audio = base64.b64encode(pcm[i : i + 9600]).decode()
                await p.send({"type": "input_audio_buffer.append", "audio": audio})
            await p.send({"type": "response.create"})
            await p.until("response.created")
            with trio.move_on_after(5):
                while not any(e["type"] == "response.done" for e in p.seen):
                    await p.recv()
        deltas = [e for e in p.seen if e["type"] == "response.output_audio.delta"]
        assert deltas, [e["type"] for e in p.seen]
        pcm_out = np.concatenate(
            [np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in deltas]
        )
        assert pcm_out.size and np.abs(pcm_out).max() > 0
    finally:
        eng.shutdown()


async def test_frame_latency_means_what_it_means_on_the_native_endpoint() -> None:
    """``realtime_frame_latency_seconds``: the audio's arrival until the frame's audio
    was handed to the socket, one observation per audio frame sent, on trio's clock
    (this endpoint measured engine submit to before the write, on another clock)."""
    from tests.telemetry.test_metrics import value

    eng = engine_for(scripted(say("Hi ", "there", None, "!")))
    try:
        async with running_server(eng) as server:
            url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
            async with open_websocket_url(url) as ws:
                p = Peer(ws)
                await p.until("session.created")
                await p.speak(0.6)
                await p.until("response.done")
            text = server.state.metrics.exposition().decode()
    finally:
        eng.shutdown()
    deltas = sum(e["type"] == "response.output_audio.delta" for e in p.seen)
    count = value(text, "realtime_frame_latency_seconds_count")
    total = value(text, "realtime_frame_latency_seconds_sum")
    assert deltas > 0 and count == deltas
    assert 0 < total < 2.0 * count  # a fake model answers in milliseconds
