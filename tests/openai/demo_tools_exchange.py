"""A tool round trip with the demo, held by three client stacks as their apps hold it:
the user speaks, the demo calls the session's first tool (its arguments from the tool's
schema), the stack's own tool machinery runs the handler and sends its output, and the
demo answers with what the tool said.

Each scenario runs on an asyncio loop of its own (in a worker thread of the trio test)
and returns the arguments the handler was called with and the answer's transcript.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from realtime.audio import prepare_input
from tests.models_fixtures import speechlike
from tests.openai.livekit_exchange import follow, generated, session
from tests.openai.sdk_exchange import API_KEY, RATE, _client, _until, next_done

STEP = 120.0
"""Seconds any one step may take: the demo's network runs on the CPU here, and opens
with the tools' prompt a token a slice."""

CITY_SCHEMA = {"type": "string", "examples": ["Paris"]}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": CITY_SCHEMA}},
    }
]

City = Annotated[str, Field(examples=["Paris"])]
"""A handler's parameter with the same example: the stacks put it in the schema."""

Result = tuple[list[dict[str, Any]], str]
"""The handler's calls (their arguments) and the transcript of the demo's answer."""


def question() -> bytes:
    """A second of speech-like sound, then a second of silence, as 24 kHz PCM16."""
    x = np.concatenate([speechlike(12), np.zeros(16000, np.float32)])
    return prepare_input(x, 16000, extra_seconds=0.0, to_rate=RATE).astype("<i2").tobytes()


def weather(city: str) -> str:
    return f"sunny in {city}"


def openai_sdk(ws_base: str) -> Result:
    """The ``openai`` SDK: server VAD, the call read from ``response.done``, its output
    sent as a ``function_call_output`` item and answered on ``response.create``."""
    log: list[dict[str, Any]] = []
    called: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        _until(conn, log, "session.created")
        conn.session.update(session={"type": "realtime", "tools": TOOLS})
        _until(conn, log, "session.updated")
        pcm = question()
        for i in range(0, len(pcm), 960):
            conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 960]).decode())
        first = _until(conn, log, "response.done")
        calls = [o for o in first["response"]["output"] if o["type"] == "function_call"]
        for call in calls:
            arguments = json.loads(call["arguments"])
            called.append(arguments)
            output = {"type": "function_call_output", "call_id": call["call_id"]}
            conn.conversation.item.create(item={**output, "output": weather(**arguments)})
        conn.response.create()
        done = next_done(conn, log, first)
    said = "".join(
        p.get("transcript", "") for o in done["response"]["output"] for p in o.get("content", [])
    )
    return called, said


async def _livekit(http: str) -> Result:
    llm = importlib.import_module("livekit.agents.llm")
    rtc = importlib.import_module("livekit.rtc")
    called: list[dict[str, Any]] = []

    async def handler(city: City) -> str:
        """The weather in a city."""
        called.append({"city": city})
        return weather(city)

    get_weather = llm.function_tool(handler, name="get_weather")
    tools = llm.ToolContext([get_weather])
    async with session(http) as (conversation, seen):
        await conversation.update_tools([get_weather])
        waiting = asyncio.ensure_future(generated(conversation, STEP))
        pcm = question()
        step = RATE // 50 * 2
        for i in range(0, len(pcm), step):
            chunk = pcm[i : i + step]
            conversation.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        created = await waiting

        async def calls() -> list[Any]:
            return [call async for call in created.function_stream]

        for call in await asyncio.wait_for(calls(), STEP):
            asked = llm.FunctionToolCall(
                name=call.name, arguments=call.arguments, call_id=call.call_id
            )
            result = await llm.utils.execute_function_call(asked, tools)
            context = conversation.chat_ctx.copy()
            context.items.append(result.fnc_call_out)
            await conversation.update_chat_ctx(context)
        reply = await asyncio.wait_for(conversation.generate_reply(), STEP)
        answer = await follow(reply, seen)
    return called, answer.text


def livekit(http: str) -> Result:
    """LiveKit's ``livekit-plugins-openai`` session with a ``function_tool``, run by
    LiveKit's own ``execute_function_call`` (as its ``AgentSession`` does) and answered
    on ``generate_reply``. Call ``tests.openai.livekit_exchange.load`` first."""
    return asyncio.run(_livekit(http))


async def _agents(ws_url: str) -> Result:
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    called: list[dict[str, Any]] = []

    def handler(city: City) -> str:
        """The weather in a city."""
        called.append({"city": city})
        return weather(city)

    get_weather = function_tool(handler, name_override="get_weather")

    agent: RealtimeAgent[Any] = RealtimeAgent(name="assistant", tools=[get_weather])
    config: Any = {"url": ws_url, "api_key": API_KEY, "initial_model_settings": {}}
    session = await RealtimeRunner(agent).run(model_config=config)
    said = ""
    async with session:
        pcm = question()
        for i in range(0, len(pcm), RATE // 10 * 2):
            await session.send_audio(pcm[i : i + RATE // 10 * 2])

        async def read() -> str:
            done = 0
            async for event in session:
                if event.type != "raw_model_event" or event.data.type != "raw_server_event":
                    continue
                raw = event.data.data
                if raw.get("type") == "response.done":
                    done += 1
                    if done == 2:
                        output = raw["response"]["output"]
                        return "".join(
                            p.get("transcript", "") for o in output for p in o.get("content", [])
                        )
            return ""

        said = await asyncio.wait_for(read(), STEP)
    return called, said


def agents(ws_url: str) -> Result:
    """The Agents SDK's ``RealtimeRunner`` with a ``function_tool``: the runner calls it
    and sends its output, asking for the answer, by itself."""
    return asyncio.run(_agents(ws_url))
