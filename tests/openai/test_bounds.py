"""What one OpenAI-dialect client can cost: the item store's byte budget, client JSON
bounded before it is built or walked, and the stalled-reader deadline in every phase.
Pure functions and the pure state machine, with explicit times."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.limits import Limits
from realtime.models.voicechat.tools import parse_calls
from realtime.openai import events as ev
from realtime.openai.dialect import Dialect, Output
from realtime.openai.items import MAX_ITEM_BYTES, MAX_ITEMS_BYTES, VALUE_BYTES, item_bytes
from realtime.session.close_codes import Close
from tests.openai.test_dialect import dialect, events, send, types


def error_of(outputs: list[Output]) -> dict[str, Any]:
    """The one error event in ``outputs`` (a refusal, which never closes)."""
    assert not any(isinstance(o, Close) for o in outputs)
    (event,) = events(outputs)
    assert event["type"] == "error", event
    error: dict[str, Any] = event["error"]
    assert error["type"] == "invalid_request_error"
    return error


def still_serving(d: Dialect) -> None:
    """The session goes on after a refusal: the next event is answered as usual."""
    assert types(send(d, {"type": "output_audio_buffer.clear"})) == ["output_audio_buffer.cleared"]


def create(content: object, **item: Any) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": content, **item},
    }


def text(n: int) -> list[dict[str, Any]]:
    return [{"type": "input_text", "text": "x" * n}]


def retrieve(d: Dialect, item_id: str) -> str:
    (event,) = events(send(d, {"type": "conversation.item.retrieve", "item_id": item_id}))
    kind: str = event["type"]
    return kind


# --- client JSON --------------------------------------------------------------------------


def test_a_flood_of_empty_objects_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The red team's 3.9 MB item of 1.3 M ``{}``: refused from its text alone."""
    frame = (
        '{"type":"conversation.item.create","item":{"type":"message","role":"user",'
        '"content":[' + ",".join(["{}"] * 1_300_000) + "]}}"
    )
    assert len(frame) > 3_900_000
    d = dialect()

    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("json.loads ran on a message with too many values")

    monkeypatch.setattr(json, "loads", never)  # the module events.py parses with
    error = error_of(d.receive(frame, 0.0))
    monkeypatch.undo()
    assert error["code"] == "message_too_large"
    assert str(ev.MAX_JSON_VALUES) in error["message"]
    assert len(d.items) == 0 and d.items.bytes == 0
    still_serving(d)


_text = st.text(st.sampled_from(list('ab,[]{}":\\\n é\U0001f600')), max_size=6)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=30,
)
_spellings = st.sampled_from(
    [{"separators": (",", ":")}, {}, {"indent": 1}, {"ensure_ascii": False}]
)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(0, 40), _spellings)
def test_values_are_counted_exactly_from_the_text(
    value: object, limit: int, spelling: dict[str, Any]
) -> None:
    """Brackets, commas, quotes and escapes inside strings do not count; empty
    objects and arrays count once, like any value."""
    frame = json.dumps(value, **spelling)
    assert ev.too_many_values(frame, limit) == (ev.shape(value).values > limit)


def test_the_value_limit_is_exact_and_strings_may_hold_any_marks() -> None:
    limit = ev.MAX_JSON_VALUES
    room = limit - ev.shape(create([])).values
    fits = create([{}] * room)
    assert ev.shape(fits).values == limit
    parsed = ev.parse_client_event(json.dumps(fits), max_bytes=1 << 22)
    assert not isinstance(parsed, ev.Invalid)
    over = ev.parse_client_event(json.dumps(create([{}] * (room + 1))), max_bytes=1 << 22)
    assert isinstance(over, ev.Invalid) and over.code == "message_too_large"
    marks = create([{"type": "input_text", "text": ',[{"\\' * 50_000}])
    assert not isinstance(ev.parse_client_event(json.dumps(marks), max_bytes=1 << 22), ev.Invalid)


@pytest.mark.parametrize("depth", [65, 400, 799, 800, 1000, 3000])
def test_deep_nesting_is_a_refusal_not_a_crash(depth: int) -> None:
    """800 levels made ``json.loads`` raise RecursionError (1011 and a traceback);
    fewer crashed ``copy.deepcopy`` or were stored. An error, and the session goes on."""
    d = dialect()
    nested = "[" * depth + "]" * depth
    for frame in (
        nested,
        '{"type":"response.create","response":{"metadata":' + nested + "}}",
        '{"type":"conversation.item.create","item":{"type":"message","content":' + nested + "}}",
    ):
        error = error_of(d.receive(frame, 0.0))
        assert error["code"] == "invalid_json"
        assert f"deeper than {ev.MAX_JSON_DEPTH} levels" in error["message"]
        still_serving(d)
    assert len(d.items) == 0


