"""A Live conversation held by LiveKit Agents' GPT-Live model
(``livekit.plugins.openai.realtime.GPTLiveModel``, client delegation), its session driven
as LiveKit's duplex adapter drives it, without a room: ``_update_session`` with the
agent's instructions (the framework's hook, which releases ``session.start``),
``push_audio`` in a room's 20 ms frames, the model's ``audio_stream`` read, the
``delegation_created`` event answered with ``append_commentary``, ``aclose``
(``session.close``, then ``session.closed`` awaited).

Runs on an asyncio loop of its own; LiveKit hands over every raw server event
(``openai_server_event_received``) and every client event it sends
(``openai_client_event_queued``). Import LiveKit's plugin on the main thread first
(:func:`tests.openai.livekit_exchange.load`).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from tests.live.conversation import (
    API_KEY,
    COMMENTARY,
    INSTRUCTIONS,
    MODEL,
    RATE,
    STEP,
    Heard,
    stream,
)


async def _conversation(http: str) -> dict[str, Any]:
    rtc = importlib.import_module("livekit.rtc")
    plugin = importlib.import_module("livekit.plugins.openai.realtime")
    heard = Heard()
    model = plugin.GPTLiveModel(
        model=MODEL, base_url=http + "/openai/v1", api_key=API_KEY, delegation="client"
    )
    session = model.session()
    errors: list[str] = []

    def received(event: dict[str, Any]) -> None:
        try:
            heard.add(event)
        except Exception as exc:
            heard.fail(exc)

    def queued(event: dict[str, Any]) -> None:
        if event.get("type") == "session.commentary.append":
            heard.sent.append(event)

    session.on("openai_server_event_received", received)
    session.on("openai_client_event_queued", queued)
    session.on("error", lambda error: errors.append(repr(error.error)))
    session.on(
        "delegation_created",
        lambda delegation: session.append_commentary(COMMENTARY, delegation_id=delegation.id),
    )

    async def play() -> None:
        async for _ in session.audio_stream:
            pass

    def push(chunk: bytes) -> None:
        session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))

    speaker = asyncio.ensure_future(play())
    stop = asyncio.Event()
    mic: asyncio.Future[None] | None = None
    try:
        await session._update_session(instructions=INSTRUCTIONS)
        await heard.until("session.started")
        mic = asyncio.ensure_future(stream(push, stop))
        await heard.until("session.delegation.created")
        appended = await heard.until("session.commentary.appended")
        await heard.relayed(appended, COMMENTARY)
        stop.set()
        await mic
        await asyncio.wait_for(session.aclose(), STEP)
        await heard.until("session.closed", timeout=1.0)
    finally:
        stop.set()
        if mic is not None:
            mic.cancel()
        speaker.cancel()
        await model.aclose()
    assert heard.failure is None, heard.failure
    assert not errors, errors
    return heard.record()


def conversation(http: str) -> dict[str, Any]:
    """One conversation with the Live endpoint of the server at ``http``
    (``http://HOST:PORT``: LiveKit is given ``/openai/v1`` and adds ``/live/sessions``)."""
    return asyncio.run(_conversation(http))
