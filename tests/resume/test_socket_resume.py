"""Resuming a conversation through a real socket: the connection is cut mid-answer,
a new one resumes, and the output is the same audio, byte for byte, as without the
drop (both endpoints, alone and beside another conversation)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
import trio

from realtime.engine.runner import Engine
from realtime.limits import Limits
from realtime.models.voicechat.model import VoiceChatModel
from realtime.testing.fake import FakeModel
from tests.helpers import append_msg, noise, running_engine, running_server
from tests.resume.peer import Resuming

NATIVE = "/v1/realtime"
OPENAI = "/openai/v1/realtime?model=x"
FRAMES = 24
SPLIT = 12
"""Client messages sent before the drop is prepared."""


def native_messages() -> list[str]:
    update = json.dumps({"type": "session.update", "session": {"seed": 7}})
    appends = [append_msg(noise(1280, seed=i)) for i in range(FRAMES)]
    return [update, *appends, json.dumps({"type": "input_audio_buffer.commit"})]


def openai_messages() -> list[str]:
    update = json.dumps({"type": "session.update", "session": {"type": "realtime"}})
    out = [update]
    for i in range(FRAMES):
        pcm = (np.clip(noise(1920, seed=i), -1, 1) * 32767).astype("<i2").tobytes()
        audio = base64.b64encode(pcm).decode()
        out.append(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    return out


OPENAI_AUDIO = FRAMES - 6
"""Audio deltas compared on the OpenAI endpoint: the answer to the client's own frames
(after them the model's clock goes on in real time, fed silence, which no two runs
share frame for frame)."""


def finished(peer: Resuming, path: str, whole_turn: bool = False) -> bool:
    if path == NATIVE or whole_turn:
        return any(e["type"] == "response.done" for e in peer.events)
    return len(_audio_events(peer)) >= OPENAI_AUDIO


def compared(peer: Resuming, path: str, whole_turn: bool = False) -> bytes:
    """The audio compared: every delta up to the turn's end (``response.done``), or on
    the OpenAI endpoint the first ``OPENAI_AUDIO`` deltas."""
    done = next((n for n, e in enumerate(peer.events) if e["type"] == "response.done"), None)
    events = [e for e in peer.events[:done] if e["type"].endswith("audio.delta")]
    if path != NATIVE and not whole_turn:
        events = events[:OPENAI_AUDIO]
    return b"".join(base64.b64decode(e["delta"]) for e in events)


async def converse(
    http: str,
    path: str,
    messages: list[str],
    *,
    drop_after_audio: int | None,
    resumable: bool,
    whole_turn: bool = False,
) -> Resuming:
    """Send ``messages`` as fast as the socket takes them (so the OpenAI endpoint's
    clock never feeds silence between them); with ``drop_after_audio``, send the first
    ``SPLIT``, wait for that many audio deltas, send four more and cut the connection at
    once (some of them in flight), stay away, resume, and send the rest. Return the
    client once the answer is in."""
    peer = Resuming(http, path)
    await peer.open("resumable=1" if resumable else "plain=1")
    await peer.until("session.created")
    if resumable:
        await peer.until("session.resumable")
    if drop_after_audio is None:
        for text in messages:
            await peer.send(text)
    else:
        for text in messages[:SPLIT]:
            await peer.send(text)
        with trio.fail_after(20):
            while len(_audio_events(peer)) < drop_after_audio:
                assert await peer.recv() is not None, peer.ws.close_code
        for text in messages[SPLIT : SPLIT + 4]:
            await peer.send(text)
        peer.drop()
        # Away for twenty frames' time: a clock that did not pause would have fed the
        # model silence meanwhile (the OpenAI endpoint), and the audio would differ.
        await trio.sleep(1.6)
        resumed = await peer.resume()
        assert resumed["type"] == "session.resumed", resumed
        for text in messages[SPLIT + 4 :]:
            await peer.send(text)
    with trio.fail_after(20):
        while not finished(peer, path, whole_turn):
            assert await peer.recv() is not None, peer.ws.close_code
    return peer


def _audio_events(peer: Resuming) -> list[dict[str, Any]]:
    return [e for e in peer.events if e["type"].endswith("audio.delta")]


async def released(engine: Engine) -> None:
    with trio.fail_after(5):
        while engine.reserved:
            await trio.sleep(0.01)


@pytest.mark.parametrize("path", [NATIVE, OPENAI])
async def test_a_dropped_conversation_resumes_bit_for_bit(engine: Engine, path: str) -> None:
    messages = native_messages() if path == NATIVE else openai_messages()
    async with running_server(engine) as server:
        plain = await converse(server.http, path, messages, drop_after_audio=None, resumable=False)
        await plain.close()
        await released(engine)
        cut = await converse(server.http, path, messages, drop_after_audio=4, resumable=True)
        await cut.close()
    assert compared(plain, path) and compared(cut, path) == compared(plain, path)
    assert cut.resumed is not None and cut.resumed["received"] <= len(messages)
    assert cut.resumed["replayed"] >= 0 and cut.resumed["last_seq"] > 0


async def chatter(http: str, stop: trio.Event) -> None:
    """Another conversation beside: streams audio until ``stop``."""
    other = Resuming(http, NATIVE)
    await other.open("plain=1")
    await other.until("session.created")
    await other.send({"type": "session.update", "session": {"seed": 3}})
    i = 0
    while not stop.is_set():
        await other.send(append_msg(noise(1280, seed=100 + i)))
        await other.until("response.audio.delta")
        i += 1
    await other.close()


@pytest.mark.parametrize("path", [NATIVE, OPENAI])
async def test_a_batched_conversation_resumes_bit_for_bit(path: str) -> None:
    messages = native_messages() if path == NATIVE else openai_messages()
    limits = Limits(max_sessions=2, admission_margin=0.0)
    with running_engine(FakeModel(), capacity=2) as engine:
        async with running_server(engine, limits=limits) as server:
            plain = await converse(
                server.http, path, messages, drop_after_audio=None, resumable=False
            )
            await plain.close()
            await released(engine)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(chatter, server.http, stop)
                cut = await converse(
                    server.http, path, messages, drop_after_audio=6, resumable=True
                )
                stop.set()
            await cut.close()
    assert compared(cut, path) == compared(plain, path)
    assert cut.resumed is not None


@pytest.mark.parametrize("path", [NATIVE, OPENAI])
async def test_the_demo_model_resumes_bit_for_bit(demo_model: VoiceChatModel, path: str) -> None:
    """The real model (the demo checkpoint, on MLX): its sampled audio of a whole turn
    after a drop and a resume is the audio of the same conversation without the drop
    (on the OpenAI endpoint the model ends its own turn, within the client's audio)."""
    messages = native_messages() if path == NATIVE else openai_messages()
    with running_engine(demo_model) as engine:
        async with running_server(engine) as server:
            plain = await converse(
                server.http, path, messages, drop_after_audio=None, resumable=False, whole_turn=True
            )
            await plain.close()
            await released(engine)
            cut = await converse(
                server.http, path, messages, drop_after_audio=3, resumable=True, whole_turn=True
            )
            await cut.close()
    expected = compared(plain, path, whole_turn=True)
    assert len(_audio_events(plain)) > 3 and compared(cut, path, whole_turn=True) == expected
    assert cut.resumed is not None


async def test_the_negotiated_formats_carry_over_a_resume(engine: Engine) -> None:
    """G.711 negotiated before the drop is what the resumed conversation speaks (and
    takes): the output after the resume is the same μ-law bytes as without the drop."""
    update = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {
                "input": {"format": {"type": "audio/pcmu"}},
                "output": {"format": {"type": "audio/pcmu"}},
            },
        },
    }
    messages = [json.dumps(update)]
    for i in range(FRAMES):
        ulaw = np.random.default_rng(i).integers(0, 256, 640, dtype=np.uint8).tobytes()
        audio = base64.b64encode(ulaw).decode()
        messages.append(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    async with running_server(engine) as server:
        plain = await converse(
            server.http, OPENAI, messages, drop_after_audio=None, resumable=False
        )
        await plain.close()
        await released(engine)
        cut = await converse(server.http, OPENAI, messages, drop_after_audio=5, resumable=True)
        await cut.close()
    expected = compared(plain, OPENAI)
    assert compared(cut, OPENAI) == expected
    # One byte a sample at 8 kHz (640 a frame, the resampler's delay aside), not PCM16.
    frames = min(len(_audio_events(cut)), OPENAI_AUDIO)
    assert abs(len(expected) - 640 * frames) <= 640, (len(expected), frames)
