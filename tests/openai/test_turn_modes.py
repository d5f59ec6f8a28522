"""Who opens a response, and what cuts it, per ``turn_detection`` (OpenAI's semantics),
on the pure dialect: manual (null), server VAD with ``create_response`` true or false,
and ``interrupt_response`` true or false."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.openai.dialect import Dialect, Output
from realtime.openai.responses import CREATE_TIMEOUT_FRAMES, HELD_FRAMES
from realtime.openai.turns import END_TAIL_FRAMES, USER_QUIET_FRAMES
from realtime.session.work import RunAudio
from tests.openai.scripted import CALL
from tests.openai.test_dialect import (
    USER_TURN_ENDED,
    Model,
    append,
    dialect,
    events,
    pad,
    pcm24,
    run,
    send,
    types,
)

MANUAL: dict[str, Any] = {"turn_detection": None}
CLIENT_DRIVEN: dict[str, Any] = {"turn_detection": {"type": "server_vad", "create_response": False}}
NO_INTERRUPT: dict[str, Any] = {
    "turn_detection": {"type": "semantic_vad", "interrupt_response": False}
}
CREATE = {"type": "response.create"}


def session(detection: dict[str, Any]) -> Dialect:
    d = dialect()
    out = send(d, {"type": "session.update", "session": {"audio": {"input": detection}}})
    assert types(out) == ["session.updated"]
    d.opened(None, now=0.0)  # audio goes to the model at once (it is held while it opens)
    return d


def reply(*words: str) -> list[dict[str, Any]]:
    """A model turn: a word a frame, the end token, its tail."""
    return [*({"text": w} for w in words), {"end": True}, *pad(END_TAIL_FRAMES)]


def done(outputs: list[Output]) -> list[dict[str, Any]]:
    return [e["response"] for e in events(outputs) if e["type"] == "response.done"]


def about_responses(outputs: list[Output]) -> list[str]:
    """The types of the events about a response (not the user's turn)."""
    return [t for t in types(outputs) if t.startswith("response.")]


def transcript(response: dict[str, Any]) -> str:
    return "".join(
        part.get("transcript", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


# --- manual: turn_detection null ------------------------------------------------------------


def test_manual_output_before_response_create_is_dropped() -> None:
    d, m = session(MANUAL), Model()
    # A whole model turn, a tool call outside speech and the model's quiet: no events.
    assert run(d, m, *reply("Hel", "lo"), {"function": CALL}, *pad(5)) == []
    out = send(d, CREATE)
    assert types(out) == ["response.created"]
    rid = events(out)[0]["response"]["id"]
    out = run(d, m, *pad(2), *reply("Yes"))
    (response,) = done(out)
    assert (response["id"], response["status"], transcript(response)) == (rid, "completed", "Yes")
    assert all(e.get("response_id", rid) == rid for e in events(out))
    # The next turn, again unasked for, is dropped.
    assert run(d, m, *reply("More")) == []


def test_manual_response_create_carries_the_turn_under_way_from_its_start() -> None:
    d, m = session(MANUAL), Model()
    assert run(d, m, {"text": "Hel"}, {}, {"text": "lo"}) == []
    out = send(d, CREATE)
    assert types(out)[:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    # The three held frames, as they would have gone out, in one go.
    assert types(out).count("response.output_audio.delta") == 3
    said = [e["delta"] for e in events(out) if e["type"].endswith("transcript.delta")]
    assert said == ["Hel", "lo"]
    out = run(d, m, {"text": " you"}, {"end": True}, *pad(END_TAIL_FRAMES))
    (response,) = done(out)
    assert transcript(response) == "Hello you"
    # Again: the second create is refused only while the first is active.
    assert types(send(d, CREATE)) == ["response.created"]
    error = events(send(d, CREATE))[0]["error"]
    assert error["code"] == "conversation_already_has_active_response"


def test_manual_create_in_the_tail_carries_the_tail_and_then_ends() -> None:
    d, m = session(MANUAL), Model()
    run(d, m, {"text": "Hi"}, {"end": True})
    out = send(d, CREATE)
    assert types(out).count("response.output_audio.delta") == 2
    out = run(d, m, *pad(END_TAIL_FRAMES))
    (response,) = done(out)
    assert transcript(response) == "Hi"


def test_manual_create_waits_until_the_model_heard_what_was_sent_before_it() -> None:
    """Turns the model takes while it still hears audio sent before response.create
    are not the response; the turn under way once it has heard it all is."""
    d, m = session(MANUAL), Model()
    queued = [o for o in send(d, append(pcm24(1.0))) if isinstance(o, RunAudio)]
    assert len(queued) > 10
    send(d, {"type": "input_audio_buffer.commit"})
    out = send(d, CREATE)
    assert types(out) == ["response.created"]
    # Talking over the user, early in the queued audio: not this response's.
    assert about_responses(run(d, m, *reply("Mm"))) == []
    # A turn still under way when the queued audio is all heard is taken from its start.
    early = len(queued) - m.index - 2
    assert about_responses(run(d, m, *pad(early), {"text": "Well"})) == []
    out = run(d, m, {"text": ","})
    assert about_responses(out)[:2] == ["response.output_item.added", "response.content_part.added"]
    out += run(d, m, {"text": " yes"}, *reply("."))
    (response,) = done(out)
    assert transcript(response) == "Well, yes."


def test_manual_create_with_nothing_to_say_ends_empty_after_its_bound() -> None:
    d, m = session(MANUAL), Model()
    queued = [o for o in send(d, append(pcm24(0.4))) if isinstance(o, RunAudio)]
    send(d, CREATE)
    # The frames of audio sent before it do not count towards the bound.
    out = run(d, m, *pad(len(queued) + CREATE_TIMEOUT_FRAMES - 1))
    assert out == []
    out = run(d, m, {})
    assert types(out) == ["response.done", "rate_limits.updated"]
    assert done(out)[0]["output"] == [] and done(out)[0]["status"] == "completed"


def test_a_cancelled_turn_running_on_does_not_keep_the_next_response_waiting() -> None:
    d, m = session(MANUAL), Model()
    send(d, CREATE)
    run(d, m, {"text": "a"})
    assert done(send(d, {"type": "response.cancel"}))[0]["status"] == "cancelled"
    send(d, CREATE)
    # The model talks on (muted) without ever ending its turn: the new response
    # still ends within its bound, empty.
    out = run(d, m, *({"text": "x"} for _ in range(CREATE_TIMEOUT_FRAMES)))
    assert types(out) == ["response.done", "rate_limits.updated"]
    assert done(out)[0]["output"] == []


def test_a_held_turn_longer_than_what_is_kept_is_given_up() -> None:
    d, m = session(MANUAL), Model()
    assert run(d, m, *({"text": "a"} for _ in range(HELD_FRAMES + 1))) == []
    out = send(d, CREATE)
    assert types(out) == ["response.created"]  # nothing held to carry
    assert run(d, m, {"text": "still"}, {"end": True}, *pad(END_TAIL_FRAMES)) == []
    (response,) = done(run(d, m, *reply("Next")))
    assert transcript(response) == "Next"


def test_manual_tool_call_goes_into_the_response_asked_for() -> None:
    d, m = session(MANUAL), Model()
    send(d, CREATE)
    out = run(d, m, {"text": "let me see"}, {"function": CALL}, *reply("!"))
    (response,) = done(out)
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]


def test_manual_user_turn_has_no_speech_events() -> None:
    d, m = session(MANUAL), Model()
    send(d, append(pcm24(0.2)))
    out = run(d, m, {"heard": "hi"}, *pad(USER_QUIET_FRAMES * 2), *reply("Hm"))
    assert out == []  # neither speech events nor a response: only the commit ends it
    assert types(send(d, {"type": "input_audio_buffer.commit"})) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]


# --- server VAD with create_response false --------------------------------------------------


def test_without_create_response_vad_events_flow_and_the_client_opens_responses() -> None:
    d, m = session(CLIENT_DRIVEN), Model()
    assert d.session["audio"]["input"]["turn_detection"]["interrupt_response"] is True
    out = run(d, m, {"heard": "what "}, {"heard": "time"}, *pad(USER_QUIET_FRAMES))
    assert types(out) == ["input_audio_buffer.speech_started", *USER_TURN_ENDED]
    assert run(d, m, *reply("Noon")) == []  # the model answered; nobody asked
    send(d, CREATE)
    (response,) = done(run(d, m, *reply("Noon", ".")))
    assert transcript(response) == "Noon."


def test_without_create_response_the_model_taking_the_floor_still_commits_the_user() -> None:
    d, m = session(CLIENT_DRIVEN), Model()
    run(d, m, {"heard": "so"})
    out = run(d, m, {"text": "Right"})  # held, unheard: but the user's turn is over
    assert types(out)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert "response.created" not in types(out)
    out = send(d, CREATE)
    assert [e["delta"] for e in events(out) if e["type"].endswith("transcript.delta")] == ["Right"]


# --- interrupt_response ---------------------------------------------------------------------


def test_user_speech_cuts_the_active_response_by_default() -> None:
    d, m = dialect(), Model()
    out = run(d, m, {"text": "Long "}, {"text": "story"})
    rid = events(out)[0]["response"]["id"]
    out = run(d, m, {"heard": "wait"})
    assert types(out)[0] == "input_audio_buffer.speech_started"
    (response,) = done(out)
    assert (response["id"], response["status"]) == (rid, "cancelled")
    assert response["status_details"]["reason"] == "turn_detected"
    assert transcript(response) == "Long story"
    # The rest of that turn is dropped; the model's next turn is a new response.
    assert "response.created" not in types(run(d, m, {"text": " short"}, *reply(".")))
    (response,) = done(run(d, m, *pad(USER_QUIET_FRAMES), *reply("Yes?")))
    assert response["id"] != rid and transcript(response) == "Yes?"


def test_without_interrupt_response_user_speech_leaves_the_response_be() -> None:
    d, m = session(NO_INTERRUPT), Model()
    run(d, m, {"text": "Long "})
    out = run(d, m, {"heard": "mm", "text": "story"}, *reply("."))
    assert "input_audio_buffer.speech_started" in types(out)
    (response,) = done(out)
    assert (response["status"], transcript(response)) == ("completed", "Long story.")


def test_without_interrupt_a_pending_response_waits_through_user_speech() -> None:
    detection = {"type": "server_vad", "create_response": False, "interrupt_response": False}
    d, m = session({"turn_detection": detection}), Model()
    send(d, CREATE)
    out = run(d, m, {"heard": "hi"}, *pad(USER_QUIET_FRAMES), *reply("Hello"))
    (response,) = done(out)
    assert transcript(response) == "Hello"


def test_speech_sent_before_response_create_does_not_cut_it() -> None:
    """With server VAD and interrupt_response, speech started in audio the client sent
    before asking for the response is not an interruption of it."""
    d, m = session(CLIENT_DRIVEN), Model()
    queued = [o for o in send(d, append(pcm24(0.8))) if isinstance(o, RunAudio)]
    send(d, CREATE)
    out = run(d, m, {"heard": "hello"}, *pad(len(queued) - 1))
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert done(out) == []
    (response,) = done(run(d, m, *reply("Hi")))
    assert (response["status"], transcript(response)) == ("completed", "Hi")
    # Speech after it does cut the next one.
    send(d, CREATE)
    run(d, m, *pad(USER_QUIET_FRAMES), {"text": "So"})
    (response,) = done(run(d, m, {"heard": "no"}))
    assert response["status_details"]["reason"] == "turn_detected"


# --- the session -----------------------------------------------------------------------------


def test_turn_detection_switches_are_echoed_and_checked() -> None:
    d = session({"turn_detection": {"type": "semantic_vad", "interrupt_response": None}})
    detection = d.session["audio"]["input"]["turn_detection"]
    assert detection == {
        "type": "semantic_vad",
        "create_response": True,
        "interrupt_response": True,
    }
    for name in ("create_response", "interrupt_response"):
        bad = {"audio": {"input": {"turn_detection": {"type": "server_vad", name: "no"}}}}
        (error,) = events(send(d, {"type": "session.update", "session": bad}))
        assert error["error"]["code"] == "invalid_value"
        assert error["error"]["param"] == f"session.audio.input.turn_detection.{name}"
    assert d.session["audio"]["input"]["turn_detection"] == detection  # nothing applied


# --- any sequence -----------------------------------------------------------------------------

_modes = [MANUAL, CLIENT_DRIVEN, NO_INTERRUPT, {"turn_detection": {"type": "server_vad"}}]
_steps = st.one_of(
    st.sampled_from(
        [
            CREATE,
            {"type": "response.cancel"},
            {"type": "input_audio_buffer.commit"},
            {"type": "input_audio_buffer.clear"},
            append(pcm24(0.2)),
            *({"type": "session.update", "session": {"audio": {"input": m}}} for m in _modes),
        ]
    ),
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "text": st.sampled_from(["a", "bc "]),
                "end": st.booleans(),
                "function": st.sampled_from([CALL, CALL[:30], CALL[30:]]),
                "heard": st.just("hi "),
            },
        ),
        min_size=1,
        max_size=40,
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_steps, max_size=25))
def test_only_the_client_opens_responses_unless_the_server_may(steps: list[Any]) -> None:
    """Whatever the order: a response that the client did not ask for opens only with
    server VAD and create_response; at most one is active; ids stay consistent."""
    d, m = dialect(), Model()
    d.opened(None, now=0.0)
    active: str | None = None
    for step in steps:
        detection = d.session["audio"]["input"]["turn_detection"]
        server_may = detection is not None and detection["create_response"]
        out = run(d, m, *step) if isinstance(step, list) else send(d, step)
        for event in events(out):
            if event["type"] == "response.created":
                assert active is None
                assert step == CREATE or server_may, step
                active = event["response"]["id"]
            elif event["type"] == "response.done":
                assert event["response"]["id"] == active
                active = None
            elif event["type"] == "error":
                code = event["error"]["code"]
                if code == "conversation_already_has_active_response":
                    assert active is not None