def test_nesting_is_served_up_to_the_limit_and_refused_past_it() -> None:
    d = dialect()
    # The event and its item are two levels, then the content arrays.
    for nested, served in ((ev.MAX_JSON_DEPTH - 2, True), (ev.MAX_JSON_DEPTH - 1, False)):
        frame = create(json.loads("[" * nested + "]" * nested))
        assert ev.shape(frame).depth == nested + 2
        out = send(d, frame)  # not a GA content list, but acknowledged when it fits
        kinds = [o["type"] for o in out if isinstance(o, dict)]
        assert kinds == (
            ["conversation.item.added", "conversation.item.done"] if served else ["error"]
        )
    assert len(d.items) == 1


def test_a_deep_tool_call_from_the_model_does_not_parse() -> None:
    assert parse_calls("[" * 5000 + "]" * 5000) is None
    deep_args = '{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}"
    assert parse_calls(deep_args) is None


def test_a_lone_surrogate_is_refused_and_a_pair_is_served() -> None:
    """``\\ud800`` parses into text no UTF-8 writer can send back (the echo failed the
    socket write: 1011); an escaped pair is one character, echoed as it is."""
    d = dialect()
    for escape in ("\\ud800", "\\udfff", "a\\ud83d"):
        frame = json.dumps(create(text(0))).replace('"text": ""', f'"text": "{escape}"')
        error = error_of(d.receive(frame, 0.0))
        assert error["code"] == "invalid_json" and "surrogate" in error["message"]
    frame = json.dumps(create([{"type": "input_text", "text": "\U0001f600"}]))
    assert "\\ud83d\\ude00" in frame
    added, _ = events(d.receive(frame, 0.0))
    assert added["item"]["content"][0]["text"] == "\U0001f600"
    ev.serialize(added).encode("utf-8")


def test_the_message_limit_counts_utf8_bytes() -> None:
    d = Dialect("sess_test", "scripted", Limits(max_message_bytes=100), now=0.0)
    frame = json.dumps({"type": "output_audio_buffer.clear", "x": "é" * 40}, ensure_ascii=False)
    assert len(frame) <= 100 < len(frame.encode("utf-8"))
    assert error_of(d.receive(frame, 0.0))["code"] == "message_too_large"


# --- the item store -----------------------------------------------------------------------


def test_item_bytes_charges_each_value_as_well_as_the_text() -> None:
    """1000 ``{}`` are 3 kB of JSON but some 70 kB of Python objects."""
    empties = {"id": "i", "content": [{}] * 1000}
    assert item_bytes(empties) == len(ev.serialize(empties)) + VALUE_BYTES * 1003
    words = {"id": "i", "text": "é" * 1000}
    assert item_bytes(words) == len(ev.serialize(words).encode("utf-8")) + VALUE_BYTES * 3


def test_an_item_over_the_cap_is_refused_and_the_session_goes_on() -> None:
    d = dialect()
    for too_big in (create(text(MAX_ITEM_BYTES)), create([{}] * 4000)):
        error = error_of(send(d, too_big))
        assert (error["code"], error["param"]) == ("invalid_value", "item")
        assert f"{MAX_ITEM_BYTES}-byte limit" in error["message"]
    assert len(d.items) == 0 and d.items.bytes == 0
    small = create(text(10), id="item_small")
    assert types(send(d, small)) == ["conversation.item.added", "conversation.item.done"]
    assert retrieve(d, "item_small") == "conversation.item.retrieved"


