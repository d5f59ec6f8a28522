"""The real ``openai`` SDK holds whole exchanges with ``/openai/v1/realtime``.

The latest SDK runs in-process (in a worker thread: it is a blocking client);
openai 2.8.1 (before 2.27, which forced ``wss`` unless ``websocket_base_url`` is
given) runs as a subprocess with that version first on its path. Every event is
checked against the GA types of the SDK that received it, and against Pipecat's
parser.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import say
from realtime.wire_audio import alaw_decode
from tests.helpers import REPO, run_python_module, running_engine, running_server
from tests.openai import sdk_exchange
from tests.openai.scripted import call_then_say, scripted, talking_over


def ws_base(http: str) -> str:
    return http.replace("http://", "ws://") + "/openai/v1"


def check_exchange(events: list[dict[str, Any]], *, vad: bool) -> None:
    types = [e["type"] for e in events]
    assert types[0] == "session.created"
    assert "error" not in types, [e for e in events if e["type"] == "error"]
    assert types.count("response.created") == 1  # the answer, and nothing the model said over it
    order = [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert [types.index(t) for t in order] == sorted(types.index(t) for t in order)
    response = next(e for e in events if e["type"] == "response.done")["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["transcript"] == "Hi there!"
    for event in events:
        if "response_id" in event:
            assert event["response_id"] == response["id"]
    deltas = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert deltas == "Hi there!"
    user = next(
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    assert user["transcript"].startswith("hello there")
    assert ("input_audio_buffer.speech_started" in types) is vad
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] == user["item_id"]


@pytest.fixture
def talking_over_engine() -> Iterator[Engine]:
    """The scripted answer, and the model talking over the user before it."""
    with running_engine(talking_over(say("Mm"), say("Hi ", "there", None, "!"))) as eng:
        yield eng


async def in_process(
    engine: Engine, scenario: str, limits: Limits | None = None
) -> list[dict[str, Any]]:
    async with running_server(engine, limits=limits) as server:
        return await trio.to_thread.run_sync(
            partial(sdk_exchange.SCENARIOS[scenario], ws_base(server.http))
        )


async def run_module(
    engine: Engine, first: Path, module: str, *args: str, limits: Limits | None = None
) -> list[str]:
    """``python -m module ARGS... WS_BASE`` against a server on ``engine`` (with
    ``limits``), with ``first`` first on its path (another package version); its stdout
    lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(first), str(REPO)])}
    async with running_server(engine, limits=limits) as server:
        done = await trio.run_process(
            [sys.executable, "-m", module, *args, ws_base(server.http)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=REPO,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout.decode().splitlines()


async def in_subprocess(engine: Engine, scenario: str, sdk: Path) -> list[dict[str, Any]]:
    output = await run_module(engine, sdk, "tests.openai.sdk_exchange", scenario)
    lines = [json.loads(line) for line in output]
    assert lines[0]["openai"] == "2.8.1"
    return lines[1:]


def pipecat_accepts(events: list[dict[str, Any]], pipecat: Path, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    run_python_module("tests.openai.pipecat_check", str(path), path=[pipecat], timeout=120)


@pytest.mark.parametrize("scenario", ["push_to_talk", "server_vad"])
async def test_latest_sdk(scripted_engine: Engine, scenario: str) -> None:
    events = await in_process(scripted_engine, scenario)
    check_exchange(events, vad=scenario == "server_vad")


async def test_latest_sdk_with_g711_alaw_both_ways(scripted_engine: Engine) -> None:
    """``audio/pcma`` in and out: the exchange is the same, and the answer's audio is
    A-law at 8 kHz, one byte a sample, as long as the frames the response carried."""
    events = await in_process(scripted_engine, "g711_alaw")
    check_exchange(events, vad=True)
    response = next(e for e in events if e["type"] == "response.done")["response"]
    assert response["audio"]["output"]["format"] == {"type": "audio/pcma"}
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio.delta"]
    codes = b"".join(base64.b64decode(d) for d in deltas)
    frames = response["usage"]["output_token_details"]["audio_tokens"]
    assert frames == len(deltas) >= 5
    # 80 ms at 8 kHz a frame: 640 bytes, give or take the block soxr hands on its
    # output in (about 540 samples from 22.05 kHz).
    assert abs(len(codes) - frames * 640) <= 640
    pcm = alaw_decode(np.frombuffer(codes, np.uint8)).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    assert abs(float(np.fft.rfftfreq(pcm.size, 1 / 8000)[int(np.argmax(spectrum))]) - 1000) < 10


@pytest.mark.parametrize("scenario", ["push_to_talk", "client_driven_vad"])
async def test_latest_sdk_gets_the_answer_it_asked_for(
    talking_over_engine: Engine, scenario: str
) -> None:
    """Push-to-talk, and server VAD with ``create_response: false``: the model talks
    over the user before it answers; that is not the response (before the fix it was,
    and the client's ``response.create`` got ``conversation_already_has_active_response``)."""
    events = await in_process(talking_over_engine, scenario)
    check_exchange(events, vad=scenario == "client_driven_vad")
    assert not any("Mm" in json.dumps(e) for e in events if e["type"].startswith("response."))


async def test_a_tool_result_reaches_the_model_and_the_follow_up_answers() -> None:
    """``function_call_output`` goes to the model (its function channel, one model step
    per token; the fake counts words) and ``response.create`` gets the turn that follows."""
    model = scripted(call_then_say("Let ", "me ", "check"))
    model.options.tool_reply = lambda output: say("It ", "is ", "21")
    with running_engine(model) as engine:
        events = await in_process(engine, "tool_round_trip")
    dones = [e for e in events if e["type"] == "response.done"]
    assert len(dones) == 2
    said = [
        part.get("transcript", "")
        for item in dones[1]["response"]["output"]
        for part in item.get("content", [])
    ]
    assert "".join(said) == "It is 21"
    assert model.calls_named("tool_result") == ['{"temperature": 21, "unit": "C"}']
    assert not [e for e in events if e["type"] == "error"]


@pytest.mark.slow
async def test_latest_sdk_gets_its_answer_through_a_slow_open() -> None:
    """The model takes 4.5 s to open while the SDK streams in real time
    from the start, past a 2 s backlog bound: no error, the newest audio (the speech
    among it) is heard, the answer comes."""
    model = scripted(say("Hi ", "there", None, "!"))
    model.options.open_delay = 4.5
    with running_engine(model) as engine:
        events = await in_process(engine, "cold_vad", Limits(max_pending_audio_seconds=2.0))
    check_exchange(events, vad=True)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["push_to_talk", "server_vad"])
async def test_openai_2_8_sdk(scripted_engine: Engine, scenario: str, openai_2_8: Path) -> None:
    events = await in_subprocess(scripted_engine, scenario, openai_2_8)
    check_exchange(events, vad=scenario == "server_vad")


@pytest.mark.slow
async def test_pipecat_parses_every_event(
    scripted_engine: Engine, pipecat: Path, tmp_path: Path
) -> None:
    events = await in_process(scripted_engine, "server_vad")
    pipecat_accepts(events, pipecat, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vad", "push_to_talk"])
async def test_a_live_pipecat_pipeline_holds_an_exchange(
    scripted_engine: Engine, pipecat: Path, mode: str
) -> None:
    """Pipecat's ``OpenAIRealtimeLLMService`` in a running pipeline (a subprocess with
    Pipecat on its path): server VAD, and push-to-talk framed by Pipecat's own
    user-started/stopped-speaking frames; the answer's audio and text come back."""
    output = await run_module(scripted_engine, pipecat, "tests.openai.pipecat_exchange", mode)
    seen = json.loads(output[-1])
    assert seen["errors"] == [] and seen["responses"] >= 1, seen
    assert seen["audio_frames"] > 0 and "Hi there!" in seen["text"], seen


@pytest.mark.slow
async def test_a_live_pipecat_pipeline_gets_its_answer_through_a_slow_open(
    pipecat: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The model takes 4.5 s to open (a long prompt's prefill) while
    Pipecat streams its microphone from the start, past a 2 s backlog bound. Before, each
    append over the bound got ``input_audio_buffer_full``, and Pipecat takes the first as
    fatal; now the newest 2 s are kept (the speech at the end of the open among them),
    the rest dropped, counted and logged once, and the answer comes."""
    model = scripted(say("Hi ", "there", None, "!"))
    model.options.open_delay = 4.5
    caplog.set_level(logging.INFO, logger="realtime.session.pipeline")
    with running_engine(model) as engine:
        output = await run_module(
            engine,
            pipecat,
            "tests.openai.pipecat_exchange",
            "cold_vad",
            limits=Limits(max_pending_audio_seconds=2.0),
        )
    seen = json.loads(output[-1])
    assert seen["errors"] == [] and seen["responses"] >= 1, seen
    assert seen["audio_frames"] > 0 and "Hi there!" in seen["text"], seen
    notes = [r.getMessage() for r in caplog.records if "still opening" in r.getMessage()]
    assert len(notes) == 1, notes
