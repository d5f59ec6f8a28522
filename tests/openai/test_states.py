"""The OpenAI dialect's transition table: complete, closed over each machine, and
the only way a state changes (a change it does not list raises)."""

from __future__ import annotations

import enum
import json
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from realtime.limits import Limits
from realtime.openai.dialect import Dialect
from realtime.openai.states import (
    TRANSITIONS,
    IllegalTransition,
    ModelState,
    Phase,
    State,
    Trigger,
    TurnPhase,
    advance,
)

MACHINES: tuple[type[enum.Enum], ...] = (ModelState, Phase, TurnPhase)
START: dict[type[enum.Enum], State] = {
    ModelState: ModelState.CLOSED,
    Phase: Phase.SERVING,
    TurnPhase: TurnPhase.BETWEEN,
}
any_advance: Callable[[Any, Trigger], Any] = advance
"""``advance`` over every machine's states at once (it is typed per machine)."""


def model_state(d: Dialect) -> ModelState:
    return d.model_state


def phase(d: Dialect) -> Phase:
    return d.phase


def test_every_state_has_a_row_and_every_move_stays_in_its_machine() -> None:
    assert set(TRANSITIONS) == {state for machine in MACHINES for state in machine}
    for state, moves in TRANSITIONS.items():
        for target in moves.values():
            assert type(target) is type(state), (state, target)


@pytest.mark.parametrize("machine", MACHINES)
def test_every_state_is_reachable_from_the_start(machine: type[enum.Enum]) -> None:
    seen = {START[machine]}
    todo: deque[State] = deque(seen)
    while todo:
        for target in TRANSITIONS[todo.popleft()].values():
            if target not in seen:
                seen.add(target)
                todo.append(target)
    assert seen == set(machine)


def test_advance_follows_the_table_and_refuses_the_rest() -> None:
    for state, moves in TRANSITIONS.items():
        for trigger in Trigger:
            if trigger in moves:
                assert any_advance(state, trigger) is moves[trigger]
            else:
                with pytest.raises(IllegalTransition, match=trigger.name):
                    any_advance(state, trigger)


def test_the_rules_the_table_spells() -> None:
    # Text in the tail cancels the end; a cancelled turn stays unheard to its end.
    assert advance(TurnPhase.TAIL, Trigger.TEXT) is TurnPhase.SPEAKING
    assert advance(TurnPhase.MUTED_TAIL, Trigger.TEXT) is TurnPhase.MUTED
    assert advance(TurnPhase.MUTED, Trigger.TURN_END) is TurnPhase.BETWEEN
    # A held turn is claimed as it stands (tail and all), or given up unheard.
    assert advance(TurnPhase.BETWEEN, Trigger.HOLD) is TurnPhase.HELD
    assert advance(TurnPhase.HELD, Trigger.CLAIM) is TurnPhase.SPEAKING
    assert advance(TurnPhase.HELD_TAIL, Trigger.CLAIM) is TurnPhase.TAIL
    assert advance(TurnPhase.HELD_TAIL, Trigger.CANCEL) is TurnPhase.MUTED_TAIL
    # Only a turn that is opening can be held, and only a held one claimed.
    for state in (TurnPhase.SPEAKING, TurnPhase.TAIL, TurnPhase.MUTED, TurnPhase.MUTED_TAIL):
        assert Trigger.HOLD not in TRANSITIONS[state]
        assert Trigger.CLAIM not in TRANSITIONS[state]
    # A failed opening may be retried; an open model is never reopened.
    assert advance(ModelState.OPENING, Trigger.OPEN_FAILED) is ModelState.CLOSED
    assert TRANSITIONS[ModelState.OPEN] == {}
    # A dropped client is the end: nothing is owed it any more.
    assert TRANSITIONS[Phase.DROPPED] == {}


def test_the_dialect_raises_on_an_engine_outcome_it_did_not_ask_for() -> None:
    d = Dialect("sess_test", "scripted", Limits(), now=0.0)
    d.receive(json.dumps({"type": "response.create"}), 0.0)
    assert model_state(d) is ModelState.OPENING
    d.opened(None, now=1.0)
    assert model_state(d) is ModelState.OPEN
    with pytest.raises(IllegalTransition):
        d.opened(None, now=2.0)  # an open model cannot open again


def test_the_dialects_phases() -> None:
    d = Dialect("sess_test", "scripted", Limits(send_timeout=1.0, idle_timeout=5.0), now=0.0)
    assert phase(d) is Phase.SERVING and not d.closed
    d.tick(5.0)
    assert phase(d) is Phase.CLOSING and d.closed
    d.tick(6.0)
    assert phase(d) is Phase.DROPPED
    assert d.failed("gone", lost=True, now=7.0)  # a later close decision changes nothing
    assert phase(d) is Phase.DROPPED
