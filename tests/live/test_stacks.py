"""The three client stacks that speak OpenAI's Live API hold whole conversations with
``/openai/v1/live/sessions`` on a real Hypercorn server: the ``openai`` SDK's
``client.live.connect()``, Pipecat's ``OpenAILiveLLMService`` with client delegation (a
backend worker answering), and LiveKit's ``GPTLiveModel`` with client delegation.

Each conversation (:mod:`tests.live.conversation`): ``session.start`` with
instructions, speech in, the model's audio out, a ``session.delegation.created``
answered with ``session.commentary.append`` (the delegation's id) and acknowledged, the
commentary spoken, ``session.close`` and ``session.closed`` (``close_requested``). Every
server event is validated strictly against ``openai.types.live.ServerEvent``.

Against two servers: a fake model scripted to call the ``delegate`` tool when the user
falls quiet and to relay the tool result it is then given (fast, no weights), and the
built-in demo checkpoint (slow: its network runs on the CPU), which delegates once after
the user's first turn and then says ``(demo) The tool said: <commentary>``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.testing.fake import Cue, FakeModel, Reply, partner, say
from realtime.testing.servers import ServerProcess
from tests.helpers import REPO, running_engine, running_server
from tests.live import livekit_exchange, sdk_exchange
from tests.live.conversation import COMMENTARY, STEP, check

CALL = '<SPECIAL_20>[{"name": "delegate", "arguments": {"task": "the weather"}}]<SPECIAL_21>'
"""VoiceChat's function channel calling the Live endpoint's one tool."""
FAKE_RELAYED = f"(fake) {COMMENTARY}"
DEMO_RELAYED = f"(demo) The tool said: {COMMENTARY}"


def relay(output: str) -> Reply:
    """What the fake model says once given a tool result: the appended text (the
    endpoint feeds ``{"commentary": text}``), after ``(fake)``."""
    try:
        value = json.loads(output)
    except ValueError:
        value = output
    if isinstance(value, dict) and len(value) == 1:
        (value,) = value.values()
    words = str(value).split()
    return say("(fake) ", *(w + " " for w in words[:-1]), *words[-1:])


def delegating() -> FakeModel:
    """A conversation partner that, when the user falls quiet, calls ``delegate`` (in
    two pieces), says "One moment", and relays the tool result when it comes."""
    reply = Reply(
        (Cue(function=CALL[:30]), Cue(function=CALL[30:]), Cue(), *say("One ", "moment").cues)
    )
    options = attrs.evolve(partner([reply]), tool_reply=relay)
    return FakeModel(options, model_id="scripted-voicechat", path=None)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with running_engine(delegating()) as eng:
        yield eng


async def pipecat_conversation(pipecat: Path, http: str) -> dict[str, Any]:
    """Pipecat's conversation in a subprocess with Pipecat first on its path."""
    url = http.replace("http://", "ws://") + "/openai/v1/live/sessions"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pipecat), str(REPO)])}
    with trio.fail_after(4 * STEP):
        done = await trio.run_process(
            [sys.executable, "-m", "tests.live.pipecat_exchange", url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=REPO,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    record: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return record


async def test_the_openai_sdk_holds_a_conversation(engine: Engine) -> None:
    async with running_server(engine) as server:
        record = await trio.to_thread.run_sync(
            sdk_exchange.conversation, server.http + "/openai/v1"
        )
    check(record, FAKE_RELAYED)
    # The SDK's transcript grouper read the timeline into the user's turn and the
    # model's, the relayed commentary in the model's last.
    speakers = [s["speaker"] for s in record["segments"]]
    assert "user" in speakers, record["segments"]
    assert speakers[-1] == "assistant", record["segments"]
    assert FAKE_RELAYED in record["segments"][-1]["text"], record["segments"]


async def test_livekit_holds_a_conversation(engine: Engine, livekit: str) -> None:
    async with running_server(engine) as server:
        record = await trio.to_thread.run_sync(livekit_exchange.conversation, server.http)
    check(record, FAKE_RELAYED)


async def test_pipecat_holds_a_conversation(engine: Engine, pipecat: Path) -> None:
    async with running_server(engine) as server:
        record = await pipecat_conversation(pipecat, server.http)
    check(record, FAKE_RELAYED)
    # The backend worked from the server's input transcript (the fake transcribes the
    # user's speech as words of its own).
    (request,) = record["requests"]
    assert "USER: " in request, request


async def test_opening_the_session_is_not_the_clients_idle_time() -> None:
    """The stacks send nothing between ``session.start`` and ``session.started``
    (LiveKit and Pipecat hold every event until it comes): a long open (a long prompt's
    prefill; the demo's first open takes about a minute on a loaded CPU) must not close
    the session for idling."""
    model = FakeModel(attrs.evolve(partner([]), open_delay=2.0), model_id="slow", path=None)
    with running_engine(model) as eng:
        async with running_server(eng, limits=Limits(idle_timeout=1.0)) as server:
            first = await trio.to_thread.run_sync(sdk_exchange.started, server.http + "/openai/v1")
    assert first["type"] == "session.started", first


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stack", ["openai", "livekit", "pipecat"])
async def test_each_stack_holds_a_conversation_with_the_demo(
    demo_server: ServerProcess, stack: str, request: pytest.FixtureRequest
) -> None:
    """The demo server (one for the run, one conversation at a time: these tests share
    its worker) delegates once after the user's first turn; each stack's delegation
    handler answers it, and the demo speaks the answer."""
    http = demo_server.http
    if stack == "openai":
        record = await trio.to_thread.run_sync(sdk_exchange.conversation, http + "/openai/v1")
    elif stack == "livekit":
        request.getfixturevalue("livekit")
        record = await trio.to_thread.run_sync(livekit_exchange.conversation, http)
    else:
        record = await pipecat_conversation(request.getfixturevalue("pipecat"), http)
        assert "USER: " in record["requests"][0], record["requests"]
    check(record, DEMO_RELAYED)
