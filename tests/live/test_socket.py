"""``/openai/v1/live/sessions`` through a real Hypercorn server: a whole conversation with a
delegation, phone audio (G.711), the default one-conversation refusal, the addresses of
the Live API this server does not serve, the API key, and the model's output bit for bit
the same as through the native endpoint."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from trio_websocket import ConnectionRejected, WebSocketConnection, open_websocket_url

from realtime.audio import float_to_pcm16, pcm16_to_float
from realtime.engine.facade import Engine
from realtime.live.config import LiveConfig, parse_config
from realtime.live.prompt import system_prompt
from realtime.models import load_model
from realtime.models.base import (
    DELEGATE_TOOL,
    AssistantTextDelta,
    AudioDelta,
    UserTranscriptDelta,
    open_session,
)
from realtime.models.voicechat.model import VoiceChatModel
from realtime.session.close_codes import CLOSE_TRY_AGAIN
from realtime.telemetry.recording import Recording
from realtime.testing.fake import QUIET, Cue, FakeModel, Reply, partner, say
from realtime.wire_audio import PCM16K, OutputResampler, WireFormat, ulaw_decode, ulaw_encode
from tests.helpers import ahttp, append_msg, running_engine, running_server
from tests.live.validate import validate_live
from tests.models_fixtures import push_all, speechlike
from tests.telemetry.test_recording import files_of, of

LIVE = "/openai/v1/live/sessions"
CALL = f'<TOOLCALL>[{{"name": "{DELEGATE_TOOL}", "arguments": {{"task": "weather"}}}}]</TOOLCALL>'


def delegating() -> FakeModel:
    """Answers the first user turn by delegating, the next with words."""
    first = Reply((Cue(text="Let "), Cue(text="me ", function=CALL), Cue(end_of_turn=True), QUIET))
    return FakeModel(partner([first, say("Sunny", "!")]), model_id="fake-live", path=None)


def live_url(http: str) -> str:
    return http.replace("http://", "ws://") + LIVE


class Live:
    """A raw Live client: every server event it receives is validated strictly."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps(event))

    async def recv(self, timeout: float = 30.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            event: dict[str, Any] = json.loads(await self.ws.get_message())
        validate_live(event)
        self.seen.append(event)
        return event

    async def until(self, type_: str, timeout: float = 30.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while True:
                event = await self.recv(timeout)
                if event["type"] == type_:
                    return event

    async def start(self, **session: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", "session": {"model": "gpt-live-1", **session}})
        return await self.until("session.started", timeout=120)


@asynccontextmanager
async def live(http: str, **kwargs: Any) -> AsyncIterator[Live]:
    async with open_websocket_url(live_url(http), **kwargs) as ws:
        yield Live(ws)


def voice(seconds: float, rate: int, seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    return np.clip(rng.standard_normal(int(seconds * rate)) * 0.2, -1, 0.999).astype(np.float32)


async def test_a_conversation_with_a_delegation_answered() -> None:
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server, live(server.http) as client:
            started = await client.start(instructions="Be brief.")
            assert started["session"]["instructions"] == "Be brief."
            pcm = (voice(1.6, 24_000) * 32767).astype("<i2")
            for start in range(0, pcm.shape[0], 1920):
                chunk = base64.b64encode(pcm[start : start + 1920].tobytes()).decode()
                await client.send({"type": "session.input_audio.append", "audio": chunk})
                await trio.sleep(0.04)
            created = await client.until("session.delegation.created")
            await client.send(
                {
                    "type": "session.commentary.append",
                    "event_id": "answer",
                    "delegation_id": created["delegation"]["id"],
                    "content": "It is sunny in Paris.",
                }
            )
            appended = await client.until("session.commentary.appended")
            assert appended["client_event_id"] == "answer"
            assert engine.model.calls_named("tool_result") == [  # type: ignore[attr-defined]
                '{"commentary": "It is sunny in Paris."}'
            ]
            await client.send({"type": "session.close", "event_id": "bye"})
            closed = await client.until("session.closed")
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    kinds = [e["type"] for e in client.seen]
    assert "session.input_transcript.delta" in kinds
    heard = [e for e in client.seen if e["type"] == "session.output_transcript.delta"]
    assert "".join(e["delta"] for e in heard).startswith("Let me")
    assert kinds.count("session.output_audio.delta") > 20
    assert engine.reserved == 0


async def test_phone_audio_both_ways() -> None:
    """G.711 μ-law at 8 kHz in 20 ms frames, as a phone gateway streams it; the answer
    comes back as μ-law at 8 kHz, 80 ms of it for each model frame."""
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server, live(server.http) as client:
            fmt = {"type": "audio/pcmu", "rate": 8000}
            started = await client.start(audio={"format": fmt})
            assert started["session"]["audio"]["format"] == fmt
            pcm = float_to_pcm16(voice(1.6, 8000))
            for start in range(0, pcm.shape[0], 160):
                frame = ulaw_encode(pcm[start : start + 160]).tobytes()
                await client.send(
                    {
                        "type": "session.input_audio.append",
                        "audio": base64.b64encode(frame).decode(),
                    }
                )
                await trio.sleep(0.01)
            await client.until("session.delegation.created")
            await client.send({"type": "session.close"})
            await client.until("session.closed")
    audio = b"".join(
        base64.b64decode(e["delta"])
        for e in client.seen
        if e["type"] == "session.output_audio.delta"
    )
    frames = engine.model.calls_named("push")  # type: ignore[attr-defined]
    assert frames
    decoded = ulaw_decode(np.frombuffer(audio, np.uint8))
    assert np.abs(decoded).max() > 1000  # the fake's tone, not silence
    # One byte a sample at 8 kHz: the model's frames, less what the resampler holds.
    heard_frames = len([e for e in client.seen if e["type"] == "session.output_audio.delta"])
    assert abs(len(audio) - heard_frames * 640) <= 640


async def test_the_default_serves_one_conversation() -> None:
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server, live(server.http) as holder:
            await holder.start()
            async with live(server.http) as refused:
                error = await refused.recv()
                assert error["type"] == "error" and error["error"]["code"] == "server_busy"
                with pytest.raises(Exception):  # noqa: B017 - the socket closes
                    await refused.recv(timeout=10)
                assert refused.ws.closed is not None
                assert refused.ws.closed.code == CLOSE_TRY_AGAIN


async def test_the_api_key_guards_the_live_endpoint() -> None:
    with running_engine(delegating()) as engine:
        async with running_server(engine, api_key="sk-live") as server:
            with pytest.raises(ConnectionRejected) as rejected:
                async with live(server.http):
                    pass
            assert rejected.value.status_code == 401
            headers = [("Authorization", "Bearer sk-live")]
            async with live(server.http, extra_headers=headers) as client:
                await client.start()


async def test_what_the_live_api_has_and_this_server_has_not() -> None:
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server:
            status, body = await ahttp("POST", server.http + LIVE, body=b"{}")
            assert status == 501 and "WebRTC" in body["error"]["message"]
            status, _ = await ahttp("GET", server.http + LIVE)
            assert status == 426
            status, _ = await ahttp("POST", server.http + LIVE + "/sess_x/fork", body=b"{}")
            assert status == 501
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(live_url(server.http) + "/sess_x/attach"):
                    pass
            assert rejected.value.status_code == 501
            assert engine.reserved == 0


async def test_bad_input_is_an_error_and_the_session_goes_on() -> None:
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server, live(server.http) as client:
            await client.send({"type": "session.input_audio.append", "audio": ""})
            assert (await client.recv())["error"]["code"] == "session_not_started"
            await client.ws.send_message("{not json")
            assert (await client.recv())["error"]["code"] == "invalid_json"
            await client.ws.send_message(b"\x00binary")
            assert (await client.recv())["type"] == "error"
            await client.send({"type": "session.start", "session": {"model": "m", "x": 1}})
            assert (await client.recv())["error"]["code"] == "unknown_parameter"
            await client.start()
            await client.send({"type": "session.commentary.append", "content": 5})
            assert (await client.until("error"))["error"]["code"] == "invalid_type"
            await client.send({"type": "session.close"})
            await client.until("session.closed")


async def test_a_recorded_live_call_keeps_its_audio_in_the_wav(tmp_path: Path) -> None:
    """``--record``: the Live session's messages go to the JSONL with their audio
    replaced by its size (the audio is in the WAV), both ways."""
    with running_engine(delegating()) as engine:
        async with running_server(engine) as server:
            server.state.recording = Recording(tmp_path, 10**9)
            async with live(server.http) as client:
                await client.start()
                pcm = (voice(0.5, 24_000) * 32767).astype("<i2").tobytes()
                audio = base64.b64encode(pcm).decode()
                await client.send({"type": "session.input_audio.append", "audio": audio})
                await client.until("session.output_audio.delta")
                await client.send({"type": "session.close"})
                await client.until("session.closed")
            [stem] = await files_of(tmp_path)
    text = of(stem, ".jsonl").read_text()
    assert audio not in text and "bytes of audio: see the WAV" in text
    lines = [json.loads(line) for line in text.splitlines()]
    sent = "".join(str(line.get("text", "")) for line in lines)
    got = [line["event"]["type"] for line in lines if isinstance(line.get("event"), dict)]
    assert '"session.start"' in sent and "session.closed" in got
    assert of(stem, ".wav").stat().st_size > 44


# --- bit for bit --------------------------------------------------------------------------

FRAMES = 10
INSTRUCTIONS = "Answer in one short sentence."


def model_run(
    model: VoiceChatModel, prompt: str | None, wire: np.ndarray[Any, Any], fmt: WireFormat
) -> tuple[list[str], list[str], str, str]:
    """The conversation alone on the model: each frame's audio as the Live endpoint
    sends it in ``fmt`` and as the native endpoint sends it, the agent's text and the
    user transcript."""
    session = open_session(model, system_prompt=prompt, seed=0, max_streaming_seconds=None)
    resampler = OutputResampler(fmt.rate)
    audio, native, text, heard = [], [], "", ""
    for event in push_all(session, pcm16_to_float(float_to_pcm16(wire)), 1280)[:-1]:
        if isinstance(event, AudioDelta) and event.frame_index < FRAMES:
            pcm = float_to_pcm16(event.samples).astype("<i2").tobytes()
            native.append(base64.b64encode(pcm).decode())
            out = resampler.push(event.samples, event.sample_rate)
            if out.shape[0]:
                audio.append(fmt.encode(out))
        elif isinstance(event, AssistantTextDelta) and event.frame_index < FRAMES:
            text += event.delta
        elif isinstance(event, UserTranscriptDelta) and event.frame_index < FRAMES:
            heard += event.delta
    return audio, native, text, heard


@pytest.mark.slow
async def test_live_output_is_bit_for_bit_the_models_and_the_native_endpoints(
    demo_path: Path, demo_model: VoiceChatModel
) -> None:
    """The same prompt, seed and frames through the Live endpoint (PCM16 at 16 kHz, so the
    model hears the very samples the native endpoint's clients send) and through
    ``/v1/realtime``: both equal the conversation run alone on the model, the Live audio
    through the session format's resampler."""
    wire = speechlike(FRAMES)
    config = parse_config({"model": "m", "instructions": INSTRUCTIONS})
    assert isinstance(config, LiveConfig)
    prompt = system_prompt(config)
    audio, native_audio, text, _ = model_run(demo_model, prompt, wire, PCM16K)
    assert len(native_audio) == FRAMES and audio
    engine = Engine(lambda: load_model(demo_path))
    engine.start()
    try:
        async with running_server(engine) as server:
            async with live(server.http) as client:
                await client.start(instructions=INSTRUCTIONS, audio={"format": PCM16K.as_json()})
                pcm = float_to_pcm16(wire).astype("<i2")
                # All at once: the client's frames run ahead of any silence.
                for start in range(0, pcm.shape[0], 2560):
                    chunk = base64.b64encode(pcm[start : start + 2560].tobytes()).decode()
                    await client.send({"type": "session.input_audio.append", "audio": chunk})
                got: list[str] = []
                with trio.fail_after(120):
                    while len(got) < len(audio):
                        event = await client.recv()
                        if event["type"] == "session.output_audio.delta":
                            got.append(event["delta"])
                await client.send({"type": "session.close"})
                await client.until("session.closed")
            within = [e for e in client.seen if e.get("end_ms", 0) <= FRAMES * 80]
            said = "".join(
                e["delta"] for e in within if e["type"] == "session.output_transcript.delta"
            )
            live_heard = "".join(
                e["delta"] for e in within if e["type"] == "session.input_transcript.delta"
            )
            assert got == audio
            assert said == text
            native = await native_run(server.http, prompt, wire)
    finally:
        engine.shutdown()
    # The user transcript as the engine's frame step emits it (both endpoints alike).
    assert native == (native_audio, text, live_heard)


async def native_run(
    http: str, prompt: str | None, wire: np.ndarray[Any, Any]
) -> tuple[list[str], str, str]:
    """The same conversation through ``/v1/realtime``: its frames' audio, text and user
    transcript."""
    async with open_websocket_url(http.replace("http://", "ws://") + "/v1/realtime") as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        session = {"system_prompt": prompt, "seed": 0}
        await ws.send_message(json.dumps({"type": "session.update", "session": session}))
        with trio.fail_after(120):
            assert json.loads(await ws.get_message())["type"] == "session.updated"
        await ws.send_message(append_msg(wire))
        await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
        text, heard, audio = "", "", []
        with trio.fail_after(120):
            while True:
                event = json.loads(await ws.get_message())
                if event.get("frame_index", FRAMES) >= FRAMES:
                    pass
                elif event["type"] == "response.text.delta":
                    text += event["delta"]
                elif event["type"] == "response.audio.delta":
                    audio.append(event["delta"])
                elif event["type"] == "conversation.item.input_audio_transcription.delta":
                    heard += event["delta"]
                if event["type"] == "response.done":
                    return audio, text, heard
