"""Hooks through which metrics, logs and benchmarks watch the server.

The connection and the engine call an :class:`Observer` at each step that
someone may want to count or time. The base class does nothing, so a server
without metrics pays one empty method call per hook; Prometheus metrics
(:mod:`realtime.metrics`) and the per-hop benchmark (``benchmarks.breakdown``)
subclass it instead of patching private methods. Hooks must be cheap and must
never raise: they run on the per-frame path, some on the engine thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

CommandKind = Literal["open", "push", "flush", "cancel", "close", "call"]

RefusalReason = Literal[
    "busy", "unauthorized", "forbidden_origin", "forbidden_host", "draining", "engine_unavailable"
]
"""Why a connection got no session: a busy slot (1013), a refused upgrade (401/403/503)."""

SessionOutcome = Literal[
    "done", "cancelled", "client_gone", "error", "timeout", "stalled_client", "shutdown"
]
"""How a session ended: committed and answered, cancelled, the client left, a server
error, a timeout (configure/idle), a client that stopped reading, server shutdown."""


@attrs.frozen(slots=True)
class SessionReport:
    """One finished session, for the session-end log line and the metrics."""

    session_id: str
    outcome: SessionOutcome
    duration: float
    """Seconds from accept to close."""
    frames: int
    """Model frames that produced audio for this client."""
    step_seconds: tuple[float, ...]
    """Engine time of each audio slice, in order (for p50/p95)."""
    close_code: int | None
    close_reason: str

    @property
    def audio_seconds(self) -> float:
        return self.frames * 0.08

    @property
    def realtime_factor(self) -> float | None:
        """Model time over audio time: below 1 keeps up with a live speaker."""
        if not self.step_seconds or not self.frames:
            return None
        return sum(self.step_seconds) / self.audio_seconds


class Observer:
    """Every hook the server calls; override the ones you need."""

    # --- engine thread ------------------------------------------------------------

    def command_started(self, kind: CommandKind) -> None:
        """The engine thread starts running a command."""

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        """The engine thread finished a command (``seconds`` of engine time)."""

    # --- trio side ------------------------------------------------------------------

    def connection_refused(self, reason: RefusalReason) -> None:
        """A client got no session (busy slot or refused upgrade)."""

    def session_started(self, session_id: str) -> None:
        """A connection holds the slot and was sent ``session.created``."""

    def session_opened(self, seconds: float) -> None:
        """``session.update`` ran on the engine (warm-up and prompt prefill)."""

    def session_ended(self, report: SessionReport) -> None:
        """The connection is closed and the slot released."""

    def error_sent(self, code: str) -> None:
        """An ``error`` event went to a client."""

    def limit_refused(self, limit: str) -> None:
        """A message was refused by a limit (``max_message_bytes``, ...)."""

    def append_received(self, at: float) -> None:
        """An audio append arrived from the socket (``time.perf_counter()``)."""

    def slice_submitted(self) -> None:
        """One audio slice was handed to the engine."""

    def slice_collected(self) -> None:
        """The connection resumed with a slice's events."""

    def frame_sent(self, latency: float) -> None:
        """A frame's audio was handed to the socket, ``latency`` s after its append arrived."""

    def audio_send(self, started: bool) -> None:
        """Around the socket write of a frame's audio (benchmark hop timing)."""

    def pending_audio(self, seconds: float) -> None:
        """Input audio accepted and not yet run by the model."""

    def send_queue(self, depth: int) -> None:
        """Events queued for the client's socket."""


class Observers(Observer):
    """Several observers as one."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self._all = tuple(observers)

    def command_started(self, kind: CommandKind) -> None:
        for o in self._all:
            o.command_started(kind)

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        for o in self._all:
            o.command_finished(kind, seconds)

    def connection_refused(self, reason: RefusalReason) -> None:
        for o in self._all:
            o.connection_refused(reason)

    def session_started(self, session_id: str) -> None:
        for o in self._all:
            o.session_started(session_id)

    def session_opened(self, seconds: float) -> None:
        for o in self._all:
            o.session_opened(seconds)

    def session_ended(self, report: SessionReport) -> None:
        for o in self._all:
            o.session_ended(report)

    def error_sent(self, code: str) -> None:
        for o in self._all:
            o.error_sent(code)

    def limit_refused(self, limit: str) -> None:
        for o in self._all:
            o.limit_refused(limit)

    def append_received(self, at: float) -> None:
        for o in self._all:
            o.append_received(at)

    def slice_submitted(self) -> None:
        for o in self._all:
            o.slice_submitted()

    def slice_collected(self) -> None:
        for o in self._all:
            o.slice_collected()

    def frame_sent(self, latency: float) -> None:
        for o in self._all:
            o.frame_sent(latency)

    def audio_send(self, started: bool) -> None:
        for o in self._all:
            o.audio_send(started)

    def pending_audio(self, seconds: float) -> None:
        for o in self._all:
            o.pending_audio(seconds)

    def send_queue(self, depth: int) -> None:
        for o in self._all:
            o.send_queue(depth)
