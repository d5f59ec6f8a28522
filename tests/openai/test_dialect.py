"""The OpenAI dialect's rules, on the pure state machine (no socket, no engine, no clock)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.limits import Limits
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    UserTranscriptDelta,
)
from realtime.models.voicechat.tools import parse_calls
from realtime.openai import events as ev
from realtime.openai.dialect import Dialect, Output
from realtime.openai.responses import CREATE_TIMEOUT_FRAMES
from realtime.openai.states import ModelState
from realtime.openai.turns import END_TAIL_FRAMES, USER_QUIET_FRAMES
from realtime.session.close_codes import Close
from realtime.session.work import CountTokens, OpenModel, RunAudio
from realtime.testing.fake import tone
from realtime.wire_audio import PCMU
from tests.openai.scripted import CALL
from tests.openai.validate import validate_ga

TONE = 1000.0


def dialect() -> Dialect:
    return Dialect("sess_test", "scripted", Limits(), now=0.0)


def send(d: Dialect, message: dict[str, Any] | str) -> list[Output]:
    return counted(d, d.receive(message if isinstance(message, str) else json.dumps(message), 0.0))


def counted(d: Dialect, outputs: list[Output]) -> list[Output]:
    """``outputs`` with each ``CountTokens`` counted as the pipeline would (on a worker
    thread there), and what the dialect answers then in its place."""
    out: list[Output] = []
    for output in outputs:
        if not isinstance(output, CountTokens):
            out.append(output)
            continue
        try:
            tokens: int | Exception = output.count(output.text)
        except Exception as exc:
            tokens = exc
        out += counted(d, d.counted(output.text, tokens, 0.0))
    return out


def events(outputs: list[Output]) -> list[dict[str, Any]]:
    out = [o for o in outputs if isinstance(o, dict)]
    for event in out:
        validate_ga(event)
    return out


def types(outputs: list[Output]) -> list[str]:
    return [e["type"] for e in events(outputs)]


class Model:
    """Frames as the model makes them: a continuous 1 kHz tone and scripted channels."""

    def __init__(self) -> None:
        self.index = 0
        self.voice = tone(TONE)

    def frame(
        self,
        text: str | None = None,
        *,
        end: bool = False,
        function: str | None = None,
        heard: str | None = None,
    ) -> list[ModelEvent]:
        i = self.index
        self.index += 1
        out: list[ModelEvent] = []
        if heard:
            out.append(UserTranscriptDelta(i, heard, heard))
        if text:
            out.append(AssistantTextDelta(i, 100, text, text))
        if function:
            out.append(FunctionDelta(i, 200, function, function))
        samples = self.voice(i, np.zeros(0, np.float32))
        out.append(AudioDelta(i, samples, (0,) * VOICECHAT_FIGURES.codebooks, end_of_turn=end))
        return out


def run(d: Dialect, model: Model, *frames: dict[str, Any]) -> list[Output]:
    out: list[Output] = []
    for frame in frames:
        out += d.frame_done(model.frame(**frame))
    return out


def pad(n: int) -> list[dict[str, Any]]:
    return [{} for _ in range(n)]


def peak_hz(samples: np.ndarray[Any, Any], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.shape[0])))
    return float(np.fft.rfftfreq(samples.shape[0], 1 / rate)[int(np.argmax(spectrum))])


def pcm24(seconds: float, hz: float = TONE) -> np.ndarray[Any, Any]:
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2")


def append(pcm: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode()}


# --- session -----------------------------------------------------------------------------


def test_session_created_is_a_complete_ga_session() -> None:
    session = dialect().session
    created = ev.session_event("session.created", session)
    validate_ga(created)
    assert session["type"] == "realtime"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"


def test_session_update_merges_and_instructions_become_the_prompt() -> None:
    d = dialect()
    out = send(d, {"type": "session.update", "session": {"type": "realtime", "instructions": "Hi"}})
    (updated,) = events(out)
    assert updated["type"] == "session.updated"
    assert updated["session"]["instructions"] == "Hi"
    assert updated["session"]["audio"]["output"]["format"]["rate"] == 24000  # kept
    update = {"audio": {"input": {"turn_detection": None}}}
    out = send(d, {"type": "session.update", "session": update})
    assert events(out)[0]["session"]["instructions"] == "Hi"
    assert events(out)[0]["session"]["audio"]["input"]["turn_detection"] is None
    out = send(d, append(pcm24(0.1)))
    assert OpenModel("Hi") in out


def test_instructions_after_the_model_started_are_refused_without_closing() -> None:
    d = dialect()
    send(d, {"type": "session.update", "session": {"instructions": "A"}})
    send(d, {"type": "response.create"})
    same = send(d, {"type": "session.update", "session": {"instructions": "A"}})
    assert types(same) == ["session.updated"]
    out = send(d, {"type": "session.update", "session": {"instructions": "B", "tools": []}})
    (error,) = events(out)
    assert error["error"]["code"] == "session_already_started"
    assert "instructions" in error["error"]["message"]
    assert not any(isinstance(o, Close) for o in out)
    assert d.session["instructions"] == "A"


def test_a_long_system_prompt_is_refused_before_any_model_work() -> None:
    counted: list[str] = []

    def words(text: str) -> int:  # a stand-in tokenizer
        counted.append(text)
        return len(text.split())

    d = Dialect("sess_test", "m", Limits(max_system_prompt_tokens=10), now=0.0, count_tokens=words)
    long = " ".join(["w"] * 11)
    out = send(d, {"type": "session.update", "session": {"instructions": long}})
    (error,) = events(out)
    assert error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.instructions"
    message = error["error"]["message"]
    assert "session.instructions is 11 tokens, over the 10-token limit" in message
    assert "--max-system-prompt-tokens" in message
    assert not any(isinstance(o, Close) for o in out)
    assert d.session.get("instructions") is None and d.model_state is ModelState.CLOSED
    # The declared tools are part of the prompt: short instructions, long tool listing.
    tool = {"type": "function", "name": "get_weather", "description": "Weather in a city."}
    out = send(d, {"type": "session.update", "session": {"instructions": "Hi", "tools": [tool]}})
    (error,) = events(out)
    assert "session.instructions with the tools is" in error["error"]["message"]
    # Short ones are not tokenized; a fitting prompt opens the model as usual.
    counted.clear()
    assert types(send(d, {"type": "session.update", "session": {"instructions": "Hi"}})) == [
        "session.updated"
    ]
    assert counted == []
    fits = " ".join(["w"] * 10)
    assert types(send(d, {"type": "session.update", "session": {"instructions": fits}})) == [
        "session.updated"
    ]
    assert counted == [fits]
    # Updates that leave the prompt as it is do not count it again.
    update = {"audio": {"input": {"turn_detection": None}}}
    assert types(send(d, {"type": "session.update", "session": update})) == ["session.updated"]
    assert counted == [fits]
    assert OpenModel(fits) in send(d, {"type": "response.create"})
    # A prompt no tokenizer could bring within the limit is refused without tokenizing.
    d2 = Dialect("sess_test", "m", Limits(max_system_prompt_tokens=10), now=0.0, count_tokens=words)
    counted.clear()
    out = send(d2, {"type": "session.update", "session": {"instructions": "x" * 100_000}})
    (error,) = events(out)
    assert "100000 characters is far longer than the 10-token limit" in error["error"]["message"]
    assert counted == []


def test_unserved_formats_are_refused() -> None:
    """24 kHz PCM16 and 8 kHz G.711 are served (tests/openai/test_formats.py); others not."""
    d = dialect()
    for fmt in ({"type": "audio/pcm", "rate": 16000}, {"type": "audio/pcmu", "rate": 16000}):
        out = send(d, {"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}})
        (error,) = events(out)
        assert error["error"]["param"] == "session.audio.input.format"
    assert types(send(d, {"type": "session.update", "session": {"type": "transcription"}})) == [
        "error"
    ]


def test_tools_are_rendered_into_the_prompt() -> None:
    d = dialect()
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    send(d, {"type": "session.update", "session": {"instructions": "Be kind.", "tools": [tool]}})
    (opened,) = [o for o in send(d, {"type": "response.create"}) if isinstance(o, OpenModel)]
    assert opened.system_prompt is not None
    assert opened.system_prompt.startswith("Be kind.")
    assert "<AVAILABLE_TOOLS>" in opened.system_prompt
    assert "get_weather" in opened.system_prompt


# --- audio in -----------------------------------------------------------------------------


def test_input_is_regrouped_into_1280_sample_frames_whatever_the_chunks() -> None:
    for chunk_ms in (20, 80, 333):
        d = dialect()
        d.opened(None, now=0.0)  # frames go on at once (held while it opens)
        pcm = pcm24(2.0)
        step = 24 * chunk_ms
        frames: list[RunAudio] = []
        for i in range(0, pcm.shape[0], step):
            frames += [o for o in send(d, append(pcm[i : i + step])) if isinstance(o, RunAudio)]
        assert all(f.samples.shape == (1280,) for f in frames)
        # 2 s at 16 kHz is 25 frames; the resampler holds back a few ms.
        assert len(frames) == 24, chunk_ms
        heard = np.concatenate([f.samples for f in frames])
        assert abs(peak_hz(heard[2000:], 16000) - TONE) < 5
        # The session's work values, numbered in order for the pipeline.
        assert [f.tag for f in frames] == list(range(24))
        assert all(f.sample_rate == 16000 for f in frames)


def test_silence_keeps_the_clock_running_when_the_client_is_quiet() -> None:
    d = dialect()
    send(d, {"type": "response.create"})
    d.opened(None, now=10.0)
    assert d.tick(10.0) == []
    out = d.tick(11.0)  # 12 frames are due, less the slack; the engine takes 2 at a time
    silence = [o for o in out if isinstance(o, RunAudio)]
    assert len(silence) == 2
    assert all(not f.samples.any() and f.received_at == 11.0 for f in silence)
    for _ in silence:
        d.frame_dropped()
    assert len([o for o in d.tick(11.0) if isinstance(o, RunAudio)]) == 2


def test_idle_client_is_closed() -> None:
    d = dialect()
    out = d.tick(Limits().idle_timeout + 1)
    assert types(out) == ["error"]
    assert isinstance(out[-1], Close)


# --- turns ------------------------------------------------------------------------------------

GA_TURN = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
]
GA_CLOSE = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]
# What the server's VAD sends when the user's speech ends: the turn committed as an item.
USER_TURN_ENDED = [
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.done",
]


def test_a_turn_opens_on_text_and_closes_after_the_end_token() -> None:
    d, m = dialect(), Model()
    assert run(d, m, *pad(5)) == []  # pad frames between turns: nothing
    out = run(d, m, {"text": "Hel"}, {}, {"text": "lo"}, {"end": True})
    assert types(out)[:6] == GA_TURN
    assert types(out).count("response.output_audio.delta") == 4  # one per frame
    tail = run(d, m, *pad(END_TAIL_FRAMES))
    assert types(tail) == ["response.output_audio.delta"] * (END_TAIL_FRAMES - 1) + [
        "response.output_audio.delta",
        *GA_CLOSE,
    ]
    everything = events(out + tail)
    rid = everything[0]["response"]["id"]
    item = everything[1]["item"]["id"]
    for event in everything:
        if "response_id" in event:
            assert event["response_id"] == rid
        if "item_id" in event:
            assert event["item_id"] == item
    done = next(e for e in everything if e["type"] == "response.done")["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == "Hello"
    transcript = [e for e in everything if e["type"].endswith("transcript.done")]
    assert transcript[0]["transcript"] == "Hello"
    assert run(d, m, *pad(5)) == []


def test_output_audio_is_24khz_and_keeps_the_tone() -> None:
    d, m = dialect(), Model()
    out = run(d, m, *({"text": "a"} for _ in range(30)))
    deltas = [e["delta"] for e in events(out) if e["type"] == "response.output_audio.delta"]
    assert len(deltas) == 30
    pcm = np.concatenate([np.frombuffer(base64.b64decode(x), "<i2") for x in deltas])
    # 30 frames of 1764 samples at 22.05 kHz are 30 x 1920 at 24 kHz, less the filter delay.
    assert 30 * 1920 - 800 < pcm.shape[0] <= 30 * 1920
    assert abs(peak_hz(pcm[2000:].astype(np.float64), 24000) - TONE) < 5


def test_a_turn_without_an_end_token_closes_after_quiet_frames() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"text": "x"}, *pad(40))
    assert "response.done" in types(out)


def test_cancel_mutes_the_rest_of_the_turn() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"text": "a"}, {"text": "b"})
    rid = events(out)[0]["response"]["id"]
    out = send(d, {"type": "response.cancel"})
    assert types(out)[-2:] == ["response.done", "rate_limits.updated"]
    done = events(out)[-2]["response"]
    assert (done["id"], done["status"]) == (rid, "cancelled")
    assert done["status_details"]["reason"] == "client_cancelled"
    assert run(d, m, {"text": "c"}, {"text": "d"}, {"end": True}, *pad(4)) == []
    out = run(d, m, {"text": "next"})
    assert events(out)[0]["response"]["id"] != rid


def test_cancel_with_nothing_active_is_a_standard_error() -> None:
    d = dialect()
    out = send(d, {"type": "response.cancel"})
    (error,) = events(out)
    assert error["error"]["code"] == "response_cancel_not_active"
    assert not any(isinstance(o, Close) for o in out)


def test_response_create_answers_at_once_and_ends_empty_when_the_model_is_silent() -> None:
    d, m = dialect(), Model()
    out = send(d, {"type": "response.create", "response": {"metadata": {"k": "v"}}})
    created = events(out)[0]
    assert created["type"] == "response.created"
    assert created["response"]["metadata"] == {"k": "v"}
    again = send(d, {"type": "response.create"})
    assert events(again)[0]["error"]["code"] == "conversation_already_has_active_response"
    out = run(d, m, *pad(CREATE_TIMEOUT_FRAMES))
    assert types(out) == ["response.done", "rate_limits.updated"]
    assert events(out)[0]["response"]["output"] == []


def test_a_pending_response_carries_the_next_turn() -> None:
    d, m = dialect(), Model()
    rid = events(send(d, {"type": "response.create"}))[0]["response"]["id"]
    out = run(d, m, *pad(3), {"text": "yes"}, {"end": True}, *pad(END_TAIL_FRAMES))
    assert types(out)[0] == "response.output_item.added"
    assert all(e.get("response_id", rid) == rid for e in events(out))
    assert events(out)[-2]["response"]["id"] == rid


def test_tool_call_becomes_a_function_call_item() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"function": CALL[:20]}, {"function": CALL[20:50]})
    assert out == []  # still arriving
    out = run(d, m, {"function": CALL[50:]})
    assert types(out) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    done = events(out)[4]
    assert done["name"] == "get_weather"
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    assert events(out)[5]["item"]["call_id"] == done["call_id"]
    # The tool's result is acknowledged as an item.
    result = {"type": "function_call_output", "call_id": done["call_id"], "output": "sunny"}
    ack = send(d, {"type": "conversation.item.create", "item": result})
    assert types(ack) == ["conversation.item.added", "conversation.item.done"]


def test_tool_call_inside_speech_joins_the_response() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"text": "let me check"}, {"function": CALL}, {"end": True}, *pad(2))
    done = [e for e in events(out) if e["type"] == "response.done"]
    assert [i["type"] for i in done[0]["response"]["output"]] == ["message", "function_call"]


def test_parse_calls() -> None:
    assert parse_calls('[{"name": "f", "arguments": "{}"}]') == [("f", "{}")]
    assert parse_calls('<TOOLCALL>{"name": "f"}</TOOLCALL>') == [("f", "{}")]
    assert parse_calls('[{"name": "f"') is None
    assert parse_calls('["x"]') is None


# --- the user's side ------------------------------------------------------------------------


def test_user_speech_is_segmented_by_its_transcript() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"heard": "hello "}, {}, {"heard": "there"})
    started = events(out)
    assert [e["type"] for e in started] == ["input_audio_buffer.speech_started"]
    item = started[0]["item_id"]
    out = run(d, m, *pad(USER_QUIET_FRAMES))
    assert types(out) == USER_TURN_ENDED
    assert all(e.get("item_id", item) == item for e in events(out))
    assert events(out)[4]["transcript"] == "hello there"
    assert events(out)[5]["item"]["content"][0]["transcript"] == "hello there"


def test_manual_commit_without_vad() -> None:
    d, m = dialect(), Model()
    send(d, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    empty = send(d, {"type": "input_audio_buffer.commit"})
    assert events(empty)[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    send(d, append(pcm24(0.2)))
    out = run(d, m, {"heard": "hi"})
    assert out == []  # no VAD: no speech_started
    out = send(d, {"type": "input_audio_buffer.commit"})
    assert types(out) == ["input_audio_buffer.committed", "conversation.item.added"]
    late = run(d, m, {"heard": " you"}, *pad(USER_QUIET_FRAMES))
    assert events(late)[-2]["transcript"] == "hi you"
    assert types(send(d, {"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]


def test_harmless_unsupported_events_are_acknowledged() -> None:
    d, m = dialect(), Model()
    run(d, m, {"text": "a"})
    item = next(iter(d.items))
    acks = {
        "conversation.item.retrieve": "conversation.item.retrieved",
        "conversation.item.truncate": "conversation.item.truncated",
        "conversation.item.delete": "conversation.item.deleted",
        "output_audio_buffer.clear": "output_audio_buffer.cleared",
    }
    for kind, answer in acks.items():
        message = {"type": kind, "item_id": item, "content_index": 0, "audio_end_ms": 10}
        assert types(send(d, message)) == [answer]
    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    assert types(send(d, {"type": "conversation.item.create", "item": text})) == [
        "conversation.item.added",
        "conversation.item.done",
    ]
    for bad in ("not json", json.dumps({"type": "nope"}), json.dumps([1])):
        assert types(send(d, bad)) == ["error"]


# --- any sequence --------------------------------------------------------------------------

_client_events = st.sampled_from(
    [
        {"type": "session.update", "session": {"instructions": "x"}},
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                }
            },
        },
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {
                        "turn_detection": {"type": "semantic_vad", "interrupt_response": False}
                    }
                }
            },
        },
        {"type": "session.update", "session": {"output_modalities": ["text"]}},
        {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "x"}}}}},
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}},
                    "output": {"format": {"type": "audio/pcma"}},
                }
            },
        },
        {
            "type": "session.update",
            "session": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}},
        },
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 24000}},
                    "output": {"format": {"type": "audio/pcm"}},
                }
            },
        },
        {"type": "input_audio_buffer.append", "audio": PCMU.encode(np.full(800, 0.2, np.float32))},
        {"type": "session.update", "session": {"tools": [{"type": "function", "name": "f"}]}},
        append(pcm24(0.05)),
        append(pcm24(0.2)),
        {"type": "input_audio_buffer.append", "audio": "!!"},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {"type": "output_audio_buffer.clear"},
        {"type": "response.create"},
        {"type": "response.cancel"},
        {"type": "response.cancel", "response_id": "resp_other"},
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c", "output": "o"},
        },
        {"type": "conversation.item.retrieve", "item_id": "nope"},
        {
            "type": "conversation.item.truncate",
            "item_id": "i",
            "content_index": 0,
            "audio_end_ms": 5,
        },
        {"type": "conversation.item.delete", "item_id": "i"},
        {"type": "bogus"},
        "{",
    ]
)
_frames = st.fixed_dictionaries(
    {},
    optional={
        "text": st.sampled_from(["a", "bc "]),
        "end": st.booleans(),
        "function": st.sampled_from([CALL[:30], CALL[30:], CALL, "junk"]),
        "heard": st.sampled_from(["hi ", "yo"]),
    },
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_client_events, st.lists(_frames, min_size=1, max_size=12)), max_size=25))
def test_any_sequence_yields_only_valid_ga_events(steps: list[Any]) -> None:
    d, m = dialect(), Model()
    d.opened(None, now=0.0)
    active: str | None = None
    for step in steps:
        out = run(d, m, *step) if isinstance(step, list) else send(d, step)
        for event in events(out):  # validates each
            if event["type"] == "response.created":
                assert active is None
                active = event["response"]["id"]
            elif event["type"] == "response.done":
                assert event["response"]["id"] == active
                active = None
            elif "response_id" in event and event["type"] != "output_audio_buffer.cleared":
                assert event["response_id"] == active
        assert not any(isinstance(o, Close) for o in out)


def test_a_client_that_stops_reading_is_dropped_at_once() -> None:
    d = Dialect("sess_test", "scripted", Limits(send_timeout=10.0), now=0.0)
    d.sending(5.0)
    assert d.next_tick(5.0) <= 15.0
    assert not any(isinstance(o, Close) for o in d.tick(14.0))
    assert d.tick(15.0) == [Close(1008, "client stopped reading", now=True)]
    d2 = Dialect("sess_test", "scripted", Limits(send_timeout=10.0), now=0.0)
    d2.sending(5.0)
    d2.sent(5.5)
    assert not any(isinstance(o, Close) for o in d2.tick(15.0))
