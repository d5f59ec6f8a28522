"""Exchanges held with the real ``openai`` SDK (sync client), for any SDK version.

Run in-process (the installed SDK) or as ``python -m tests.openai.sdk_exchange
SCENARIO WS_BASE_URL`` with another SDK version first on ``PYTHONPATH``; either
way each scenario returns (or prints, one JSON object a line) every server event
it received, after checking each against that SDK's GA types.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import numpy as np

from tests.openai.validate import validate_ga

RATE = 24_000
API_KEY = "sk-local-test"


def voice(seconds: float, seed: int = 0) -> bytes:
    """Noise loud enough to count as speech, as 24 kHz PCM16."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(int(seconds * RATE)) * 0.2
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _client(ws_base: str) -> Any:
    from openai import OpenAI

    http = ws_base.replace("ws://", "http://")
    return OpenAI(api_key=API_KEY, base_url=http, websocket_base_url=ws_base, max_retries=0)


def _recv(conn: Any, log: list[dict[str, Any]]) -> dict[str, Any]:
    raw = conn.recv_bytes()
    event: dict[str, Any] = json.loads(raw)
    validate_ga(event)
    conn.parse_event(raw)  # the SDK's own parser takes it too
    log.append(event)
    return event


def _until(conn: Any, log: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    """The first event of ``type_``, received already or next."""
    for seen in log:
        if seen["type"] == type_:
            return seen
    while True:
        event = _recv(conn, log)
        if event["type"] == type_:
            return event


def next_done(conn: Any, log: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any]:
    """The next ``response.done`` of a response other than ``first``'s."""
    while True:
        done = _recv(conn, log)
        if done["type"] == "response.done" and done["response"]["id"] != first["response"]["id"]:
            return done


def _send_audio(conn: Any, pcm: bytes, chunk_ms: int = 20) -> None:
    step = RATE * chunk_ms // 1000 * 2
    for i in range(0, len(pcm), step):
        conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())


def push_to_talk(ws_base: str) -> list[dict[str, Any]]:
    """The SDK's push-to-talk shape: no VAD, append, commit, response.create."""
    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        created = _recv(conn, log)
        assert created["type"] == "session.created"
        conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Be brief.",
                "audio": {"input": {"turn_detection": None}},
            }
        )
        updated = _until(conn, log, "session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        _send_audio(conn, voice(1.0))
        conn.input_audio_buffer.commit()
        conn.response.create(response={"metadata": {"client_event_id": "ptt-1"}})
        _until(conn, log, "response.done")
        _until(conn, log, "conversation.item.input_audio_transcription.completed")
    return log


def server_vad(ws_base: str) -> list[dict[str, Any]]:
    """Microphone shape: stream audio, let the server find the turns."""
    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        _until(conn, log, "session.updated")
        _send_audio(conn, voice(0.8))
        _until(conn, log, "response.done")
        _until(conn, log, "conversation.item.input_audio_transcription.completed")
    return log


def client_driven_vad(ws_base: str) -> list[dict[str, Any]]:
    """Server VAD with ``create_response: false``: the VAD's events flow, and the
    client asks for the answer itself, right after its audio."""
    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        detection = {"type": "server_vad", "create_response": False}
        conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
        )
        updated = _until(conn, log, "session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["create_response"] is False
        _send_audio(conn, voice(1.0))
        conn.response.create()
        _until(conn, log, "response.done")
        _until(conn, log, "conversation.item.input_audio_transcription.completed")
    return log


def g711_alaw(ws_base: str) -> list[dict[str, Any]]:
    """Phone audio both ways: ``audio/pcma`` for input and output (8 kHz A-law, one
    byte a sample), 20 ms appends of 160 bytes, the server finding the turn."""
    from realtime.wire_audio import alaw_encode

    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        alaw = {"type": "audio/pcma"}
        conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"format": alaw}, "output": {"format": alaw}},
            }
        )
        updated = _until(conn, log, "session.updated")
        assert updated["session"]["audio"]["input"]["format"] == alaw
        pcm = np.frombuffer(voice(0.8), "<i2")[::3]  # 24 kHz noise taken at 8 kHz
        codes = alaw_encode(pcm.astype(np.int16)).tobytes()
        for i in range(0, len(codes), 160):
            conn.input_audio_buffer.append(audio=base64.b64encode(codes[i : i + 160]).decode())
        _until(conn, log, "response.done")
        _until(conn, log, "conversation.item.input_audio_transcription.completed")
    return log


TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def tool_round_trip(ws_base: str) -> list[dict[str, Any]]:
    """Push-to-talk with a tool: the model calls it, the client returns its output as a
    ``function_call_output`` item and asks for the follow-up with ``response.create``."""
    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        conn.session.update(
            session={
                "type": "realtime",
                "tools": TOOLS,
                "audio": {"input": {"turn_detection": None}},
            }
        )
        _until(conn, log, "session.updated")
        _send_audio(conn, voice(1.0))
        conn.input_audio_buffer.commit()
        conn.response.create()
        first = _until(conn, log, "response.done")
        calls = [o for o in first["response"]["output"] if o["type"] == "function_call"]
        assert calls, first
        conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": calls[0]["call_id"],
                "output": '{"temperature": 21, "unit": "C"}',
            }
        )
        conn.response.create()
        next_done(conn, log, first)
    return log


def tool_output_only(ws_base: str) -> list[dict[str, Any]]:
    """A client that returns a tool's output (the model's call went unseen, or came
    from elsewhere) and asks for the follow-up: manual turns, a second of silence."""
    log: list[dict[str, Any]] = []
    with _client(ws_base).realtime.connect(model="nemotron-voicechat") as conn:
        assert _recv(conn, log)["type"] == "session.created"
        conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        _until(conn, log, "session.updated")
        _send_audio(conn, bytes(2 * RATE))
        conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}
        )
        conn.response.create()
        _until(conn, log, "response.done")
    return log


SCENARIOS = {
    "tool_output_only": tool_output_only,
    "tool_round_trip": tool_round_trip,
    "push_to_talk": push_to_talk,
    "server_vad": server_vad,
    "client_driven_vad": client_driven_vad,
    "g711_alaw": g711_alaw,
}


def main(argv: list[str]) -> None:
    scenario, ws_base = argv
    import openai

    events = SCENARIOS[scenario](ws_base)
    print(json.dumps({"openai": openai.__version__}))
    for event in events:
        print(json.dumps(event))


if __name__ == "__main__":
    main(sys.argv[1:])
