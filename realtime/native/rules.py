"""The rules of one ``/v1/realtime`` connection, as a pure state machine.

Everything that decides what a client message is answered with, what the model
is asked to do, and when and how the connection closes lives in this file:
the phase (CONFIGURING → READY → COMMITTED / CANCELLED → CLOSED), whether a
``session.update`` is in flight, the pending-audio budget, the failed-append
rule, the timeouts and the wire error code of every engine failure. There is no
trio, no engine, no socket and no clock here: time comes in as an argument,
frames and engine outcomes come in as method calls, and what to do comes out as
a list of outputs (in the spirit of h11's ``_state.py`` and wsproto's
``receive_data()``/``events()``). :mod:`realtime.session.pipeline` is the plumbing
that carries those outputs to the socket and the engine (through
:class:`~realtime.native.connection.NativeRules`). It answers what the native
protocol asks of the model: an open, audio, a commit's flush and a cancel; it feeds
no tool results and counts a prompt as it comes, so it implements neither
capability (:mod:`realtime.session.rules`), and it reads socket writes from the
pipeline's backlog.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final

import attrs

from realtime.limits import Limits, message_size, prompt_refusal
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AudioDelta,
    Cancelled,
    Done,
    ModelEvent,
    ModelFigures,
    PromptUse,
)
from realtime.native import wire as protocol
from realtime.observe import SessionOutcome
from realtime.session import work
from realtime.session.close_codes import CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY, Close

MAX_QUEUED_MESSAGES: Final = 1024
"""Accepted messages waiting for the model; beyond it a client sends faster than it may."""


class Phase(enum.Enum):
    CONFIGURING = "configuring"
    """No session yet: ``session.update`` may come (``update_in_flight`` once it has)."""
    READY = "ready"
    """The session is open: audio runs."""
    COMMITTED = "committed"
    """The client committed: the rest runs, then ``response.done`` and close 1000."""
    CANCELLED = "cancelled"
    """The client cancelled: at most the running slice completes, then close 1000."""
    CLOSED = "closed"
    """A close was decided; nothing more is accepted."""


TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.CONFIGURING: frozenset({Phase.READY, Phase.COMMITTED, Phase.CANCELLED, Phase.CLOSED}),
    Phase.READY: frozenset({Phase.COMMITTED, Phase.CANCELLED, Phase.CLOSED}),
    # An open that failed after the commit queued behind it: the client may try again.
    Phase.COMMITTED: frozenset({Phase.CONFIGURING, Phase.CLOSED}),
    Phase.CANCELLED: frozenset({Phase.CLOSED}),
    # A drop (the client read nothing) may follow a close already decided.
    Phase.CLOSED: frozenset({Phase.CLOSED}),
}
"""Every legal phase change, in one table (h11's way): :meth:`Conversation._enter` is
the only place a phase is set, and refuses anything else (a bug, not a client error)."""


# --- outputs: what the plumbing must do -----------------------------------------------


Output = protocol.Event | work.Work | work.StopModel | Close | work.LimitRefused
"""An event dict is sent to the client as is."""


@attrs.frozen(slots=True)
class Timeout:
    """Which deadline ``next_deadline`` refers to."""

    at: float
    what: str


def error_code_for(failure: work.Failure) -> protocol.ErrorCode:
    """The wire error code of an engine failure (the one place this mapping lives)."""
    if failure.during == "open" and failure.kind in ("open_failed", "session_lost"):
        return "session_initialization_failed"
    return "inference_error"


def _audio_first(event: ModelEvent) -> int:
    # A frame's audio goes first: it is what the listener waits for; text and
    # transcript only update a display. Done/Cancelled stay last.
    if isinstance(event, AudioDelta):
        return 0
    return 2 if isinstance(event, (Done, Cancelled)) else 1


class Conversation:
    """One connection's state. Not thread-safe; one trio task at a time calls it."""

    def __init__(
        self,
        session_id: str,
        limits: Limits,
        *,
        model_id: str,
        model_path: str | None,
        now: float,
        count_tokens: Callable[[str], int] = len,
        figures: ModelFigures = VOICECHAT_FIGURES,
    ) -> None:
        self.session_id = session_id
        self.limits = limits
        self.figures = figures
        """The served model's rates and frame sizes (``RealtimeModel.figures``)."""
        self.model_id = model_id
        self.model_path = model_path
        self._count_tokens = count_tokens
        """The model's tokenizer (how many prefill steps a system prompt costs)."""
        self.phase = Phase.CONFIGURING
        self.update_in_flight = False
        self.session_open = False
        """The engine holds an open model session for this connection."""
        self.outcome: SessionOutcome | None = None
        self.close_reason = ""
        self.frames = 0
        self._accepted_at = now
        self._last_message = now
        self.backlog = work.Backlog(idle_from=now)
        """What is still owed the client: the pipeline counts it, the rules read it."""
        self._max_pending = int(limits.max_pending_audio_seconds * figures.input_sample_rate)
        self._ended = False
        """A drop was decided or the plumbing ended the connection: no deadline remains."""
        self._next_append = 0
        self._failed_append = -1
        """The append whose remaining slices are dropped after a model error."""
        self._asked: protocol.SessionUpdate | None = None
        """The ``session.update`` being opened: ``session.updated`` echoes it."""

    # --- client frames ------------------------------------------------------------

    def receive(self, frame: str | bytes | None, now: float) -> list[Output]:
        """One WebSocket message from the client."""
        self._last_message = now
        if self.phase is Phase.CLOSED:
            return []
        if frame is None:
            frame = b""
        size = message_size(frame, self.limits.max_message_bytes)
        if size > self.limits.max_message_bytes:
            return [
                work.LimitRefused("max_message_bytes"),
                self._refuse(
                    f"message of {size} bytes exceeds the "
                    f"{self.limits.max_message_bytes}-byte limit",
                ),
            ]
        try:
            message = protocol.parse_client_message(frame, self.figures)
        except protocol.ProtocolError as exc:
            return [self._refuse(exc.message)]
        match message:
            case protocol.Ping():
                return [protocol.pong()]
            case protocol.Cancel():
                return self._cancel()
            case _ if self.phase is Phase.CANCELLED:
                return [self._refuse("the session was cancelled; no more input is accepted")]
            case protocol.SessionUpdate():
                return self._update(message)
            case _ if self.phase is Phase.CONFIGURING and not self.update_in_flight:
                what = "audio" if isinstance(message, protocol.AudioAppend) else "commit"
                return [self._refuse(f"send session.update before {what}")]
            case _ if self.phase is Phase.COMMITTED:
                return [self._refuse("input audio was already committed; the session is ending")]
            case protocol.AudioAppend():
                return self._append(message, now)
            case protocol.AudioCommit():
                return self._commit(message)
        raise AssertionError(message)  # pragma: no cover

    def _refuse(self, message: str) -> protocol.Event:
        return protocol.error_event("invalid_request", message)

    def _queue(self, item: work.Work) -> list[Output]:
        if self.backlog.queued >= MAX_QUEUED_MESSAGES:
            return [
                work.LimitRefused("max_queued_messages"),
                self._refuse(
                    f"more than {MAX_QUEUED_MESSAGES} messages are waiting; this one was refused"
                ),
            ]
        return [item]

    def _update(self, update: protocol.SessionUpdate) -> list[Output]:
        if self.update_in_flight or self.phase is not Phase.CONFIGURING:
            return [
                self._refuse(
                    "the session is already configured; session.update is accepted "
                    "once per connection"
                )
            ]
        if update.model is not None and not protocol.model_matches(
            update.model, self.model_id, self.model_path
        ):
            return [
                self._refuse(
                    f"model {update.model!r} is not served here; this server serves "
                    f"{self.model_id!r}"
                )
            ]
        refusal = prompt_refusal(
            update.system_prompt,
            self.limits.max_system_prompt_tokens,
            self._count_tokens,
            field="session.system_prompt",
        )
        if refusal is not None:
            return [work.LimitRefused("max_system_prompt_tokens"), self._refuse(refusal)]
        out = self._queue(
            work.OpenModel(update.system_prompt, update.seed, update.max_streaming_seconds)
        )
        if isinstance(out[0], work.OpenModel):
            self.update_in_flight = True
            self._asked = update
        return out

    def _append(self, append: protocol.AudioAppend, now: float) -> list[Output]:
        rate = self.figures.input_sample_rate
        if append.sample_rate != rate:
            return [
                protocol.error_event(
                    "inference_error",
                    f"expected {rate} Hz PCM, received {append.sample_rate} Hz; "
                    f"resample to {rate} Hz mono before sending",
                )
            ]
        n = int(append.samples.shape[0])
        seconds = n / rate
        limit = self.limits.max_pending_audio_seconds
        if n > self._max_pending:
            return [
                work.LimitRefused("max_pending_audio_seconds"),
                self._refuse(
                    f"this append of {seconds:.2f} s is larger than the {limit:g} s limit on "
                    "pending input audio; send it in smaller appends, no faster than real time"
                ),
            ]
        pending = self.backlog.pending_samples
        if pending + n > self._max_pending:
            return [
                work.LimitRefused("max_pending_audio_seconds"),
                self._refuse(
                    f"input audio backlog is full: "
                    f"{pending / rate:.2f} s waiting, limit "
                    f"{limit:g} s; this append of {seconds:.2f} s was refused "
                    "(send audio no faster than real time)"
                ),
            ]
        out = self._queue(work.RunAudio(self._next_append, append.samples, append.sample_rate, now))
        if isinstance(out[0], work.RunAudio):
            self._next_append += 1
        return out

    def _commit(self, commit: protocol.AudioCommit) -> list[Output]:
        out = self._queue(work.FlushModel(commit.pad_partial))
        if isinstance(out[0], work.FlushModel):
            self._enter(Phase.COMMITTED)
        return out

    def _cancel(self) -> list[Output]:
        if self.phase in (Phase.COMMITTED, Phase.CANCELLED, Phase.CLOSED):
            return []
        self._enter(Phase.CANCELLED)
        return [work.StopModel(), work.CancelModel()]

    # --- the model's side ---------------------------------------------------------------

    def begin_audio(self, audio: work.RunAudio) -> list[Output] | None:
        """The submitter reached an append: ``None`` to run it, else what to send instead
        (the append is dropped; the pipeline returns its budget)."""
        if self.session_open and self.phase in (Phase.READY, Phase.COMMITTED):
            return None
        if self.phase in (Phase.CANCELLED, Phase.CLOSED):
            return []
        return [self._refuse("send session.update before audio")]

    def keep_submitting(self, append_id: int) -> bool:
        """Whether the next slice of this append may still go to the model."""
        return self.phase is not Phase.CANCELLED and append_id != self._failed_append

    def slice_done(
        self, append_id: int, events: list[ModelEvent] | None, now: float
    ) -> list[protocol.Event]:
        """A slice ran (``events``) or was skipped (``None``): its wire events, audio
        first. (Its model time is the plumbing's to record: the session report.)"""
        if events is None:
            return []
        if append_id == self._failed_append:
            return []
        return self._model_events(events)

    def slice_failed(self, append_id: int, failure: work.Failure, now: float) -> list[Output]:
        """A slice failed: the error once per append; a lost session ends the connection;
        at the context limit the error once, ``response.done`` and a normal close."""
        if failure.lost:
            return self._fail(failure)
        if failure.kind == "context_limit":
            self._failed_append = append_id
            if self.phase is Phase.CLOSED:
                return []
            return [
                work.StopModel(),
                protocol.error_event(error_code_for(failure), failure.message),
                protocol.wire_event(Done(self.frames), self.figures),
                self._close(CLOSE_NORMAL, "context limit reached", "done"),
            ]
        if append_id == self._failed_append:
            return []
        self._failed_append = append_id
        return [protocol.error_event(error_code_for(failure), failure.message)]

    def opened(
        self, failure: work.Failure | None, now: float, *, prompt: PromptUse | None = None
    ) -> list[Output]:
        """The engine finished the open: ``session.updated``, or the error (``prompt``: not
        reported on this endpoint)."""
        self.update_in_flight = False
        update = self._asked
        assert update is not None, "opened without a session.update"
        if failure is None:
            self.session_open = True
            if self.phase is Phase.CONFIGURING:
                self._enter(Phase.READY)
            return [protocol.session_updated(self.session_id, self.model_id, update, self.figures)]
        if failure.kind == "engine_dead":
            return self._fail(failure)
        if self.phase in (Phase.CANCELLED, Phase.CLOSED):
            return []  # a cancel skipped the queued open; it answers for itself
        # Nothing was opened: the client may fix its options and try again.
        if self.phase is Phase.COMMITTED:
            self._enter(Phase.CONFIGURING)
        return [protocol.error_event(error_code_for(failure), failure.message)]

    def flushed(self, result: list[ModelEvent] | work.Failure | None, now: float) -> list[Output]:
        """The engine ran the commit's flush (``None``: no session was open)."""
        if isinstance(result, work.Failure):
            return self._fail(result)
        if result is None:
            # The open failed after the commit was accepted: nothing to flush.
            return [self._refuse("send session.update before commit")]
        self.session_open = False
        out: list[Output] = [protocol.input_audio_committed()]
        out += self._model_events(result)
        out.append(self._close(CLOSE_NORMAL, "response done", "done"))
        return out

    def cancelled(self, result: list[ModelEvent] | work.Failure | None, now: float) -> list[Output]:
        """The engine ran the cancel (``None``: no session was open)."""
        if isinstance(result, work.Failure):
            return self._fail(result)
        self.session_open = False
        out: list[Output] = list(self._model_events(result or []))
        if not any(e.get("type") == "response.cancelled" for e in out if isinstance(e, dict)):
            out.append(protocol.cancelled(self.frames))
        out.append(self._close(CLOSE_NORMAL, "cancelled", "cancelled"))
        return out

    def _model_events(self, events: Sequence[ModelEvent]) -> list[protocol.Event]:
        """Wire events of model events, a frame's audio first; counts the frames."""
        out = []
        for event in sorted(events, key=_audio_first):
            if isinstance(event, AudioDelta):
                self.frames += 1
            out.append(protocol.wire_event(event, self.figures))
        return out

    def _fail(self, failure: work.Failure) -> list[Output]:
        """The session is gone (engine failure): say so and close 1011."""
        self.session_open = False
        if self.phase is Phase.CLOSED:
            return []
        return [
            protocol.error_event(error_code_for(failure), failure.message),
            self._close(CLOSE_INTERNAL, failure.message[:120], "error"),
        ]

    def _enter(self, phase: Phase) -> None:
        """The one place a phase changes: ``TRANSITIONS`` says which changes exist."""
        if phase not in TRANSITIONS[self.phase]:
            raise AssertionError(f"no transition {self.phase.name} -> {phase.name}")
        self.phase = phase

    def _close(
        self, code: int, reason: str, outcome: SessionOutcome, *, now: bool = False
    ) -> Close:
        self._enter(Phase.CLOSED)
        self.outcome = outcome
        self.close_reason = reason
        return Close(code, reason, now=now)

    # --- time -----------------------------------------------------------------------------

    def next_deadline(self) -> Timeout | None:
        """The earliest deadline now in force, if any.

        The stalled-reader deadline holds in every phase, closing included: once a
        close is decided, the last events (and the close after them) still wait on a
        client that may read nothing, and it must not hold the slot by not reading.
        Only the configure and idle clocks stop once the client has said its piece.
        """
        if self._ended:
            return None
        best: Timeout | None = None
        backlog = self.backlog
        if backlog.sending_since is not None:
            best = Timeout(backlog.sending_since + self.limits.send_timeout, "send")
        if self.phase in (Phase.CONFIGURING, Phase.READY):
            if self.phase is Phase.CONFIGURING and not self.update_in_flight:
                at = self._accepted_at + self.limits.configure_timeout
                if best is None or at < best.at:
                    best = Timeout(at, "configure")
            if backlog.idle_from is not None:
                at = max(self._last_message, backlog.idle_from) + self.limits.idle_timeout
                if best is None or at < best.at:
                    best = Timeout(at, "idle")
        return best

    def check_timeouts(self, now: float) -> list[Output]:
        """What a deadline that has passed requires (nothing if none has)."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline.at:
            return []
        if deadline.what == "send":
            # Even after a normal close was decided: the client never read its end.
            self._ended = True
            return [self._close(CLOSE_POLICY, "client stopped reading", "stalled_client", now=True)]
        if deadline.what == "idle":
            message = f"no message for {self.limits.idle_timeout:g} s; closing"
        else:
            message = f"no session.update within {self.limits.configure_timeout:g} s; closing"
        return [
            protocol.error_event("invalid_request", message),
            self._close(CLOSE_POLICY, message[:120], "timeout"),
        ]

    def next_check(self, now: float) -> float:
        """When the plumbing should call :meth:`check_timeouts` next: the earliest
        deadline, or a poll (deadlines may move earlier)."""
        deadline = self.next_deadline()
        at = now + self.poll_interval()
        return at if deadline is None else min(deadline.at, at)

    def poll_interval(self) -> float:
        """How often the plumbing re-reads ``next_deadline`` (deadlines may move earlier)."""
        return min(
            1.0,
            self.limits.send_timeout / 4,
            self.limits.idle_timeout / 4,
            self.limits.configure_timeout / 4,
        )

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None:
        """The plumbing ended the connection itself (client gone, shutdown)."""
        if self.outcome is None:
            self.outcome = outcome
            self.close_reason = reason
        self._enter(Phase.CLOSED)
        self._ended = True
