"""Conversations sharing one engine are isolated bit for bit (demo checkpoint).

Each session's output must equal the same session run alone (same seed, prompt, audio
and chunking), whatever runs beside it and however frames interleave: mlx-vlm's TTS
samples with MLX's one global key, so without per-session keys
(realtime.models.voicechat.keys) interleaved sessions change each other's audio codes.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import pytest
import trio

from realtime.audio import float_to_pcm16, pcm16_to_float
from realtime.engine.facade import Engine
from realtime.models import load_model
from realtime.models.base import (
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    UserTranscriptDelta,
    open_session,
)
from realtime.models.voicechat.model import VoiceChatModel
from tests.helpers import append_msg, connect, running_server
from tests.models_fixtures import push_all, speechlike

LONG_PROMPT = (
    "You are a patient assistant for a bicycle repair shop. Answer in one or two short "
    "sentences and never invent prices."
)
"""About a hundred prefill steps on the demo tokenizer: a hundred slices."""

Digest = list[tuple[Any, ...]]


def digest(events: list[ModelEvent]) -> Digest:
    """Everything a session emitted, as comparable values (audio as its bytes)."""
    out: Digest = []
    for e in events:
        if isinstance(e, AudioDelta):
            out.append(("audio", e.frame_index, e.audio_codes, e.samples.tobytes()))
        elif isinstance(e, (AssistantTextDelta, FunctionDelta)):
            out.append((type(e).__name__, e.frame_index, e.token_id, e.delta))
        elif isinstance(e, UserTranscriptDelta):
            out.append(("transcript", e.frame_index, e.delta))
        else:
            out.append((type(e).__name__, e.frame_index))
    return out


def digest_mlx_vlm(events: list[Any]) -> Digest:
    """mlx-vlm's own events in the same shape as :func:`digest`."""
    out: Digest = []
    for e in events:
        frame = int(e.frame_index or 0)
        if e.kind == "audio":
            codes = tuple(int(c) for c in np.asarray(e.audio_codes).reshape(-1).tolist())
            samples = np.array(e.samples, dtype=np.float32).reshape(-1)
            out.append(("audio", frame, codes, samples.tobytes()))
        elif e.kind in ("assistant_text_delta", "function_delta"):
            name = "AssistantTextDelta" if e.kind == "assistant_text_delta" else "FunctionDelta"
            out.append((name, frame, int(e.token_id), str(e.delta)))
        elif e.kind == "user_transcript_delta":
            out.append(("transcript", frame, str(e.delta)))
        else:
            out.append(({"done": "Done", "cancelled": "Cancelled"}[e.kind], frame))
    return out


CASES = [  # (seed, system prompt, chunk)
    (7, None, 1280),
    (8, "", 1000),
    (9, LONG_PROMPT, 1280),
]


FRAMES = 8


def audio_for(seed: int, frames: int = FRAMES) -> np.ndarray:
    return speechlike(frames, seed=seed)


def alone(model: VoiceChatModel, seed: int, prompt: str | None, chunk: int) -> Digest:
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    return digest(push_all(session, audio_for(seed), chunk))


def test_a_sliced_open_is_mlx_vlms_own_session_bit_for_bit(demo_model: VoiceChatModel) -> None:
    """The opening in slices (constructor with a blank prompt, then one prefill token a
    slice) and the per-session key give exactly what mlx-vlm's constructor gives."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    for seed, prompt, chunk in CASES:
        theirs = VoiceChatStreamingSession(demo_model.runtime, system_prompt=prompt, seed=seed)
        samples = audio_for(seed)
        raw: list[Any] = []
        for start in range(0, samples.shape[0], chunk):
            raw += theirs.push_audio(samples[start : start + chunk], sample_rate=16000)
        raw += theirs.flush(pad_partial=True)
        assert alone(demo_model, seed, prompt, chunk) == digest_mlx_vlm(raw), (seed, prompt)


def test_interleaved_sessions_equal_each_session_run_alone(demo_model: VoiceChatModel) -> None:
    """Three sessions opened and stepped in a shuffled interleaving, the long prompt's
    opening advanced slice by slice between the others' frames."""
    expected = [alone(demo_model, *case) for case in CASES]
    rng = random.Random(5)
    openings = {
        i: demo_model.begin_session(system_prompt=p, seed=s, max_streaming_seconds=None)
        for i, (s, p, _) in enumerate(CASES)
    }
    sessions: dict[int, Any] = {}
    pieces = {
        i: [audio_for(s)[a : a + c] for a in range(0, FRAMES * 1280, c)]
        for i, (s, _, c) in enumerate(CASES)
    }
    events: dict[int, list[ModelEvent]] = {i: [] for i in range(len(CASES))}
    while openings or any(pieces.values()):
        i = rng.choice([*openings, *(k for k, v in pieces.items() if v and k in sessions)])
        if i in openings:
            session = openings[i].advance()
            if session is not None:
                sessions[i] = session
                del openings[i]
            continue
        events[i] += sessions[i].push_audio(pieces[i].pop(0), 16000)
    for i, session in sessions.items():
        events[i] += session.flush(True)
    for i in range(len(CASES)):
        assert digest(events[i]) == expected[i], CASES[i][:2]


