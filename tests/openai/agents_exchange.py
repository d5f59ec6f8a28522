"""Exchanges held by the OpenAI Agents SDK's ``RealtimeRunner`` (``openai-agents``),
as an app built on it holds them: a ``RealtimeAgent``, a session from
``runner.run(model_config=...)``, audio in with ``send_audio``, the session's events out.

Each scenario runs on its own asyncio loop (``asyncio.run``, in a worker thread of the
trio test) against a server on 127.0.0.1 and returns what the session surfaced.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import attrs
import numpy as np
from agents.realtime import (
    RealtimeAgent,
    RealtimeModelConfig,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionModelSettings,
)
from agents.realtime.model_inputs import RealtimeModelSendRawMessage

from realtime.wire_audio import ulaw_encode
from tests.openai.sdk_exchange import API_KEY, RATE, cold_speech, voice

STEP = 20.0
"""Seconds any one exchange may take before the scenario gives up (a safety net: each
takes about a second against the fake model)."""


@attrs.define
class Seen:
    audio_bytes: int = 0
    """PCM the session handed on as ``RealtimeAudio`` events."""
    audio: bytearray = attrs.Factory(bytearray)
    """Their bytes, in order (the Twilio scenario keeps them: μ-law at 8 kHz)."""
    errors: list[str] = attrs.Factory(list)
    """The session's ``error`` events, as text."""
    server: list[dict[str, Any]] = attrs.Factory(list)
    """Every raw server event, audio deltas without their audio."""

    def done(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.server if e["type"] == "response.done"]


async def _send_voice(session: RealtimeSession, seconds: float, *, commit: bool = False) -> None:
    pcm = voice(seconds)
    step = RATE // 10 * 2
    for i in range(0, len(pcm), step):
        last = i + step >= len(pcm)
        await session.send_audio(pcm[i : i + step], commit=commit and last)


async def _until_done(session: RealtimeSession, seen: Seen, responses: int) -> None:
    """Read the session's events until ``responses`` responses are done in all."""
    async for event in session:
        if event.type == "audio":
            seen.audio_bytes += len(event.audio.data)
            seen.audio += event.audio.data
        elif event.type == "error":
            seen.errors.append(repr(event.error))
        elif event.type == "raw_model_event" and event.data.type == "raw_server_event":
            raw = dict(event.data.data)
            if raw.get("type") == "response.output_audio.delta":
                raw["delta"] = ""
            seen.server.append(raw)
            if len(seen.done()) >= responses:
                return


async def _session(ws_url: str, settings: RealtimeSessionModelSettings) -> RealtimeSession:
    agent: RealtimeAgent[Any] = RealtimeAgent(name="assistant", instructions="Be brief.")
    config: RealtimeModelConfig = {
        "url": ws_url,
        "api_key": API_KEY,
        "initial_model_settings": settings,
    }
    return await RealtimeRunner(agent).run(model_config=config)


async def server_vad(ws_url: str) -> Seen:
    """The SDK's default session (semantic VAD, interrupt_response on): speak, and the
    server answers by itself."""
    seen = Seen()
    async with await _session(ws_url, {}) as session:
        await _send_voice(session, 1.0)
        await asyncio.wait_for(_until_done(session, seen, 1), STEP)
    return seen


async def push_to_talk(ws_url: str) -> Seen:
    """``turn_detection: None``: audio committed with the last chunk, then a
    ``response.create`` sent raw (the SDK's own way for a push-to-talk app)."""
    seen = Seen()
    async with await _session(ws_url, {"turn_detection": None}) as session:
        await _send_voice(session, 1.0, commit=True)
        create = RealtimeModelSendRawMessage(message={"type": "response.create"})
        await session.model.send_event(create)
        await asyncio.wait_for(_until_done(session, seen, 1), STEP)
    return seen


TWILIO_SETTINGS: RealtimeSessionModelSettings = {
    "input_audio_format": "g711_ulaw",
    "output_audio_format": "g711_ulaw",
    "turn_detection": {
        "type": "semantic_vad",
        "interrupt_response": True,
        "create_response": True,
    },
}
"""The Agents SDK's Twilio example's session (examples/realtime/twilio): phone audio
both ways, which the SDK sends as ``{"type": "audio/pcmu"}``."""
TWILIO_FRAME = 160
"""Bytes of one Twilio media message: 20 ms of μ-law at 8 kHz."""
TWILIO_BUFFER = 400
"""What the example gathers before each ``send_audio``: 50 ms."""


def twilio_media(seconds: float, seed: int = 0) -> list[str]:
    """A Twilio media stream's ``media`` messages: ``seconds`` of voice (noise loud
    enough to be speech), then a phone line's silence, 20 ms of μ-law a message."""
    rng = np.random.default_rng(seed)
    noise = np.clip(rng.standard_normal(int(seconds * 8000)) * 0.2, -1, 1)
    ulaw = ulaw_encode(np.rint(noise * 32767).astype(np.int16)).tobytes()
    out = []
    for i in range(0, len(ulaw), TWILIO_FRAME):
        payload = base64.b64encode(ulaw[i : i + TWILIO_FRAME]).decode()
        out.append(json.dumps({"event": "media", "media": {"payload": payload}}))
    return out


TWILIO_SILENCE = json.dumps(
    {"event": "media", "media": {"payload": base64.b64encode(b"\xff" * TWILIO_FRAME).decode()}}
)


async def _twilio_stream(session: RealtimeSession, voice_seconds: float) -> None:
    """What the example's handler does with Twilio's stream, in real time: each media
    message's μ-law is gathered and sent on every 50 ms; after the caller's voice the
    line stays open with silence (a phone call streams until it hangs up)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    buffer = bytearray()
    voice = twilio_media(voice_seconds)
    n = 0
    while True:
        message = json.loads(voice[n] if n < len(voice) else TWILIO_SILENCE)
        buffer += base64.b64decode(message["media"]["payload"])
        if len(buffer) >= TWILIO_BUFFER:
            await session.send_audio(bytes(buffer))
            buffer.clear()
        n += 1
        await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))


async def twilio(ws_url: str) -> Seen:
    """The Twilio example's settings and a simulated Twilio media stream: a caller
    speaks for a second, and the answer comes back as μ-law at 8 kHz."""
    seen = Seen()
    async with await _session(ws_url, TWILIO_SETTINGS) as session:
        stream = asyncio.create_task(_twilio_stream(session, 1.0))
        try:
            await asyncio.wait_for(_until_done(session, seen, 1), STEP)
        finally:
            stream.cancel()
            try:
                await stream
            except asyncio.CancelledError:
                pass
    return seen


async def cold_vad(ws_url: str) -> Seen:
    """:func:`server_vad` streamed in real time from the start, silence first, as a
    microphone app does while a slow model still opens."""
    seen = Seen()
    async with await _session(ws_url, {}) as session:
        loop = asyncio.get_running_loop()
        pcm, step = cold_speech(), RATE // 50 * 2  # 20 ms
        start = loop.time()
        for n, i in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
            await session.send_audio(pcm[i : i + step])
        await asyncio.wait_for(_until_done(session, seen, 1), STEP)
    return seen


SCENARIOS = {
    "push_to_talk": push_to_talk,
    "server_vad": server_vad,
    "twilio": twilio,
    "cold_vad": cold_vad,
}


def run(scenario: str, ws_url: str) -> Seen:
    """One scenario on a loop of its own."""
    return asyncio.run(SCENARIOS[scenario](ws_url))
