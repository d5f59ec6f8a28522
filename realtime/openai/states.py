"""The OpenAI dialect's states and their legal transitions, as data.

Three small machines run side by side in one connection: the model session
(:class:`ModelState`), the connection's own lifetime (:class:`Phase`) and the
model's current turn (:class:`TurnPhase`). :data:`TRANSITIONS` lists every
change each trigger may make; :func:`advance` is the only way a state changes,
so a change the table does not list is a bug in the dialect, raised at once
rather than carried on as a state no rule was written for.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, TypeVar


class ModelState(enum.Enum):
    """The model session on the engine."""

    CLOSED = enum.auto()
    """Not asked for yet, or its opening failed (the next audio asks again)."""
    OPENING = enum.auto()
    """Asked for (:class:`~realtime.session.work.OpenModel` handed out)."""
    OPEN = enum.auto()
    """Running: its clock is fed silence while the client is quiet."""


class Phase(enum.Enum):
    """The connection, as the dialect serves it."""

    SERVING = enum.auto()
    CLOSING = enum.auto()
    """The close is decided: nothing but the close (and what is queued) is owed."""
    DROPPED = enum.auto()
    """The client stopped reading and was dropped: nothing is left to time."""


class TurnPhase(enum.Enum):
    """The model's turn, as the text channel draws it."""

    BETWEEN = enum.auto()
    """No turn: the model's audio is resampled and dropped."""
    SPEAKING = enum.auto()
    TAIL = enum.auto()
    """The end token came: a few frames more ring out, unless text comes again."""
    MUTED = enum.auto()
    """Its response was cancelled (or it outgrew the hold): the model cannot be
    interrupted, so the rest of the turn runs unheard."""
    MUTED_TAIL = enum.auto()
    HELD = enum.auto()
    """It began with no response to carry it, in a session where only the client
    opens responses: unheard, but kept for a ``response.create`` to claim."""
    HELD_TAIL = enum.auto()


class Trigger(enum.Enum):
    """What moves a state: a client message, an engine outcome or a model frame."""

    OPEN = enum.auto()
    """Audio or ``response.create`` needs the model."""
    OPENED = enum.auto()
    OPEN_FAILED = enum.auto()
    CLOSE = enum.auto()
    """The dialect decides to close (idle, a lost session, a stalled reader)."""
    DROP = enum.auto()
    """The client read nothing for ``send_timeout``."""
    TEXT = enum.auto()
    """A frame with agent text (it cancels a tail)."""
    END_TOKEN = enum.auto()
    TURN_END = enum.auto()
    """The tail ran out, or the turn was quiet too long."""
    CANCEL = enum.auto()
    """Its response was cancelled (``response.cancel``, or the user's speech with
    ``interrupt_response``), or a held turn outgrew what is kept of it."""
    HOLD = enum.auto()
    """A turn opens with no response ready for it, and only the client opens them."""
    CLAIM = enum.auto()
    """A response the client created takes the held turn."""


State = ModelState | Phase | TurnPhase
S = TypeVar("S", ModelState, Phase, TurnPhase)

TRANSITIONS: Final[Mapping[State, Mapping[Trigger, State]]] = {
    ModelState.CLOSED: {
        Trigger.OPEN: ModelState.OPENING,
        # The engine may report a session the dialect did not ask for: a plumbing
        # that opens the model up front (the dialect tests drive it so).
        Trigger.OPENED: ModelState.OPEN,
    },
    ModelState.OPENING: {
        Trigger.OPENED: ModelState.OPEN,
        Trigger.OPEN_FAILED: ModelState.CLOSED,
    },
    ModelState.OPEN: {},
    Phase.SERVING: {Trigger.CLOSE: Phase.CLOSING},
    Phase.CLOSING: {Trigger.DROP: Phase.DROPPED},
    Phase.DROPPED: {},
    TurnPhase.BETWEEN: {Trigger.TEXT: TurnPhase.SPEAKING, Trigger.HOLD: TurnPhase.HELD},
    TurnPhase.SPEAKING: {
        Trigger.TEXT: TurnPhase.SPEAKING,
        Trigger.END_TOKEN: TurnPhase.TAIL,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CANCEL: TurnPhase.MUTED,
    },
    TurnPhase.TAIL: {
        Trigger.TEXT: TurnPhase.SPEAKING,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CANCEL: TurnPhase.MUTED_TAIL,
    },
    TurnPhase.MUTED: {
        Trigger.TEXT: TurnPhase.MUTED,
        Trigger.END_TOKEN: TurnPhase.MUTED_TAIL,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CANCEL: TurnPhase.MUTED,
    },
    TurnPhase.MUTED_TAIL: {
        Trigger.TEXT: TurnPhase.MUTED,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CANCEL: TurnPhase.MUTED_TAIL,
    },
    TurnPhase.HELD: {
        Trigger.TEXT: TurnPhase.HELD,
        Trigger.END_TOKEN: TurnPhase.HELD_TAIL,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CLAIM: TurnPhase.SPEAKING,
        Trigger.CANCEL: TurnPhase.MUTED,
    },
    TurnPhase.HELD_TAIL: {
        Trigger.TEXT: TurnPhase.HELD,
        Trigger.TURN_END: TurnPhase.BETWEEN,
        Trigger.CLAIM: TurnPhase.TAIL,
        Trigger.CANCEL: TurnPhase.MUTED_TAIL,
    },
}


class IllegalTransition(RuntimeError):
    """A state change :data:`TRANSITIONS` does not allow: a bug in the dialect."""


def advance(state: S, trigger: Trigger) -> S:
    """The state ``trigger`` moves ``state`` to, by the table; raises
    :class:`IllegalTransition` when the table has no such move."""
    following = TRANSITIONS[state].get(trigger)
    if not isinstance(following, type(state)):
        raise IllegalTransition(f"{trigger.name} is not allowed in {state}")
    return following
