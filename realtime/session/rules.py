"""A dialect as the session drives it: a small core every dialect implements, and
capabilities that only the dialects using them implement.

The pipeline (:mod:`realtime.session.pipeline`) and the lifetime
(:mod:`realtime.session.lifetime`) call a dialect's rules through :class:`Rules`;
what only one dialect ever asks for (a commit's flush and a cancel, a tool result, a
count of the client's text, a word on each socket write) is a capability of its own,
checked with ``isinstance`` once per connection. A dialect never carries a method it
has no use for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, NoReturn, Protocol, runtime_checkable

from realtime.limits import Limits
from realtime.models.base import ModelEvent, PromptUse, RealtimeModel
from realtime.observe import SessionOutcome
from realtime.session.close_codes import Close
from realtime.session.work import (
    Backlog,
    CountTokens,
    Failure,
    LimitRefused,
    RunAudio,
    StopModel,
    Work,
)

Event = dict[str, Any]
Output = Event | Work | StopModel | Close | LimitRefused | CountTokens
Ended = list[ModelEvent] | Failure | None
"""What a flush or cancel came to: the model's events, its failure, or None (no
session was open)."""

Refusal = Literal["server_busy", "engine_unavailable"]


class Rules(Protocol):
    """What every dialect implements: its serializer, its state machine's answers to
    the client, the clock and each frame, and how the session ended."""

    session_id: str
    session_open: bool
    backlog: Backlog
    """What is still owed the client: counted by the pipeline, read by the rules."""
    audio_event: ClassVar[str]
    """The event type a frame's audio travels in (the frame latency ends at its write)."""

    def created_event(self) -> Event | None:
        """The greeting sent on accept (``None``: the client speaks first)."""
        ...

    def refusal_event(self, code: Refusal, message: str) -> Event: ...
    def serialize(self, event: Event) -> str: ...

    def receive(self, frame: str | bytes | None, now: float) -> Sequence[Output]: ...
    def check_timeouts(self, now: float) -> Sequence[Output]: ...
    def next_check(self, now: float) -> float: ...

    def begin_audio(self, work: RunAudio) -> Sequence[Output] | None: ...
    def keep_submitting(self, tag: int) -> bool: ...
    def slice_done(
        self, tag: int, events: list[ModelEvent] | None, now: float
    ) -> Sequence[Output]: ...
    def slice_failed(self, tag: int, failure: Failure, now: float) -> Sequence[Output]: ...
    def opened(
        self, failure: Failure | None, now: float, *, prompt: PromptUse | None = None
    ) -> Sequence[Output]: ...

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None: ...
    def ending(self) -> tuple[SessionOutcome, str]: ...


DialectFactory = Callable[[RealtimeModel, Limits, float], Rules]
"""Builds a connection's rules: ``(model, limits, now) -> Rules``."""


@runtime_checkable
class EndsTurns(Protocol):
    """Rules that hand out :class:`~realtime.session.work.FlushModel` and
    :class:`~realtime.session.work.CancelModel` (the native commit and cancel)."""

    def flushed(self, result: Ended, now: float) -> Sequence[Output]: ...
    def cancelled(self, result: Ended, now: float) -> Sequence[Output]: ...


@runtime_checkable
class FeedsTools(Protocol):
    """Rules that hand out :class:`~realtime.session.work.FeedModel` (a tool's output)."""

    def fed(self, failure: Failure | None, now: float, tokens: int) -> Sequence[Output]: ...


@runtime_checkable
class CountsText(Protocol):
    """Rules that hand out :class:`~realtime.session.work.CountTokens` (counted off the loop)."""

    def counted(self, text: str, tokens: int | Exception, now: float) -> Sequence[Output]: ...


@runtime_checkable
class WatchesWrites(Protocol):
    """Rules that keep a clock of their own on socket writes (beside the backlog's)."""

    def sending(self, now: float) -> None: ...
    def sent(self, now: float) -> None: ...


def lacking(rules: Rules, asked: object, capability: type) -> NoReturn:
    """A dialect handed out work whose answer it does not implement: a bug in the
    dialect, named as such."""
    raise TypeError(
        f"{type(rules).__name__} handed out {type(asked).__name__} "
        f"but does not implement {capability.__name__}"
    )
