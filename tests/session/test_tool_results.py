"""A tool's result reaches the model.

On the engine: a :class:`~realtime.engine.commands.ToolResult` goes in one model step a slice,
other conversations' frames run between the slices, the session's own later frames
wait for it and then carry the model's follow-up; a model without the input says so.
The VoiceChat side (NVIDIA's inserted function-channel steps) is in
tests/models/voicechat/test_step.py; the OpenAI endpoint's ``function_call_output`` in
tests/openai/.
"""

from __future__ import annotations

import pytest
import trio

from realtime.engine.commands import EngineError, Open, Push, Step, ToolResult
from realtime.engine.facade import Engine
from realtime.models.base import AssistantTextDelta, AudioDelta, ToolInput
from realtime.testing.fake import FakeModel, FakeOptions, NullModel, say
from tests.engine.test_batch import GATE, batching_engine, frame, held, open_all, push


def tool(output: str) -> ToolInput:
    """``output`` as the fake model tokenizes it (what the pipeline submits)."""
    return FakeModel().tool_input(output)


def test_a_tool_result_runs_in_slices_between_other_frames_then_the_answer_follows() -> None:
    model = FakeModel(FakeOptions(tool_reply=lambda output: say(f"it is {output} ")))
    with batching_engine(model) as engine:
        open_all(engine, "gate", "a", "b", seeds=(GATE, 1, 2))
        with held(engine, model):
            feed = engine.submit(ToolResult("a", tool("21 degrees")))  # 3 slices
            others = [engine.submit(push("b")) for _ in range(3)]
        assert feed.result(10) is None
        step = engine.submit(push("a")).result(10)
        assert isinstance(step, Step)
        texts = [e.delta for e in step.events if isinstance(e, AssistantTextDelta)]
        assert texts == ["it is 21 degrees "]
        assert all(isinstance(f.result(10), Step) for f in others)
        calls = [name for name, _, _ in model.calls if name in ("push", "tool_step")]
        assert calls.count("tool_step") == 3
        # b's frames were not held back by a's slices: they ran between them.
        first, last = calls.index("tool_step"), len(calls) - 1 - calls[::-1].index("tool_step")
        assert "push" in calls[first:last], calls
        nxt = engine.submit(push("a")).result(10)
        assert isinstance(nxt, Step)
        assert any(isinstance(e, AudioDelta) and e.end_of_turn for e in nxt.events)


def test_a_tool_result_for_an_ended_session_or_a_model_without_the_input_fails() -> None:
    model = FakeModel()
    with batching_engine(model) as engine:
        open_all(engine, "gate", "a", seeds=(GATE, 1))
        engine.submit(push("a")).result(10)
        from realtime.engine.commands import Flush

        engine.submit(Flush("a")).result(10)
        with pytest.raises(EngineError) as failed:
            engine.submit(ToolResult("a", tool("x"))).result(10)
        assert failed.value.kind == "step_failed" and not failed.value.session_lost
        with pytest.raises(EngineError) as missing:
            engine.submit(ToolResult("nobody", tool("x"))).result(10)
        assert missing.value.session_lost
    null = NullModel()
    engine = Engine(lambda: null)
    engine.start()
    try:
        assert engine.try_reserve("n")
        engine.submit(Open("n", None, 1, None)).result(10)
        with pytest.raises(EngineError, match="takes no tool results") as refused:
            engine.submit(ToolResult("n", tool("x"))).result(10)
        assert refused.value.kind == "step_failed"
        assert isinstance(engine.submit(Push("n", frame(), 16000)).result(10), Step)
    finally:
        engine.shutdown()


@pytest.mark.slow
async def test_on_the_demo_a_tool_output_goes_in_and_the_demo_answers_with_it() -> None:
    """The demo checkpoint through the OpenAI endpoint and the openai SDK: the network
    takes the output on its function channel (NVIDIA's inserted steps), then the demo's
    scripted turn says what the tool said."""
    from realtime.launch.server import model_loader
    from tests.helpers import running_server
    from tests.openai import sdk_exchange
    from tests.openai.test_sdk import ws_base

    engine = Engine(model_loader(None, None))
    engine.start()
    try:
        async with running_server(engine) as server:
            events = await trio.to_thread.run_sync(
                sdk_exchange.tool_output_only, ws_base(server.http)
            )
    finally:
        engine.shutdown()
    assert not [e for e in events if e["type"] == "error"], events
    said = "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )
    assert said == "(demo) The tool said: sunny, 21 C"
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
