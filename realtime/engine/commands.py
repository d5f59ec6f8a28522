"""What crosses the engine's thread line: the typed commands the event loop submits, the
results and errors the engine thread answers with, and the queued entry that carries a
command and its future between them.

Every command is a frozen value; its result comes back through a
``concurrent.futures.Future`` (the one channel from the engine thread back to the event
loop: nothing else of the engine thread's state is read by the loop). The engine knows
nothing of the wire protocol: its failures carry their own :data:`FailureKind`, which
the connection maps to wire error codes.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Final, Literal

import attrs

from realtime.models import base as model
from realtime.models.base import ModelEvent, Opening, Samples
from realtime.observe import CommandKind

FailureKind = Literal["open_failed", "step_failed", "context_limit", "session_lost", "engine_dead"]
"""``open_failed``: nothing was opened, the client may try again. ``step_failed``: the
model refused this input but the session goes on (bad rate). ``context_limit``: the
session reached its ``max_streaming_seconds`` and takes no more audio.
``session_lost``: the session is gone. ``engine_dead``: the engine thread has stopped."""


class EngineError(Exception):
    """A command failed; ``kind`` says what is left of the session."""

    def __init__(self, kind: FailureKind, message: str, *, during: CommandKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message
        self.during: CommandKind = during

    @property
    def session_lost(self) -> bool:
        """True when the session is gone (the connection cannot go on with it)."""
        return self.kind in ("session_lost", "engine_dead")


class EngineLoadError(Exception):
    """The loader failed; the message is the model's own."""


# --- commands -------------------------------------------------------------------


@attrs.frozen(slots=True, eq=False)
class Open:
    """Open the session: seed, voice warm-up, system-prompt prefill. Result: the
    session's :class:`~realtime.models.base.PromptUse` (how it read its system prompt:
    tokens, and how many came from the prompt cache)."""

    session_id: str
    system_prompt: str | None
    seed: int
    max_streaming_seconds: float | None
    stop: threading.Event | None = None
    """Set when the connection is gone: a queued open is skipped."""
    prompt_scope: str | None = attrs.field(default=None, kw_only=True)
    """Whose prompt cache the prefill is looked up in and stored to (the tenant's
    name; None: the shared scope, where warmed prompts are)."""


@attrs.frozen(slots=True, eq=False)
class Push:
    """Run one slice of audio. Result: a :class:`Step`, or ``None`` when ``stop`` was set
    while it waited in the queue (a cancel or disconnect: queued audio must not run)."""

    session_id: str
    samples: Samples
    sample_rate: int
    stop: threading.Event | None = None


@attrs.frozen(slots=True)
class Flush:
    """Run the partial frame (zero-padded when ``pad_partial``) and end. Result: events."""

    session_id: str
    pad_partial: bool = True


@attrs.frozen(slots=True)
class Cancel:
    """End the session without running more audio. Result: events (``Cancelled``)."""

    session_id: str


@attrs.frozen(slots=True)
class Close:
    """Drop the session (cancel it if it is still running), clear the buffer cache and
    free the reservation. Result: ``None``."""

    session_id: str


@attrs.frozen(slots=True)
class ToolResult:
    """Give the session's model a tool's ``output`` (the OpenAI endpoint's
    ``function_call_output``), one inserted model step per slice with other sessions'
    frames between the slices (:class:`realtime.models.base.TakesToolResults`); the
    session's own later commands wait for it. Result: ``None``."""

    session_id: str
    tool: model.ToolInput
    """Tokenized before it is submitted (off the engine thread)."""
    stop: threading.Event | None = attrs.field(default=None, eq=False)
    """Set when the connection is gone or cancelled: the feed stops before its next
    step (a queued :class:`Close` of the session stops it too)."""


Command = Open | Push | Flush | Cancel | Close | ToolResult

KINDS: Final[dict[type[Command], CommandKind]] = {
    Open: "open",
    Push: "push",
    Flush: "flush",
    Cancel: "cancel",
    Close: "close",
    ToolResult: "tool_result",
}
"""Each command's name in the observer's metrics and logs (and an error's ``during``)."""


@attrs.frozen(slots=True, eq=False)
class Step:
    """What one :class:`Push` produced, and the engine time it took."""

    events: list[ModelEvent]
    seconds: float
    """The model step this frame ran in; batched, the whole batch's (what one frame of
    this conversation held the shared engine for)."""
    rows: int = 1
    """Frames (one per conversation) in that model step."""


# --- a command on its way -------------------------------------------------------


@attrs.define(slots=True)
class Queued:
    """A submitted command and its future, as it waits in the queue and (a command that
    runs in slices) between its slices. The future is the event loop's; the other
    fields are the engine thread's."""

    command: Command
    future: concurrent.futures.Future[object]
    opening: Opening | None = None
    """An Open under way: its next slice runs when the scheduler picks it again."""
    engine_seconds: float = 0.0
    """A sliced command's engine time over all its slices."""
    started: bool = False
    """A sliced command whose first slice has run (its future is running)."""
    began: bool = False
    """An Open that passed its checks (it counts against the capacity until it ends)."""
    feed: model.ToolResultFeed | None = None
    """A ToolResult under way: its next step runs when the scheduler picks it again."""
    slice_seconds: float | None = None
    """A sliced command's last slice: what its next is expected to cost."""
    slice_steps: int = 0
    """Model steps its last slice ran, where the engine sizes its slices
    (:class:`~realtime.models.base.SizedSlices`; 0: none, or not sized)."""
    ask: int | None = None
    """Steps its next slice may run (None: as many as it likes), set as it starts."""


def settle(
    future: concurrent.futures.Future[object],
    *,
    result: object = None,
    exception: BaseException | None = None,
) -> None:
    """Complete a future unless it already is (a hung call's future is failed early)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, and its message if it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def dead_error(command: Command, reason: str | None) -> EngineError:
    """What every command gets once the engine thread has stopped."""
    return EngineError(
        "engine_dead",
        f"the model engine has stopped: {reason or 'not running'}",
        during=KINDS[type(command)],
    )
