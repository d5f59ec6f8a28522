"""Client stacks built on the OpenAI Realtime API hold whole exchanges with
``/openai/v1/realtime`` on a real Hypercorn server: LiveKit's ``livekit-plugins-openai``
``RealtimeModel`` session and the OpenAI Agents SDK's ``RealtimeRunner``, in push-to-talk
(``turn_detection`` null) and server-VAD modes, and the Agents SDK's Twilio example
(G.711 μ-law both ways, a simulated Twilio media stream).

Each runs on an asyncio loop of its own in a worker thread; the fake model answers
each time the user goes quiet, and in push-to-talk it also talks over the user first
(what must not become the response). Both are dev dependencies; a test skips with a
message only where its stack is not installed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import FakeModel, say
from realtime.wire_audio import ulaw_decode
from tests.helpers import running_engine, running_server
from tests.openai import livekit_exchange
from tests.openai.scripted import scripted, talking_over
from tests.openai.validate import validate_ga

ANSWER = say("Hi ", "there", None, "!")
LONG = say(*["word "] * 20)
"""Long enough (1.6 s) to be cut while it plays."""


COLD_OPEN = 4.5
"""``cold_vad``: seconds the model takes to open (a long prompt's prefill), past
``COLD_LIMITS``' backlog bound, while the client streams in real time."""
COLD_LIMITS = Limits(max_pending_audio_seconds=2.0)


def model_for(scenario: str) -> FakeModel:
    if scenario == "push_to_talk":
        return talking_over(say("Mm"), ANSWER, LONG, LONG)
    model = scripted(ANSWER, LONG, LONG)
    if scenario == "cold_vad":
        model.options.open_delay = COLD_OPEN
    return model


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    with running_engine(model_for(request.param)) as eng:
        yield eng


@pytest.fixture(scope="session")
def agents() -> str:
    """The Agents SDK (a dev dependency), imported once, not at collection; its version."""
    pytest.importorskip(
        "agents.realtime",
        reason="openai-agents is not installed (a dev dependency: pip install -e '.[dev]')",
    )
    return importlib.metadata.version("openai-agents")


def valid(server: list[dict[str, Any]]) -> list[str]:
    """The types of ``server``'s events, each checked against the GA types."""
    for event in server:
        validate_ga(event)
    return [e["type"] for e in server]


def statuses(done: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["status"], (r.get("status_details") or {}).get("reason")) for r in done]


def transcript(response: dict[str, Any]) -> str:
    return "".join(p["transcript"] for i in response["output"] for p in i["content"])


async def livekit_run(
    engine: Engine, scenario: str, limits: Limits | None = None
) -> livekit_exchange.Seen:
    async with running_server(engine, limits=limits) as server:
        with trio.fail_after(60):  # a safety net: it takes a few seconds
            return await trio.to_thread.run_sync(
                partial(livekit_exchange.run, scenario, server.http)
            )


@pytest.mark.parametrize("engine", ["push_to_talk"], indirect=True)
async def test_livekit_push_to_talk(engine: Engine, livekit: str) -> None:
    """``turn_detection=None``: ``commit_audio`` + ``generate_reply`` get the answer
    (not what the model said over the user, and no
    ``conversation_already_has_active_response``); ``interrupt`` cancels the next."""
    seen = await livekit_run(engine, "push_to_talk")
    assert seen.errors == []
    assert [g.user_initiated for g in seen.generations] == [True, True]
    assert seen.generations[0].text == "Hi there!" and seen.generations[0].audio_samples > 0
    done = seen.done()
    assert statuses(done) == [("completed", None), ("cancelled", "client_cancelled")]
    assert all(r["metadata"]["client_event_id"].startswith("response_create_") for r in done)
    assert not any("Mm" in transcript(r) for r in done)
    assert "input_audio_buffer.speech_started" not in valid(seen.server)


@pytest.mark.parametrize("engine", ["server_vad"], indirect=True)
async def test_livekit_server_vad(engine: Engine, livekit: str) -> None:
    """LiveKit's default semantic VAD: the server answers by itself; ``interrupt``
    cancels the second answer, the user speaking over the third cuts it
    (``interrupt_response``)."""
    seen = await livekit_run(engine, "server_vad")
    assert seen.errors == []
    assert [g.user_initiated for g in seen.generations] == [False, False, False]
    assert seen.generations[0].text == "Hi there!"
    assert statuses(seen.done()) == [
        ("completed", None),
        ("cancelled", "client_cancelled"),
        ("cancelled", "turn_detected"),
    ]
    assert "input_audio_buffer.speech_started" in valid(seen.server)