def test_items_past_the_budget_forget_the_oldest() -> None:
    d = dialect()
    size = MAX_ITEM_BYTES - 1024
    count = MAX_ITEMS_BYTES // size + 3
    for i in range(count):
        assert types(send(d, create(text(size - 600), id=f"item_{i}")))[0] == (
            "conversation.item.added"
        )
        assert d.items.bytes <= MAX_ITEMS_BYTES
    kept = list(d.items)
    assert kept == [f"item_{i}" for i in range(count - len(kept), count)]
    assert len(kept) == MAX_ITEMS_BYTES // item_bytes(d.items.get(kept[0]) or {})
    assert d.items.bytes == sum(item_bytes(d.items.get(i) or {}) for i in kept)
    assert retrieve(d, "item_0") == "error"  # item_not_found, as after OpenAI's truncation
    assert retrieve(d, kept[-1]) == "conversation.item.retrieved"
    send(d, {"type": "conversation.item.delete", "item_id": kept[-1]})
    assert d.items.bytes == sum(item_bytes(d.items.get(i) or {}) for i in kept[:-1])


def test_an_item_id_that_is_not_a_string_is_refused() -> None:
    """A list id was a dict key: TypeError, 1011."""
    d = dialect()
    for bad in ([1], {"a": 1}, 7, ""):
        error = error_of(send(d, create([], id=bad)))
        assert (error["code"], error["param"]) == ("invalid_value", "item.id")
    still_serving(d)


def test_unknown_audio_settings_are_not_kept() -> None:
    """Each was stored: one session.update after another grew the session (and every
    session.updated) without end."""
    d = dialect()
    for i in range(3):
        update = {"audio": {"input": {f"extra_{i}": "x" * 1000}, "output": {"other": 1}}}
        send(d, {"type": "session.update", "session": update})
    assert set(d.session["audio"]["input"]) == {
        "format",
        "transcription",
        "noise_reduction",
        "turn_detection",
    }
    assert set(d.session["audio"]["output"]) == {"format", "voice", "speed"}


# --- the stalled-reader deadline -------------------------------------------------------------


def _in_phase(phase: str) -> tuple[Dialect, float]:
    """A dialect in ``phase`` and the time it got there (send_timeout 10, idle 100)."""
    d = Dialect("sess_test", "scripted", Limits(send_timeout=10.0, idle_timeout=100.0), now=0.0)
    if phase in ("opening", "open", "lost"):
        send(d, {"type": "response.create"})
    if phase in ("open", "lost"):
        d.opened(None, now=0.0)
    if phase == "lost":
        assert isinstance(d.failed("gone", lost=True, now=50.0)[-1], Close)
        return d, 50.0
    if phase == "idle closed":
        assert isinstance(d.tick(100.0)[-1], Close)
        return d, 100.0
    return d, 0.0


PHASES = ("configuring", "opening", "open", "idle closed", "lost")


def test_a_client_that_stops_reading_is_dropped_in_every_phase() -> None:
    """Closing included: there the close is owed even when no write is reported, and
    the clock never waits for a deadline already past (it spun on the idle one)."""
    for phase in PHASES:
        d, t = _in_phase(phase)
        d.sending(t + 1.0)
        # Closing, the clock runs from the close decision, before this write began.
        deadline = t + (10.0 if d.closed else 11.0)
        assert d.next_tick(t + 1.0) <= deadline, phase
        assert not any(isinstance(o, Close) for o in d.tick(deadline - 0.1)), phase
        assert d.tick(deadline) == [Close(1008, "client stopped reading", now=True)], phase
        assert d.tick(deadline + 1.0) == [], phase
        assert d.next_tick(deadline + 1.0) == float("inf"), phase
    for phase in ("idle closed", "lost"):
        d, t = _in_phase(phase)  # nothing reported under way: the close frame is owed
        assert t < d.next_tick(t) == t + 10.0, phase
        assert d.tick(t + 9.9) == [], phase
        assert d.tick(t + 10.0) == [Close(1008, "client stopped reading", now=True)], phase


def test_a_closing_client_that_reads_is_not_dropped() -> None:
    """Each write done while closing restarts the clock; the deadline is send_timeout
    after the last progress, whatever is still queued ahead of the close."""
    d, t = _in_phase("idle closed")
    for k in range(1, 4):
        d.sending(t + 8.0 * k - 1.0)
        d.sent(t + 8.0 * k)
        assert d.tick(t + 8.0 * k + 9.9) == []
    assert d.next_tick(t + 24.0) == t + 34.0
    assert d.tick(t + 34.0) == [Close(1008, "client stopped reading", now=True)]
    # A write under way when the close was decided keeps its own, earlier, deadline.
    d2 = Dialect("sess_test", "scripted", Limits(send_timeout=10.0, idle_timeout=100.0), now=0)
    d2.sending(95.0)
    d2.tick(100.0)
    assert d2.stall_deadline() == 105.0
