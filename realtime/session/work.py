"""What a dialect's rules ask of the model pipeline, and what comes back: neutral values.

Both state machines (:mod:`realtime.native.rules` for ``/v1/realtime``,
:mod:`realtime.openai.dialect` for ``/openai/v1/realtime``) hand the one pipeline
(:mod:`realtime.session.pipeline`) the same work, in arrival order, and hear about its
results in the same terms, so a change on the frame path (a metric, a limit, an
engine outcome) is made once.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from realtime.engine.commands import EngineError, FailureKind
from realtime.models.base import Samples
from realtime.observe import CommandKind, DropReason


@attrs.frozen(slots=True)
class OpenModel:
    """Open the model session (seed, voice warm-up, system-prompt prefill); runs in
    order with the audio around it."""

    system_prompt: str | None
    seed: int = 0
    max_streaming_seconds: float | None = None


@attrs.frozen(slots=True, eq=False)
class RunAudio:
    """Run this audio through the model, one frame at a time, in order. ``tag`` names
    it for the results (an append's id, a frame's number); ``received_at`` is trio's
    clock as it arrived, which the frame latency runs from."""

    tag: int
    samples: Samples
    sample_rate: int
    received_at: float


@attrs.frozen(slots=True)
class FlushModel:
    """Run the partial frame (zero-padded when ``pad_partial``) and end the turn."""

    pad_partial: bool


@attrs.frozen(slots=True)
class CancelModel:
    """End the session without running more audio."""


@attrs.frozen(slots=True)
class FeedModel:
    """Give the model a tool's result (``realtime.engine.commands.ToolResult``); runs in order
    with the audio around it."""

    output: str


Work = OpenModel | RunAudio | FlushModel | CancelModel | FeedModel
"""Work for the model, in arrival order."""


@attrs.frozen(slots=True)
class StopModel:
    """Set the stop signal now: queued frames (and a queued open) must not run."""


@attrs.frozen(slots=True, eq=False)
class CountTokens:
    """Count ``text``'s tokens with ``count`` (the model's tokenizer) off the event loop
    and the engine thread, then hand the result to the rules' ``counted``; the
    connection reads nothing more from its client meanwhile."""

    text: str
    count: Callable[[str], int]


@attrs.frozen(slots=True)
class LimitRefused:
    """A message was refused by this limit (for the metrics; the error is sent too)."""

    limit: str


@attrs.frozen(slots=True)
class DroppedAudio:
    """The rules dropped ``seconds`` of input audio (for the metrics); ``note``, when
    not empty, is the session's one log line about it (the first drop for ``reason``)."""

    seconds: float
    reason: DropReason
    note: str = ""


@attrs.frozen(slots=True)
class Failure:
    """An engine command failed: what is left of the session (``kind``), the model's
    message, and which command it was. The one shape both dialects map to their
    wire errors."""

    kind: FailureKind
    message: str
    during: CommandKind

    @classmethod
    def of(cls, error: EngineError) -> Failure:
        return cls(error.kind, error.message, error.during)

    @property
    def lost(self) -> bool:
        """The session is gone: the connection cannot go on with it."""
        return self.kind in ("session_lost", "engine_dead")


@attrs.define(slots=True)
class Backlog:
    """What the server still owes the client, counted by the pipeline alone (it is
    the only writer); the rules read it for their decisions: the pending-audio budget,
    the queued-message bound, the stalled-reader and the idle clocks. So the rules
    keep no counter that stays right only if calls come in the right order."""

    idle_from: float | None
    """When the server last stopped owing the client anything (None: it owes)."""
    pending_samples: int = 0
    """Accepted input audio not yet handed to the model."""
    queued: int = 0
    """Accepted work for the model not yet finished."""
    inflight: int = 0
    """Frames with the model whose events are not yet out."""
    unsent: int = 0
    """Events handed to the socket's queue and not yet written."""
    sending_since: float | None = None
    """A socket write under way since then (the stalled-reader clock)."""

    def accepted(self, item: Work) -> None:
        """The rules accepted ``item``: it is owed until it finishes."""
        self.queued += 1
        if isinstance(item, RunAudio):
            self.pending_samples += int(item.samples.shape[0])
        self.idle_from = None

    def submitted(self, samples: int) -> None:
        """A frame of accepted audio went to the model."""
        self.pending_samples -= samples
        self.inflight += 1

    def audio_done(self, unsubmitted: int) -> None:
        """The pipeline is done with an append (``unsubmitted`` samples never ran)."""
        self.pending_samples -= unsubmitted
        self.queued -= 1

    def frame_back(self, now: float) -> None:
        """A frame's result came back from the model."""
        self.inflight -= 1
        self._settle(now)

    def finished(self, now: float) -> None:
        """An open, flush or cancel finished on the model."""
        self.queued -= 1
        self._settle(now)

    def event_queued(self) -> None:
        self.unsent += 1
        self.idle_from = None

    def sending(self, now: float) -> None:
        self.sending_since = now

    def sent(self, now: float) -> None:
        self.sending_since = None
        self.unsent -= 1
        self._settle(now)

    def owes(self) -> bool:
        return bool(self.queued or self.inflight or self.unsent or self.pending_samples)

    def _settle(self, now: float) -> None:
        if self.idle_from is None and not self.owes():
            self.idle_from = now
