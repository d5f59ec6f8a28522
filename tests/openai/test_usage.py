"""``response.done.response.usage``: counted from what the model did, against known
counts (scripted frames on the pure dialect, and the fake model over a socket)."""

from __future__ import annotations

from typing import Any

from realtime.engine.facade import Engine
from realtime.limits import Limits
from realtime.openai.dialect import Dialect, Output
from realtime.openai.turns import END_TAIL_FRAMES
from realtime.session.work import FeedModel, OpenModel, RunAudio
from tests.openai.scripted import CALL
from tests.openai.test_dialect import Model, append, events, pad, pcm24, run, send
from tests.openai.test_socket import peer


def words(text: str) -> int:
    """A tokenizer whose counts a test can see: one token a word."""
    return len(text.split())


def opened(instructions: str, cached: int = 0) -> Dialect:
    """A dialect whose model opened with ``instructions`` as its prompt."""
    d = Dialect("sess_test", "scripted", Limits(), now=0.0, count_tokens=words)
    send(d, {"type": "session.update", "session": {"instructions": instructions}})
    assert OpenModel(instructions) in send(d, append(pcm24(0.1)))
    # The audio heard while it opened goes on now, and nothing else.
    assert all(isinstance(o, RunAudio) for o in d.opened(None, 0.0, cached_tokens=cached))
    return d


def done(outputs: list[Output]) -> list[dict[str, Any]]:
    return [e["response"]["usage"] for e in events(outputs) if e["type"] == "response.done"]


def test_a_spoken_answer_counts_its_context_and_what_it_made() -> None:
    d, m = opened("Be brief and kind", cached=3), Model()
    heard = 5 + 4 + END_TAIL_FRAMES
    out = run(d, m, *pad(5), {"text": "Hel"}, {}, {"text": "lo"}, {"end": True})
    out += run(d, m, *pad(END_TAIL_FRAMES))
    (usage,) = done(out)
    spoken = 4 + END_TAIL_FRAMES  # every frame of the turn went out as audio
    assert usage == {
        "total_tokens": 4 + heard + 2 + spoken,
        "input_tokens": 4 + heard,
        "output_tokens": 2 + spoken,
        "input_token_details": {
            "text_tokens": 4,
            "audio_tokens": heard,
            "image_tokens": 0,
            "cached_tokens": 3,
            "cached_tokens_details": {"text_tokens": 3, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": 2, "audio_tokens": spoken},
    }


def test_each_response_counts_the_whole_context_and_only_its_own_output() -> None:
    d, m = opened("Hi there"), Model()
    first = done(run(d, m, {"text": "a"}, {"end": True}, *pad(END_TAIL_FRAMES)))
    second = done(run(d, m, *pad(3), {"text": "b"}, {"text": "c"}, {"end": True}))
    second += done(run(d, m, *pad(END_TAIL_FRAMES)))
    frames = 2 + END_TAIL_FRAMES
    assert first[0]["input_token_details"]["audio_tokens"] == frames
    assert second[0]["input_token_details"]["audio_tokens"] == frames + 3 + frames + 1
    assert [u["output_token_details"]["text_tokens"] for u in first + second] == [1, 2]
    assert second[0]["input_token_details"]["cached_tokens"] == 0


def test_tool_calls_and_outputs_are_text_tokens() -> None:
    d, m = opened("Use tools"), Model()
    made = run(d, m, {"function": CALL[:20]}, {"function": CALL[20:50]}, {"function": CALL[50:]})
    (call,) = done(made)
    assert call["output_token_details"] == {"text_tokens": 3, "audio_tokens": 0}
    assert call["input_token_details"]["text_tokens"] == 2
    call_id = next(
        e["item"]["call_id"] for e in events(made) if e["type"] == "conversation.item.done"
    )
    item = {"type": "function_call_output", "call_id": call_id, "output": "sunny and warm"}
    fed = send(d, {"type": "conversation.item.create", "item": item})
    assert FeedModel("sunny and warm") in fed
    d.fed(None, 0.0, 3)
    (answer,) = done(run(d, m, {"text": "sunny"}, {"end": True}, *pad(END_TAIL_FRAMES)))
    assert answer["input_token_details"]["text_tokens"] == 2 + 3
    # A tool output the model could not take is not in its context.
    send(d, {"type": "conversation.item.create", "item": {**item, "output": "lost words"}})
    d.fed("the model session is not open", 0.0)
    (after,) = done(run(d, m, {"text": "x"}, {"end": True}, *pad(END_TAIL_FRAMES)))
    assert after["input_token_details"]["text_tokens"] == 2 + 3


async def test_the_fake_models_answer_over_the_socket(scripted_engine: Engine) -> None:
    """The scripted partner's first answer, ``say("Hi ", "there", None, "!")``: three
    text tokens, and as many audio tokens as audio deltas the client got."""
    async with peer(scripted_engine) as p:
        await p.until("session.created")
        await p.speak(1.0)
        usage = (await p.until("response.done"))["response"]["usage"]
        audio = [e for e in p.seen if e["type"] == "response.output_audio.delta"]
        assert usage["output_token_details"] == {"text_tokens": 3, "audio_tokens": len(audio)}
        details = usage["input_token_details"]
        assert details["text_tokens"] == 0 and details["cached_tokens"] == 0
        assert details["audio_tokens"] >= 1.0 / 0.08  # every frame heard, fed silence too
        assert usage["input_tokens"] == details["audio_tokens"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
