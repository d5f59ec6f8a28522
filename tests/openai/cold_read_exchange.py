"""Each client stack through a cold read of a long agent prompt on the demo checkpoint.

A stack sets instructions of about 3,000 demo tokens that no session has sent before
(its own text: each stack's read is cold), then streams a microphone in real time from
the start, as an app does while the model still reads the prompt: silence, with a
second of speech-like sound every few seconds (a user who says it again until answered;
the server keeps only the newest audio while it opens), until the demo's first answer
has come. Each returns what it saw: its errors, the answer's audio and its transcript.

The openai SDK, the Agents SDK and LiveKit run here (an asyncio loop, or the sync
client with a sending thread, in a worker thread of the trio test); Pipecat runs as
``python -m tests.openai.cold_read_exchange pipecat WS_BASE`` with its pinned
environment first on the path (the instructions in ``COLD_INSTRUCTIONS``).
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs

from realtime.audio import prepare_input
from tests.models_fixtures import speechlike

RATE = 24_000
API_KEY = "sk-local-test"
CHUNK = RATE // 50 * 2
"""20 ms of 24 kHz PCM16."""
SAY_EVERY = 5.0
"""Seconds between the user's attempts (each a second of speech, then silence)."""
WAIT = 900.0
"""Seconds a stack may wait for its answer: a cold read of 3,000 tokens on a loaded CPU
(a safety net, not a measure)."""
INSTRUCTIONS_ENV = "COLD_INSTRUCTIONS"

RULES = (
    "Greet the caller by the name on the booking when it is known. ",
    "Ask for the booking reference before changing anything. ",
    "Never promise a refund; say who decides and how long it takes. ",
    "Offer a person when the caller asks twice. ",
    "Keep each answer to two short sentences. ",
    "Read dates back as weekday, day and month. ",
    "Say prices with their currency and whether fees are included. ",
    "When a train is late, give the new time, not the delay. ",
)


def agent_prompt(stack: str, chars: int = 4100) -> str:
    """About ``chars`` characters of agent instructions of ``stack``'s own (some 3,000
    demo tokens), so no two stacks' prompts share a state."""
    lines = [f"You are the {stack} desk's voice agent for a regional rail operator. "]
    k = 0
    while sum(len(line) for line in lines) < chars:
        lines.append(f"Rule {k} for {stack}: {RULES[k % len(RULES)]}")
        k += 1
    return "".join(lines)[:chars]


def microphone() -> Iterator[bytes]:
    """20 ms chunks for as long as asked: silence, and a second of speech-like sound
    (then silence) every :data:`SAY_EVERY` seconds, the first after two seconds."""
    silence = bytes(CHUNK)
    sound = prepare_input(speechlike(12), 16000, extra_seconds=0.0, to_rate=RATE)
    speech = sound.astype("<i2").tobytes()
    said = [speech[i : i + CHUNK] for i in range(0, len(speech), CHUNK)]
    period = int(SAY_EVERY * 50)
    n = 0
    while True:
        at = (n - 100) % period if n >= 100 else -1
        yield said[at] if 0 <= at < len(said) else silence
        n += 1


