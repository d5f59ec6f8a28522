"""The dialect's pure parts on their own: turns drawn from the channels, tool calls
read from the function channel as it streams, and the session merge."""

from __future__ import annotations

import itertools

import numpy as np

from realtime.models.base import VOICECHAT_FIGURES, AssistantTextDelta, AudioDelta, ModelEvent
from realtime.models.voicechat.tools import CallReader
from realtime.openai import events as ev
from realtime.openai import session as sess
from realtime.openai.states import TurnPhase
from realtime.openai.turns import (
    END_TAIL_FRAMES,
    QUIET_FRAMES,
    USER_QUIET_FRAMES,
    Channels,
    Committed,
    SpeechStarted,
    SpeechStopped,
    Transcribed,
    Turns,
    channels,
)
from tests.openai.scripted import CALL

FRAME_MS = round(VOICECHAT_FIGURES.frame_ms)


def ids() -> Turns:
    numbers = itertools.count()
    return Turns(lambda prefix: f"{prefix}_{next(numbers)}", VOICECHAT_FIGURES.frame_seconds)


def phase(turns: Turns) -> TurnPhase:
    """Read afresh (mypy would keep an earlier ``is`` narrowing across calls)."""
    return turns.phase


def frame(
    index: int, *, text: str = "", heard: str = "", end: bool = False, audio: bool = True
) -> Channels:
    events: list[ModelEvent] = []
    if text:
        events.append(AssistantTextDelta(index, 100, text, text))
    if audio:
        samples = np.zeros(1764, np.float32)
        events.append(
            AudioDelta(index, samples, (0,) * VOICECHAT_FIGURES.codebooks, end_of_turn=end)
        )
    channel = channels(events, fallback_index=index)
    if heard:
        return Channels(index, channel.audio, channel.text, channel.spoken, (), heard)
    return channel


def test_channels_sorts_one_frame() -> None:
    split = channels([AssistantTextDelta(4, 1, "a", "a"), AssistantTextDelta(4, 1, "b", "ab")], 9)
    assert (split.index, split.audio, split.text, split.spoken) == (9, None, True, "ab")


def test_a_turn_ends_after_its_tail_and_text_in_the_tail_cancels_the_end() -> None:
    turns = ids()
    step = turns.frame(frame(0, text="hi"), vad=True)
    assert (step.speak, step.active, step.ended) == (True, True, False)
    assert not turns.frame(frame(1, end=True), vad=True).ended
    assert phase(turns) is TurnPhase.TAIL
    assert turns.frame(frame(2, text="more"), vad=True).speak
    assert phase(turns) is TurnPhase.SPEAKING
    turns.frame(frame(3, end=True), vad=True)
    steps = [turns.frame(frame(4 + i), vad=True) for i in range(END_TAIL_FRAMES)]
    assert [s.ended for s in steps] == [False] * (END_TAIL_FRAMES - 1) + [True]
    assert phase(turns) is TurnPhase.BETWEEN


def test_a_turn_without_an_end_token_ends_quiet_and_a_muted_one_is_not_heard() -> None:
    turns = ids()
    turns.frame(frame(0, text="hi"), vad=True)
    turns.mute()
    assert phase(turns) is TurnPhase.MUTED and not turns.speaking
    assert not turns.frame(frame(1, text="still"), vad=True).speak
    steps = [turns.frame(frame(2 + i), vad=True) for i in range(QUIET_FRAMES)]
    assert not any(s.ended for s in steps)  # it ended unheard
    assert phase(turns) is TurnPhase.BETWEEN
    turns.mute()  # between turns: nothing to mute
    assert phase(turns) is TurnPhase.BETWEEN


def test_a_held_turn_is_unheard_until_claimed_and_its_end_is_heard_once_claimed() -> None:
    turns = ids()
    step = turns.frame(frame(0, text="hi"), vad=False, hold=True)
    assert (step.speak, step.active, phase(turns)) == (False, True, TurnPhase.HELD)
    assert turns.held and not turns.speaking
    # Once held, the rest of the turn stays held whatever ``hold`` says.
    assert not turns.frame(frame(1, text="ho", end=True), vad=False).speak
    assert phase(turns) is TurnPhase.HELD_TAIL
    turns.claim()
    assert phase(turns) is TurnPhase.TAIL and turns.speaking
    steps = [turns.frame(frame(2 + i), vad=False) for i in range(END_TAIL_FRAMES)]
    assert steps[-1].ended


