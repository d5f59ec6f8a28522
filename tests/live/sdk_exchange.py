"""A Live conversation held by the ``openai`` SDK's ``client.live.connect()``, as its
``openai/lib/live/README.md`` lays the lifecycle out: send ``session.start``, wait for
``session.started``, stream audio, answer the delegation with commentary, close.

Runs on an asyncio loop of its own (``asyncio.run``, in a worker thread of the trio
test); every raw event is validated strictly, parsed by the SDK itself and pushed to
the SDK's ``AsyncTranscriptGrouper``, whose closed segments (speaker and text) the
record carries as ``segments``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from websockets.exceptions import ConnectionClosedOK

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


async def _conversation(base_url: str) -> dict[str, Any]:
    from openai import AsyncOpenAI
    from openai.lib.live import AsyncTranscriptGrouper

    heard = Heard()
    segments: list[dict[str, Any]] = []
    grouper = AsyncTranscriptGrouper()
    grouper.on(
        "segment.closed",
        lambda closed: segments.append(
            {"speaker": closed.segment.speaker, "text": closed.segment.text}
        ),
    )
    client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    async with client.live.connect() as conn:

        async def read() -> None:
            try:
                while True:
                    raw = await conn.recv_bytes()
                    heard.add(json.loads(raw))
                    # The SDK's own parser, and its transcript grouper (which reads
                    # the transcripts' event ids and timeline) take it too.
                    await grouper.push(conn.parse_event(raw))
            except ConnectionClosedOK:
                heard.end()
            except Exception as exc:
                heard.fail(exc)

        reader = asyncio.ensure_future(read())
        stop = asyncio.Event()
        mic: asyncio.Future[None] | None = None
        try:
            await conn.session.start(
                session={
                    "model": MODEL,
                    "instructions": INSTRUCTIONS,
                    "audio": {"format": {"type": "audio/pcm", "rate": RATE}},
                    "delegation": {"type": "client"},
                },
                event_id="start_1",
            )
            await heard.until("session.started")

            async def append(chunk: bytes) -> None:
                await conn.session.input_audio.append(audio=base64.b64encode(chunk).decode())

            mic = asyncio.ensure_future(stream(append, stop))
            delegated = await heard.until("session.delegation.created")
            answer = {
                "type": "session.commentary.append",
                "content": COMMENTARY,
                "delegation_id": delegated["delegation"]["id"],
                "event_id": "commentary_1",
            }
            heard.sent.append(answer)
            await conn.session.commentary.append(
                content=COMMENTARY, delegation_id=answer["delegation_id"], event_id="commentary_1"
            )
            appended = await heard.until("session.commentary.appended")
            await heard.relayed(appended, COMMENTARY)
            stop.set()
            await mic
            await conn.session.close(event_id="close_1")
            await heard.until("session.closed")
            await asyncio.wait_for(reader, STEP)  # the server closes the socket
            assert heard.failure is None, heard.failure
        finally:
            stop.set()
            reader.cancel()
            if mic is not None:
                mic.cancel()
    await grouper.close()
    await client.close()
    return {**heard.record(), "segments": segments}


def conversation(base_url: str) -> dict[str, Any]:
    """One conversation with the Live endpoint under ``base_url`` (``http://HOST:PORT/openai/v1``:
    the SDK adds ``/live/sessions`` and the ``ws`` scheme)."""
    return asyncio.run(_conversation(base_url))


async def _started(base_url: str) -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    async with client.live.connect() as conn:
        await conn.session.start(session={"model": MODEL, "instructions": INSTRUCTIONS})
        event: dict[str, Any] = json.loads(await asyncio.wait_for(conn.recv_bytes(), STEP))
        await conn.session.close()
    await client.close()
    return event


def started(base_url: str) -> dict[str, Any]:
    """The first event after ``session.start``, the client sending nothing else
    meanwhile (as the stacks wait for ``session.started``)."""
    return asyncio.run(_started(base_url))
