"""The demo calls tools: a session that declares one gets a real ``function_call``
from the demo, and each client stack's tool machinery runs its handler end to end (the
openai SDK, LiveKit's ``function_tool``, the Agents SDK's ``function_tool``)."""

from __future__ import annotations

import pytest
import trio

from realtime.engine.facade import Engine
from realtime.launch.server import model_loader
from tests.helpers import running_server
from tests.openai import demo_tools_exchange as exchange
from tests.openai import livekit_exchange
from tests.openai.test_sdk import ws_base

ANSWER = "(demo) The tool said: sunny in Paris"
"""The demo's answer to the tool's output (the schema's example is the city)."""


@pytest.mark.slow
async def test_the_demo_calls_the_declared_tool_for_each_stack() -> None:
    pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai missing")
    pytest.importorskip("agents.realtime", reason="openai-agents is not installed")
    livekit_exchange.load()
    engine = Engine(model_loader(None, None))
    engine.start()
    results = {}
    try:
        async with running_server(engine) as server:
            base = ws_base(server.http)
            runs = {
                "openai": (exchange.openai_sdk, base),
                "livekit": (exchange.livekit, server.http),
                "agents": (exchange.agents, base + "/realtime?model=x"),
            }
            for name, (run, where) in runs.items():
                results[name] = await trio.to_thread.run_sync(run, where)
    finally:
        engine.shutdown()
    for name, (called, said) in results.items():
        assert called == [{"city": "Paris"}], (name, called)
        assert said == ANSWER, (name, said)