def test_an_unclaimed_held_turn_ends_unheard_and_hold_only_applies_to_an_opening() -> None:
    turns = ids()
    turns.frame(frame(0, text="hi", end=True), vad=False, hold=True)
    steps = [turns.frame(frame(1 + i), vad=False) for i in range(END_TAIL_FRAMES)]
    assert not any(s.ended for s in steps) and phase(turns) is TurnPhase.BETWEEN
    turns.frame(frame(9, text="x"), vad=False)
    assert turns.frame(frame(10, text="y"), vad=False, hold=True).speak  # already speaking


def test_a_held_turn_takes_the_floor_from_the_user() -> None:
    turns = ids()
    turns.frame(frame(0, heard="so"), vad=True)
    step = turns.frame(frame(1, text="Right"), vad=True, hold=True)
    assert step.user == (SpeechStopped("item_0", FRAME_MS), Committed("item_0"))
    assert not step.speak


def test_the_users_turn_is_drawn_from_its_transcript() -> None:
    turns = ids()
    step = turns.frame(frame(3, heard="hello"), vad=True)
    assert step.user == (SpeechStarted("item_0", 3 * FRAME_MS),)
    quiet = [turns.frame(frame(4 + i), vad=True) for i in range(USER_QUIET_FRAMES)]
    assert [s.user for s in quiet[:-1]] == [()] * (USER_QUIET_FRAMES - 1)
    assert quiet[-1].user == (
        SpeechStopped("item_0", 4 * FRAME_MS),
        Committed("item_0"),
        Transcribed("item_0", "hello", FRAME_MS / 1000),
    )


def test_the_model_answering_commits_the_user_and_late_transcript_settles() -> None:
    turns = ids()
    turns.frame(frame(0, heard="what"), vad=True)
    step = turns.frame(frame(1, text="Well"), vad=True)
    assert step.user == (SpeechStopped("item_0", FRAME_MS), Committed("item_0"))
    turns.frame(frame(2, heard=" time"), vad=True)
    beats = [b for i in range(USER_QUIET_FRAMES) for b in turns.frame(frame(3 + i), vad=True).user]
    assert beats == [Transcribed("item_0", "what time", FRAME_MS / 1000)]


def test_without_vad_only_a_commit_ends_the_users_turn() -> None:
    turns = ids()
    assert turns.frame(frame(0, heard="hi"), vad=False).user == ()
    for i in range(USER_QUIET_FRAMES * 2):
        assert turns.frame(frame(1 + i), vad=False).user == ()
    assert turns.user_pending
    assert turns.commit(vad=False, frame_index=20) == [Committed("item_0")]
    assert not turns.user_pending


def test_calls_come_out_once_complete_and_a_malformed_one_is_skipped() -> None:
    reader = CallReader()
    assert reader.push(CALL[:20]) == []
    assert reader.push(CALL[20:]) == [("get_weather", '{"city": "Paris"}')]
    assert reader.push("<TOOLCALL>not json</TOOLCALL>") == []
    assert reader.push('<TOOLCALL>[{"name": "f"}]</TOOLCALL>') == [("f", "{}")]


def test_a_refused_update_leaves_the_session_as_it_was() -> None:
    session = ev.default_session("sess_x", "m")
    before = ev.serialize(session)
    update = {"instructions": "new", "audio": {"output": {"format": {"type": "audio/opus"}}}}
    refused = sess.updated(session, update, applied=None, max_prompt_tokens=99, count_tokens=len)
    assert isinstance(refused, ev.Invalid) and refused.param == "session.audio.output.format"
    assert ev.serialize(session) == before
    applied = sess.prefilled(session)
    changed = sess.updated(
        session, {"tools": []}, applied=applied, max_prompt_tokens=99, count_tokens=len
    )
    assert changed == session  # the same tools: allowed once started
    late = sess.updated(
        session, {"instructions": "x"}, applied=applied, max_prompt_tokens=99, count_tokens=len
    )
    assert isinstance(late, ev.Invalid) and late.code == "session_already_started"