# --- through the socket -----------------------------------------------------------------


def wire_digest(events: list[dict[str, Any]]) -> Digest:
    """A socket session's frames: codes and PCM16 bytes per audio frame, text deltas."""
    out: Digest = []
    for e in events:
        if e["type"] == "response.audio.delta":
            out.append(("audio", e["frame_index"], tuple(e["audio_codes"]), e["delta"]))
        elif e["type"] in ("response.text.delta", "response.function.delta"):
            out.append((e["type"], e["frame_index"], e["delta"]))
    return out


def reference(model: VoiceChatModel, seed: int, prompt: str | None, wire: np.ndarray) -> Digest:
    """The same conversation alone, on the model directly, from the audio as the
    server decodes it, as the server would write it."""
    session = open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
    out: Digest = []
    for e in push_all(session, pcm16_to_float(float_to_pcm16(wire)), 1280):
        if isinstance(e, AudioDelta):
            pcm = float_to_pcm16(e.samples).astype("<i2").tobytes()
            out.append(("audio", e.frame_index, e.audio_codes, base64.b64encode(pcm).decode()))
        elif isinstance(e, AssistantTextDelta):
            out.append(("response.text.delta", e.frame_index, e.delta))
        elif isinstance(e, FunctionDelta):
            out.append(("response.function.delta", e.frame_index, e.delta))
    return out


@pytest.mark.parametrize("sessions", [2, 3])
async def test_concurrent_socket_sessions_each_equal_the_session_alone(
    demo_path: Any, demo_model: VoiceChatModel, sessions: int
) -> None:
    """N conversations at once on one engine; the last opens with the long prompt while
    the others stream. Each one's frames equal the same conversation run alone."""
    cases = CASES[:sessions] if sessions == 3 else [CASES[0], CASES[2]]
    engine = Engine(lambda: load_model(demo_path), capacity=sessions)
    engine.start()
    results: dict[int, list[dict[str, Any]]] = {}
    streaming = trio.Event()
    try:
        async with running_server(engine) as server:

            async def converse(i: int, seed: int, prompt: str | None) -> None:
                if prompt == LONG_PROMPT:
                    await streaming.wait()  # open while the others stream
                async with connect(server.url) as client:
                    assert (await client.recv())["type"] == "session.created"
                    session = {"seed": seed, "system_prompt": prompt}
                    await client.send({"type": "session.update", "session": session})
                    updated = await client.recv(timeout=120)  # after the prefill
                    assert updated["type"] == "session.updated", updated
                    audio = audio_for(seed)
                    for start in range(0, audio.shape[0], 2560):
                        await client.send(append_msg(audio[start : start + 2560]))
                        streaming.set()
                        await trio.sleep(0.02)
                    await client.send({"type": "input_audio_buffer.commit"})
                    results[i] = await client.recv_until("response.done", timeout=120)

            async with trio.open_nursery() as nursery:
                for i, (seed, prompt, _) in enumerate(cases):
                    nursery.start_soon(converse, i, seed, prompt)
    finally:
        engine.shutdown()
    for i, (seed, prompt, _) in enumerate(cases):
        got = wire_digest(results[i])
        assert len([g for g in got if g[0] == "audio"]) == FRAMES
        assert got == reference(demo_model, seed, prompt, audio_for(seed)), (seed, prompt)
