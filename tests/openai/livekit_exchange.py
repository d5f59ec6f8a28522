"""Exchanges held by LiveKit's ``livekit-plugins-openai`` ``RealtimeModel`` session, as
LiveKit's ``AgentSession`` drives it (``push_audio``, ``commit_audio``, ``generate_reply``,
``interrupt``), without a LiveKit room.

Each scenario runs on its own asyncio loop (``asyncio.run``, in a worker thread of the
trio test) against a server on 127.0.0.1 and returns what LiveKit surfaced: its
generations, their text and audio, its errors and the raw server events. LiveKit is
imported here only, so the tests skip when it is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

import attrs

from tests.openai.sdk_exchange import API_KEY, RATE, cold_speech, voice

STEP = 20.0
"""Seconds any one step may take before the scenario gives up (a safety net: each
takes well under a second against the fake model)."""


@attrs.define
class Generation:
    """One LiveKit generation: a response as LiveKit's agent sees it."""

    user_initiated: bool
    text: str = ""
    audio_samples: int = 0


@attrs.define
class Seen:
    generations: list[Generation] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    """LiveKit's ``error`` events (a ``RealtimeModelError`` each), as text."""
    server: list[dict[str, Any]] = attrs.Factory(list)
    """Every raw server event, audio deltas without their audio."""

    def done(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.server if e["type"] == "response.done"]


@contextlib.asynccontextmanager
async def session(http: str, **options: Any) -> AsyncIterator[tuple[Any, Seen]]:
    """A LiveKit realtime session at ``http``'s ``/openai/v1`` (LiveKit adds ``/realtime``)."""
    lk = importlib.import_module("livekit.plugins.openai")
    model = lk.realtime.RealtimeModel(
        base_url=http + "/openai/v1", api_key=API_KEY, modalities=["audio"], **options
    )
    conversation = model.session()
    seen = Seen()

    def server_event(event: dict[str, Any]) -> None:
        if event["type"] == "response.output_audio.delta":
            event = {**event, "delta": ""}
        seen.server.append(event)

    conversation.on("openai_server_event_received", server_event)
    conversation.on("error", lambda error: seen.errors.append(repr(error.error)))
    try:
        yield conversation, seen
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conversation.aclose(), STEP)
        await model.aclose()


def speak(conversation: Any, seconds: float) -> None:
    """``seconds`` of voice, in the 20 ms frames a LiveKit room delivers."""
    rtc = importlib.import_module("livekit.rtc")
    pcm = voice(seconds)
    step = RATE // 50 * 2
    for i in range(0, len(pcm), step):
        chunk = pcm[i : i + step]
        conversation.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))


async def follow(event: Any, seen: Seen, *, on_audio: Any = None) -> Generation:
    """Read one generation to its end, as LiveKit's agent does; ``on_audio(n)`` is
    called with the number of each audio frame as it comes."""
    generation = Generation(event.user_initiated)
    seen.generations.append(generation)

    async def audio(stream: Any) -> None:
        frames = 0
        async for frame in stream:
            generation.audio_samples += frame.samples_per_channel
            frames += 1
            if on_audio is not None:
                on_audio(frames)

    async def text(stream: Any) -> None:
        async for piece in stream:
            generation.text += str(piece)

    async def read() -> None:
        async for message in event.message_stream:
            await asyncio.gather(audio(message.audio_stream), text(message.text_stream))

    await asyncio.wait_for(read(), STEP)
    return generation


def at(frame: int, act: Any) -> Any:
    """An ``on_audio`` that calls ``act`` once, at audio frame ``frame``."""
    return lambda n: act() if n == frame else None


async def generated(conversation: Any, timeout: float = STEP) -> Any:
    """The next generation the server opens by itself."""
    created: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_created(event: Any) -> None:
        if not created.done():
            created.set_result(event)

    conversation.on("generation_created", on_created)
    try:
        return await asyncio.wait_for(created, timeout)
    finally:
        conversation.off("generation_created", on_created)


async def push_to_talk(http: str) -> Seen:
    """``turn_detection=None``: the user's turn is committed by hand and answered on
    ``generate_reply``; the second answer is cut with ``interrupt``. The server must
    open no response of its own (the model talks over the user each time)."""
    async with session(http, turn_detection=None) as (conversation, seen):
        unasked: list[Any] = []
        conversation.on(
            "generation_created", lambda e: None if e.user_initiated else unasked.append(e)
        )
        for on_audio in (None, at(1, conversation.interrupt)):
            speak(conversation, 1.0)
            conversation.commit_audio()
            reply = await asyncio.wait_for(conversation.generate_reply(), STEP)
            await follow(reply, seen, on_audio=on_audio)
        assert not unasked, "the server opened a response nobody asked for"
    return seen


async def server_vad(http: str) -> Seen:
    """Server VAD (LiveKit's default: semantic VAD, create_response and
    interrupt_response on): the server answers by itself; the second answer is cut with
    ``interrupt``, the third by the user speaking again (once the model has spoken for
    ten frames, so that the speech is a new user turn)."""
    async with session(http) as (conversation, seen):
        for on_audio in (
            None,
            at(1, conversation.interrupt),
            at(10, lambda: speak(conversation, 0.5)),
        ):
            waiting = asyncio.ensure_future(generated(conversation))
            speak(conversation, 1.0)
            await follow(await waiting, seen, on_audio=on_audio)
    return seen


async def cold_vad(http: str) -> Seen:
    """Server VAD, the room's audio pushed in real time from the start, silence first,
    as it comes while a slow model still opens: the server answers by itself."""
    rtc = importlib.import_module("livekit.rtc")
    async with session(http) as (conversation, seen):
        waiting = asyncio.ensure_future(generated(conversation))
        loop = asyncio.get_running_loop()
        pcm, step = cold_speech(), RATE // 50 * 2  # 20 ms
        start = loop.time()
        for n, i in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
            chunk = pcm[i : i + step]
            conversation.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        await follow(await waiting, seen)
    return seen


SCENARIOS = {"push_to_talk": push_to_talk, "server_vad": server_vad, "cold_vad": cold_vad}


def load() -> None:
    """Import LiveKit's plugin, which must be on the main thread (it registers itself)."""
    importlib.import_module("livekit.plugins.openai")


def run(scenario: str, http: str) -> Seen:
    """One scenario on a loop of its own (call :func:`load` first, on the main thread)."""
    return asyncio.run(SCENARIOS[scenario](http))
