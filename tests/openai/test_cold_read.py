"""Each of the four client stacks (the openai SDK, the Agents SDK, LiveKit, Pipecat)
gets its answer through a cold read of a ~3,000-token agent prompt on the demo
checkpoint, streaming its microphone in real time all the while (one server; each
stack's prompt its own, so each read is cold: the first also extends the seed's voice
chain, the others read only their language model's part). No error reaches a stack
(before, each got thousands of ``input_audio_buffer_full`` and Pipecat gave up at the
first). Each stack's seconds to its answer are printed (``-s``) and written beside the
test's temporary files."""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from realtime.engine.facade import Engine
from realtime.launch.server import model_loader
from tests.helpers import running_server
from tests.openai import cold_read_exchange as cold
from tests.openai import livekit_exchange
from tests.openai.test_sdk import ws_base

REPO = Path(__file__).resolve().parent.parent.parent


async def _pipecat(pipecat: Path, base: str, instructions: str) -> cold.Seen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(pipecat), str(REPO)]),
        cold.INSTRUCTIONS_ENV: instructions,
    }
    done = await trio.run_process(
        [sys.executable, "-m", "tests.openai.cold_read_exchange", "pipecat", base],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return cold.Seen(**json.loads(done.stdout.decode().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_each_stack_gets_its_answer_through_a_cold_read(
    pipecat: Path, tmp_path: Path
) -> None:
    pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai missing")
    pytest.importorskip("agents.realtime", reason="openai-agents is not installed")
    livekit_exchange.load()
    engine = Engine(model_loader(None, None))
    model: Any = engine.start()
    seen: dict[str, cold.Seen] = {}
    tokens: dict[str, int] = {}
    began = time.monotonic()
    try:
        async with running_server(engine) as server:
            base = ws_base(server.http)
            runs: dict[str, Any] = {
                "openai": partial(cold.openai_sdk, base),
                "agents": partial(cold.agents, base + "/realtime?model=x"),
                "livekit": partial(cold.livekit, server.http),
            }
            for stack in ("openai", "agents", "livekit", "pipecat"):
                prompt = cold.agent_prompt(stack)
                tokens[stack] = model.count_tokens(prompt)
                if stack == "pipecat":
                    seen[stack] = await _pipecat(pipecat, base, prompt)
                else:
                    seen[stack] = await trio.to_thread.run_sync(runs[stack], prompt)
                print(f"cold read, {stack}: {tokens[stack]} tokens, {seen[stack]}", flush=True)
    finally:
        engine.shutdown()
    figures = {stack: {"tokens": tokens[stack], **s.to_dict()} for stack, s in seen.items()}
    figures["all_seconds"] = time.monotonic() - began  # type: ignore[assignment]
    (tmp_path / "cold-read.json").write_text(json.dumps(figures, indent=2))
    for stack, s in seen.items():
        assert 2500 <= tokens[stack] <= 4096, (stack, tokens[stack])
        assert s.errors == [], (stack, s.errors)
        assert s.audio_bytes > 0 and s.transcript, (stack, s)
        assert s.appends > 50 * 2, (stack, s)  # it streamed in real time through the read
    misses = model.prompt_cache_figures().misses
    assert misses >= 4  # each stack's read was its own