@pytest.mark.parametrize("engine", ["push_to_talk", "server_vad"], indirect=True)
async def test_agents_realtime_runner(engine: Engine, agents: str, request: Any) -> None:
    """The SDK's default semantic VAD, and push-to-talk (``turn_detection: None``, the
    commit with the last chunk, then a raw ``response.create``): one answer each, no
    error event."""
    from tests.openai import agents_exchange

    scenario = request.node.callspec.params["engine"]
    async with running_server(engine) as server:
        url = server.http.replace("http://", "ws://") + "/openai/v1/realtime"
        with trio.fail_after(60):  # a safety net: it takes a few seconds
            seen = await trio.to_thread.run_sync(partial(agents_exchange.run, scenario, url))
    assert seen.errors == []
    (response,) = seen.done()
    assert (response["status"], transcript(response)) == ("completed", "Hi there!")
    assert seen.audio_bytes > 0
    types = valid(seen.server)
    assert types.count("response.created") == 1
    assert ("input_audio_buffer.speech_started" in types) is (scenario == "server_vad")


@pytest.mark.parametrize("engine", ["server_vad"], indirect=True)
async def test_agents_twilio_g711(engine: Engine, agents: str) -> None:
    """The Agents SDK's Twilio example: its session settings (``g711_ulaw`` both ways,
    sent as ``audio/pcmu``) and a simulated Twilio media stream, 20 ms μ-law frames in
    real time; the answer comes back as μ-law at 8 kHz, as long as the frames the
    response says it carried, at the fake model's pitch."""
    from tests.openai import agents_exchange

    async with running_server(engine) as server:
        url = server.http.replace("http://", "ws://") + "/openai/v1/realtime"
        with trio.fail_after(60):  # a safety net: it takes a few seconds
            seen = await trio.to_thread.run_sync(partial(agents_exchange.run, "twilio", url))
    assert seen.errors == []
    types = valid(seen.server)
    updated = [e["session"]["audio"] for e in seen.server if e["type"] == "session.updated"]
    assert updated[-1]["input"]["format"] == {"type": "audio/pcmu"}
    assert updated[-1]["output"]["format"] == {"type": "audio/pcmu"}
    assert "input_audio_buffer.speech_started" in types
    (response,) = seen.done()
    assert (response["status"], transcript(response)) == ("completed", "Hi there!")
    assert response["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    # One 80 ms frame of model audio a delta.
    frames = response["usage"]["output_token_details"]["audio_tokens"]
    assert frames == types.count("response.output_audio.delta") >= 5
    # 80 ms at 8 kHz a frame: 640 bytes, give or take the block soxr hands on its
    # output in (about 540 samples from 22.05 kHz).
    assert abs(len(seen.audio) - frames * 640) <= 640
    pcm = ulaw_decode(np.frombuffer(bytes(seen.audio), np.uint8)).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    peak = float(np.fft.rfftfreq(pcm.size, 1 / 8000)[int(np.argmax(spectrum))])
    assert abs(peak - 1000) < 10  # the fake model speaks a 1 kHz tone


@pytest.mark.parametrize("engine", ["cold_vad"], indirect=True)
async def test_livekit_gets_its_answer_through_a_slow_open(engine: Engine, livekit: str) -> None:
    """The model opens in 4.5 s (a long prompt's prefill) while the
    room's audio streams in real time past a 2 s backlog bound: no error, the answer."""
    seen = await livekit_run(engine, "cold_vad", COLD_LIMITS)
    assert seen.errors == []
    assert seen.generations[0].text == "Hi there!" and seen.generations[0].audio_samples > 0
    assert "error" not in valid(seen.server)


@pytest.mark.parametrize("engine", ["cold_vad"], indirect=True)
async def test_agents_sdk_gets_its_answer_through_a_slow_open(engine: Engine, agents: str) -> None:
    """The same for the Agents SDK's ``RealtimeRunner`` (semantic VAD)."""
    from tests.openai import agents_exchange

    async with running_server(engine, limits=COLD_LIMITS) as server:
        url = server.http.replace("http://", "ws://") + "/openai/v1/realtime"
        with trio.fail_after(60):
            seen = await trio.to_thread.run_sync(partial(agents_exchange.run, "cold_vad", url))
    assert seen.errors == []
    (response,) = seen.done()
    assert (response["status"], transcript(response)) == ("completed", "Hi there!")
    assert "error" not in valid(seen.server)