@attrs.define
class Seen:
    errors: list[str] = attrs.Factory(list)
    audio_bytes: int = 0
    transcript: str = ""
    seconds: float = 0.0
    """From the session's start to the answer's end."""
    appends: int = 0
    """Audio chunks sent in real time until then."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _said(response: dict[str, Any]) -> str:
    return "".join(
        p.get("transcript", "") for o in response["output"] for p in o.get("content", [])
    )


# --- the openai SDK (sync client, a sending thread) ----------------------------------


def openai_sdk(ws_base: str, instructions: str) -> Seen:
    from tests.openai.sdk_exchange import _client, _recv

    seen = Seen()
    began = time.monotonic()
    log: list[dict[str, Any]] = []
    stop = threading.Event()
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        conn.session.update(session={"type": "realtime", "instructions": instructions})

        def send() -> None:
            start = time.monotonic()
            for n, chunk in enumerate(microphone()):
                if stop.is_set():
                    return
                time.sleep(max(0.0, start + n * 0.02 - time.monotonic()))
                conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                seen.appends += 1

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while time.monotonic() - began < WAIT:
                event = _recv(conn, log)
                if event["type"] == "error":
                    seen.errors.append(json.dumps(event["error"]))
                elif event["type"] == "response.output_audio.delta":
                    seen.audio_bytes += len(base64.b64decode(event["delta"]))
                elif event["type"] == "response.done":
                    seen.transcript = _said(event["response"])
                    break
        finally:
            stop.set()
            sender.join(5)
    seen.seconds = time.monotonic() - began
    return seen


# --- the Agents SDK ------------------------------------------------------------------


async def _agents(ws_url: str, instructions: str) -> Seen:
    from agents.realtime import RealtimeAgent, RealtimeRunner

    seen = Seen()
    began = time.monotonic()
    agent: RealtimeAgent[Any] = RealtimeAgent(name="assistant", instructions=instructions)
    config: Any = {"url": ws_url, "api_key": API_KEY, "initial_model_settings": {}}
    session = await RealtimeRunner(agent).run(model_config=config)
    async with session:

        async def send() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for n, chunk in enumerate(microphone()):
                await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
                await session.send_audio(chunk)
                seen.appends += 1

        async def read() -> None:
            async for event in session:
                if event.type == "audio":
                    seen.audio_bytes += len(event.audio.data)
                elif event.type == "error":
                    seen.errors.append(repr(event.error))
                elif event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    raw = event.data.data
                    if raw.get("type") == "response.done":
                        seen.transcript = _said(raw["response"])
                        return

        sender = asyncio.ensure_future(send())
        try:
            await asyncio.wait_for(read(), WAIT)
        finally:
            sender.cancel()
    seen.seconds = time.monotonic() - began
    return seen


def agents(ws_url: str, instructions: str) -> Seen:
    """The Agents SDK's ``RealtimeRunner`` (its default semantic VAD), the agent's
    instructions the long prompt."""
    return asyncio.run(_agents(ws_url, instructions))


# --- LiveKit ---------------------------------------------------------------------------


async def _livekit(http: str, instructions: str) -> Seen:
    from tests.openai.livekit_exchange import generated, session

    rtc = importlib.import_module("livekit.rtc")
    seen = Seen()
    began = time.monotonic()
    async with session(http) as (conversation, events):
        await conversation.update_instructions(instructions)
        waiting = asyncio.ensure_future(generated(conversation, WAIT))

        async def send() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for n, chunk in enumerate(microphone()):
                await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
                conversation.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
                seen.appends += 1

        sender = asyncio.ensure_future(send())
        try:
            created = await waiting

            async def follow() -> None:
                async for message in created.message_stream:

                    async def audio(stream: Any) -> None:
                        async for frame in stream:
                            seen.audio_bytes += 2 * frame.samples_per_channel

                    async def text(stream: Any) -> None:
                        async for piece in stream:
                            seen.transcript += str(piece)

                    await asyncio.gather(audio(message.audio_stream), text(message.text_stream))

            await asyncio.wait_for(follow(), WAIT)
        finally:
            sender.cancel()
        seen.errors += events.errors
    seen.seconds = time.monotonic() - began
    return seen


def livekit(http: str, instructions: str) -> Seen:
    """LiveKit's ``livekit-plugins-openai`` session (server VAD), its instructions set
    as LiveKit's agent sets them (``update_instructions``). Call
    ``tests.openai.livekit_exchange.load`` first, on the main thread."""
    return asyncio.run(_livekit(http, instructions))


# --- Pipecat (in its own environment) --------------------------------------------------


async def _pipecat(url: str, instructions: str) -> Seen:
    from pipecat.frames.frames import (  # type: ignore[import-not-found]
        EndFrame,
        ErrorFrame,
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline  # type: ignore[import-not-found]
    from pipecat.pipeline.runner import PipelineRunner  # type: ignore[import-not-found]
    from pipecat.pipeline.task import PipelineParams, PipelineTask  # type: ignore[import-not-found]
    from pipecat.processors.frame_processor import FrameProcessor  # type: ignore[import-not-found]
    from pipecat.services.openai.realtime import events  # type: ignore[import-not-found]
    from pipecat.services.openai.realtime.llm import (  # type: ignore[import-not-found]
        OpenAIRealtimeLLMService,
    )

    seen = Seen()
    began = time.monotonic()
    done = asyncio.Event()

    class Sink(FrameProcessor):  # type: ignore[misc]
        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                seen.audio_bytes += len(frame.audio)
            elif isinstance(frame, LLMTextFrame):
                seen.transcript += frame.text
            elif isinstance(frame, ErrorFrame):
                seen.errors.append(str(frame.error))
                done.set()
            elif isinstance(frame, LLMFullResponseEndFrame) and seen.audio_bytes:
                done.set()
            await self.push_frame(frame, direction)

    properties = events.SessionProperties(
        instructions=instructions,
        audio=events.AudioConfiguration(
            input=events.AudioInput(turn_detection=events.TurnDetection())
        ),
    )
    llm = OpenAIRealtimeLLMService(api_key=API_KEY, base_url=url, session_properties=properties)
    task = PipelineTask(
        Pipeline([llm, Sink()]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )

    async def speak() -> None:
        await asyncio.sleep(1.0)  # the session is set up (its instructions sent) first
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n, chunk in enumerate(microphone()):
            if done.is_set():
                break
            await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
            await task.queue_frame(
                InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
            )
            seen.appends += 1
        await task.queue_frame(EndFrame())

    runner = PipelineRunner(handle_sigint=False)
    await asyncio.wait_for(asyncio.gather(runner.run(task), speak()), WAIT)
    seen.seconds = time.monotonic() - began
    return seen


def main(argv: list[str]) -> None:
    stack, ws_base = argv
    if stack != "pipecat":
        raise SystemExit(f"only pipecat runs as a command, not {stack!r}")
    instructions = os.environ[INSTRUCTIONS_ENV]
    seen = asyncio.run(_pipecat(ws_base + "/realtime", instructions))
    print(json.dumps(seen.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1:])
